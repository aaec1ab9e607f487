"""Training throughput of an encoder built from our layer against torch's own (issue: models and training).

A 6-layer, 8-head, d_model 512, FFN 2048 post-norm encoder: ours (``mh.models.EncoderBlock``)
against ``torch.nn.TransformerEncoder`` of ``TransformerEncoderLayer`` with the same weights, on
the same inputs (B=16, T=128, random embeddings, padding on a quarter of the sequences), one
training step = forward + backward + AdamW. Timed round-robin, paired ratio (target ≥ 0.95x).
Memory: peak RSS rise of one training step with activation checkpointing off and on, each in a
fresh process.

Usage: python benchmarks/bench_train.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
from torch import nn

import multihead as mh
from _common import compare, paired_ratio, setup_threads, table, verdict
from multihead.models import EncoderBlock

L, H, D, F, B, T = 6, 8, 512, 2048, 16, 128


def _models():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, F, dropout=0.0, activation="gelu", batch_first=True)
    theirs = nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
    ours = nn.ModuleList([EncoderBlock(D, H, F, dropout=0.0, activation="gelu") for _ in range(L)])
    with torch.no_grad():
        for mine, t in zip(ours, theirs.layers, strict=True):
            mine.attn.load_state_dict(mh.MultiHeadAttention.from_torch(t.self_attn).state_dict())
            mine.ffn.up.load_state_dict(t.linear1.state_dict())
            mine.ffn.down.load_state_dict(t.linear2.state_dict())
            mine.norm1.load_state_dict(t.norm1.state_dict())
            mine.norm2.load_state_dict(t.norm2.state_dict())
    return ours, theirs


def _inputs():
    torch.manual_seed(1)
    x = torch.randn(B, T, D)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[: B // 4, T // 2:] = False
    return x, valid


def _step_fn(model, x, mask_fn):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        y = mask_fn(model, x)
        loss = y.square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _ours_forward(blocks, x, mask):
    for block in blocks:
        x = block(x, mask)
    return x


def memory_worker(checkpoint: bool) -> None:
    ours, _ = _models()
    for block in ours:
        block.checkpoint = checkpoint
    x, valid = _inputs()
    mask = mh.masks.key_padding(valid)
    step = _step_fn(ours, x, lambda m, h: _ours_forward(m, h, mask))
    step()  # warm up: optimiser state exists before measuring
    with open("/proc/self/status") as f:
        before = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    step()
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    print(json.dumps({"checkpoint": checkpoint, "rise_mib": peak - before}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--memory-worker", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_worker:
        memory_worker(args.memory_worker == "on")
        return
    threads = setup_threads()
    ours, theirs = _models()
    x, valid = _inputs()
    mask = mh.masks.key_padding(valid)
    steps = {
        "torch TransformerEncoder": _step_fn(theirs, x, lambda m, h: m(h, src_key_padding_mask=~valid)),
        "ours (EncoderBlock x 6)": _step_fn(ours, x, lambda m, h: _ours_forward(m, h, mask)),
    }
    times = compare(steps, repeat=3 if args.quick else 7)
    tokens = B * T
    print(f"## Training throughput: {L} layers, {H} heads, d_model {D}, FFN {F}, B={B}, T={T}, fp32, "
          f"{threads} threads\n")
    rows = [[name, f"{min(t) * 1e3:.0f}", f"{tokens / min(t):.0f}"] for name, t in times.items()]
    print(table(["model", "ms per step (best)", "tokens/s"], rows))
    ratio = 1 / paired_ratio(times, "ours (EncoderBlock x 6)", "torch TransformerEncoder")
    print(f"\nours / torch throughput: {ratio:.3f}x (target >= 0.95x): {verdict(ratio >= 0.95)}")
    rows = []
    for flag in ("off", "on"):
        path = os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])
        env = dict(os.environ, PYTHONPATH=path, MALLOC_MMAP_THRESHOLD_="65536")
        done = subprocess.run([sys.executable, __file__, "--memory-worker", flag], capture_output=True, text=True,
                              env=env, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append([f"checkpointing {flag}", f"{result['rise_mib']:.0f}"])
    print("\n" + table(["training step", "peak RSS rise (MiB)"], rows))
    off, on = float(rows[0][1]), float(rows[1][1])
    print(f"\nactivation checkpointing saves {off - on:.0f} MiB ({off / max(on, 1):.2f}x less)")


if __name__ == "__main__":
    main()
