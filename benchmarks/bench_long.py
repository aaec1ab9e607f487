"""Long sequences: our local (sliding-window) kernel against dense masked SDPA and FlexAttention.

B=1, H=8, Dk=64, two-sided window 256, CPU float32, n in {1k, 4k, 16k, 64k}. Every
measurement runs in a fresh worker process, so its peak memory (the rise of the process's
peak RSS over what it held before the call, inputs included in neither) is its own.

Peers:
* dense: ``F.scaled_dot_product_attention`` with the band materialised as a (n, n) bool mask;
* flex: ``torch.compile(flex_attention)`` with the band as a block mask. PyTorch has no
  FlexAttention backward on the CPU, so flex rows are forward only.

Usage: python benchmarks/bench_long.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import reset_peak, rss

WINDOW = 256
B, H, DK = 1, 8, 64


def checkpoint_worker(backend: str, checkpoint: bool, n: int) -> dict[str, float]:
    """Peak memory of forward+backward through a stack of attention layers."""
    import torch

    import multihead as mh

    torch.manual_seed(0)
    layers = torch.nn.Sequential(*(mh.MultiHeadAttention(256, 8, backend=backend, checkpoint=checkpoint)
                                   for _ in range(CKPT_LAYERS)))
    x = torch.randn(1, n, 256, requires_grad=True)

    def step():
        layers.zero_grad(set_to_none=True)
        x.grad = None
        layers(x).sum().backward()

    step()
    layers.zero_grad(set_to_none=True)
    x.grad = None
    reset_peak()
    base = rss("VmRSS")
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    peak = max(rss("VmHWM") - base, 0)
    return {"seconds": seconds, "peak_bytes": peak, "working_bytes": peak}


CKPT_LAYERS = 4


def _make_step(variant: str, n: int, mode: str):
    """A callable running one forward (or forward+backward) of ``variant``, and its inputs."""
    import torch
    import torch.nn.functional as F

    import multihead as mh

    torch.manual_seed(0)
    grad = mode == "fwd+bwd"
    q, k, v = (torch.randn(B, H, n, DK, requires_grad=grad) for _ in range(3))
    if variant in ("ours local", "ours auto"):
        mask = mh.masks.window(WINDOW)
        backend = "local" if variant == "ours local" else "auto"

        def call():
            return mh.attention(q, k, v, mask, backend=backend)[0]
    elif variant == "dense SDPA":

        def call():  # the (n, n) band mask is part of what this method needs, so it is timed and counted
            keep = mh.masks.window(WINDOW).materialize(n, n).contiguous()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    elif variant == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def band(b, h, qi, ki):
            return (ki - qi <= WINDOW) & (qi - ki <= WINDOW)

        block_mask = create_block_mask(band, None, None, n, n, device="cpu")
        flex = torch.compile(flex_attention)

        def call():
            return flex(q, k, v, block_mask=block_mask)
    else:
        raise ValueError(variant)

    def step():
        if grad:
            for t in (q, k, v):
                t.grad = None
            call().sum().backward()
        else:
            with torch.no_grad():
                call()

    return step, (q, k, v)


def memory_worker(variant: str, n: int, mode: str) -> dict[str, float]:
    """Peak memory of one step after a warm-up (run with a fixed mmap threshold, see measure_memory)."""
    if variant.startswith("stack "):  # "stack BACKEND on|off"
        _, backend, flag = variant.split()
        return checkpoint_worker(backend, flag == "on", n)
    step, (q, k, v) = _make_step(variant, n, mode)
    step()  # warm-up (compiles flex)
    for t in (q, k, v):
        t.grad = None  # the baseline holds no gradients: each step allocates its own
    reset_peak()
    base = rss("VmRSS")
    step()
    peak = max(rss("VmHWM") - base, 0)
    # What every method must hold whatever its kernel: the output, and in training the three
    # input gradients. The rest is the kernel's working memory.
    io = q.numel() * 4 * (4 if mode == "fwd+bwd" else 1)  # (.sum().backward()'s gradient is a broadcast scalar)
    return {"peak_bytes": peak, "working_bytes": max(peak - io, 0)}


def timing_worker(variants: list[str], n: int, mode: str) -> dict[str, list[float] | str]:
    """All variants in one process, timed round-robin: drift in the machine's speed hits each
    alike, and ratios are taken round by round. At least 3 rounds; more (up to 10) while a round
    takes under 2 s."""
    steps, out = {}, {}
    for variant in variants:
        try:
            step, _ = _make_step(variant, n, mode)
            step()  # warm-up (compiles flex)
            steps[variant] = step
        except (RuntimeError, MemoryError) as err:
            text = (str(err).splitlines() or [type(err).__name__])[0]
            oom = "alloc" in text.lower() or "memory" in text.lower()
            out[variant] = "failed: out of memory" if oom else f"failed: {text[:60]}"
    times: dict[str, list[float]] = {v: [] for v in steps}
    rounds, spent = 0, 0.0
    while steps and (rounds < 3 or (rounds < 10 and spent / rounds < 2.0)):
        for variant, step in steps.items():
            start = time.perf_counter()
            step()
            times[variant].append(time.perf_counter() - start)
            spent += times[variant][-1]
        rounds += 1
    out.update(times)
    if mode == "forward":  # the machine's matmul peak, measured now, in this process
        sys.path.insert(0, str(Path(__file__).parent))
        from _common import matmul_peak_gflops

        out["mm peak"] = matmul_peak_gflops()
    return out


def useful_flops(n: int) -> float:
    """FLOPs of a window-attention forward that count: q·k and p·v over the keys each row may see."""
    keys = sum(min(i + WINDOW, n - 1) - max(i - WINDOW, 0) + 1 for i in range(n))
    return B * H * keys * DK * 4.0


def _run(args: list[str], timeout: float, extra_env: dict[str, str]) -> dict | str:
    cmd = [sys.executable, __file__, *args]
    env = dict(os.environ, PYTHONWARNINGS="ignore", **extra_env)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if "alloc" in tail.lower() or "memory" in tail.lower():
            return "failed: out of memory"
        return f"failed: {tail[:80]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_memory(variant: str, n: int, mode: str, timeout: float = 900) -> dict | str:
    """Peak memory in a worker of its own with a fixed mmap threshold: every large tensor is its
    own mapping, returned to the system when freed, so the peak RSS follows what the tensors hold
    (each allocation then page-faults, so no time is taken there)."""
    return _run(["--memory-worker", variant, str(n), mode], timeout, {"MALLOC_MMAP_THRESHOLD_": "65536"})


def measure_times(variants: list[str], n: int, mode: str, timeout: float = 1800) -> dict | str:
    return _run(["--timing-worker", ",".join(variants), str(n), mode], timeout, {})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n in {1k, 2k}, one repeat (checks the script runs)")
    parser.add_argument("--memory-worker", nargs=3, metavar=("VARIANT", "N", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--timing-worker", nargs=3, metavar=("VARIANTS", "N", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_worker:
        variant, n, mode = args.memory_worker
        print(json.dumps(memory_worker(variant, int(n), mode)))
        return
    if args.timing_worker:
        variants, n, mode = args.timing_worker
        print(json.dumps(timing_worker(variants.split(","), int(n), mode)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import table, verdict

    sizes = [1024, 2048] if args.quick else [1024, 4096, 16384, 65536]
    # The dense peer at 64k needs a 4 GiB mask and ~16x the 16k time: measured up to 16k.
    dense_limit = 2048 if args.quick else 16384
    results: dict[tuple[str, int, str], dict | str] = {}
    for n in sizes:
        for mode in ("forward", "fwd+bwd"):
            run = []
            for variant in ("ours local", "ours auto", "dense SDPA", "flex"):
                if variant == "ours auto" and mode == "fwd+bwd":
                    continue
                if variant == "flex" and mode == "fwd+bwd":
                    results[(variant, n, mode)] = "no CPU backward in torch"
                elif variant == "dense SDPA" and n > dense_limit:
                    results[(variant, n, mode)] = f"skipped: O(n²), mask alone {n * n / 2**30:.0f} GiB"
                else:
                    run.append(variant)
            timed = measure_times(run, n, mode)
            if isinstance(timed, dict) and "mm peak" in timed:
                results[("mm peak", n, mode)] = timed.pop("mm peak")
            for variant in run:
                got = timed if isinstance(timed, str) else timed.get(variant, "failed: no result")
                if isinstance(got, str):
                    results[(variant, n, mode)] = got
                    continue
                mem = measure_memory(variant, n, mode)
                if isinstance(mem, str):
                    results[(variant, n, mode)] = mem
                    continue
                results[(variant, n, mode)] = {"times": got, "seconds": min(got), **mem}

    print(f"## bench_long: B={B} H={H} Dk={DK}, window {WINDOW} two-sided, CPU float32\n")
    print("ours: mh.attention(..., backend='local'); auto picks it when the window leaves <= 55% of the keys "
          "and n >= 1024 (so from n = 1k here), dense SDPA otherwise.\n")
    rows = []
    for (variant, n, mode), r in results.items():
        if variant == "mm peak":
            continue
        ours = results[("ours local", n, mode)]
        if isinstance(r, str):
            rows.append([n, mode, variant, r, "", "", "", "", ""])
            continue
        ratio_t = ratio_m = ratio_w = ""
        if variant != "ours local" and isinstance(ours, dict):
            ratio_t = f"{_paired(r['times'], ours['times']):.2f}x"
            ratio_m = f"{r['peak_bytes'] / max(ours['peak_bytes'], 1):.1f}x"
            ratio_w = f"{r['working_bytes'] / max(ours['working_bytes'], 2**20):.1f}x"
        rows.append([n, mode, variant, f"{r['seconds'] * 1e3:.0f}", f"{r['peak_bytes'] / 2**20:.0f}",
                     f"{r['working_bytes'] / 2**20:.0f}", ratio_t, ratio_m, ratio_w])
    print(table(["n", "mode", "kernel", "ms (best)", "peak MiB", "working MiB", "peer time / ours",
                 "peer peak / ours", "peer working / ours"], rows))
    print("\ntime ratio: median over rounds of the paired ratio (all kernels of a row group run round-robin in "
          "one process)")
    print("\npeak: rise of the worker's peak RSS during the call; working: peak minus the output and, with "
          "backward, the incoming and the three input gradients, which every method holds")

    share_rows, shares = [], {}
    for n in sizes:
        peak = results.get(("mm peak", n, "forward"))
        for variant in ("ours local", "ours auto", "flex", "dense SDPA"):
            r = results.get((variant, n, "forward"))
            if isinstance(r, dict) and isinstance(peak, float):
                gflops = useful_flops(n) / r["seconds"] / 1e9
                shares[(variant, n)] = gflops / peak
                share_rows.append([n, variant, f"{r['seconds'] * 1e3:.0f}", f"{gflops:.1f}", f"{peak:.1f}",
                                   f"{gflops / peak:.0%}"])
    if share_rows:
        print("\nForward, useful FLOPs only (q·k and p·v over the keys each row may see), against torch.mm's peak "
              "measured in the same worker\n")
        print(table(["n", "kernel", "ms (best)", "useful GFLOP/s", "mm peak GFLOP/s", "share of peak"], share_rows))

    growth = []
    for mode in ("forward", "fwd+bwd"):
        for a, b in itertools.pairwise(sizes):
            ra, rb = results[("ours local", a, mode)], results[("ours local", b, mode)]
            if isinstance(ra, dict) and isinstance(rb, dict):
                doublings = (b // a).bit_length() - 1
                growth.append([mode, f"{a} -> {b}", f"{(rb['seconds'] / ra['seconds']) ** (1 / doublings):.2f}x"])
    if growth:
        print("\nTime growth of our local kernel per doubling of n\n")
        print(table(["mode", "n", "per doubling"], growth))

    ckpt_n = 1024 if args.quick else 4096
    ckpt_rows = []
    for backend in ("math", "sdpa"):
        cells = {}
        for flag in ("off", "on"):
            cells[flag] = measure_memory(f"stack {backend} {flag}", ckpt_n, "fwd+bwd")
        off, on = cells["off"], cells["on"]
        if isinstance(off, dict) and isinstance(on, dict):
            ckpt_rows.append([backend, f"{off['peak_bytes'] / 2**20:.0f}", f"{on['peak_bytes'] / 2**20:.0f}",
                              f"{off['peak_bytes'] / max(on['peak_bytes'], 1):.1f}x",
                              f"{on['seconds'] / off['seconds']:.2f}x"])
        else:
            ckpt_rows.append([backend, str(off), str(on), "", ""])
    print(f"\nGradient checkpointing: {CKPT_LAYERS} stacked MultiHeadAttention(256, 8) layers, T={ckpt_n}, "
          "forward+backward, peak memory\n")
    print(table(["backend", "peak MiB, checkpoint off", "peak MiB, checkpoint on", "memory saved (off/on)",
                 "time on/off (one step)"], ckpt_rows))

    big = sizes[-2] if not args.quick else sizes[-1]
    ours_fb, dense_fb = results[("ours local", big, "fwd+bwd")], results[("dense SDPA", big, "fwd+bwd")]
    print("\nTargets")
    if isinstance(ours_fb, dict) and isinstance(dense_fb, dict):
        speed = _paired(dense_fb["times"], ours_fb["times"])
        mem = dense_fb["peak_bytes"] / max(ours_fb["peak_bytes"], 1)
        work = dense_fb["working_bytes"] / max(ours_fb["working_bytes"], 2**20)  # floor: 1 MiB
        print(f"- n={big} fwd+bwd >= 10x faster than dense masked SDPA: {speed:.1f}x -> {verdict(speed >= 10)}")
        print(f"- n={big} fwd+bwd <= 1/20 of dense peak memory: 1/{mem:.1f} -> {verdict(mem >= 20)} "
              f"(working memory: 1/{work:.1f})")
    for ours_name in ("ours local", "ours auto"):
        flex_ratios = []
        for n in sizes:
            f, o = results[("flex", n, "forward")], results[(ours_name, n, "forward")]
            if isinstance(f, dict) and isinstance(o, dict):
                flex_ratios.append((n, _paired(f["times"], o["times"])))
        if flex_ratios:
            worst = min(r for _, r in flex_ratios)
            shown = ", ".join(f"n={n}: {r:.2f}x" for n, r in flex_ratios)
            print(f"- forward >= 1.0x FlexAttention's speed ({ours_name}): {shown} -> {verdict(worst >= 1.0)}")
    target_n = 16384 if not args.quick else sizes[-1]
    if ("ours local", target_n) in shares:
        share = shares[("ours local", target_n)]
        print(f"- local kernel forward at n={target_n} >= 60% of the torch.mm peak (useful FLOPs): {share:.0%} -> "
              f"{verdict(share >= 0.6)}")
    worst_growth = max((float(g[2][:-1]) for g in growth), default=0.0)
    print(f"- time grows <= 2.3x per doubling of n: worst {worst_growth:.2f}x -> {verdict(worst_growth <= 2.3)}")
    last = results[("ours local", sizes[-1], "fwd+bwd")]
    if isinstance(last, dict) and not args.quick:
        print(f"- n={sizes[-1]} fwd+bwd within 4 GiB: peak {last['peak_bytes'] / 2**30:.2f} GiB -> "
              f"{verdict(last['peak_bytes'] <= 4 * 2**30)}")


def _paired(peer: list[float], ours: list[float]) -> float:
    """Median over rounds of peer time / our time in the same round."""
    return statistics.median(p / o for p, o in zip(peer, ours, strict=True))


if __name__ == "__main__":
    main()
