"""Buffers a streaming caller lends the math kernel, reused chunk after chunk.

A capture streams a long layer through the math kernel in chunks of query rows, and each chunk's
scores, float32 weights and half-precision weights are tens of MB. Made afresh for every chunk,
on a CPU those blocks come from fresh pages — glibc maps blocks this large anew, or hands freed
ones back to the system — and the kernel zeroes every page before the kernel's first write:
measured 11 % of a Qwen2-shaped capture's CPU time at 4,096 tokens in page faults and page
clearing. A :class:`Workspace` keeps one block per role for the whole layer (its chunks take at
most the same bytes each) — and, lent by a capture's reader, for every layer of a forward: made
afresh for each of SmolLM2's 30 layers, its blocks' pages had cost a quarter of a bfloat16
capture's time at 1k-4k tokens (AMD EPYC) — so the pages are faulted in once.

Whatever the kernel returns from a workspace — the weights — lives in it until the next call
that uses it: for callers that read each chunk and keep nothing of it (the analysis's reducers).
So does what a workspace asks the kernel to form on the way: with ``entropy=True``, each row's
entropy where the kernel's softmax forms it from the scores (the compiled softmax, which then
spares the readers a log a weight), in :attr:`Workspace.entropy` after the call, else None there.
And where a streaming caller names the layer's whole operands (:attr:`Workspace.layer`), the AMX
tiles' path packs its keys and values once for all its chunks, not again for each.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["Workspace"]


class Workspace:
    """Named flat buffers handed out as views of the shape asked for, grown (never shrunk) when a
    request is larger than what a name holds, and remade for another dtype or device — or, made
    under inference mode, when asked for outside it (PyTorch forbids writing it there).

    ``map_entries``: the most entries a chunk's map takes (the caller's chunk budget): a map-shaped
    buffer is made that large at once — a causal layer's chunks grow from a few keys to all of
    them, and a buffer grown chunk by chunk would take fresh pages at every step again.

    ``entropy``: ask the math kernel for each row's entropy (nats) where its softmax forms it on the
    way; after each call :attr:`entropy` is that (B, H, T) float32, or None where it did not.

    ``layer``: the streamed layer's whole key and value (B, Hkv, S, D) while its chunks run — set and
    cleared by the caller, whose chunks' operands are their first keys (``key[:, :, :K]``): the tiles'
    path packs them once, into this workspace, and ``packed`` is then that same pair.

    :meth:`kept_mask`: a chunk's evaluated mask kept for the next layers that stream the same chunks
    (a causal mask's, within :data:`MASK_BYTES`)."""

    #: bytes of chunk masks :meth:`kept_mask` keeps (SmolLM2's two causal chunks a layer at 1k tokens: 0.85 MB;
    #: a long text's first chunks only — at 8k a layer's chunks hold 33 MB of mask, beyond any plan's say)
    MASK_BYTES = 4 << 20

    def __init__(self, map_entries: int = 0, *, entropy: bool = False) -> None:
        self.map_entries = map_entries
        self.wants_entropy = entropy
        #: the last call's rows' entropies (B, H, T) float32, or None (not asked, or not formed by its path)
        self.entropy: Tensor | None = None
        self._buffers: dict[str, Tensor] = {}
        self.layer: tuple[Tensor, Tensor] | None = None
        #: the ``layer`` whose operands the "packed keys" and "packed values" buffers hold (None: none)
        self.packed: tuple[Tensor, Tensor] | None = None
        self._masks: dict[tuple, object] = {}  # kept_mask's, for the grid _masks_for
        self._masks_for: tuple | None = None
        self._mask_bytes = 0

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *,
             map_shaped: bool = False) -> Tensor:
        """A contiguous tensor of ``shape`` over the buffer ``name`` (its values are whatever the last
        user left: write before reading); ``map_shaped``: made for at least ``map_entries``."""
        n = math.prod(shape)
        buffer = self._buffers.get(name)
        # a buffer made under inference mode may not be written outside it (a capture's workspace outlives a
        # forward: the next may run under no_grad)
        stale = buffer is None or (buffer.is_inference() and not torch.is_inference_mode_enabled())
        if stale or buffer.numel() < n or buffer.dtype != dtype or buffer.device != torch.device(device):
            self._buffers.pop(name, None)  # the old block goes before the new one is made
            size = max(n, self.map_entries) if map_shaped else n
            buffer = self._buffers[name] = torch.empty(size, dtype=dtype, device=device)
        return buffer[:n].view(shape)

    def buffers(self) -> list[Tensor]:
        """The blocks it holds now, one per name (those a memory plan's trace keeps for every layer)."""
        return list(self._buffers.values())

    def kept_mask(self, grid: tuple, key: tuple, size: int, make: Callable[[], object]) -> object:
        """A chunk's evaluated mask (read-only to every user), made by ``make`` once for every layer
        that streams the same chunks of a mask over the same ``grid`` (e.g. its type, T and S) —
        ``key`` the chunk's place in it, ``size`` its bytes — while they stay within
        :data:`MASK_BYTES`; another grid's first chunk lets the last grid's go."""
        if grid != self._masks_for:
            self._masks, self._masks_for, self._mask_bytes = {}, grid, 0
        found = self._masks.get(key)
        if found is None:
            found = make()
            if self._mask_bytes + size <= self.MASK_BYTES:
                self._masks[key] = found
                self._mask_bytes += size
        return found
