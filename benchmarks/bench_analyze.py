"""Corpus analysis against what users do today (issue: see every head of a real model).

2,000 real sentences (the articles' examples + Rotten Tomatoes) through all-MiniLM-L6-v2:

* (a) Hugging Face ``output_attentions=True`` (eager attention) at batch size 1, with the same
  13 per-head metrics computed in NumPy from the returned maps — the BertViz / tutorial way;
* (b) the same forward batched (32, padded), returning every layer's maps, *without* metrics;
* ours: ``mh.analyze`` at batch size 32 — every metric, plus the head x head redundancy
  (JS distance and output cosine), which neither peer computes.

Targets: ours ≥ 3x faster than (a); ≥ 1.0x (b)'s plain forward time while also computing the
metrics; peak memory flat as the corpus grows from 500 to 2,000 sentences (each size measured
in a fresh process: peak RSS during the run minus RSS before it; the 2,000 are the 500 repeated,
so the largest batch is the same and only the corpus length changes).

Usage: python benchmarks/bench_analyze.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import unicodedata

import numpy as np
import torch

import multihead as mh
from _common import setup_threads, table, verdict
from multihead.data import sample_sentences


def _numpy_metrics(maps: list[np.ndarray], ids: list[int], tok, sums: np.ndarray, punct_ids: set[int]) -> None:
    """What a user writes: the same metrics from one sentence's maps (each (H, T, T)), in NumPy."""
    T = len(ids)
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    off = j - i
    sep = np.array([t in (tok.sep_token_id,) for t in ids])
    punct = np.array([t in punct_ids for t in ids])
    for layer, p in enumerate(maps):
        p = p.astype(np.float64)  # (H, T, T)
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = np.where(p > 0, np.log(p), 0.0)
        ent = -(p * logp).sum(-1)  # (H, T)
        values = [
            ent, ent / np.log(T), (p * np.abs(off)).sum(-1), (p * (off == 0)).sum(-1),
            (p * (off == -1)).sum(-1), (p * (off == 1)).sum(-1), (p * (np.abs(off) <= 2)).sum(-1),
            p[..., 0], (p * sep).sum(-1), (p * punct).sum(-1), p.max(-1), np.log(T) - ent,
        ]
        for m, v in enumerate(values):
            sums[m, layer] += v.sum(-1)
        sums[12, layer] += p.sum(1).max(-1)  # vertical (column share = max / T), weighted by T tokens


def peer_batch1_numpy(texts: list[str]) -> float:
    from transformers import AutoModel

    hf = mh.hf.load("minilm")
    eager = AutoModel.from_pretrained(hf.path, attn_implementation="eager").eval()
    tok = hf.tokenizer
    punct_ids = {i for t, i in tok.get_vocab().items()
                 if t and all(unicodedata.category(c).startswith("P") for c in t)}
    sums = np.zeros((13, 6, 12))
    start = time.perf_counter()
    with torch.inference_mode():
        for text in texts:
            enc = tok(text, return_tensors="pt")
            maps = eager(**enc, output_attentions=True).attentions
            _numpy_metrics([m[0].numpy() for m in maps], enc["input_ids"][0].tolist(), tok, sums, punct_ids)
    return time.perf_counter() - start


def peer_batched_forward(texts: list[str], batch_size: int = 32) -> float:
    from transformers import AutoModel

    hf = mh.hf.load("minilm")
    eager = AutoModel.from_pretrained(hf.path, attn_implementation="eager").eval()
    tok = hf.tokenizer
    order = sorted(texts, key=len)  # the same length bucketing ours does, to be fair to the peer
    start = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(order), batch_size):
            enc = tok(order[s:s + batch_size], padding=True, return_tensors="pt")
            eager(**enc, output_attentions=True)
    return time.perf_counter() - start


def ours(texts: list[str], batch_size: int = 32, redundancy: bool = False) -> float:
    hf = mh.hf.load("minilm")
    start = time.perf_counter()
    mh.analyze(hf, texts, batch_size=batch_size, coreference=False, redundancy=redundancy)
    return time.perf_counter() - start


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


MEMORY_BASE = 500


def memory_worker(n: int) -> None:
    """Run in a fresh process: the analysis of n sentences; print peak RSS growth (MiB) as JSON."""
    hf = mh.hf.load("minilm")
    # The same sentences repeated: the corpus grows, its length distribution (so the largest batch) does not.
    base = sample_sentences(MEMORY_BASE)
    texts = base * (n // MEMORY_BASE)
    mh.analyze(hf, base[:8], batch_size=32, coreference=False)  # warm caches and allocator
    before = _status_mib("VmRSS")
    try:  # reset the peak (VmHWM) to the current RSS, so the peak is this run's own
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    mh.analyze(hf, texts, batch_size=32, coreference=False)
    peak = _status_mib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"n": n, "before": before, "peak": peak, "reset": reset}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="400 sentences instead of 2,000")
    parser.add_argument("--memory-worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_worker:
        memory_worker(args.memory_worker)
        return
    threads = setup_threads()
    n = 400 if args.quick else 2000
    texts = sample_sentences(n)
    tokens = sum(len(ids) for ids in mh.hf.load("minilm").tokenizer(texts)["input_ids"])
    print(f"## Corpus analysis: {n} real sentences ({tokens} tokens) through MiniLM (6 x 12 heads), "
          f"{threads} threads\n")
    times = {}
    # Alternate the order over two rounds and keep each one's best: the machine is shared and noisy.
    for _ in range(2):
        times.setdefault("ours", []).append(ours(texts))
        times.setdefault("b", []).append(peer_batched_forward(texts))
        times.setdefault("ours+red", []).append(ours(texts, redundancy=True))
        times.setdefault("a", []).append(peer_batch1_numpy(texts))
    t = {k: min(v) for k, v in times.items()}
    rows = [
        ["(a) HF output_attentions, batch 1, NumPy metrics", f"{t['a']:.1f}", f"{n / t['a']:.0f}", "1.00"],
        ["(b) HF output_attentions, batch 32, no metrics", f"{t['b']:.1f}", f"{n / t['b']:.0f}",
         f"{t['a'] / t['b']:.2f}"],
        ["ours: mh.analyze, batch 32, the 13 metrics", f"{t['ours']:.1f}", f"{n / t['ours']:.0f}",
         f"{t['a'] / t['ours']:.2f}"],
        ["ours: + head x head redundancy (all-pairs JS, cosine)", f"{t['ours+red']:.1f}",
         f"{n / t['ours+red']:.0f}", f"{t['a'] / t['ours+red']:.2f}"],
    ]
    print(table(["run", "seconds", "sentences/s", "speed vs (a)"], rows))
    vs_a, vs_b = t["a"] / t["ours"], t["b"] / t["ours"]
    vs_a_red = t["a"] / t["ours+red"]
    print(f"\nours vs (a): {vs_a:.2f}x faster (target >= 3x): {verdict(vs_a >= 3)}; with redundancy "
          f"{vs_a_red:.2f}x")
    print(f"ours vs (b): {vs_b:.2f}x (b's time / ours, metrics included; target >= 1.0x): {verdict(vs_b >= 1.0)}")

    sizes = (MEMORY_BASE, 2 * MEMORY_BASE) if args.quick else (MEMORY_BASE, 4 * MEMORY_BASE)
    mem = []
    for size in sizes:
        path = os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])
        env = dict(os.environ, PYTHONPATH=path)
        done = subprocess.run([sys.executable, __file__, "--memory-worker", str(size)], capture_output=True,
                              text=True, env=env, check=True)
        mem.append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = [[m["n"], f"{m['before']:.0f}", f"{m['peak']:.0f}", f"{m['peak'] - m['before']:.0f}"] for m in mem]
    print("\n" + table(["sentences", "RSS before (MiB)", "peak RSS (MiB)", "growth (MiB)"], rows))
    growth = [m["peak"] - m["before"] for m in mem]
    flat = growth[1] <= max(growth[0] * 1.25, growth[0] + 50)
    print(f"\npeak memory {sizes[0]} -> {sizes[1]} sentences: {growth[0]:.0f} -> {growth[1]:.0f} MiB above the "
          f"loaded model (flat within 25% or 50 MiB): {verdict(flat)}")


if __name__ == "__main__":
    main()
