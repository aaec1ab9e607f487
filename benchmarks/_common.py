"""Timing and table helpers shared by the benchmarks (not part of the library)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def setup_threads() -> int:
    """Use every core this machine has (2 on the project machines) and say so."""
    torch.set_num_threads(torch.get_num_threads())
    return torch.get_num_threads()


def compare(fns: dict[str, Callable[[], object]], *, repeat: int = 5, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of each function in each of ``repeat`` rounds, timed round-robin.

    Round-robin makes drift in the machine's speed (other load, thermal, memory) hit every
    variant alike; report :func:`best` for a time and :func:`paired_ratio` for a comparison.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def best(times: list[float]) -> float:
    """The least noisy estimate of a function's own cost on a shared machine (as ``timeit``)."""
    return min(times)


def paired_ratio(times: dict[str, list[float]], name: str, peer: str) -> float:
    """Median over rounds of (name's time / peer's time in the same round)."""
    return statistics.median(a / b for a, b in zip(times[name], times[peer], strict=True))


def rss(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in bytes ("VmRSS", or "VmHWM": the peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def reset_peak() -> None:
    """Reset this process's peak RSS (VmHWM) to its current RSS."""
    # Give freed heap pages back to the system first, so memory the warm-up freed and malloc
    # kept cannot be reused unseen; then reset VmHWM to the current RSS.
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def matmul_peak_gflops(n: int = 2048, repeat: int = 5) -> float:
    """fp32 ``torch.mm`` throughput (GFLOP/s) on n x n matrices, measured now (best of ``repeat``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_once(lambda: torch.mm(a, b)) for _ in range(repeat))
    return 2 * n**3 / best / 1e9


def _once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A Markdown table (readable in a terminal, pasteable into notes)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    return "\n".join([line, sep, *body])


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"
