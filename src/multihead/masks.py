"""Composable attention masks.

One convention, everywhere in multihead: **True means "may attend"** (as in
``F.scaled_dot_product_attention``; ``nn.MultiheadAttention`` uses the opposite and
the compatibility code converts).

A mask is a predicate, as FlexAttention's ``mask_mod``: :meth:`Mask.mask_mod` answers "may
query i attend key j?" for whole tensors of indices at once, so a kernel can evaluate it on
just the (query, key) blocks it computes. :meth:`Mask.materialize` evaluates it on the full
grid: a dense boolean reference of shape ``(..., T, S)`` that broadcasts to ``(B, H, T, S)``,
the oracle every fast kernel is tested against (as xFormers' ``materialize``).

New mask kinds (windows, global tokens, block layouts) are new subclasses that implement
``mask_mod``; the combinators ``&``, ``|`` and ``~`` work on them unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "And",
    "Blocks",
    "Causal",
    "Cover",
    "FromTensor",
    "GlobalTokens",
    "KeyPadding",
    "Mask",
    "Not",
    "Or",
    "Padding",
    "RandomBlocks",
    "Rows",
    "Segments",
    "TopK",
    "Window",
    "as_mask",
    "blocks",
    "causal",
    "from_tensor",
    "global_tokens",
    "key_padding",
    "padding",
    "random_blocks",
    "segments",
    "split_topk",
    "topk",
    "window",
]

INF = math.inf


@dataclass(frozen=True)
class Cover:
    """Where a mask *may* allow attention, read from its structure alone: a superset of its
    True entries, so a kernel can skip everything outside it and evaluate ``mask_mod`` inside.

    The union of
    * a band ``-left <= j - (i + S - T) <= right`` (``has_band=False``: no band at all;
      ``INF``: unbounded on that side — causal is ``left=INF, right=0``);
    * the rows and the columns of the ``global_rows`` / ``global_cols`` positions;
    * the blocks set in each ``(block_size, layout)`` of ``layouts`` (layout: (nqb, nkb) bool).
    """

    left: float = INF
    right: float = INF
    has_band: bool = True
    global_rows: tuple[int, ...] = ()
    global_cols: tuple[int, ...] = ()
    layouts: tuple[tuple[int, Tensor], ...] = ()

    @property
    def is_full(self) -> bool:
        return self.has_band and self.left == INF and self.right == INF

    @property
    def bounded_band(self) -> bool:
        return not self.has_band or (self.left < INF and self.right < INF)

    def __and__(self, other: Cover) -> Cover:
        # (Ba ∪ Xa) ∩ (Bb ∪ Xb) ⊆ (Ba ∩ Bb) ∪ Xa ∪ Xb, X = global rows/cols and blocks.
        if self.is_full:
            return other
        if other.is_full:
            return self
        both = self.has_band and other.has_band
        return Cover(
            left=min(self.left, other.left) if both else 0,
            right=min(self.right, other.right) if both else 0,
            has_band=both,
            global_rows=_union(self.global_rows, other.global_rows),
            global_cols=_union(self.global_cols, other.global_cols),
            layouts=self.layouts + other.layouts,
        )

    def __or__(self, other: Cover) -> Cover:
        if not self.has_band:
            left, right, has_band = other.left, other.right, other.has_band
        elif not other.has_band:
            left, right, has_band = self.left, self.right, True
        else:
            left, right, has_band = max(self.left, other.left), max(self.right, other.right), True
        return Cover(
            left=left, right=right, has_band=has_band,
            global_rows=_union(self.global_rows, other.global_rows),
            global_cols=_union(self.global_cols, other.global_cols),
            layouts=self.layouts + other.layouts,
        )


FULL = Cover()


class Mask:
    """Base class: a predicate over (batch, head, query i, key j); True = may attend."""

    #: True when :meth:`bias` may return an additive float tensor (only float masks do).
    has_bias: bool = False

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        """May query ``i`` attend key ``j``? (bool, True = yes)

        ``i`` and ``j`` are integer index tensors of the same number of dims that broadcast
        together to some shape ``P`` (for the full grid: ``(T, 1)`` and ``(1, S)``). The result
        broadcasts to ``(B, H, *P)``: structural masks return ``P``, per-example masks
        ``(B, 1, *P)``. ``T`` and ``S`` are the full query and key lengths.
        """
        raise NotImplementedError

    def bias_mod(self, i: Tensor, j: Tensor, T: int, S: int, dtype: torch.dtype) -> Tensor | None:
        """Finite additive bias for the same indices as :meth:`mask_mod`, or None."""
        return None

    def cover(self, T: int, S: int) -> Cover:
        """A structural superset of the allowed pairs (see :class:`Cover`); default: everything."""
        return FULL

    @property
    def bias_needs_grad(self) -> bool:
        """True when the additive bias is a tensor that takes a gradient (a learned relative
        position bias, ALiBi slopes): only the dense kernels differentiate it."""
        return False

    @property
    def relative(self) -> bool:
        """True when whether query i may attend key j depends only on the offset j - (i + S - T),
        the same for every example and head (causal, windows and their combinations): every block
        of the grid at the same offset has the same pattern, so a kernel may build it once."""
        return False

    def materialize(self, T: int, S: int, *, device: torch.device | str | None = None) -> Tensor:
        """Dense bool mask of shape ``(..., T, S)``, broadcastable to ``(B, H, T, S)``.

        Structural masks return ``(T, S)``; per-example masks return ``(B, 1, T, S)``.
        """
        i, j = _grid(T, S, device)
        out = self.mask_mod(i, j, T, S)
        return out.expand(*out.shape[:-2], T, S)

    def bias(self, T: int, S: int, *, dtype: torch.dtype, device: torch.device | str | None = None
             ) -> Tensor | None:
        """Finite additive bias of shape ``(..., T, S)`` added to the scores, or None."""
        if not self.has_bias:
            return None
        i, j = _grid(T, S, device)
        out = self.bias_mod(i, j, T, S, dtype)
        return None if out is None else out.expand(*out.shape[:-2], T, S)

    def __and__(self, other: Mask) -> Mask:
        return And(self, _require_mask(other, "&"))

    def __or__(self, other: Mask) -> Mask:
        return Or(self, _require_mask(other, "|"))

    def __invert__(self) -> Mask:
        return Not(self)

    def __rand__(self, other: Mask) -> Mask:
        return And(_require_mask(other, "&"), self)

    def __ror__(self, other: Mask) -> Mask:
        return Or(_require_mask(other, "|"), self)


class Causal(Mask):
    """Query i may attend key j when j <= i + (S - T).

    The triangle is aligned to the bottom-right corner: with T == S it is the usual lower
    triangle; with T < S (new queries over a longer KV cache) the last query sees every
    key. With T > S the first T - S query rows see nothing and yield zeros.
    """

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        return j <= i + (S - T)

    def cover(self, T: int, S: int) -> Cover:
        return Cover(left=INF, right=0)

    @property
    def relative(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "causal()"


class KeyPadding(Mask):
    """Per-example key validity: ``valid`` is (B, S) bool, True marks a real token.

    Same meaning as Hugging Face's ``attention_mask`` (1 = real token). Queries are not
    masked: a padded query still attends to the real keys (its output is usually ignored).
    """

    def __init__(self, valid: Tensor) -> None:
        if not isinstance(valid, Tensor):
            raise TypeError(f"key_padding(valid) expects a (B, S) bool tensor, got {type(valid).__name__}")
        if valid.dim() != 2:
            raise ValueError(
                f"key_padding(valid) expects a (B, S) tensor (True = real token); got shape {tuple(valid.shape)}"
            )
        if valid.dtype != torch.bool:
            if valid.dtype.is_floating_point or valid.dtype.is_complex:
                raise TypeError(
                    "key_padding(valid) expects bool or integer 0/1 values (True/1 = real token); "
                    f"got {valid.dtype}. For an additive float mask use from_tensor()."
                )
            # a 2 or a -1 is no token flag (lengths, or ids given by mistake); checked on a CPU tensor only:
            # on a GPU the check would wait for the device on every forward, under torch.compile break the graph
            if valid.device.type == "cpu" and not torch.compiler.is_compiling():
                odd = valid[(valid != 0) & (valid != 1)]
                if odd.numel():
                    raise ValueError(f"key_padding(valid) expects 0/1 values (1 = real token); got {int(odd[0])}. "
                                     "Lengths go to padding(lengths)")
            valid = valid != 0
        self.valid = valid

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        if self.valid.shape[1] != S:
            raise ValueError(f"key_padding mask covers {self.valid.shape[1]} keys but the keys have length S={S}")
        valid = self.valid.to(j.device)[:, j]  # (B, *j.shape)
        return valid.unsqueeze(1)  # (B, 1, *j.shape)

    def __repr__(self) -> str:
        return f"key_padding(B={self.valid.shape[0]}, S={self.valid.shape[1]})"


class Padding(Mask):
    """Right padding given true lengths: key j of example b is real when j < lengths[b]."""

    def __init__(self, lengths: Tensor | list[int]) -> None:
        lengths = torch.as_tensor(lengths)
        if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ValueError(
                f"padding(lengths) expects a 1-D integer sequence of length B; got {lengths.dtype} "
                f"of shape {tuple(lengths.shape)}"
            )
        if bool((lengths < 0).any()):
            raise ValueError(f"padding(lengths) must be >= 0; got {lengths.tolist()}")
        self.lengths = lengths

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        longest = int(self.lengths.max()) if self.lengths.numel() else 0
        if longest > S:
            raise ValueError(f"padding length {longest} is longer than the keys (S={S})")
        lengths = self.lengths.to(j.device).view(-1, *([1] * j.dim()))  # (B, 1, ..., 1)
        return (j < lengths).unsqueeze(1)  # (B, 1, *j.shape)

    def __repr__(self) -> str:
        return f"padding(lengths={self.lengths.tolist()})"


class FromTensor(Mask):
    """A mask given as a tensor broadcastable to (B, H, T, S).

    * bool: True = may attend.
    * float: an additive bias (as in ``nn.MultiheadAttention`` float masks). ``-inf``
      entries mean "may not attend"; finite entries, however negative, are added to the
      scores in float32 (so ``-1e9`` never overflows half precision).
    """

    def __init__(self, t: Tensor) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"from_tensor(t) expects a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bool and not t.dtype.is_floating_point:
            raise TypeError(
                f"mask tensor must be bool (True = may attend) or floating point (additive bias); got {t.dtype}"
            )
        if t.dim() > 4 or t.dim() < 1:
            raise ValueError(
                f"mask tensor must have 1 to 4 dims broadcastable to (B, H, T, S); got shape {tuple(t.shape)}"
            )
        self.tensor = t
        self.has_bias = t.dtype.is_floating_point

    @property
    def bias_needs_grad(self) -> bool:
        return self.has_bias and self.tensor.requires_grad

    def _check_shape(self, T: int, S: int) -> None:
        shape = tuple(self.tensor.shape)
        t_dim = shape[-2] if len(shape) >= 2 else 1
        if shape[-1] not in (1, S) or t_dim not in (1, T):
            raise ValueError(
                f"mask of shape {shape} does not broadcast to (B, H, T, S) with T={T}, S={S}; "
                "expected (..., T, S) with each leading dim 1 or the full size"
            )

    def _indexed(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        self._check_shape(T, S)
        t = self.tensor.to(j.device)
        t = t.view(*([1] * (4 - t.dim())), *t.shape)  # (B', H', T', S')
        rows = i if t.shape[2] == T else torch.zeros_like(i)
        cols = j if t.shape[3] == S else torch.zeros_like(j)
        out = t[:, :, rows, cols]  # (B', H', *P)
        return out.reshape(out.shape[4 - max(self.tensor.dim(), 2):])  # drop the dims view() added

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        t = self._indexed(i, j, T, S)
        return t if t.dtype == torch.bool else t != float("-inf")

    def materialize(self, T: int, S: int, *, device: torch.device | str | None = None) -> Tensor:
        # The full grid is the tensor itself: a broadcast view, no gather and no copy.
        _check_lengths(T, S)
        self._check_shape(T, S)
        t = self.tensor if device is None else self.tensor.to(device)
        keep = t if t.dtype == torch.bool else t != float("-inf")
        return keep.expand(*keep.shape[:-2], T, S) if keep.dim() >= 2 else keep.expand(T, S)

    def bias_mod(self, i: Tensor, j: Tensor, T: int, S: int, dtype: torch.dtype) -> Tensor | None:
        if not self.has_bias:
            return None
        t = self._indexed(i, j, T, S).to(dtype)
        return t.masked_fill(t == float("-inf"), 0.0)  # masked entries are handled by mask_mod()

    def __repr__(self) -> str:
        kind = "bool" if self.tensor.dtype == torch.bool else f"additive {self.tensor.dtype}"
        return f"from_tensor({kind}, shape={tuple(self.tensor.shape)})"


class And(Mask):
    """May attend where both masks allow it; additive biases add up."""

    def __init__(self, a: Mask, b: Mask) -> None:
        self.a, self.b = a, b
        self.has_bias = a.has_bias or b.has_bias

    @property
    def bias_needs_grad(self) -> bool:
        return self.a.bias_needs_grad or self.b.bias_needs_grad

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        return self.a.mask_mod(i, j, T, S) & self.b.mask_mod(i, j, T, S)

    def cover(self, T: int, S: int) -> Cover:
        return self.a.cover(T, S) & self.b.cover(T, S)

    @property
    def relative(self) -> bool:
        return self.a.relative and self.b.relative

    def bias_mod(self, i: Tensor, j: Tensor, T: int, S: int, dtype: torch.dtype) -> Tensor | None:
        parts = [m.bias_mod(i, j, T, S, dtype) for m in (self.a, self.b)]
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else parts[0] + parts[1]

    def __repr__(self) -> str:
        return f"({self.a!r} & {self.b!r})"


class Or(Mask):
    """May attend where either mask allows it."""

    def __init__(self, a: Mask, b: Mask) -> None:
        for m in (a, b):
            _refuse_bias(m, "|")
            _refuse_topk(m, "|")
        self.a, self.b = a, b

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        return self.a.mask_mod(i, j, T, S) | self.b.mask_mod(i, j, T, S)

    def cover(self, T: int, S: int) -> Cover:
        return self.a.cover(T, S) | self.b.cover(T, S)

    @property
    def relative(self) -> bool:
        return self.a.relative and self.b.relative

    def __repr__(self) -> str:
        return f"({self.a!r} | {self.b!r})"


class Not(Mask):
    """May attend exactly where the inner mask forbids it."""

    def __init__(self, a: Mask) -> None:
        _refuse_bias(a, "~")
        _refuse_topk(a, "~")
        self.a = a

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        return ~self.a.mask_mod(i, j, T, S)

    @property
    def relative(self) -> bool:
        return self.a.relative

    def __repr__(self) -> str:
        return f"~{self.a!r}"


class Rows(Mask):
    """Query rows ``start ..`` of ``mask`` over the full (T, S) grid, as a mask of their own over
    (c, K): what a chunk of the queries of a longer attention, reading its first K keys, may see.

    Predicates are evaluated at the rows' and keys' positions in the full grid, so a causal or
    windowed mask keeps its alignment (a streamed capture hands each chunk one of these).
    """

    def __init__(self, mask: Mask, start: int, T: int, S: int) -> None:
        if not 0 <= start < T:
            raise ValueError(f"Rows(start={start}) must be a query row of the T = {T} rows")
        self.mask, self.start, self.T, self.S = mask, start, T, S
        self.has_bias = mask.has_bias

    @property
    def bias_needs_grad(self) -> bool:
        return self.mask.bias_needs_grad

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        return self.mask.mask_mod(i + self.start, j, self.T, self.S)

    def bias_mod(self, i: Tensor, j: Tensor, T: int, S: int, dtype: torch.dtype) -> Tensor | None:
        return self.mask.bias_mod(i + self.start, j, self.T, self.S, dtype)

    def last_key(self, stop: int) -> int | None:
        """The last key any of the full grid's rows ``start .. stop - 1`` may see, read from the
        mask's :class:`Cover` (None when the cover does not bound it: no band or an unbounded
        right side, global columns or block layouts; negative when no row may see a key)."""
        cover = self.mask.cover(self.T, self.S)
        if not cover.has_band or cover.right == INF or cover.global_cols or cover.layouts:
            return None
        if any(self.start <= r < stop for r in cover.global_rows):
            return self.S - 1
        return int(min(self.S - 1, stop - 1 + (self.S - self.T) + cover.right))

    def __repr__(self) -> str:
        return f"rows({self.mask!r}, start={self.start})"


class Window(Mask):
    """Sliding window: query i sees keys j with ``i' - left <= j <= i' + right``, i' = i + S - T.

    Aligned like :class:`Causal` (i' = i when T == S), so ``window(w) & causal()`` is the
    causal sliding window of w previous tokens plus the token itself.
    """

    def __init__(self, left: int, right: int | None = None) -> None:
        right = left if right is None else right
        for name, value in (("left", left), ("right", right)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"window({name}=...) must be a non-negative integer; got {value!r}")
        self.left, self.right = left, right

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        d = j - (i + (S - T))
        return (d >= -self.left) & (d <= self.right)

    def cover(self, T: int, S: int) -> Cover:
        return Cover(left=self.left, right=self.right)

    @property
    def relative(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"window({self.left}, {self.right})"


class GlobalTokens(Mask):
    """Longformer global attention: the listed positions attend to every key and every query
    attends to them. Indices count from 0 (negative ones from the end, as in Python)."""

    def __init__(self, indices: Tensor | list[int] | tuple[int, ...]) -> None:
        idx = torch.as_tensor(indices)
        if idx.dim() != 1 or idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise ValueError(f"global_tokens(indices) expects a 1-D list of integer positions; got {indices!r}")
        self.indices = tuple(int(x) for x in idx.tolist())

    def _resolve(self, n: int) -> tuple[int, ...]:
        out = []
        for x in self.indices:
            y = x + n if x < 0 else x
            if not 0 <= y < n:
                raise ValueError(f"global token index {x} is out of range for length {n}")
            out.append(y)
        return tuple(sorted(set(out)))

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        rows = torch.tensor(self._resolve(T), dtype=i.dtype, device=i.device)
        cols = torch.tensor(self._resolve(S), dtype=j.dtype, device=j.device)
        return torch.isin(i, rows) | torch.isin(j, cols)

    def cover(self, T: int, S: int) -> Cover:
        return Cover(has_band=False, left=0, right=0, global_rows=self._resolve(T), global_cols=self._resolve(S))

    def __repr__(self) -> str:
        return f"global_tokens({list(self.indices)})"


class Segments(Mask):
    """Packed sequences in one row (block-diagonal): tokens attend within their own segment.

    ``lengths`` are the segment lengths in order; positions past their sum belong to no
    segment and attend to nothing. Needs T == S (self-attention over the packed row).
    """

    def __init__(self, lengths: Tensor | list[int]) -> None:
        lengths = torch.as_tensor(lengths)
        if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ValueError(f"segments(lengths) expects a 1-D list of integer lengths; got {lengths.tolist()}")
        if bool((lengths <= 0).any()):
            raise ValueError(f"segments(lengths) must all be > 0; got {lengths.tolist()}")
        self.lengths = lengths
        self.total = int(lengths.sum())

    def _ids(self, pos: Tensor) -> Tensor:
        ends = torch.cumsum(self.lengths, 0).to(pos.device)
        ids = torch.searchsorted(ends, pos, right=True)
        return torch.where(pos < self.total, ids, -1)

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        if T != S:
            raise ValueError(f"segments() needs as many queries as keys; got T={T}, S={S}")
        if self.total > S:
            raise ValueError(f"segment lengths add up to {self.total}, more than the sequence length {S}")
        a, b = self._ids(i), self._ids(j)
        return (a == b) & (a >= 0)

    def cover(self, T: int, S: int) -> Cover:
        longest = int(self.lengths.max()) - 1
        return Cover(left=longest, right=longest)

    def __repr__(self) -> str:
        return f"segments({self.lengths.tolist()})"


class Blocks(Mask):
    """An arbitrary block layout: query block a may attend key block b when ``layout[a, b]``.

    ``layout`` is (nqb, nkb) bool with nqb >= ceil(T / block_size), nkb >= ceil(S / block_size).
    """

    def __init__(self, block_size: int, layout: Tensor) -> None:
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
            raise ValueError(f"blocks(block_size, ...) must be a positive integer; got {block_size!r}")
        if not isinstance(layout, Tensor) or layout.dim() != 2 or layout.dtype != torch.bool:
            raise ValueError("blocks(..., layout) expects a 2-D bool tensor (query blocks, key blocks)")
        self.block_size, self.layout = block_size, layout

    def _layout(self, T: int, S: int) -> Tensor:
        nqb, nkb = -(-T // self.block_size), -(-S // self.block_size)
        if self.layout.shape[0] < nqb or self.layout.shape[1] < nkb:
            raise ValueError(
                f"block layout of shape {tuple(self.layout.shape)} does not cover T={T}, S={S} with "
                f"block_size={self.block_size}: expected at least ({nqb}, {nkb})"
            )
        return self.layout[:nqb, :nkb]

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        layout = self._layout(T, S).to(i.device)
        return layout[i // self.block_size, j // self.block_size]

    def cover(self, T: int, S: int) -> Cover:
        return Cover(has_band=False, left=0, right=0, layouts=((self.block_size, self._layout(T, S)),))

    def __repr__(self) -> str:
        return f"blocks({self.block_size}, layout={tuple(self.layout.shape)})"


class RandomBlocks(Blocks):
    """BigBird random attention: every query block attends ``n_blocks`` key blocks drawn at
    random (without replacement), the same for a given ``seed``, T and S."""

    def __init__(self, n_blocks: int, block_size: int, seed: int = 0) -> None:
        if not isinstance(n_blocks, int) or isinstance(n_blocks, bool) or n_blocks < 0:
            raise ValueError(f"random_blocks(n_blocks, ...) must be a non-negative integer; got {n_blocks!r}")
        super().__init__(block_size, torch.zeros(0, 0, dtype=torch.bool))
        self.n_blocks, self.seed = n_blocks, int(seed)
        self._cache: dict[tuple[int, int], Tensor] = {}  # the layout is fixed by (seed, blocks)

    def _layout(self, T: int, S: int) -> Tensor:
        nqb, nkb = -(-T // self.block_size), -(-S // self.block_size)
        cached = self._cache.get((nqb, nkb))
        if cached is not None:
            return cached
        g = torch.Generator().manual_seed(self.seed)
        layout = torch.zeros(nqb, nkb, dtype=torch.bool)
        for a in range(nqb):
            layout[a, torch.randperm(nkb, generator=g)[: self.n_blocks]] = True
        self._cache[(nqb, nkb)] = layout
        return layout

    def __repr__(self) -> str:
        return f"random_blocks({self.n_blocks}, {self.block_size}, seed={self.seed})"


class TopK(Mask):
    """Data-dependent: each query keeps its ``k`` largest scores among the keys the rest of
    the mask allows (the articles' "sparse attention: keep top-k, zero the rest").

    It combines only with ``&``. Its dense reference needs the scores:
    ``materialize(T, S, scores=s)``. Gradients flow through the kept scores; the choice of
    which k keys are kept is piecewise constant and has no gradient.
    """

    def __init__(self, k: int) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
            raise ValueError(f"topk(k) must be a positive integer; got {k!r}")
        self.k = k

    def mask_mod(self, i: Tensor, j: Tensor, T: int, S: int) -> Tensor:
        raise TypeError("topk() depends on the scores: use materialize(T, S, scores=...) or a kernel")

    def select(self, scores: Tensor) -> Tensor:
        """Bool (..., T, S): True at the k largest entries of each row of ``scores``
        (masked entries should be -inf there; they are never selected)."""
        k = min(self.k, scores.shape[-1])
        idx = scores.topk(k, dim=-1).indices
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, True)
        return keep & (scores > float("-inf"))

    def materialize(self, T: int, S: int, *, device: torch.device | str | None = None,
                    scores: Tensor | None = None) -> Tensor:
        if scores is None:
            raise TypeError("topk() depends on the scores: pass materialize(T, S, scores=...)")
        if scores.shape[-2:] != (T, S):
            raise ValueError(f"scores of shape {tuple(scores.shape)} do not end in (T, S) = ({T}, {S})")
        return self.select(scores)

    def __repr__(self) -> str:
        return f"topk({self.k})"


def causal() -> Causal:
    """Causal mask: query i sees keys j <= i (bottom-right aligned when T != S)."""
    return Causal()


def key_padding(valid: Tensor) -> KeyPadding:
    """Key padding from a (B, S) bool/0-1 tensor, True = real token (HF ``attention_mask``)."""
    return KeyPadding(valid)


def padding(lengths: Tensor | list[int]) -> Padding:
    """Right padding from true lengths (B,): key j of example b is real when j < lengths[b]."""
    return Padding(lengths)


def from_tensor(t: Tensor) -> FromTensor:
    """Wrap a bool (True = may attend) or additive float tensor broadcastable to (B, H, T, S)."""
    return FromTensor(t)


def window(left: int, right: int | None = None) -> Window:
    """Sliding window: query i sees keys i-left .. i+right (right defaults to left)."""
    return Window(left, right)


def global_tokens(indices: Tensor | list[int] | tuple[int, ...]) -> GlobalTokens:
    """Longformer global tokens: these positions attend to all and are attended by all."""
    return GlobalTokens(indices)


def segments(lengths: Tensor | list[int]) -> Segments:
    """Packed variable-length sequences (block-diagonal mask) from their lengths."""
    return Segments(lengths)


def random_blocks(n_blocks: int, block_size: int, seed: int = 0) -> RandomBlocks:
    """BigBird random blocks: n_blocks random key blocks per query block, fixed by seed."""
    return RandomBlocks(n_blocks, block_size, seed)


def blocks(block_size: int, layout: Tensor) -> Blocks:
    """An arbitrary (query block, key block) bool layout."""
    return Blocks(block_size, layout)


def topk(k: int) -> TopK:
    """Keep each query's k largest scores among the allowed keys (combine with &)."""
    return TopK(k)


def split_topk(mask: Mask | None) -> tuple[int | None, Mask | None]:
    """Split ``topk(k) & rest`` into ``(k, rest)``; ``(None, mask)`` when there is no top-k.

    Two top-k masks combined with & keep the smaller k.
    """
    if isinstance(mask, TopK):
        return mask.k, None
    if isinstance(mask, And):
        ka, ra = split_topk(mask.a)
        kb, rb = split_topk(mask.b)
        if ka is None and kb is None:
            return None, mask
        k = min(x for x in (ka, kb) if x is not None)
        rest = ra if rb is None else rb if ra is None else And(ra, rb)
        return k, rest
    return None, mask


def as_mask(mask: Mask | Tensor | None) -> Mask | None:
    """Accept a Mask, a tensor (see :func:`from_tensor`) or None."""
    if mask is None or isinstance(mask, Mask):
        return mask
    if isinstance(mask, Tensor):
        return FromTensor(mask)
    raise TypeError(
        f"mask must be a multihead.masks.Mask, a bool/float tensor or None; got {type(mask).__name__}"
    )


def _require_mask(other: object, op: str) -> Mask:
    if isinstance(other, Tensor):
        return FromTensor(other)
    if not isinstance(other, Mask):
        raise TypeError(f"cannot combine a Mask with {type(other).__name__} using {op}")
    return other


def _refuse_bias(m: Mask, op: str) -> None:
    if m.has_bias:
        raise ValueError(
            f"'{op}' is not defined for additive float masks; combine them with '&' "
            "(biases add up) or convert to a bool mask first"
        )


def _refuse_topk(m: Mask, op: str) -> None:
    if split_topk(m)[0] is not None:
        raise ValueError(f"topk() combines only with '&' (keep the top k among what the rest allows); got '{op}'")


def _union(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(set(a) | set(b)))


def _check_lengths(T: int, S: int) -> None:
    if not (isinstance(T, int) and isinstance(S, int)) or T < 0 or S < 0:
        raise ValueError(f"materialize(T, S) expects non-negative integer lengths; got T={T!r}, S={S!r}")


def _grid(T: int, S: int, device: torch.device | str | None) -> tuple[Tensor, Tensor]:
    _check_lengths(T, S)
    i = torch.arange(T, device=device).unsqueeze(1)  # (T, 1)
    j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    return i, j
