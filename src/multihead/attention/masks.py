"""Composable attention masks.

One convention, everywhere in multihead: **True means "may attend"** (as in
``F.scaled_dot_product_attention``; ``nn.MultiheadAttention`` uses the opposite and
the compatibility code converts).

Every mask can :meth:`Mask.materialize` a dense boolean reference of shape ``(..., T, S)``
that broadcasts to ``(B, H, T, S)``. That dense tensor is the oracle every fast kernel is
tested against; kernels may instead read a mask's structure (``isinstance`` checks on the
classes below) to pick a cheaper path, the way FlexAttention turns a ``mask_mod`` into
block structure.

New mask kinds (windows, global tokens, block layouts) are new subclasses that implement
``_materialize``; the combinators ``&``, ``|`` and ``~`` work on them unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "And",
    "Causal",
    "FromTensor",
    "KeyPadding",
    "Mask",
    "Not",
    "Or",
    "Padding",
    "as_mask",
    "causal",
    "from_tensor",
    "key_padding",
    "padding",
]


class Mask:
    """Base class: a predicate over (batch, head, query i, key j); True = may attend."""

    #: True when :meth:`bias` may return an additive float tensor (only float masks do).
    has_bias: bool = False

    def materialize(self, T: int, S: int, *, device: torch.device | str | None = None) -> Tensor:
        """Dense bool mask of shape ``(..., T, S)``, broadcastable to ``(B, H, T, S)``.

        Structural masks return ``(T, S)``; per-example masks return ``(B, 1, T, S)``
        (an expanded view, so no B·T·S memory is used until someone writes to it).
        """
        _check_lengths(T, S)
        out = self._materialize(T, S, torch.device(device) if device is not None else None)
        if out.dtype != torch.bool or out.shape[-2:] != (T, S):  # pragma: no cover - subclass bug
            raise RuntimeError(f"{type(self).__name__} materialized {out.dtype} {tuple(out.shape)}")
        return out

    def bias(self, T: int, S: int, *, dtype: torch.dtype, device: torch.device | str | None = None
             ) -> Tensor | None:
        """Finite additive bias of shape ``(..., T, S)`` added to the scores, or None."""
        return None

    def _materialize(self, T: int, S: int, device: torch.device | None) -> Tensor:
        raise NotImplementedError

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

    def _materialize(self, T: int, S: int, device: torch.device | None) -> Tensor:
        i = torch.arange(T, device=device).unsqueeze(1)  # (T, 1)
        j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
        return j <= i + (S - T)  # (T, S)

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
            valid = valid != 0
        self.valid = valid

    def _materialize(self, T: int, S: int, device: torch.device | None) -> Tensor:
        B, S_valid = self.valid.shape
        if S_valid != S:
            raise ValueError(f"key_padding mask covers {S_valid} keys but the keys have length S={S}")
        valid = self.valid if device is None else self.valid.to(device)
        return valid[:, None, None, :].expand(B, 1, T, S)  # (B, 1, T, S)

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

    def _materialize(self, T: int, S: int, device: torch.device | None) -> Tensor:
        longest = int(self.lengths.max()) if self.lengths.numel() else 0
        if longest > S:
            raise ValueError(f"padding length {longest} is longer than the keys (S={S})")
        lengths = self.lengths if device is None else self.lengths.to(device)
        valid = torch.arange(S, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
        return valid[:, None, None, :].expand(len(lengths), 1, T, S)  # (B, 1, T, S)

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

    def _check(self, T: int, S: int) -> None:
        shape = tuple(self.tensor.shape)
        t_dim = shape[-2] if len(shape) >= 2 else 1
        if shape[-1] not in (1, S) or t_dim not in (1, T):
            raise ValueError(
                f"mask of shape {shape} does not broadcast to (B, H, T, S) with T={T}, S={S}; "
                "expected (..., T, S) with each leading dim 1 or the full size"
            )

    def _materialize(self, T: int, S: int, device: torch.device | None) -> Tensor:
        self._check(T, S)
        t = self.tensor if device is None else self.tensor.to(device)
        keep = t if t.dtype == torch.bool else t != float("-inf")
        shape = (*keep.shape[:-2], T, S) if keep.dim() >= 2 else (T, S)
        return keep.expand(shape)

    def bias(self, T: int, S: int, *, dtype: torch.dtype, device: torch.device | str | None = None
             ) -> Tensor | None:
        if not self.has_bias:
            return None
        self._check(T, S)
        t = self.tensor.to(device=device, dtype=dtype)
        return t.masked_fill(t == float("-inf"), 0.0)  # masked entries are handled by materialize()

    def __repr__(self) -> str:
        kind = "bool" if self.tensor.dtype == torch.bool else f"additive {self.tensor.dtype}"
        return f"from_tensor({kind}, shape={tuple(self.tensor.shape)})"


class And(Mask):
    """May attend where both masks allow it; additive biases add up."""

    def __init__(self, a: Mask, b: Mask) -> None:
        self.a, self.b = a, b
        self.has_bias = a.has_bias or b.has_bias

    def _materialize(self, T: int, S: int, device: torch.device | None) -> Tensor:
        return self.a._materialize(T, S, device) & self.b._materialize(T, S, device)

    def bias(self, T: int, S: int, *, dtype: torch.dtype, device: torch.device | str | None = None
             ) -> Tensor | None:
        parts = [m.bias(T, S, dtype=dtype, device=device) for m in (self.a, self.b)]
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else parts[0] + parts[1]

    def __repr__(self) -> str:
        return f"({self.a!r} & {self.b!r})"


class Or(Mask):
    """May attend where either mask allows it."""

    def __init__(self, a: Mask, b: Mask) -> None:
        _refuse_bias(a, "|")
        _refuse_bias(b, "|")
        self.a, self.b = a, b

    def _materialize(self, T: int, S: int, device: torch.device | None) -> Tensor:
        return self.a._materialize(T, S, device) | self.b._materialize(T, S, device)

    def __repr__(self) -> str:
        return f"({self.a!r} | {self.b!r})"


class Not(Mask):
    """May attend exactly where the inner mask forbids it."""

    def __init__(self, a: Mask) -> None:
        _refuse_bias(a, "~")
        self.a = a

    def _materialize(self, T: int, S: int, device: torch.device | None) -> Tensor:
        return ~self.a._materialize(T, S, device)

    def __repr__(self) -> str:
        return f"~{self.a!r}"


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


def _check_lengths(T: int, S: int) -> None:
    if not (isinstance(T, int) and isinstance(S, int)) or T < 0 or S < 0:
        raise ValueError(f"materialize(T, S) expects non-negative integer lengths; got T={T!r}, S={S!r}")
