"""The multi-head layer against PyTorch, CPU float32 (issue: the core layer).

Peers, all measured in this run on the same weights and inputs:
* ``nn.MultiheadAttention`` with need_weights=False and with per-head weights;
* a hand-written nanoGPT-style layer (three Linear projections + F.scaled_dot_product_attention);
* the attention core alone: ``F.scaled_dot_product_attention`` against ``mh.attention``.

"forward" runs in eval mode under ``torch.inference_mode`` (torch's MHA takes its native fast
path there); "fwd+bwd" is a training step's forward and backward.

Usage: python benchmarks/bench_layer.py [--quick]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import multihead as mh
from _common import best, compare, matmul_peak_gflops, paired_ratio, setup_threads, table, verdict


class NanoGPTStyle(nn.Module):
    """What users write by hand: one Linear for QKV, SDPA, one Linear out."""

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        D = mha.embed_dim
        self.h = mha.num_heads
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)
        with torch.no_grad():
            self.qkv.weight.copy_(mha.in_proj_weight)
            self.qkv.bias.copy_(mha.in_proj_bias)
            self.out.weight.copy_(mha.out_proj.weight)
            self.out.bias.copy_(mha.out_proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q = q.view(B, T, self.h, -1).transpose(1, 2)  # (B, H, T, Dk)
        k = k.view(B, T, self.h, -1).transpose(1, 2)  # (B, H, T, Dk)
        v = v.view(B, T, self.h, -1).transpose(1, 2)  # (B, H, T, Dk)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, Dk)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


def _variants(B: int, T: int, D: int, H: int):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(D, H, batch_first=True)
    ours = mh.MultiHeadAttention.from_torch(theirs)
    ours_math = mh.MultiHeadAttention.from_torch(theirs)
    ours_math.backend = "math"
    hand = NanoGPTStyle(theirs)
    x = torch.randn(B, T, D)
    return {
        "torch MHA (need_weights=False)": lambda: theirs(x, x, x, need_weights=False)[0],
        "torch MHA (per-head weights)": lambda: theirs(x, x, x, need_weights=True, average_attn_weights=False),
        "ours auto": lambda: ours(x),
        "ours math (per-head weights)": lambda: ours_math(x, need_weights=True),
        "nanoGPT-style Linear+SDPA": lambda: hand(x),
    }, [theirs, ours, ours_math, hand]


def _fwd(fn):
    def run():
        with torch.inference_mode():
            fn()
    return run


def _fwd_bwd(fn, modules):
    def run():
        for m in modules:
            m.zero_grad(set_to_none=True)
        out = fn()
        y = out[0] if isinstance(out, tuple) else out
        loss = y.float().square().mean()
        if isinstance(out, tuple):
            loss = loss + out[1].float().square().mean()
        loss.backward()
    return run


def bench_layer(shapes, repeat: int) -> list[list[object]]:
    rows = []
    for B, T, D, H in shapes:
        variants, modules = _variants(B, T, D, H)
        for mode in ("forward", "fwd+bwd"):
            for m in modules:
                m.train(mode == "fwd+bwd")
            runs = {name: _fwd(fn) if mode == "forward" else _fwd_bwd(fn, modules) for name, fn in variants.items()}
            times = compare(runs, repeat=repeat)
            for name, ts in times.items():
                with_weights = name.endswith("(per-head weights)")
                peer = "torch MHA (per-head weights)" if with_weights else "torch MHA (need_weights=False)"
                rows.append([f"B={B} T={T} D={D} H={H}", mode, name, f"{best(ts) * 1e3:.1f}",
                             f"{paired_ratio(times, name, peer):.3f}"])
    return rows


def bench_core(B: int, T: int, H: int, Dk: int, repeat: int, peak: float) -> tuple[list[list[object]], float]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, Dk) for _ in range(3))
    flops = 4 * B * H * T * T * Dk  # q·kᵀ and weights·v, 2 flops per multiply-add
    rows = []
    share = 0.0
    with torch.inference_mode():
        times = compare({"F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
                         "mh.attention (auto)": lambda: mh.attention(q, k, v),
                         "mh.attention (math)": lambda: mh.attention(q, k, v, backend="math")}, repeat=repeat)
        for name, ts in times.items():
            t = best(ts)
            gflops = flops / t / 1e9
            if name == "mh.attention (auto)":
                share = gflops / peak
            rows.append([f"B={B} H={H} T={T} Dk={Dk}", name, f"{t * 1e3:.1f}", f"{gflops:.1f}",
                         f"{100 * gflops / peak:.0f}%"])
    return rows, share


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one repeat (checks the script runs)")
    args = parser.parse_args(argv)
    threads = setup_threads()
    if args.quick:
        shapes, core, repeat = [(2, 32, 64, 4)], (1, 64, 4, 16), 1
    else:
        shapes, core, repeat = [(8, 512, 512, 8), (1, 4096, 512, 8)], (1, 4096, 8, 64), 9
    print(f"## bench_layer: CPU float32, {threads} threads, torch {torch.__version__}\n")
    rows = bench_layer(shapes, repeat)
    print(table(["shape", "mode", "variant", "ms (best of rounds)", "ratio to torch"], rows))
    print("\nratio: median over rounds of the paired time ratio, to torch MHA need_weights=False; rows with "
          "weights: to torch MHA with per-head weights")
    peak = matmul_peak_gflops(n=512 if args.quick else 2048)
    core_rows, share = bench_core(*core, repeat=repeat, peak=peak)
    print(f"\nAttention core, forward; torch.mm peak measured now: {peak:.1f} GFLOP/s\n")
    print(table(["shape", "kernel", "ms", "GFLOP/s", "share of mm peak"], core_rows))

    auto = [float(r[4]) for r in rows if r[2] == "ours auto"]
    weights = [float(r[4]) for r in rows if r[2] == "ours math (per-head weights)"]
    print("\nTargets")
    print(f"- ours auto <= 1.05x torch MHA(need_weights=False): worst {max(auto):.3f} -> {verdict(max(auto) <= 1.05)}")
    print(f"- ours with weights <= 1.0x torch with weights: worst {max(weights):.3f} -> "
          f"{verdict(max(weights) <= 1.0)}")
    print(f"- attention core >= 60% of matmul peak at T={core[1]}: {100 * share:.0f}% -> "
          f"{verdict(share >= 0.6)}")


if __name__ == "__main__":
    main()
