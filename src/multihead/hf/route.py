"""One routed attention call per site: the single place where reading and intervening happen.

Everything multihead attaches to a model — a capture that reads the maps, head gates, uniform
attention, mean or patched replacement outputs, an extra mask — is an :class:`Attachment` fixed
at some of the model's named layers (``decoder.3``; :func:`~multihead.hf.sites.select`) by
:func:`attach`. While anything is attached, the site's attention runs through :func:`routed`:

1. the model's own mask, intersected with every attachment's :meth:`Attachment.mask`;
2. the attention itself — in query-row chunks when a reader is attached and the layer's map
   would pass the readers' memory budget (:data:`MAP_BUDGET`), else in one call;
3. heads replaced by uniform attention over their visible keys (:meth:`Attachment.uniform`);
4. head outputs times the gates ξ, plus ``(1 − ξ)`` times a replacement (mean ablation,
   activation patching);
5. every reader handed each chunk of the map (:class:`AttentionChunk`), in order.

Where its one reader can take a layer as row sums (:meth:`Attachment.summary`) and the layer allows
it (:func:`_summary_plan`: self-attention, causal or no mask, no soft-cap, sinks, bias, uniform heads
or replacement), steps 2 and 5 are one pass of the row-statistics kernels
(:mod:`multihead.attn.rowstats`): the map is never formed, and the reader gets the whole layer as
one chunk with its :class:`LayerSummary` — on CUDA by default (``MULTIHEAD_ROWSTATS``: :data:`ROWSTATS_ENV`).

transformers' attention modules reach it through an attention function registered with
transformers (the model's configs point at it only while something is attached); our own
:class:`~multihead.MultiHeadAttention` layers through their ``router`` slot. Neither knows the
other: the same five steps for both.

The model computes exactly what it computes without the routing: every argument transformers
passes to its attention function is honoured — scaling, dropout, Gemma 2's ``softcap``, sliding
windows, GPT-OSS's sink logits (``s_aux``), T5's relative ``position_bias``, ``is_causal`` — and an
argument the routing does not know is an error that names it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attn import attention, rowstats
from ..attn.cpu_trace import runs_as_cpu
from ..attn.heap import PacedGiveBack
from ..attn.layer import MultiHeadAttention, scale_heads
from ..attn.memory import available_memory
from ..attn.precision import KEY_GRID, half_matmul, key_grid
from ..attn.workspace import Workspace
from ..masks import Causal, FromTensor, Mask, Rows, as_mask, causal, from_tensor, split_topk, window
from .model import ModelLike, as_module
from .sites import AttentionSite
from .version import require_transformers

__all__ = ["CHUNK_BYTES", "IMPLEMENTATION", "MAP_BUDGET", "ROWSTATS_ENV", "Attachment", "AttentionChunk", "Handle",
           "LayerSummary", "SummaryRequest", "attach", "chunk_bytes", "map_chunks", "routed"]

IMPLEMENTATION = "multihead_capture"

#: The dtype the readers get a map in whatever the model's dtype: the softmax's own (float32; a
#: float64 model's maps stay float64).
READ_DTYPE = torch.float32
#: The most bytes of one streamed chunk's map (float32): glibc serves blocks below 32 MiB from its
#: heap once it has seen them freed, larger ones are mapped afresh and page-faulted on every call —
#: measured 4-5x slower per pass over a 37 MB map than over two of 19 MB.
CHUNK_BYTES = 24 << 20
#: A layer's map (B·H·T·S float32) above this many bytes is streamed to its readers in chunks of
#: query rows (:data:`CHUNK_BYTES` each, up to twice that: :func:`at_least_rows`) instead of being
#: formed whole: 16 sentences of 512 tokens of a 12-head model stay whole, one 4,096-token document
#: of SmolLM2 (604 MB) streams.
MAP_BUDGET = 256 << 20
#: On a CPU, a streamed chunk holds at least this many rows of every key where twice its bytes hold them
#: (:func:`at_least_rows`).
MIN_CHUNK_ROWS = 160
#: On a CUDA device the caching allocator has no page-fault cliff: a chunk may take this share of
#: the memory free when the layer runs (larger chunks, fewer kernel launches), within the bounds
#: below — a small share, as the readers' work on a chunk takes a few times its size again.
CUDA_CHUNK_SHARE = 1 / 32
CUDA_CHUNK_MAX = 512 << 20
#: A plan's trace on the meta device (:mod:`~multihead.analysis.pipelines.memory_plan`) runs this
#: many of a streamed layer's first chunks and as many of its last, the ones between not: they make
#: and free the same buffers, of sizes between the first's and the last's, and a long text's
#: thousands took the trace minutes (Llama-3-70B's 32k tokens: 5,467 chunks a layer, 12-30 s a plan).
#: The shapes the plan is measured against here stream at most 64 chunks a layer: all traced.
TRACED_EDGE_CHUNKS = 48

#: the one attribute routing keeps on a module: its :class:`_SiteState`
_STATE = "_multihead_route"
#: Where a reader that can take a layer's row sums gets them instead of its map: ``auto`` (the
#: default) on CUDA with Triton, where the map's memory traffic is most of an analysis's time
#: (docs/scale.md); ``1`` wherever the kernels run (also CPU tensors in Triton's interpreter: the
#: tests); ``0`` never (the map: the reference).
ROWSTATS_ENV = "MULTIHEAD_ROWSTATS"


@dataclass
class SummaryRequest:
    """What a reader asks of a layer given as row sums (:class:`LayerSummary`): the kernels' key
    sets (F, B, T) bool, induction targets ``(previous, token)`` (B, T) each, distance bins (0: none),
    and the rows whose column sums it wants ((B, T) bool; None: no column sums) — see
    :func:`multihead.attn.rowstats.attention_with_statistics`. ``key_valid`` (B, T) bool: the batch's
    real tokens when they come first in every text (right padding); a layer whose mask is a tensor
    goes to the kernels where that mask is exactly these keys, with or without the causal rule (else
    its map), and a padded batch without it keeps to the maps."""

    key_sets: Tensor | None = None
    targets: tuple[Tensor, Tensor] | None = None
    bins: int = 0
    columns: Tensor | None = None
    key_valid: Tensor | None = None
    #: mask tensors already compared with ``key_valid``: {(address, shape, strides, dtype): rule} — a
    #: request serves one batch's forward, whose layers transformers hands the same mask (in new views)
    rules: dict = field(default_factory=dict, repr=False)


@dataclass(eq=False)
class LayerSummary:
    """A whole self-attention layer as the row-statistics kernels sum it, the map never formed:
    ``query`` (B, H, T, D) and ``key`` (B, Hkv, T, D) as the model computed them, the ``scale``
    (None: 1/√D) and whether it was ``causal`` (else every key: no mask), ``found`` the rows'
    :class:`~multihead.attn.rowstats.RowStatistics`, ``columns`` (B, H, T) float32 the column sums
    over the requested rows (or None), ``key_valid`` (B, T) bool the keys a padded batch's rows may
    see at all (None: every key). Weights at chosen pairs or rows come from ``query``, ``key`` and
    ``found.lse`` (:func:`~multihead.attn.rowstats.weights_at`, :func:`~multihead.attn.rowstats.rows_at`)."""

    query: Tensor
    key: Tensor
    scale: float | None
    causal: bool
    found: rowstats.RowStatistics
    columns: Tensor | None
    key_valid: Tensor | None = None

    def to(self, device: torch.device, non_blocking: bool = False) -> LayerSummary:
        def moved(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        f = self.found
        found = rowstats.RowStatistics(*(moved(getattr(f, name)) for name in
                                         ("lse", "entropy", "max_weight", "distance", "key_sets", "repeat", "bins")))
        return LayerSummary(moved(self.query), moved(self.key), self.scale, self.causal, found, moved(self.columns),
                            moved(self.key_valid))


@dataclass(eq=False)
class AttentionChunk:
    """A chunk of query rows of one layer's attention, as every reader receives it.

    ``weights`` (B, H, c, K): rows ``start .. start + c`` of the layer's (T, S) map over its first
    K <= S keys (the keys after K have weight exactly 0 for these rows: a causal chunk ending at
    row r has K = r + 1); ``outputs`` (B, H, c, Dv): the heads' outputs for those rows, before W^O
    and after any gate; ``visible`` (B|1, 1|H, c, K) bool: which keys each row may see. A layer
    that fits the budget comes as one chunk (start 0, c = T, K = S). Chunks of a layer come in
    order; :attr:`last` marks the one that ends at row T.

    ``memo`` is shared by every reader of this chunk, ``call_memo`` by every chunk of this layer's
    call: derived quantities computed once, whichever reader asks first (they go with the chunk).
    ``entropy`` (B, H, c) float32: each row's entropy (nats) as the kernel's softmax formed it from
    the scores — the compiled softmax of a streamed layer on a CPU — or None where it did not
    (readers then form it from the weights).

    A layer given as row sums (``summary``, :class:`LayerSummary`; only to a reader that asked for
    them, :meth:`Attachment.summary`) is one chunk of every row with ``weights`` and ``visible`` None.
    """

    site: AttentionSite
    layer: int
    start: int
    rows: int
    keys: int
    weights: Tensor
    outputs: Tensor
    visible: Tensor
    call_memo: dict
    memo: dict = field(default_factory=dict)
    entropy: Tensor | None = None
    summary: LayerSummary | None = None

    @property
    def name(self) -> str:
        """The layer's name, e.g. ``decoder.3``."""
        return f"{self.site.stack}.{self.layer}"

    @property
    def stop(self) -> int:
        return self.start + (self.rows if self.weights is None else self.weights.shape[2])

    @property
    def last(self) -> bool:
        """Whether this chunk holds the layer's last query rows."""
        return self.stop >= self.rows

    @property
    def whole(self) -> bool:
        """Whether this chunk is the whole (T, S) map."""
        return self.start == 0 and self.last and (self.weights is None or self.weights.shape[-1] == self.keys)

    def output_projection(self) -> Tensor | None:
        """W^O of the layer, (D, H·Dv), or None when it cannot be found (on the layer's device)."""
        return self.site.output_weight()

    def to(self, device: torch.device) -> AttentionChunk:
        """This chunk with its tensors on ``device`` (itself where they are there already): the
        chunk of a layer that a device map put on another GPU, for readers that keep their sums on
        one device. Its ``memo`` starts afresh (what readers derive is then derived there); the
        layer call's ``call_memo`` is shared, as every chunk of the call comes the same way."""
        device = torch.device(device)
        if self.outputs.device == device:
            return self
        # GPU to GPU without waiting (stream-ordered); into host memory the copy must be done before
        # readers look at it
        ahead = device.type == "cuda"

        def moved(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=ahead)

        return AttentionChunk(self.site, self.layer, self.start, self.rows, self.keys, moved(self.weights),
                              moved(self.outputs), moved(self.visible), self.call_memo, entropy=moved(self.entropy),
                              summary=None if self.summary is None else self.summary.to(device, non_blocking=ahead))


def map_chunks(chunk: AttentionChunk, limit: int | None = None) -> Iterator[AttentionChunk]:
    """A layer given as row sums (``chunk.summary``) as its map after all, for a reader that reads
    maps: formed from the layer's Q, K and rows' ``lse`` (``p = exp(s − lse)``, float32) in chunks of
    query rows of at most ``limit`` bytes (default :func:`chunk_bytes` of the layer's device), each
    over the keys its rows may see (a causal chunk ending at row r: r + 1) — as the maps' path hands
    them, with the layer's outputs for those rows."""
    s = chunk.summary
    q = s.query
    B, H, T = q.shape[:3]
    row_bytes = max(1, B * H * T * 4)
    limit = chunk_bytes(q.device, row_bytes=row_bytes) if limit is None else limit
    rows = max(1, limit // row_bytes)
    for start in range(0, T, rows):
        stop = min(T, start + rows)
        c, K = stop - start, (stop if s.causal else T)
        weights = rowstats.rows_between(q, s.key, s.found.lse, start, stop, K, scale=s.scale)  # (B, H, c, K)
        keys, at = torch.arange(K, device=q.device), torch.arange(start, stop, device=q.device)
        visible = (keys <= at[:, None] if s.causal else (keys >= 0).expand(c, K))[None, None]  # (1, 1, c, K)
        if s.key_valid is not None:  # a padded batch: its padding keys unseen
            visible = visible & s.key_valid[:, None, None, :K]  # (B, 1, c, K)
        # 0 where unseen; a row that sees no key (lse -inf: none with a causal mask or none) sees nothing
        weights.masked_fill_(~visible | (s.found.lse[:, :, start:stop, None] == float("-inf")), 0.0)
        yield AttentionChunk(chunk.site, chunk.layer, start, T, chunk.keys, weights, chunk.outputs[:, :, start:stop],
                             visible, chunk.call_memo)
        del weights  # not kept while the next chunk is formed


def chunk_bytes(device: Any, free: int | None = None, row_bytes: int = 0) -> int:
    """The most bytes of one streamed chunk's map (float32) on ``device``: :data:`CHUNK_BYTES` on a
    CPU (the heap rule; up to twice that where it would hold fewer than :data:`MIN_CHUNK_ROWS` rows
    of ``row_bytes``, a row over every key, B·H·S·4: :func:`at_least_rows`) and any other device,
    :data:`CUDA_CHUNK_SHARE` of the free memory on CUDA (``free``: bytes, default
    ``torch.cuda.mem_get_info``), between :data:`CHUNK_BYTES` and :data:`CUDA_CHUNK_MAX`."""
    device = torch.device(device)
    if device.type == "cpu":
        return at_least_rows(CHUNK_BYTES, row_bytes)
    if device.type != "cuda":
        return CHUNK_BYTES
    if free is None:  # the driver's free memory and what PyTorch's cache holds unused: both are ours to take
        free = available_memory(device) or 0
    return int(min(CUDA_CHUNK_MAX, max(CHUNK_BYTES, free * CUDA_CHUNK_SHARE)))


class Attachment:
    """A reader or an intervention, attached at sites by :func:`attach`. Every method answers for
    one call of one layer (``layer``: the layer within the site's stack); the defaults change nothing."""

    #: whether :meth:`read` wants the maps (they are then computed by the math kernel)
    reads: bool = False
    #: stream every layer in chunks of at most this many query rows (None: only beyond ``budget``)
    rows: int | None = None
    #: map bytes above which a read layer is streamed in chunks
    budget: int = MAP_BUDGET
    #: the most map bytes of one streamed chunk (None: :func:`chunk_bytes` of the layer's device)
    chunk_bytes: int | None = None
    #: whether :meth:`read` keeps nothing of a chunk's tensors once it returns: when every reader of a
    #: streamed layer says so, its chunks' maps are made in buffers the next chunk reuses
    #: (:class:`~multihead.attn.workspace.Workspace`) — and the next layer's: the first such reader
    #: holds them (:attr:`workspace`) until :meth:`release` or :meth:`remove`
    transient: bool = False
    #: the buffers this reader lends its streamed layers, made at the first one (see ``transient``)
    workspace: Workspace | None = None
    #: the C heap's free pages given back after each of its streamed layers, paced (made with
    #: ``workspace``: a CPU's; :class:`~multihead.attn.heap.PacedGiveBack`)
    give_back: PacedGiveBack | None = None
    #: whether a streamed layer's chunks may take more rows where their rows see fewer keys
    #: (:func:`_widest`); False: every chunk takes the rows of all S keys its bytes hold
    grow: bool = True

    def mask(self, site: AttentionSite, layer: int) -> Mask | None:
        """A mask this layer's attention is intersected with (True = may attend)."""
        return None

    def uniform(self, site: AttentionSite, layer: int) -> Sequence[int]:
        """Heads that attend uniformly to the keys they may see (Kovaleva et al.'s ablation)."""
        return ()

    def gates(self, site: AttentionSite, layer: int) -> Tensor | None:
        """Gates ξ of the layer's heads, (H,) or per example (B, H): ``out = ξ·out + (1 − ξ)·replacement``."""
        return None

    def replacement(self, site: AttentionSite, layer: int) -> Tensor | None:
        """What a gated-off head's output becomes: (H, Dv) at every position (mean ablation) or
        (B, H, T, Dv) per example and position (activation patching); None: zeros."""
        return None

    def read(self, chunk: AttentionChunk) -> None:
        """Receive one chunk of the layer's map (:class:`AttentionChunk`); never keep it."""

    def summary(self, site: AttentionSite, layer: int) -> SummaryRequest | None:
        """The row sums this reader can take instead of the layer's map (:class:`SummaryRequest`;
        then :meth:`read` gets one chunk with a :class:`LayerSummary` where the layer allows it), or
        None: it reads the map."""
        return None

    # As a context manager: attached at ``self.where`` of ``self.model`` inside the block.
    model: nn.Module
    where: list[tuple[AttentionSite, int]]
    _handle: Handle | None = None

    def __enter__(self):
        if self._handle is None:
            self._handle = attach(self.model, self, self.where)
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def release(self) -> None:
        """Let the buffers lent to streamed layers go (:attr:`workspace`): e.g. once a forward is
        done, so that what runs between forwards does not sit beside them; the next streamed layer
        makes them again."""
        self.workspace = None

    def remove(self) -> None:
        """Take it off (and the model's own attention implementation back, once nothing is attached)."""
        self.release()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


class _SiteState:
    """What is attached at one module: (attachment, the layers it is attached at) pairs."""

    def __init__(self, site: AttentionSite) -> None:
        self.site = site
        self.attached: list[tuple[Attachment, frozenset[int]]] = []
        self.calls = 0  # a shared module (ALBERT) computes consecutive layers, call by call

    def layer_of_call(self) -> int:
        if self.site.repeats == 1:
            return self.site.layer
        n = self.calls
        self.calls = n + 1
        return self.site.layer * self.site.repeats + n % self.site.repeats

    def at(self, layer: int) -> list[Attachment]:
        return [a for a, layers in self.attached if layer in layers]


class Handle:
    """What :func:`attach` returns: :meth:`remove` (or leaving the ``with`` block) takes it off."""

    def __init__(self, model: nn.Module, attachment: Attachment, states: list[_SiteState]) -> None:
        self.model, self.attachment, self._states = model, attachment, states

    def remove(self) -> None:
        for state in self._states:
            state.attached = [(a, layers) for a, layers in state.attached if a is not self.attachment]
            if not state.attached:
                _unroute_site(state)
        if self._states:
            _unroute_model(self.model)
        self._states = []

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def attach(model: ModelLike, attachment: Attachment, where: Iterable[tuple[AttentionSite, int]]) -> Handle:
    """Attach ``attachment`` at the (site, layer) pairs ``where`` (:func:`~multihead.hf.sites.select`)
    of ``model``; returns the :class:`Handle` that takes it off. Attachments compose: gates multiply,
    masks intersect, readers all read; two replacements at one layer are an error at the call."""
    module = as_module(model)
    layers: dict[int, tuple[AttentionSite, set[int]]] = {}
    for site, layer in where:
        layers.setdefault(id(site.module), (site, set()))[1].add(layer)
    states = []
    hf = False
    for site, chosen in layers.values():
        state = getattr(site.module, _STATE, None)
        if state is None:
            state = _SiteState(site)
            setattr(site.module, _STATE, state)
        state.attached.append((attachment, frozenset(chosen)))
        states.append(state)
        if isinstance(site.module, MultiHeadAttention):
            site.module.router = _our_router(state)
        else:
            hf = True
    if hf:
        _route_model(module)
    return Handle(module, attachment, states)


def _unroute_site(state: _SiteState) -> None:
    module = state.site.module
    if getattr(module, _STATE, None) is state:
        delattr(module, _STATE)
    if isinstance(module, MultiHeadAttention):
        module.router = None


# --------------------------------------------------------------------------- transformers' configs

#: configs pointed at IMPLEMENTATION: id -> [config, its own implementation, how many models route it]
_ROUTED: dict[int, list[Any]] = {}
_REGISTERED = False


def _configs(model: nn.Module) -> list[Any]:
    seen: dict[int, Any] = {}
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            seen.setdefault(id(config), config)
    return list(seen.values())


def _route_model(model: nn.Module) -> None:
    """Point every transformers config of ``model`` at the routed function (counted: nested
    attachments restore the model's own implementation only when the last one goes)."""
    configs = _configs(model)
    if not configs:
        raise ValueError(f"{type(model).__name__} has no transformers config to route attention through")
    register()
    for config in configs:
        entry = _ROUTED.get(id(config))
        if entry is None:
            _ROUTED[id(config)] = [config, config._attn_implementation, 1]
            config._attn_implementation = IMPLEMENTATION
        else:
            entry[2] += 1


def _unroute_model(model: nn.Module) -> None:
    for config in _configs(model):
        entry = _ROUTED.get(id(config))
        if entry is None:
            continue
        entry[2] -= 1
        if entry[2] <= 0:
            config._attn_implementation = entry[1]
            del _ROUTED[id(config)]


def register() -> None:
    """Register the routed attention function with transformers (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    require_transformers()  # what the routing registers with is transformers 5's
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _transformers_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    _REGISTERED = True


#: Arguments transformers passes that change nothing in the maps: flags about what to return, and
#: positions the eager path does not read.
_INERT = ("output_attentions", "output_hidden_states", "position_ids", "use_cache", "cache_position",
          "return_dict")
#: Arguments of packed (varlen) flash attention: honoured only when absent.
_PACKED = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _transformers_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                            attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                            **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """The attention function transformers calls while a model is routed: its arguments as our
    mask, scale, soft-cap and sinks, then :func:`routed`.

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
        raise ValueError(f"{type(module).__name__} passes {names} to its attention function; multihead's routing "
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
    state = getattr(module, _STATE, None)
    plain = softcap is None and sinks is None
    dropout_p = dropout if module.training else 0.0
    if state is None:  # routed for another module of this model: the model's own attention
        out, weights = attention(query, key, value, mask, scale=scaling, dropout_p=dropout_p,
                                 backend="auto" if plain else "math", softcap=softcap, sinks=sinks)
    else:
        out, weights = routed(state, query, key, value, mask, scale=scaling, dropout_p=dropout_p,
                              softcap=softcap, sinks=sinks, backend="auto" if plain else "math")
    return out.transpose(1, 2).contiguous(), weights  # (B, T, H, Dv) as transformers expects


def _our_router(state: _SiteState):
    """The ``router`` of one of our layers: its attention call, through :func:`routed`."""

    def route(layer: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, mask: Mask | Tensor | None, *,
              dropout_p: float, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        return routed(state, q, k, v, mask, dropout_p=dropout_p, backend=layer.backend, need_weights=need_weights)

    return route


# --------------------------------------------------------------------------- the routed call


def routed(state: _SiteState, query: Tensor, key: Tensor, value: Tensor, mask: Mask | Tensor | None, *,
           scale: float | None = None, dropout_p: float = 0.0, softcap: float | None = None,
           sinks: Tensor | None = None, backend: str = "auto", need_weights: bool = False
           ) -> tuple[Tensor, Tensor | None]:
    """One site's attention with everything attached at this call's layer applied (see the module).

    query (B, H, T, Dk), key/value (B, Hkv, S, D·); returns the head outputs (B, H, T, Dv) and
    the weights (B, H, T, S) when they were formed whole (None when streamed or not needed).
    """
    site = state.site
    layer = state.layer_of_call()
    here = state.at(layer)
    T, S = query.shape[2], key.shape[2]
    for a in here:
        extra = a.mask(site, layer)
        if extra is not None:  # e.g. replace_attention's window and sinks, with the model's own mask
            mask = extra if mask is None else as_mask(mask) & extra
    heads = sorted({h for a in here for h in a.uniform(site, layer)})
    gates: Tensor | None = None
    for a in here:
        g = a.gates(site, layer)
        if g is not None:
            gates = g if gates is None else _product(gates, g)
    fills = [f for f in (a.replacement(site, layer) for a in here) if f is not None]
    if len(fills) > 1:
        raise ValueError(f"{site.stack}.{layer}: two attachments replace its heads' outputs; attach one at a time")
    fill = fills[0] if fills else None
    readers = [a for a in here if a.reads]
    call_memo: dict = {}
    B, H = query.shape[:2]
    limit = 0
    if readers and not heads:
        given = [a.chunk_bytes for a in readers if a.chunk_bytes is not None]
        # once per layer call, not per chunk; a caller's own bytes stand
        limit = min(given) if given else chunk_bytes(query.device, row_bytes=B * H * S * 4)
    plan = _summary_plan(readers, site, layer, query, key, value, mask, heads=heads, fill=fill, dropout_p=dropout_p,
                         softcap=softcap, sinks=sinks, need_weights=need_weights)
    out = None if plan is None else _summarised(site, layer, readers, query, key, value, scale, gates, call_memo,
                                                *plan)
    if out is not None:
        return out, None
    streamed = _stream_rows(readers, mask, B, H, T, S, limit) if readers and not heads else None
    if streamed is not None:
        # rows from the budget (no reader asked for a row count): a chunk may take more rows where they see fewer keys
        grow = all(a.grow for a in readers) and not any(a.rows is not None for a in readers)
        out = _chunked(site, layer, readers, query, key, value, as_mask(mask), streamed, limit, scale, softcap,
                       sinks, gates, fill, call_memo, grow)
        return out, None
    want = bool(readers) or need_weights
    # the readers get the softmax's float32 weights, not a half-precision rounding of them
    out, weights = attention(query, key, value, mask, scale=scale, need_weights=want, dropout_p=dropout_p,
                             backend="math" if readers else backend, softcap=softcap, sinks=sinks,
                             weights_dtype=READ_DTYPE if readers and query.dtype != torch.float64 else None)
    if heads:  # these heads attend uniformly to the keys they may see
        visible = _visible(mask, T, S, query.device).to(value.dtype)
        flat = visible / visible.sum(-1, keepdim=True).clamp_min(1)  # (B|1, 1, T, S)
        group = query.shape[1] // value.shape[1]
        out = out.clone()
        for h in heads:
            out[:, h] = half_matmul(flat[:, 0], value[:, h // group])  # (B, T, Dv)
    if gates is not None:
        out = _gated(out, gates, fill)
    if readers:
        chunk = AttentionChunk(site, layer, 0, T, S, weights, out, _visible(mask, T, S, query.device), call_memo)
        for a in readers:
            a.read(chunk)
    return out, (weights.to(query.dtype) if weights is not None else None)


def _summary_plan(readers: list[Attachment], site: AttentionSite, layer: int, query: Tensor, key: Tensor,
                  value: Tensor, mask: Mask | Tensor | None, *, heads: Sequence[int], fill: Tensor | None,
                  dropout_p: float, softcap: float | None, sinks: Tensor | None, need_weights: bool
                  ) -> tuple[SummaryRequest, bool, bool] | None:
    """(the reader's request, causal, padded) where this layer call goes to its reader as row sums, else
    None: one reader that asks for them (:meth:`Attachment.summary`), a self-attention (T = S) in a
    dtype the kernels take, on a device :data:`ROWSTATS_ENV` lets them run on, with no mask or the
    causal one alone — or, for a right-padded batch, a mask tensor that is exactly its real keys, with
    or without the causal rule (:func:`_padding_rule_of`) — and nothing the kernels do not compute:
    soft-capping, sink logits, dropout, uniform heads, a replacement, the weights returned."""
    if len(readers) != 1 or heads or fill is not None or dropout_p or softcap is not None or sinks is not None \
            or need_weights:
        return None
    tensor_mask = isinstance(mask, (Tensor, FromTensor))
    if query.shape[2] != key.shape[2] or (mask is not None and type(mask) is not Causal and not tensor_mask):
        return None
    setting = os.environ.get(ROWSTATS_ENV, "auto")
    if setting == "0" or (setting != "1" and query.device.type != "cuda") or not rowstats.available(query.device):
        return None
    if not rowstats.supported(query, key, value) or _shape_key(query, value) in _UNBUILT:
        return None
    request = readers[0].summary(site, layer)
    if request is None or not _fits(request, *query.shape[:1], query.shape[2]):
        return None
    if not tensor_mask:
        return request, mask is not None, False
    if request.key_valid is None:  # a padded batch the readers do not take as right-padded: its maps
        return None
    t = mask.tensor if isinstance(mask, FromTensor) else mask  # (B|1, 1, T|1, T)
    # one comparison a forward: its layers get the same mask (each in a view of its own), and the
    # request — the batch's — outlives none of them
    seen = (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
    if seen not in request.rules:
        request.rules[seen] = _padding_rule_of(t, request.key_valid.to(t.device))
    rule = request.rules[seen]
    return None if rule is None else (request, rule, True)


def _padding_rule_of(t: Tensor, key_valid: Tensor) -> bool | None:
    """Whether a mask tensor t (B|1, 1, T|1, T) is exactly a padded batch's keys ``key_valid`` (B, T)
    with the causal rule (True), without it (False), or something else (None: a window, a block, a
    bias, another batch's padding) — bool (True: may attend) or additive (0: may attend; its dtype's
    lowest value or −inf: may not; anything else is a bias the kernels do not add). One comparison
    on the mask's device and one read back."""
    B, T = key_valid.shape
    if t.dim() != 4 or t.shape[0] not in (1, B) or t.shape[1] != 1 or t.shape[2] not in (1, T) or t.shape[3] != T:
        return None
    if t.dtype == torch.bool:
        allowed, known = t, torch.ones((), dtype=torch.bool, device=t.device)
    else:
        allowed = t == 0
        known = (allowed | (t <= torch.finfo(t.dtype).min)).all()  # 0 or "never": no bias of its own
    keys = key_valid[:, None, None, :]  # (B, 1, 1, T)
    i = torch.arange(T, device=t.device)
    earlier = i[None, :] <= i[:, None]  # (T, T): key j at or before row i
    full = (allowed == keys).all()
    causal_rule = (allowed == (keys & earlier)).all() if t.shape[2] == T else torch.zeros_like(full)
    known, full, causal_rule = torch.stack([known, full, causal_rule]).tolist()  # the one read back
    if not known:
        return None
    return True if causal_rule else False if full else None


#: (device, dtype, head sizes) the kernels could not be built for on this GPU: the maps, without trying again
_UNBUILT: set[tuple] = set()


def _shape_key(query: Tensor, value: Tensor) -> tuple:
    return query.device, query.dtype, query.shape[-1], value.shape[-1]


def _fits(request: SummaryRequest, B: int, T: int) -> bool:
    """Whether a request's tensors are this layer's texts and tokens (a layer whose length is not the
    batch's — tokens the model prepends — reads its map)."""
    shaped = [request.columns, *(request.targets or ())]
    if request.key_sets is not None:
        shaped.append(request.key_sets[0])
    return all(t.shape == (B, T) for t in shaped if t is not None)


def _summarised(site: AttentionSite, layer: int, readers: list[Attachment], query: Tensor, key: Tensor,
                value: Tensor, scale: float | None, gates: Tensor | None, call_memo: dict,
                request: SummaryRequest, causal_mask: bool, padded: bool) -> Tensor | None:
    """The layer in one pass of the row-statistics kernels, handed to its reader as one chunk with
    its :class:`LayerSummary`; returns the head outputs (B, H, T, Dv) — or None where Triton cannot
    build the kernels for this GPU and these heads (before anything ran or was read: the maps then,
    for this and every later layer of the shape)."""
    T, S = query.shape[2], key.shape[2]
    device = query.device

    def here(t: Tensor | None) -> Tensor | None:  # the request is made where the reader is: this layer's device
        return None if t is None else t.to(device)

    targets = None if request.targets is None else (here(request.targets[0]), here(request.targets[1]))
    key_valid = here(request.key_valid) if padded else None  # (B, T): a padded batch's keys
    try:
        out, found = rowstats.attention_with_statistics(query, key, value, scale=scale, causal=causal_mask,
                                                        key_valid=key_valid, key_sets=here(request.key_sets),
                                                        targets=targets, bins=request.bins)  # (B, H, T, Dv)
        columns = None if request.columns is None else rowstats.column_sums(
            query, key, found.lse, scale=scale, causal=causal_mask, key_valid=key_valid, rows=here(request.columns))
    except rowstats.KernelUnavailableError:
        _UNBUILT.add(_shape_key(query, value))
        return None
    if gates is not None:
        out = _gated(out, gates, None)
    chunk = AttentionChunk(site, layer, 0, T, S, None, out, None, call_memo,
                           summary=LayerSummary(query, key, scale, causal_mask, found, columns, key_valid))
    for a in readers:
        a.read(chunk)
    return out


def _product(a: Tensor, b: Tensor) -> Tensor:
    """Two gates (H,) or (B, H) multiplied, broadcasting (H,) over the batch."""
    return a * b if a.dim() == b.dim() else (a if a.dim() == 2 else a[None]) * (b if b.dim() == 2 else b[None])


def _stream_rows(readers: list[Attachment], mask: Mask | Tensor | None, B: int, H: int, T: int, S: int,
                 limit: int) -> int | None:
    """Query rows per chunk when the readers' layer is streamed, or None to form it whole: the
    smallest row limit any reader asks for, or — when the map passes the smallest budget — as
    many rows as ``limit`` bytes of map hold. A mask that depends on the scores (top-k) is formed whole."""
    rows = [a.rows for a in readers if a.rows is not None]
    budget = min(a.budget for a in readers)
    if not rows and B * H * T * S * 4 <= budget:
        return None
    if mask is not None and split_topk(as_mask(mask))[0] is not None:  # data-dependent (top-k): no rows of its own
        return None
    if rows:
        return max(1, min(rows))
    return max(1, limit // (B * H * S * 4))


def _gated(out: Tensor, gates: Tensor, fill: Tensor | None) -> Tensor:
    """Head outputs (B, H, T, Dv) times their gates (H,) or (B, H) — plus, with a replacement,
    (1 − ξ) times it: (H, Dv) the same at every position (mean ablation) or (B, H, T, Dv) per
    example and position (activation patching: another run's outputs)."""
    gates = gates.to(out.device)  # gates and replacements may be made on the CPU for a model elsewhere
    gated = scale_heads(out, gates)
    if fill is None:
        return gated
    fill = fill.to(out.device, out.dtype)  # (H, Dv) or (B, H, T, Dv)
    if fill.dim() == 2:
        fill = fill[:, None, :]  # (H, 1, Dv)
    elif fill.shape[-2] != out.shape[-2]:  # a streamed chunk of rows: the same rows of the replacement
        raise ValueError("per-position replacement outputs need the whole sequence in one call (no chunked capture)")
    rest = (1 - gates).to(out.dtype)  # (H,) or (B, H)
    rest = rest[:, None, None] if rest.dim() == 1 else rest[:, :, None, None]  # (H|B, …, 1, 1)
    return gated + rest * fill  # (B, H, T, Dv)


def _chunked(site: AttentionSite, layer: int, readers: list[Attachment], query: Tensor, key: Tensor, value: Tensor,
             mask: Mask | None, rows_per_chunk: int, limit: int, scaling: float | None, softcap: float | None,
             sinks: Tensor | None, gates: Tensor | None, fill: Tensor | None, call_memo: dict,
             grow: bool = False) -> Tensor:
    """The attention of ``query`` rows in chunks, each chunk's maps handed to the readers;
    returns the head outputs (B, H, T, Dv), equal to the unchunked ones row for row.

    A chunk attends only to the keys up to the last one any of its rows may see (a causal chunk
    ending at row r reads r + 1 keys, not S): the keys after it would get exactly zero weight, so
    its map is handed over as (B, H, c, K) with K <= S and those columns implied zero. That halves
    a causal model's attention and statistics work. With ``grow``, a chunk takes as many rows as
    ``limit`` bytes of its own keys hold (:func:`_widest`), not ``rows_per_chunk`` (which the
    whole S keys fit): a causal layer's first rows see few keys.
    """
    T, S = query.shape[2], key.shape[2]
    B, H = query.shape[:2]
    # the layer's outputs in one block made before its chunks: a chunk's own output kept until the
    # layer ends would sit between the next chunks' buffers and grow a CPU heap by holes it cannot reuse
    outs = value.new_empty(B, H, T, value.shape[-1])  # (B, H, T, Dv)
    # readers that keep nothing of a chunk, on a CPU: its maps in buffers every chunk reuses, of this
    # layer and the next ones (no fresh pages a chunk or a layer for the heap to map and the kernel to
    # zero: a quarter of a bfloat16 SmolLM2's capture at 1k-4k tokens, AMD EPYC; CUDA's caching allocator
    # reuses its blocks itself)
    reuse = runs_as_cpu(query.device) and all(a.transient for a in readers)
    # its map-shaped buffers as large as the layer's largest chunk: the budget or the rows asked for,
    # and keys padded to the half products' grid (attn.precision.key_grid) at most; chunks that grow fill the budget
    largest = min(limit // 4, B * H * rows_per_chunk * S) * (S + KEY_GRID) // S
    if grow:
        largest = max(largest, limit // 4)
    workspace = _lent_workspace(readers[0], largest) if reuse else None
    if workspace is not None:  # every chunk's operands are the layer's first keys: packed once where the kernel packs
        workspace.layer, workspace.packed = (key, value), None
    try:
        _chunks(site, layer, readers, query, key, value, mask, rows_per_chunk, limit, scaling, softcap, sinks,
                gates, fill, call_memo, grow, workspace, outs)
    finally:
        if workspace is not None:
            workspace.layer = workspace.packed = None
    if workspace is not None and readers[0].give_back is not None:
        # the layer's chunks are freed: their heap's free pages back to the system before the rest of
        # the block (its MLP, where a long text's peak is) grows the heap further (see PacedGiveBack)
        readers[0].give_back()
    return outs  # (B, H, T, Dv)


def _chunks(site: AttentionSite, layer: int, readers: list[Attachment], query: Tensor, key: Tensor, value: Tensor,
            mask: Mask | None, rows_per_chunk: int, limit: int, scaling: float | None, softcap: float | None,
            sinks: Tensor | None, gates: Tensor | None, fill: Tensor | None, call_memo: dict, grow: bool,
            workspace: Workspace | None, outs: Tensor) -> None:
    """:func:`_chunked`'s chunks, in ``workspace``'s buffers where it lends them, their head outputs
    written into ``outs`` (B, H, T, Dv)."""
    T, S = query.shape[2], key.shape[2]
    B, H = query.shape[:2]
    # a mask whose structure does not bound its rows' keys (a tensor: padding, a model's own sliding window):
    # each row's last visible key, read once a layer, for the chunks to grow by
    lasts = None
    if grow and mask is not None and query.device.type != "meta" and Rows(mask, 0, T, S).last_key(1) is None:
        lasts = _row_last_keys(mask, T, S, query.device)
    start, done = 0, 0
    # on meta (a plan's trace) the chunks between the first and last TRACED_EDGE_CHUNKS are not run
    tracing, between = query.device.type == "meta", T - TRACED_EDGE_CHUNKS * rows_per_chunk
    while start < T:
        stop = min(T, start + rows_per_chunk)
        rows = None if mask is None else Rows(mask, start, T, S)  # this chunk's rows of the mask
        known = None if lasts is None else _running_last(lasts, start, S)  # the rows' last keys, without the mask
        if grow and rows is not None:
            last_key = rows.last_key if known is None else known
            stop = _widest(start, stop, T, S, B * H * 4, limit, last_key, lambda keys: key_grid(value, keys))
        while True:  # as many rows as fit ``limit`` bytes of map (at least one)
            if rows is None:
                K = S
            else:
                K = (known(stop) if known is not None else _last_key(rows, stop, query.device)) + 1
            fit = max(1, limit // (B * H * K * 4))
            if stop - start <= fit:
                break
            stop = start + fit
        done += 1
        if tracing and done > TRACED_EDGE_CHUNKS and stop <= between:  # never in a run: only meta has no values
            start = stop
            continue
        # the chunk's mask evaluated once, over its K keys: the kernel and the visible keys read the same tensor
        chunk_mask = None if rows is None else _evaluated_once(rows, stop - start, K, query, workspace)
        out, weights = attention(query[:, :, start:stop], key[:, :, :K], value[:, :, :K], chunk_mask,
                                 scale=scaling, need_weights=True, backend="math", softcap=softcap, sinks=sinks,
                                 weights_dtype=READ_DTYPE if query.dtype != torch.float64 else None,
                                 workspace=workspace)  # (B, H, c, Dv), (B, H, c, K)
        if gates is not None:
            out = _gated(out, gates, fill)
        chunk = AttentionChunk(site, layer, start, T, S, weights, out,
                               _visible(chunk_mask, stop - start, K, query.device), call_memo,
                               entropy=None if workspace is None else workspace.entropy)
        for a in readers:
            a.read(chunk)
        del chunk, weights
        outs[:, :, start:stop] = out
        start = stop


def at_least_rows(limit: int, row_bytes: int) -> int:
    """A chunk's bytes on a CPU by default (:func:`chunk_bytes`): ``limit``, or up to
    twice that where ``limit`` would hold fewer than :data:`MIN_CHUNK_ROWS` rows of ``row_bytes``
    (a row over every key: B·H·S·4) — the rows of a long text's last chunks, which see every key:
    the products' key packing and a chunk's fixed Python and small operations are paid once a
    chunk, and 85 rows a chunk (SmolLM2's nine heads at 8,192 tokens in 24 MiB) pay them over few
    rows; with at least 160 (45 MiB) SmolLM2 bfloat16's analysis there took 29.2 → 26.6 s (128:
    26.9), while 48 MiB chunks at 1k and 4k tokens, which hold more than 160 rows anyway, were
    2-3 % slower (one process alternating them, AMD EPYC, two threads)."""
    return max(limit, min(2 * limit, MIN_CHUNK_ROWS * row_bytes))


def _row_last_keys(mask: Mask, T: int, S: int, device: torch.device) -> Tensor:
    """Each query row's last key any text or head may see, (T,) int64 on the host (-1: none) —
    one pass over the mask's (B|1, 1|H, T, S) values, in blocks of rows of 2^21 entries of every
    text and head (the mask's values, a bool copy and the keys' numbers in int32: ~16 MiB at most
    beside the chunks' buffers, at a layer's start)."""
    lasts = torch.empty(T, dtype=torch.long)
    keys = torch.arange(S, dtype=torch.int32, device=device)
    leading = Rows(mask, 0, T, S).materialize(1, S, device=device).numel() // S  # texts x heads the mask has
    block = max(1, (1 << 21) // (S * leading))
    for start in range(0, T, block):
        c = min(block, T - start)
        seen = Rows(mask, start, T, S).materialize(c, S, device=device)  # (…, c, S) bool
        seen = seen.reshape(-1, c, S).any(0)  # (c, S): any text, any head
        lasts[start:start + c] = torch.where(seen, keys, -1).amax(-1).cpu()  # (c,)
    return lasts


def _running_last(lasts: Tensor, start: int, S: int) -> Callable[[int], int]:
    """The last key any of rows ``start .. end - 1`` may see, from each row's own (``lasts``,
    :func:`_row_last_keys`), as :func:`_last_key` answers it by evaluating the rows: S - 1 where
    none may see a key (the kernel's to zero over every key)."""
    running = lasts[start:].cummax(0).values.tolist()  # once a chunk: the bisection reads it a dozen times

    def last_key(end: int) -> int:
        found = running[end - start - 1]
        return found if found >= 0 else S - 1

    return last_key


def _widest(start: int, stop: int, T: int, S: int, entry_bytes: int, limit: int,
            last_key: Callable[[int], int | None], grid: Callable[[int], int]) -> int:
    """The end of the widest chunk from ``start`` (at least to ``stop``, at most to T) whose
    map fits ``limit`` bytes over the keys its rows may see (``last_key(end)``: the last key any of
    rows start .. end - 1 may see, None where it is not known; negative: none, S keys then, as the
    kernel zeroes such rows over every key) as its products take them (``grid``: the half products'
    key grid, :func:`~multihead.attn.precision.key_grid`; ``entry_bytes`` a row and key: B·H·4), by
    bisection — (rows) x (their keys) grows with the end, except after leading rows that see no key
    (S keys, then fewer): there the end found fits but may not be the widest. Every chunk costs the
    same Python and small operations (~2 ms for an analysis's readers, AMD EPYC) and its products a
    packing of the keys: the rows of S keys a chunk of ``limit`` bytes holds (85 at 8k tokens for
    SmolLM2's nine heads) are, over a causal layer's first rows, a small fraction of what fits.
    ``stop`` where ``last_key`` does not know them."""

    def fits(end: int) -> bool:
        last = last_key(end)
        if last is None:
            return False
        return (end - start) * grid(S if last < 0 else last + 1) * entry_bytes <= limit  # the workspace holds it

    if stop >= T or not fits(stop):
        return stop
    if fits(T):
        return T
    fitting, too_many = stop, T
    while too_many - fitting > 1:
        middle = (fitting + too_many) // 2
        fitting, too_many = (middle, too_many) if fits(middle) else (fitting, middle)
    return fitting


def _lent_workspace(reader: Attachment, entries: int) -> Workspace:
    """The buffers ``reader`` lends a streamed layer whose map chunks take up to ``entries``
    entries: its own from an earlier layer (a larger layer's chunks grow them), else new ones."""
    if reader.workspace is None:
        reader.workspace = Workspace(entries, entropy=True)
        reader.give_back = PacedGiveBack()
    reader.workspace.map_entries = max(reader.workspace.map_entries, entries)
    return reader.workspace


def _last_key(rows: Rows, stop: int, device: torch.device) -> int:
    """The last key column any of the full grid's rows ``rows.start .. stop - 1`` may see: from
    the mask's structure where it bounds it, else by evaluating the rows (S - 1 when none may see
    any: such rows are the kernel's to zero, over every key as unchunked)."""
    found = rows.last_key(stop)
    if found is not None:
        return found if found >= 0 else rows.S - 1
    if device.type == "meta":  # a memory plan's trace: no values to read, so every key (the most it can take)
        return rows.S - 1
    seen = rows.materialize(stop - rows.start, rows.S, device=device)  # (…, c, S)
    columns = seen.reshape(-1, seen.shape[-1]).any(0).nonzero()  # (n, 1)
    return int(columns[-1]) if len(columns) else rows.S - 1


def _evaluated_once(rows: Rows, c: int, K: int, query: Tensor, workspace: Workspace | None) -> Mask:
    """:func:`_evaluated`, kept in ``workspace`` for a causal mask: every layer of a forward streams the
    same chunks of it (SmolLM2 at 1k tokens: 60 evaluations of ~0.2 ms, two of them distinct); any
    other mask is evaluated for each chunk (a tensor mask's values may differ from call to call)."""
    if workspace is None or type(rows.mask) is not Causal:
        return _evaluated(rows, c, K, query)
    grid = ("causal", rows.T, rows.S, query.device, query.dtype == torch.float64, torch.is_inference_mode_enabled())
    return workspace.kept_mask(grid, (rows.start, c, K), c * K, lambda: _evaluated(rows, c, K, query))


def _evaluated(rows: Rows, c: int, K: int, query: Tensor) -> Mask:
    """``rows`` over its first K keys as a tensor mask (…, c, K): bool, or for a mask with a bias
    float with -inf where it may not attend (float64 for float64 queries)."""
    device = query.device
    keep = rows.materialize(c, K, device=device)
    bias = rows.bias(c, K, dtype=torch.float64 if query.dtype == torch.float64 else torch.float32, device=device)
    if bias is None:
        return from_tensor(keep)
    return from_tensor(torch.where(keep, bias, torch.tensor(float("-inf"), dtype=bias.dtype, device=device)))


def _visible(mask: Mask | Tensor | None, T: int, S: int, device: torch.device) -> Tensor:
    """Which keys each query may see, (B|1, 1|H, T, S) bool (all of them without a mask, or for a
    mask that depends on the scores: every key was a candidate)."""
    if mask is None:
        return torch.ones(1, 1, T, S, dtype=torch.bool, device=device)
    try:
        visible = as_mask(mask).materialize(T, S, device=device)
    except (TypeError, ValueError):  # data-dependent (top-k)
        return torch.ones(1, 1, T, S, dtype=torch.bool, device=device)
    return visible if visible.dim() == 4 else visible.view(1, 1, T, S)

