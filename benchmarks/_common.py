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


def timeit(fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1, min_time: float = 0.0) -> float:
    """Median wall time of ``fn()`` in seconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    start_all = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start_all < min_time:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak_gflops(n: int = 2048, repeat: int = 5) -> float:
    """fp32 ``torch.mm`` throughput (GFLOP/s) on n x n matrices, measured now."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = timeit(lambda: torch.mm(a, b), repeat=repeat, warmup=2)
    return 2 * n**3 / seconds / 1e9


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A Markdown table (readable in a terminal, pasteable into notes)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    return "\n".join([line, sep, *body])


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"
