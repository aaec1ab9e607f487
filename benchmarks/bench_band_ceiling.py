"""How close can a band (sliding-window) forward built from PyTorch's CPU kernels get to the matmul peak?

The long-inputs issue asks the local kernel's forward at n = 16,384 (window ±256, 8 heads of 64)
for >= 60 % of torch.mm's peak, counting useful FLOPs only. This measures, in one process, the
building blocks any such kernel is made of, so the ceiling is a measurement rather than a guess:

* ours: ``mh.attention(..., window(256, 256), backend="local")``;
* ``SDPA chunks, no mask``: the fused kernel on each chunk of 64..512 query rows over the keys the
  chunk's rows need, *without* the corners' mask — what our chunked design would cost if masking
  were free (its result is wrong at the corners; only its time counts);
* ``three parts (c)``: each chunk of c rows as a dense middle part plus two triangles (the left
  one flipped to be causal), each through the fused kernel, combined by their log-sum-exps — the
  decomposition that needs no mask at all;
* the fused kernel's throughput on the block shapes these are made of (full and causal squares of
  64..256 rows, batched over the sequence) — the upper bound of any decomposition into them.

    python benchmarks/bench_band_ceiling.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from _common import best, compare, matmul_peak_gflops, setup_threads, table

H, D, W = 8, 64, 256


def useful_flops(n: int) -> float:
    """q·k and p·v over the keys each row may see (2·2·D per key per head)."""
    keys = sum(min(n - 1, i + W) - max(0, i - W) + 1 for i in range(n))
    return 4.0 * D * H * keys


def sdpa_chunks_unmasked(q, k, v, c: int):
    n = q.shape[2]
    out = torch.empty_like(q)
    for s in range(0, n, c):
        lo, hi = max(0, s - W), min(n, s + c + W)
        out[:, :, s:s + c] = F.scaled_dot_product_attention(q[:, :, s:s + c], k[:, :, lo:hi], v[:, :, lo:hi])
    return out


def three_parts(q, k, v, c: int):
    """Interior chunks only (the edges would take the masked path): left triangle, middle, right
    triangle, each exact through the fused kernel, merged with their log-sum-exps."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    n = q.shape[2]
    scale = D ** -0.5
    out = torch.zeros_like(q)
    for s in range(W, n - c - W + 1, c):
        qc = q[:, :, s:s + c]
        o_l, l_l = flash(qc.flip(2), k[:, :, s - W:s - W + c].flip(2), v[:, :, s - W:s - W + c].flip(2), 0.0, True,
                         scale=scale)
        parts = [(o_l.flip(2), l_l.flip(2)),
                 flash(qc, k[:, :, s + W:s + W + c], v[:, :, s + W:s + W + c], 0.0, True, scale=scale)]
        if 2 * W > c:
            parts.append(flash(qc, k[:, :, s - W + c:s + W], v[:, :, s - W + c:s + W], 0.0, False, scale=scale))
        lse = torch.logsumexp(torch.stack([lp for _, lp in parts]), 0)  # (B, H, c)
        out[:, :, s:s + c] = sum(o * (lp - lse).exp()[..., None] for o, lp in parts)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4k tokens instead of 16k")
    args = parser.parse_args(argv)
    import multihead as mh
    from multihead.masks import window

    threads = setup_threads()
    n = 4096 if args.quick else 16384
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, n, D) for _ in range(3))
    mask = window(W, W)
    peak = matmul_peak_gflops()
    flops = useful_flops(n)
    variants = {"ours (local kernel)": lambda: mh.attention(q, k, v, mask, backend="local")}
    for c in (64, 128, 256, 512):
        variants[f"SDPA chunks of {c}, no mask"] = lambda c=c: sdpa_chunks_unmasked(q, k, v, c)
    for c in (128, 256, 512):
        variants[f"three parts, chunks of {c}"] = lambda c=c: three_parts(q, k, v, c)
    times = compare(variants, repeat=3)
    rows = []
    for name, ts in times.items():
        seconds = best(ts)
        gflops = flops / seconds / 1e9
        rows.append([name, f"{seconds * 1e3:.0f}", f"{gflops:.1f}", f"{gflops / peak:.0%}"])
    print(f"Band forward at n = {n}, window ±{W}, {H} heads of {D}; torch.mm peak measured now: {peak:.1f} GFLOP/s; "
          f"{threads} threads")
    print(table(["method", "ms (best of 3)", "useful GFLOP/s", "share of mm peak"], rows))

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    block_rows = []
    for b in (64, 128, 256):
        qb, kb, vb = (torch.randn(n // b, H, b, D) for _ in range(3))
        for causal in (False, True):
            def call(qb=qb, kb=kb, vb=vb, causal=causal):
                return flash(qb, kb, vb, 0.0, causal)

            seconds = best(compare({"block": call}, repeat=3)["block"])
            computed = 4.0 * D * H * n * b
            useful = computed / 2 if causal else computed
            block_rows.append([f"{b} x {b}", "causal" if causal else "full", f"{seconds * 1e3:.1f}",
                               f"{computed / seconds / 1e9:.1f}", f"{useful / seconds / 1e9:.1f}",
                               f"{useful / seconds / 1e9 / peak:.0%}"])
    print(f"\nThe fused CPU kernel on square blocks along the sequence ({n // 64}..{n // 256} blocks x {H} heads)")
    print(table(["block", "mask", "ms", "GFLOP/s (all entries)", "useful GFLOP/s", "useful share of peak"],
                block_rows))
    print("\nA band of ±w in blocks of b costs at least 2w + b keys per row (w/b full blocks a side plus the two "
          "triangles, which the kernel computes whole), at the blocks' own throughput above.")


if __name__ == "__main__":
    main(sys.argv[1:])
