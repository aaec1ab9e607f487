"""See every head of a Hugging Face model: a registered transformers attention function.

While :class:`AttentionCapture` is active, every attention site (:mod:`multihead.hf.sites`) of
one stack of the model — by default its single self-attention stack — computes its attention
with our math kernel and hands ``(layer, weights, head_outputs, visible)`` to a callback, one
layer at a time, so nothing holds L·H·n² maps at once. This is not ``output_attentions=True``:
the model never returns the maps; the callback reduces them and lets them go.

The model computes exactly what it computes without the capture: every argument transformers
passes to its attention function is honoured — scaling, dropout, Gemma 2's ``softcap``,
sliding windows, GPT-OSS's sink logits (``s_aux``), T5's relative ``position_bias``,
``is_causal`` — and an argument the capture does not know is an error that names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..attn import attention
from ..attn.layer import MultiHeadAttention, scale_heads
from ..masks import Mask, Rows, as_mask, causal, from_tensor, window
from .load import ModelLike, as_module
from .sites import AttentionSite, find_sites, main_stack

__all__ = ["IMPLEMENTATION", "AttentionCapture", "LayerCallback"]

IMPLEMENTATION = "multihead_capture"
#: attribute of an attention module holding a callable that returns its gates (see .gates)
GATE_ATTRIBUTE = "_multihead_gate"
#: attribute holding a callable that returns the heads to replace by uniform attention
UNIFORM_ATTRIBUTE = "_multihead_uniform"
#: attribute holding a callable that returns the outputs gated-off heads are replaced by: (H, Dv)
#: (mean ablation: out = ξ·out + (1 − ξ)·mean) or (B, H, T, Dv) (activation patching); see .gates
REPLACEMENT_ATTRIBUTE = "_multihead_replacement"
#: attribute holding a Mask every call of the module intersects with its own (see .replace)
EXTRA_MASK_ATTRIBUTE = "_multihead_extra_mask"

#: The most bytes of one streamed chunk's map (float32): glibc serves blocks below 32 MiB from its
#: heap once it has seen them freed, larger ones are mapped afresh and page-faulted on every call —
#: measured 4-5x slower per pass over a 37 MB map than over two of 19 MB.
CHUNK_BYTES = 24 << 20

#: callback(layer, weights (B, H, T, S), head_outputs (B, H, T, Dv) before W^O, visible (B|1, 1, T, S) bool)
LayerCallback = Callable[[int, Tensor, Tensor, Tensor], None]

_ACTIVE: list[AttentionCapture] = []
_REGISTERED = False


class AttentionCapture:
    """Context manager routing a model's attention through the capture function.

    ``stack``: which stack's layers report to ``callback`` (default: the model's one
    self-attention stack; an encoder–decoder model must name one). Layers are numbered within
    the stack (see :func:`~multihead.hf.sites.find_sites`).

    ``chunk``: stream each layer's maps in chunks of at most this many query rows (fewer where a
    chunk's map would pass :data:`CHUNK_BYTES`) — the callback is then called once per chunk as
    ``callback(layer, weights (B, H, c, K), head_outputs (B, H, c, Dv), visible (B|1, 1|H, c, K),
    start)`` with the chunk's first query row ``start`` (chunks come in order; the last one ends
    at row T) and its keys cut after the last one any of its rows may see (K <= S; the keys after
    it have weight 0: a causal chunk ending at row r has K = r + 1). No (T, S) map of a layer is
    ever held: peak memory per layer is O(B·H·c·S). The model's own outputs are the same.
    Transformers models only (our own layers report whole maps).
    """

    def __init__(self, model: ModelLike, callback: LayerCallback, *, stack: str | None = None,
                 chunk: int | None = None) -> None:
        if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"chunk must be a positive number of query rows; got {chunk!r}")
        self.model = as_module(model)
        self.callback = callback
        self.chunk = chunk
        self.sites = find_sites(self.model)
        self.stack = stack if stack is not None else main_stack(self.sites)
        watched = [s for s in self.sites if s.stack == self.stack]
        if not watched:
            raise ValueError(f"the model has no {self.stack!r} stack; it has "
                             f"{sorted({s.stack for s in self.sites})}")
        self._site_of = {id(s.module): s for s in watched}
        self._calls: dict[int, int] = {}  # a shared module (ALBERT) computes consecutive layers, call by call
        self._saved: list[tuple[Any, str]] = []
        self._w_o = {layer: _output_weight(s) for s in watched for layer in s.layers}

    def output_projection(self, layer: int) -> Tensor | None:
        """W^O of a layer of the watched stack, (D, H·Dv), or None when it cannot be found."""
        return self._w_o.get(layer)

    def site_of(self, module: nn.Module) -> AttentionSite | None:
        return self._site_of.get(id(module))

    def layer_of_call(self, site: AttentionSite) -> int:
        """The layer this call of ``site`` computes (its own, or the next of its shared run)."""
        if site.repeats == 1:
            return site.layer
        n = self._calls.get(id(site.module), 0)
        self._calls[id(site.module)] = n + 1
        return site.layer * site.repeats + n % site.repeats

    def __enter__(self) -> AttentionCapture:
        ours = [s for s in self._site_of.values() if s.ours]
        if ours and self.chunk is not None:
            raise ValueError("chunked capture reads transformers models; our own layers report whole maps "
                             "(their long-sequence kernels never hold them anyway)")
        if ours:  # models built from our layer (or HF models with it swapped in): observe each layer
            for site in ours:
                site.module._observers.append(self._observer(site.layer))
            return self
        self._saved = route_through_capture(self.model)
        _ACTIVE.append(self)
        return self

    def _observer(self, index: int):
        def observe(layer: MultiHeadAttention, weights: Tensor, out: Tensor, mask: object) -> None:
            T, S = weights.shape[-2:]
            try:
                visible = _visible(as_mask(mask), T, S, weights.device)
            except (TypeError, ValueError):  # data-dependent (top-k): every key was a candidate
                visible = _visible(None, T, S, weights.device)
            self.callback(index, weights, out, visible)

        observe.capture = self  # type: ignore[attr-defined]
        return observe

    def __exit__(self, *exc: object) -> None:
        ours = [s for s in self._site_of.values() if s.ours]
        if ours:
            for site in ours:
                site.module._observers[:] = [o for o in site.module._observers
                                             if getattr(o, "capture", None) is not self]
            return
        _ACTIVE.remove(self)
        restore(self._saved)
        self._saved = []


def route_through_capture(model: nn.Module) -> list[tuple[Any, str]]:
    """Point every transformers config of ``model`` at the capture function; returns what to restore."""
    register()
    saved: list[tuple[Any, str]] = []
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation") and all(c is not config for c, _ in saved):
            saved.append((config, config._attn_implementation))
            config._attn_implementation = IMPLEMENTATION
    if not saved:
        raise ValueError(f"{type(model).__name__} has no transformers config to route attention through")
    return saved


def restore(saved: list[tuple[Any, str]]) -> None:
    """Undo :func:`route_through_capture`."""
    for config, impl in saved:
        config._attn_implementation = impl


#: Arguments transformers passes that change nothing in the maps: flags about what to return, and
#: positions the eager path does not read.
_INERT = ("output_attentions", "output_hidden_states", "position_ids", "use_cache", "cache_position",
          "return_dict")
#: Arguments of packed (varlen) flash attention: honoured only when absent.
_PACKED = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _capture_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                       attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                       **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """The one attention function both the capture and the head gates route through.

    query (B, H, T, Dk), key/value (B, Hkv, S, D·); returns (B, T, H, Dv) as transformers expects.
    """
    T, S = query.shape[2], key.shape[2]
    softcap = kwargs.pop("softcap", None)
    sinks = kwargs.pop("s_aux", None)
    if sinks is None:
        sinks = kwargs.pop("sinks", None)
    position_bias = kwargs.pop("position_bias", None)
    is_causal = kwargs.pop("is_causal", None)
    sliding_window = kwargs.pop("sliding_window", None)
    for name in _INERT:
        kwargs.pop(name, None)
    packed = [name for name in _PACKED if kwargs.pop(name, None) is not None]
    asked = sorted({*packed, *(k for k, v in kwargs.items() if v is not None and v is not False)})
    if asked:  # None / False: the argument asks for nothing (e.g. encoder_hidden_states=None)
        names = ", ".join(asked)
        raise ValueError(f"{type(module).__name__} passes {names} to its attention function; multihead's capture "
                         "does not implement it and will not compute a different attention than the model's own")
    causal_here = (is_causal if is_causal is not None else getattr(module, "is_causal", False)) and T > 1
    if attention_mask is not None:
        mask: Mask | None = from_tensor(attention_mask[..., :S])
    elif causal_here:
        mask = causal()  # transformers leaves a plain causal mask implicit
        if sliding_window is not None and int(sliding_window) < S:  # ... and a window the mask would carry
            mask = mask & window(int(sliding_window) - 1, 0)
    else:
        mask = None
    if position_bias is not None:  # T5's relative positions: an additive bias, before the mask
        bias = from_tensor(position_bias[..., -T:, :S].to(torch.float32 if query.dtype != torch.float64
                                                          else query.dtype))
        mask = bias if mask is None else bias & mask
    extra = getattr(module, EXTRA_MASK_ATTRIBUTE, None)
    if extra is not None:  # replace_attention: the model's own mask and ours (e.g. a window and sinks)
        mask = extra if mask is None else mask & extra
    capture = next((c for c in reversed(_ACTIVE) if c.site_of(module) is not None), None)
    watched = capture is not None
    uniform = getattr(module, UNIFORM_ATTRIBUTE, None)
    heads = uniform() if uniform is not None else ()
    gate = getattr(module, GATE_ATTRIBUTE, None)
    if watched and capture.chunk is not None and not heads:  # stream the maps, chunk by chunk
        out = _chunked(capture, module, query, key, value, mask, scaling, softcap, sinks,
                       gate() if gate is not None else None)
        return out.transpose(1, 2).contiguous(), None  # (B, T, H, Dv)
    plain = softcap is None and sinks is None
    out, weights = attention(query, key, value, mask, scale=scaling, need_weights=watched,
                             dropout_p=dropout if module.training else 0.0,
                             backend="auto" if plain and not watched else "math", softcap=softcap, sinks=sinks)
    if heads:  # Kovaleva et al.'s ablation: these heads attend uniformly to the keys they may see
        visible = _visible(mask, T, S, query.device).to(value.dtype)
        flat = visible / visible.sum(-1, keepdim=True).clamp_min(1)  # (B|1, 1, T, S)
        group = query.shape[1] // value.shape[1]
        out = out.clone()
        for h in heads:
            out[:, h] = flat[:, 0] @ value[:, h // group]  # (B, T, Dv)
    if gate is not None:
        out = _gated(module, out, gate())
    if watched:
        capture.callback(capture.layer_of_call(capture.site_of(module)), weights, out,
                         _visible(mask, T, S, query.device))
    return out.transpose(1, 2).contiguous(), weights  # (B, T, H, Dv) as transformers expects


def _gated(module: nn.Module, out: Tensor, gates: Tensor) -> Tensor:
    """Head outputs (B, H, T, Dv) times their gates (H,) or (B, H) — plus, where the module holds
    replacement outputs, (1 − ξ) times those: (H, Dv) the same at every position (mean ablation)
    or (B, H, T, Dv) per example and position (activation patching: another run's outputs)."""
    gated = scale_heads(out, gates)
    replacement = getattr(module, REPLACEMENT_ATTRIBUTE, None)
    if replacement is None:
        return gated
    fill = replacement().to(out.dtype)  # (H, Dv) or (B, H, T, Dv)
    if fill.dim() == 2:
        fill = fill[:, None, :]  # (H, 1, Dv)
    elif fill.shape[-2] != out.shape[-2]:  # a streamed chunk of rows: the same rows of the replacement
        raise ValueError("per-position replacement outputs need the whole sequence in one call (no chunked capture)")
    rest = (1 - gates).to(out.dtype)  # (H,) or (B, H)
    rest = rest[:, None, None] if rest.dim() == 1 else rest[:, :, None, None]  # (H|B, …, 1, 1)
    return gated + rest * fill  # (B, H, T, Dv)


def _chunked(capture: AttentionCapture, module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
             mask: Mask | None, scaling: float | None, softcap: float | None, sinks: Tensor | None,
             gates: Tensor | None) -> Tensor:
    """The attention of ``query`` rows in chunks, each chunk's maps handed to the capture's callback;
    returns the head outputs (B, H, T, Dv), equal to the unchunked ones row for row.

    A chunk attends only to the keys up to the last one any of its rows may see (a causal chunk
    ending at row r reads r + 1 keys, not S): the keys after it would get exactly zero weight, so
    its map is handed over as (B, H, c, K) with K <= S and those columns implied zero. That halves
    a causal model's attention and statistics work.
    """
    T, S = query.shape[2], key.shape[2]
    layer = capture.layer_of_call(capture.site_of(module))
    B, H = query.shape[:2]
    outs = []
    start = 0
    while start < T:
        stop = min(T, start + capture.chunk)
        rows = None if mask is None else Rows(mask, start, T, S)  # this chunk's rows of the mask
        while True:  # as many rows as fit CHUNK_BYTES of map (at least one)
            K = S if rows is None else _last_key(rows, stop, query.device) + 1
            fit = max(1, CHUNK_BYTES // (B * H * K * 4))
            if stop - start <= fit:
                break
            stop = start + fit
        # the chunk's mask evaluated once, over its K keys: the kernel and the visible keys read the same tensor
        chunk_mask = None if rows is None else _evaluated(rows, stop - start, K, query)
        out, weights = attention(query[:, :, start:stop], key[:, :, :K], value[:, :, :K], chunk_mask,
                                 scale=scaling, need_weights=True, backend="math", softcap=softcap,
                                 sinks=sinks)  # (B, H, c, Dv), (B, H, c, K)
        if gates is not None:
            out = _gated(module, out, gates)
        visible = _visible(chunk_mask, stop - start, K, query.device)
        capture.callback(layer, weights, out, visible, start)
        outs.append(out)
        start = stop
    return torch.cat(outs, dim=2)  # (B, H, T, Dv)


def _last_key(rows: Rows, stop: int, device: torch.device) -> int:
    """The last key column any of the full grid's rows ``rows.start .. stop - 1`` may see: from
    the mask's structure where it bounds it, else by evaluating the rows (S - 1 when none may see
    any: such rows are the kernel's to zero, over every key as unchunked)."""
    found = rows.last_key(stop)
    if found is not None:
        return found if found >= 0 else rows.S - 1
    seen = rows.materialize(stop - rows.start, rows.S, device=device)  # (…, c, S)
    columns = seen.reshape(-1, seen.shape[-1]).any(0).nonzero()  # (n, 1)
    return int(columns[-1]) if len(columns) else rows.S - 1


def _evaluated(rows: Rows, c: int, K: int, query: Tensor) -> Mask:
    """``rows`` over its first K keys as a tensor mask (…, c, K): bool, or for a mask with a bias
    float with -inf where it may not attend (float64 for float64 queries)."""
    device = query.device
    keep = rows.materialize(c, K, device=device)
    bias = rows.bias(c, K, dtype=torch.float64 if query.dtype == torch.float64 else torch.float32, device=device)
    if bias is None:
        return from_tensor(keep)
    return from_tensor(torch.where(keep, bias, torch.tensor(float("-inf"), dtype=bias.dtype, device=device)))


def _visible(mask: Mask | None, T: int, S: int, device: torch.device) -> Tensor:
    """Which keys each query may see, (B|1, 1|H, T, S) bool (all of them without a mask)."""
    if mask is None:
        return torch.ones(1, 1, T, S, dtype=torch.bool, device=device)
    visible = mask.materialize(T, S, device=device)
    return visible if visible.dim() == 4 else visible.view(1, 1, T, S)


def _output_weight(site: AttentionSite) -> Tensor | None:
    """W^O as (D, H·Dv): an nn.Linear's weight, or the transpose of transformers' Conv1D (GPT-2)."""
    o = site.o
    if isinstance(o, nn.Linear):
        return o.weight
    if o is not None and type(o).__name__ == "Conv1D":
        return o.weight.T
    return None


def register() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _capture_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    _REGISTERED = True
