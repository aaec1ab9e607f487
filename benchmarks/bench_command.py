"""`multihead analyze` as a user runs it: the memory plan it prints against the command's own peak.

bench_scale times the pass and holds its plan to the pass's memory above the weights. A user sees
something else: the plan line the command prints before a long run (``this process + weights +
pass + statistics + host = total``) and what the system shows the process hold at its worst — the
libraries, the tokenizer and spaCy's parse, the weights once a forward has read them, the pass,
the probes that follow it and the writing of the page. Here SmolLM2 runs `multihead analyze --file
DOC --document` on one Penn Treebank document of 1k, 4k and 8k tokens, each in a fresh process
whose peak RSS (``ru_maxrss`` from ``wait4``) is the figure; the plan's total is read from its
printed line.

Target: the printed plan within 20 % of the command's peak.

    python benchmarks/bench_command.py [--quick] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import table
from bench_scale import cpu_name, document

LENGTHS = (1024, 4096, 8192)
QUICK = (600,)
#: the plan line's total: "... = 1.46 GiB of 23.31 GiB available"
TOTAL = re.compile(r"memory plan for .*?= ([0-9.]+) (GiB|MiB)")


def planned_total(output: str) -> int | None:
    """The total of the first memory plan the command printed, in bytes (None: it printed none)."""
    found = TOTAL.search(output)
    if found is None:
        return None
    return int(float(found.group(1)) * (2**30 if found.group(2) == "GiB" else 2**20))


def command(text_file: Path, out: Path, dtype: str) -> tuple[int, float, int, str]:
    """Run the command once: (exit status, seconds, peak RSS in bytes, what it printed)."""
    cli = Path(sys.executable).with_name("multihead")
    args = [str(cli), "analyze", "--model", "smollm2", "--file", str(text_file), "--document", "--out", str(out),
            "--dtype", dtype]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as printed:
        child = subprocess.Popen(args, stdout=printed, stderr=subprocess.STDOUT, text=True,
                                 env=dict(os.environ, HF_HUB_OFFLINE="1"))
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        printed.seek(0)
        output = printed.read()
    return os.waitstatus_to_exitcode(status), seconds, usage.ru_maxrss * 1024, output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{', '.join(map(str, QUICK))} tokens")
    parser.add_argument("--dtype", default="auto", help="the command's --dtype (default: auto)")
    args = parser.parse_args(argv)
    import multihead as mh

    lengths = QUICK if args.quick else LENGTHS
    dtype = args.dtype
    tokenizer = mh.hf.load("smollm2").tokenizer
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for n in lengths:
            text, ids = document(tokenizer, n)
            source = Path(folder) / f"ptb-{n}.txt"
            source.write_text(text, encoding="utf-8")
            code, seconds, peak, output = command(source, Path(folder) / f"report-{n}", dtype)
            total = planned_total(output)
            if code != 0 or total is None:
                last = output.strip().splitlines()[-1][:100] if output.strip() else "?"
                rows.append([len(ids), f"failed ({code}): {last}", "", "", ""])
            else:
                rows.append([len(ids), f"{total / 2**30:.2f}", f"{peak / 2**30:.2f}", f"{total / peak - 1:+.0%}",
                             f"{seconds:.1f}"])
            print(" | ".join(map(str, rows[-1])), flush=True)
    print(f"multihead analyze --model smollm2 --document --dtype {dtype}: the printed plan against the command's "
          f"peak RSS; {cpu_name()}, {os.cpu_count()} CPUs")
    print(table(["tokens", "plan total GiB", "peak RSS GiB", "plan vs peak", "command s"], rows))


if __name__ == "__main__":
    main(sys.argv[1:])
