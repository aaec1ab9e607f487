"""How much memory an attention call needs, and failing fast when it will not fit.

A dense (B, H, T, S) score matrix at B=1, H=8, T=S=64k is 128 GiB in float32: the process
would be killed half-way. :func:`estimate_memory` predicts the peak *extra* memory of a call
from shapes alone (meta tensors work: ``torch.empty(B, H, T, D, device="meta")``), and
:func:`attention <multihead.attention>` raises :class:`AttentionMemoryError` with the
estimate and a remedy before allocating anything.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..masks import FULL, Mask, as_mask, split_topk
from .dispatch import choose
from .plans import plan_cost
from .precision import HALF, key_grid, raised_dtype

__all__ = ["AttentionMemoryError", "LiveBytes", "MemoryEstimate", "available_memory", "check_memory",
           "estimate_memory", "pages_in_memory", "process_resident"]

#: Below this an estimate is not checked against the free memory (reading it costs a syscall).
CHECK_ABOVE = 256 * 2**20



class AttentionMemoryError(MemoryError):
    """An attention call would need more memory than the device has free."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak extra memory of one attention call, in bytes, and what dominates it."""

    backend: str
    bytes: int
    detail: str
    device: torch.device

    def __str__(self) -> str:
        return f"{self.backend}: about {_human(self.bytes)} ({self.detail})"


def estimate_memory(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    need_weights: bool = False,
    backend: str = "auto",
    training: bool | None = None,
) -> MemoryEstimate:
    """Peak extra memory of ``attention(q, k, v, mask, ...)``, beyond q, k, v themselves.

    ``backend="auto"`` estimates the kernel auto would choose. ``training`` (default: whether
    autograd will record the call) adds what the backward pass keeps and allocates.
    """
    mask = as_mask(mask)
    if backend == "auto":
        backend = choose(q, k, mask, need_weights, "auto").backend
    if training is None:
        training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    B, H, T, _ = q.shape
    S, Dv = k.shape[2], v.shape[3]
    item = q.element_size()
    acc = 4 if q.dtype in HALF else item
    out = B * H * T * Dv * item
    _, rest = split_topk(mask)
    mask_bytes = 0 if rest is None else B * T * S  # a materialised bool mask, per example at worst
    if backend == "math":
        scores = B * H * T * S * acc
        copies = 3 if training else (1 if q.device.type == "cpu" else 2)
        weights = B * H * T * key_grid(q, S) * item if q.dtype in HALF else 0  # on the key grid, padded
        total = copies * scores + weights + 2 * mask_bytes + out
        detail = f"{copies} x (B, H, T, S) = ({B}, {H}, {T}, {S}) scores in {_dtype_name(acc)}"
    elif backend == "sdpa":
        total = 2 * mask_bytes + out * (3 if training else 1)
        detail = f"dense mask {_human(mask_bytes)}" if mask_bytes else "fused kernel, no score matrix"
        if training and raised_dtype(q) is not None:
            # the kernel runs on float32 copies of q, k, v (kept for the backward) and gives a float32 output
            raised = (q.numel() + k.numel() + v.numel() + B * H * T * Dv) * 4
            total += raised
            detail += f"; float32 operands {_human(raised)} (a half request with a gradient on this CPU)"
    else:
        cover = FULL if rest is None else rest.cover(T, S)
        summary = plan_cost(cover, T, S, B=B, H=H)
        temporaries = 6 * summary.max_block * acc
        grads = (B * H * T * k.shape[3] + 2 * k.numel()) * acc if training else 0
        total = temporaries + B * H * T * acc + out + grads
        detail = (f"{summary.chunks} chunks of at most {summary.max_block:,} scores, "
                  f"{summary.mean_keys:.0f} keys per query")
    return MemoryEstimate(backend, int(total), detail, q.device)


def available_memory(device: torch.device) -> int | None:
    """Free memory on ``device`` in bytes, or None when unknown (meta tensors, other devices, a GPU this
    machine does not have: a plan for one answers without a verdict unless told its memory)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count():
            return None
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type != "cpu":
        return None
    free = _meminfo_available()
    limit = _cgroup_free()
    candidates = [x for x in (free, limit) if x is not None]
    return min(candidates) if candidates else None


def check_memory(estimate: MemoryEstimate) -> None:
    """Raise :class:`AttentionMemoryError` when ``estimate`` exceeds the free memory."""
    if estimate.bytes < CHECK_ABOVE:
        return
    free = available_memory(estimate.device)
    if free is None or estimate.bytes <= free:
        return
    remedy = ("use a sparse mask such as mh.masks.window(256) (memory O(T·w) with the local kernel), "
              "a smaller batch, or shorter inputs")
    if estimate.backend == "math":
        remedy = "drop need_weights (fused and chunked kernels never hold the weights), or " + remedy
    raise AttentionMemoryError(
        f"attention would need {estimate} but only {_human(free)} is free on {estimate.device}; {remedy}"
    )


def process_resident() -> int | None:
    """This process's resident memory now, in bytes (Linux's VmRSS; None elsewhere)."""
    return _proc_bytes("/proc/self/status", "VmRSS")


#: pages read from /proc/self/pagemap at a time (8 bytes a page)
_PAGEMAP_PAGES = 1 << 18


def pages_in_memory(tensors: Iterable[Tensor]) -> int | None:
    """Bytes of the CPU ``tensors``' storages in this process's resident memory now, each page once
    (Linux's ``/proc/self/pagemap``: the pages present in its page table, what VmRSS counts); None
    where that cannot be read. A model loaded from safetensors maps its files, and a page becomes
    resident only when a forward first reads it."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    spans = []
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        if tensor.is_contiguous():  # its own bytes (a storage may hold more: a whole file's tensors)
            start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        else:
            storage = tensor.untyped_storage()
            start, size = storage.data_ptr(), storage.nbytes()
        if size:
            spans.append((start // page, -(-(start + size) // page)))
    merged: list[list[int]] = []
    for first, end in sorted(spans):  # a page shared by two storages counted once
        if merged and first <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([first, end])
    present = 0
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            for first, end in merged:
                for at in range(first, end, _PAGEMAP_PAGES):
                    count = min(_PAGEMAP_PAGES, end - at)
                    pagemap.seek(at * 8)
                    entries = pagemap.read(count * 8)
                    if len(entries) != count * 8:
                        return None
                    # bit 63 of each entry: the page is present (the sign bit of an int64)
                    present += int((torch.frombuffer(bytearray(entries), dtype=torch.int64) < 0).sum())
    except OSError:
        return None
    return present * page


def _meminfo_available() -> int | None:
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def _proc_bytes(path: str, field: str) -> int | None:
    """A ``field:  N kB`` line of a /proc file, in bytes (None: no such file or field)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_free() -> int | None:
    base = "/sys/fs/cgroup"
    try:
        with open(os.path.join(base, "memory.max")) as f:
            raw = f.read().strip()
        if raw == "max":
            return None
        with open(os.path.join(base, "memory.current")) as f:
            return int(raw) - int(f.read().strip())
    except (OSError, ValueError):
        return None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _dtype_name(nbytes: int) -> str:
    return {2: "16-bit floats", 4: "float32", 8: "float64"}.get(nbytes, f"{nbytes}-byte values")


def _tensors(tree: object) -> list[Tensor]:
    """The tensors in an op's arguments (tuples, lists and dicts of them), in order — what
    ``tree_flatten`` finds there, without building its spec."""
    if isinstance(tree, Tensor):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


class LiveBytes(TorchDispatchMode):
    """Context manager: the bytes of tensor storage that every op inside creates, while alive —
    ``peak`` is the most held at once. On the ``meta`` device nothing is allocated, so a model's
    whole pass can be measured from its config alone (tensors made before entering, such as the
    weights, are not counted). Storage shared by views counts once; caching allocators' slack and
    kernels' private scratch are not tensors and are not seen. ``device``: count only tensors on
    devices of this type (``"cpu"``, ``"meta"``...; None: every device). With ``record``,
    ``events`` lists every allocation and free in order, ``(key, +bytes)`` and ``(key, -bytes)``,
    as :func:`~multihead.attn.heap.replay` runs them."""

    def __init__(self, device: str | None = None, *, record: bool = False) -> None:
        super().__init__()
        self.device = device
        self.live = 0
        self.peak = 0
        self.events: list[tuple[int, int]] | None = [] if record else None
        self._sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = None  # the arguments' storages, gathered only when an output's storage is new to us
        for tensor in ((out,) if isinstance(out, Tensor) else tree_flatten(out)[0]):
            if isinstance(tensor, Tensor) and (self.device is None or tensor.device.type == self.device):
                storage = tensor.untyped_storage()
                key = storage._cdata
                if key in self._sizes:
                    continue
                if inputs is None:  # (a traced pass at 32k tokens runs ~10^6 ops: pytree's flattening was a third)
                    inputs = {t.untyped_storage()._cdata for t in _tensors((args, kwargs))}
                if key in inputs:  # a view (of a weight: W.t() in every Linear), or in place
                    continue
                self._sizes[key] = storage.nbytes()
                self.live += self._sizes[key]
                if self.events is not None and self._sizes[key]:
                    self.events.append((key, self._sizes[key]))
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._freed, key)
        return out

    def _freed(self, key: int) -> None:
        size = self._sizes.pop(key, 0)
        self.live -= size
        if self.events is not None and size:
            self.events.append((key, -size))
