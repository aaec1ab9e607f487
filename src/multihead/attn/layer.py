"""``MultiHeadAttention``: project, split into heads, attend, merge, project back.

    head_i = Attention(x·W_i^Q, c·W_i^K, c·W_i^V)            # i = 1..H, each of width Dk
    MultiHead(x, c) = Concat(ξ_1·head_1, ..., ξ_H·head_H)·W^O

x is the query input (B, T, D); c the context (B, S, kdim/vdim) — c = x for
self-attention. ξ are the per-head gates (all ones by default). With ``num_kv_heads`` < H,
groups of H / Hkv query heads share one key/value head (grouped-query attention).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from ..masks import Mask
from .kernels import BACKENDS, attention
from .precision import linear

__all__ = ["MultiHeadAttention"]


def rotate(x: Tensor, start: int = 0, base: float = 10000.0) -> Tensor:
    """Rotary position embedding of x (B, H, T, Dk) for positions start..start+T-1 (pairs of
    features (i, i + Dk/2) rotated by position · base^(-2i/Dk), the GPT-NeoX/Llama layout)."""
    T, Dk = x.shape[-2], x.shape[-1]
    if Dk % 2:
        raise ValueError(f"rotary embedding needs an even head_dim; got {Dk}")
    inv = base ** (-torch.arange(0, Dk, 2, device=x.device, dtype=torch.float32) / Dk)  # (Dk/2,)
    angle = torch.arange(start, start + T, device=x.device, dtype=torch.float32)[:, None] * inv  # (T, Dk/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., : Dk // 2], x[..., Dk // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (B, H, T, Dk)


def scale_heads(out: Tensor, gates: Tensor) -> Tensor:
    """Head outputs (B, H, T, Dv) times per-head gates (H,) or per-example gates (B, H)."""
    g = gates[:, None, None] if gates.dim() == 1 else gates[:, :, None, None]
    return out * g.to(out.dtype)  # (B, H, T, Dv)


class KVCache:
    """Keys and values of the tokens seen so far, for one layer: (B, Hkv, S, Dk) each."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else int(self.k.shape[2])

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


class MultiHeadAttention(nn.Module):
    """Multi-head attention, batch-first.

    Args:
        embed_dim: model width D (query input and output size).
        num_heads: number of query heads H; D must be divisible by H (Dk = D / H).
        num_kv_heads: number of key/value heads Hkv (default H); must divide H.
        kdim, vdim: feature sizes of the key / value inputs (default D).
        bias: add biases to the four projections.
        dropout: dropout on the attention weights, in training mode only.
        backend: kernel backend passed to :func:`multihead.attention` (see ``BACKENDS``).
        checkpoint: in training, keep no attention activations for backward and recompute
            the attention core instead (gradient checkpointing; same gradients and dropout).

    Attributes:
        head_gates: (H,) buffer of per-head multipliers ξ applied to each head's output
            before W^O. Set an entry to 0 to silence a head; call
            ``head_gates.requires_grad_(True)`` to take gradients with respect to them.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "auto",
        checkpoint: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_config(embed_dim, num_heads, num_kv_heads, kdim, vdim, dropout, backend)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.dropout = dropout
        self.backend = backend
        self.checkpoint = checkpoint
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(embed_dim, num_heads * self.head_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(self.kdim, kv_width, bias=bias, **factory)
        self.v_proj = nn.Linear(self.vdim, kv_width, bias=bias, **factory)
        self.out_proj = nn.Linear(num_heads * self.head_dim, embed_dim, bias=bias, **factory)
        self.register_buffer("head_gates", torch.ones(num_heads, **factory))
        #: the routed attention call (multihead.hf.route) while a reader or an intervention is
        #: attached at this layer: router(layer, q, k, v, mask, dropout_p=, need_weights=) ->
        #: (head outputs, weights | None). A plain attribute, so not part of the state dict.
        self.router = None
        #: rotary position embedding (Su et al. 2021) of queries and keys in self-attention
        self.rotary = False
        self.rotary_base = 10000.0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise as ``nn.MultiheadAttention`` does: Xavier-uniform inputs, zero biases."""
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        x: Tensor,
        context: Tensor | tuple[Tensor, Tensor] | None = None,
        *,
        mask: Mask | Tensor | None = None,
        need_weights: bool = False,
        average_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``x`` (B, T, D) to ``context``.

        Args:
            x: (B, T, D) queries.
            context: None for self-attention; a (B, S, kdim) tensor used as both key and
                value input (kdim == vdim); or a ``(key_input, value_input)`` pair of
                (B, S, kdim) and (B, S, vdim).
            mask: a :class:`~multihead.masks.Mask` or tensor broadcastable to (B, H, T, S);
                True = may attend (float tensors are additive biases).
            need_weights: also return the attention weights.
            average_weights: return weights averaged over heads, (B, T, S).
            cache: a :class:`KVCache` for incremental decoding (self-attention only): this
                call's keys and values are appended to it and the queries attend to all of
                them (a causal mask is bottom-right aligned, so it still means "no future").

        Returns:
            out (B, T, D), or ``(out, weights)`` with weights (B, H, T, S) per head (before
            dropout), or (B, T, S) if ``average_weights``.
        """
        key_in, value_in = self._inputs(x, context)
        B, T, _ = x.shape
        H, Hkv, Dk = self.num_heads, self.num_kv_heads, self.head_dim
        if H == 0:  # every head pruned (multihead.heads.prune_heads): only W^O's bias is left
            y = x.new_zeros(B, T, self.out_proj.out_features)
            y = y + self.out_proj.bias if self.out_proj.bias is not None else y
            return (y, x.new_zeros(B, 0, T, key_in.shape[1])) if need_weights else y
        if context is None:
            # One GEMM for the three projections when they share the input.
            w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
            b = None if self.q_proj.bias is None else torch.cat(
                [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
            qkv = linear(x, w, b)  # (B, T, (H + 2·Hkv)·Dk)
            if H == Hkv:
                # One copy into (3, B, H, T, Dk) gives the kernels contiguous heads; matmul would
                # otherwise copy q, k and v one by one to batch over (B, H).
                q, k, v = qkv.view(B, T, 3, H, Dk).permute(2, 0, 3, 1, 4).contiguous()  # (B, H, T, Dk) each
            else:
                q, k, v = qkv.split([H * Dk, Hkv * Dk, Hkv * Dk], dim=-1)
                q, k, v = _heads(q, H), _heads(k, Hkv), _heads(v, Hkv)
        else:
            q = _heads(self.q_proj(x), H)  # (B, H, T, Dk)
            k = _heads(self.k_proj(key_in), Hkv)  # (B, Hkv, S, Dk)
            v = _heads(self.v_proj(value_in), Hkv)  # (B, Hkv, S, Dv)
        if self.rotary and context is None:  # RoPE: rotate by absolute position, scores see the offset
            start = len(cache) if cache is not None else 0
            q, k = rotate(q, start, self.rotary_base), rotate(k, start, self.rotary_base)
        if cache is not None:
            if context is not None:
                raise ValueError("a KV cache is for self-attention: pass context=None")
            k, v = cache.append(k, v)  # (B, Hkv, S_past + T, Dk)
        dropout_p = self.dropout if self.training else 0.0

        def core(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor | None]:
            return attention(q, k, v, mask, dropout_p=dropout_p, need_weights=need_weights, backend=self.backend)

        if self.router is not None:  # a capture or an intervention is attached (not checkpointed: readers run once)
            out, weights = self.router(self, q, k, v, mask, dropout_p=dropout_p, need_weights=need_weights)
        elif self.checkpoint and self.training and torch.is_grad_enabled():
            out, weights = torch.utils.checkpoint.checkpoint(core, q, k, v, use_reentrant=False)
        else:
            out, weights = core(q, k, v)  # (B, H, T, Dv), (B, H, T, S) | None
        out = out.transpose(1, 2).reshape(B, T, H * Dk)  # (B, T, H·Dv)
        # ξ_h scales head h's columns of W^O: the same as scaling the head's output, cheaper.
        w_o = self.out_proj.weight * self.head_gates.repeat_interleave(Dk)  # (D, H·Dv)
        y = linear(out, w_o, self.out_proj.bias)  # (B, T, D)
        if not need_weights:
            return y
        assert weights is not None
        return y, (weights.mean(dim=1) if average_weights else weights)

    def _inputs(self, x: Tensor, context: Tensor | tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
        _check_input("x", x, self.embed_dim)
        weights = self.q_proj.weight.dtype
        if x.dtype != weights and not _autocast_on(x.device.type):  # torch's word: "mat1 and mat2 must have …"
            raise TypeError(f"x is {x.dtype} but the layer's weights are {weights}: convert one "
                            f"(layer.to({x.dtype}) or x.to({weights})), or run it under torch.autocast")
        if context is None:
            if self.kdim != self.embed_dim or self.vdim != self.embed_dim:
                raise ValueError(
                    f"self-attention needs kdim == vdim == embed_dim; this layer has kdim={self.kdim}, "
                    f"vdim={self.vdim}: pass context"
                )
            return x, x
        if isinstance(context, tuple):
            if len(context) != 2:
                raise ValueError("context must be a tensor or a (key_input, value_input) pair")
            key_in, value_in = context
        else:
            key_in = value_in = context
        _check_input("key input", key_in, self.kdim)
        _check_input("value input", value_in, self.vdim)
        for name, t in (("key input", key_in), ("value input", value_in)):
            if t.shape[0] != x.shape[0]:
                raise ValueError(f"batch sizes differ: x has B={x.shape[0]}, {name} has B={t.shape[0]}")
            if t.dtype != x.dtype:
                raise TypeError(f"x is {x.dtype} but {name} is {t.dtype}")
        if key_in.shape[1] != value_in.shape[1]:
            raise ValueError(
                f"key and value inputs must have the same length S; got {key_in.shape[1]} and {value_in.shape[1]}"
            )
        return key_in, value_in

    # ------------------------------------------------------------------ conversion

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """Exact copy of an ``nn.MultiheadAttention`` (any ``batch_first``; kdim/vdim; bias).

        The returned layer is always batch-first. Masks change meaning: torch's bool masks
        mark positions to *ignore*; ours mark positions that *may attend*.
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"from_torch expects nn.MultiheadAttention, got {type(mha).__name__}")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn have no equivalent in MultiHeadAttention")
        w = mha.in_proj_weight if mha._qkv_same_embed_dim else None
        ref = w if w is not None else mha.q_proj_weight
        layer = cls(
            mha.embed_dim, mha.num_heads, kdim=mha.kdim, vdim=mha.vdim,
            bias=mha.in_proj_bias is not None, dropout=mha.dropout,
            device=ref.device, dtype=ref.dtype,
        )
        E = mha.embed_dim
        with torch.no_grad():
            if w is not None:
                wq, wk, wv = w.split(E)
            else:
                wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
            for proj, weight in ((layer.q_proj, wq), (layer.k_proj, wk), (layer.v_proj, wv)):
                proj.weight.copy_(weight)
            layer.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.in_proj_bias is not None:
                for proj, b in zip((layer.q_proj, layer.k_proj, layer.v_proj), mha.in_proj_bias.split(E),
                                   strict=True):
                    proj.bias.copy_(b)
                layer.out_proj.bias.copy_(mha.out_proj.bias)
        return layer

    def to_torch(self, *, batch_first: bool = True) -> nn.MultiheadAttention:
        """An ``nn.MultiheadAttention`` computing the same function (head gates folded into W^O).

        Raises ValueError for grouped-query layers, which torch's module cannot express.
        """
        if self.num_kv_heads != self.num_heads:
            raise ValueError(
                f"nn.MultiheadAttention has no grouped-query form (num_kv_heads={self.num_kv_heads} "
                f"!= num_heads={self.num_heads})"
            )
        bias = self.q_proj.bias is not None
        ref = self.q_proj.weight
        mha = nn.MultiheadAttention(
            self.embed_dim, self.num_heads, dropout=self.dropout, bias=bias, kdim=self.kdim,
            vdim=self.vdim, batch_first=batch_first, device=ref.device, dtype=ref.dtype,
        )
        with torch.no_grad():
            weights = (self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
            if mha._qkv_same_embed_dim:
                mha.in_proj_weight.copy_(torch.cat(weights))
            else:
                for dst, src in zip((mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight), weights,
                                    strict=True):
                    dst.copy_(src)
            mha.out_proj.weight.copy_(self.out_proj.weight * self.head_gates.repeat_interleave(self.head_dim))
            if bias:
                mha.in_proj_bias.copy_(torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]))
                mha.out_proj.bias.copy_(self.out_proj.bias)
        return mha

    def extra_repr(self) -> str:
        kv = f", num_kv_heads={self.num_kv_heads}" if self.num_kv_heads != self.num_heads else ""
        ckpt = ", checkpoint=True" if self.checkpoint else ""
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}{kv}, head_dim={self.head_dim}, "
                f"kdim={self.kdim}, vdim={self.vdim}, dropout={self.dropout}, backend={self.backend!r}{ckpt}")


def _heads(x: Tensor, n: int) -> Tensor:
    """(B, L, n·Dk) -> (B, n, L, Dk), a view."""
    B, L, width = x.shape
    return x.view(B, L, n, width // n).transpose(1, 2)


def _check_config(embed_dim: int, num_heads: int, num_kv_heads: int, kdim: int | None,
                  vdim: int | None, dropout: float, backend: str) -> None:
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    for name, value in (("kdim", kdim), ("vdim", vdim)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"{name} must be a positive integer or None; got {value!r}")
    if embed_dim % num_heads != 0:
        raise ValueError(
            f"embed_dim={embed_dim} must be divisible by num_heads={num_heads} "
            f"(each head gets embed_dim / num_heads features)"
        )
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1); got {dropout}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")


def _autocast_on(device_type: str) -> bool:
    """Whether autocast casts this device's matmuls now (it takes inputs of any floating dtype)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no device type
        return torch.is_autocast_enabled() or (device_type == "cpu" and torch.is_autocast_cpu_enabled())


def _check_input(name: str, t: Tensor, features: int) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 3:
        raise ValueError(f"{name} must be 3-D (B, length, {features}) batch-first; got shape {tuple(t.shape)}")
    if t.shape[-1] != features:
        raise ValueError(f"{name} must have {features} features in its last dim; got shape {tuple(t.shape)}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must be floating point; got {t.dtype}")
