"""Batched matrix products on a CPU that keep every thread busy.

PyTorch hands a float32 ``bmm`` on a CPU to MKL's batched GEMM, which gives each thread whole
matrices of the batch: a batch of 3 on 2 threads takes as long as a batch of 4 — one thread idle a
third of the time (AMD EPYC, 2 threads: three products of 2,100 × 64 × 2,048 in 20.1 ms, four in
21.0 ms; each on its own with both threads, 16.2 ms). A grouped-query model's capture multiplies in
batches of its key-value heads (SmolLM2: 3), so its scores and P·V ran a quarter slower than the
threads allow. :func:`bmm` multiplies such a batch one matrix at a time, each on every thread.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .autodiff import differentiated

__all__ = ["SPREAD_MACS", "bmm", "spread"]

#: The fewest multiply-adds of one matrix of a batch, per thread, for it to be multiplied alone on every
#: thread: a smaller GEMM split over threads runs slower than it runs whole on one (2 threads: 90 × 64 ×
#: 512, 1.5 M a thread, 0.32 ms a batch of 3 one by one against 0.21 ms batched; 300 × 64 × 512, 4.9 M a
#: thread, even; AMD EPYC) — per thread, so that more threads need larger matrices before they split one.
SPREAD_MACS = 1 << 22


def spread(a: Tensor, b: Tensor) -> bool:
    """Whether :func:`bmm` multiplies a (n, r, k) by b (n, k, m) one matrix at a time: float32 or
    float64 in CPU memory (MKL's batched GEMM; a half product goes to oneDNN, which splits its
    own work), no derivative (:func:`~.autodiff.differentiated`: ``out=`` takes none), matrices of
    at least :data:`SPREAD_MACS` multiply-adds a thread, and a batch whose
    whole matrices leave a quarter or more of the threads' time idle — n = 3 on 2 threads (4 slots
    for 3), 2 on 4; not 5 on 2 (6 for 5), where the smaller products split over threads lose more;
    not 1 (MKL splits a lone matrix over the threads itself)."""
    threads = torch.get_num_threads()
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        return False  # torch.bmm's own message
    n, r, k = a.shape
    m = b.shape[-1]
    if (threads < 2 or n < 2 or a.device.type != "cpu" or a.dtype not in (torch.float32, torch.float64)
            or b.dtype != a.dtype or r * k * m < SPREAD_MACS * threads or differentiated(a) or differentiated(b)):
        return False
    slots = -(-n // threads) * threads  # what the batched GEMM takes: whole matrices, a round of threads each
    return 3 * slots >= 4 * n


def bmm(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """``torch.bmm(a, b, out=out)`` — a (n, r, k) @ b (n, k, m) -> (n, r, m), any strides — with a
    batch the threads would share unevenly multiplied one matrix at a time (:func:`spread`): each
    matrix MKL's GEMM of the same operands, split over the threads instead of on one (the same
    products within float32's summation order)."""
    if not spread(a, b) or (out is not None and out.shape != (a.shape[0], a.shape[1], b.shape[2])):
        return torch.bmm(a, b, out=out)
    if out is None:
        out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])  # (n, r, m)
    for i in range(a.shape[0]):
        torch.mm(a[i], b[i], out=out[i])  # (r, m), every thread on it
    return out
