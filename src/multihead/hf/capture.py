"""See every head of a model: a reader attached at its named layers.

While :class:`AttentionCapture` is active, every chosen layer (by default the model's single
self-attention stack; any stack or layer names, :func:`~multihead.hf.sites.select`) hands its
attention to a callback as :class:`~multihead.hf.route.AttentionChunk` objects, layer by layer, so
nothing holds L·H·n² maps at once. This is not ``output_attentions=True``: the model never returns
the maps; the callback reduces them and lets them go. A layer whose map would pass the memory
budget is handed over in chunks of query rows (a 4,096-token document's 604 MB map never exists
whole); the model's own outputs are the same either way.

Works alike for transformers models and models built from our own layer: both go through the one
routed call of :mod:`multihead.hf.route`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from . import route
from .model import ModelLike, as_module
from .placement import model_devices
from .route import MAP_BUDGET, Attachment, AttentionChunk, SummaryRequest
from .sites import AttentionSite, find_sites, select

__all__ = ["AttentionCapture", "LayerCallback"]

#: callback(chunk): one chunk of query rows of one layer's map (the whole map when it fits the budget)
LayerCallback = Callable[[AttentionChunk], None]
#: A reader of another's pass: given the token ids of a batch it runs (one list a text), the callback
#: that batch's chunks are handed to (a probe's ``reader``: the page's view of its input).
BatchReader = Callable[[list[list[int]]], LayerCallback]


class AttentionCapture(Attachment):
    """Context manager: ``callback(chunk)`` receives every chunk of every chosen layer's attention.

    ``at``: a stack name (``"decoder"``), layer names (``"decoder.3"`` or a list), or None for the
    model's one self-attention stack; ``stack`` is the same as a stack name in ``at``. Layers are
    numbered within their stack (:func:`~multihead.hf.sites.find_sites`).

    ``budget``: map bytes (B·H·T·S float32) above which a layer is streamed in chunks of query rows
    (default :data:`~multihead.hf.route.MAP_BUDGET`); ``chunk``: stream every layer in chunks of at
    most this many rows whatever its size; ``chunk_bytes``: the most map bytes of one streamed chunk
    (default :func:`~multihead.hf.route.chunk_bytes` of the layer's device: the CPU's heap rule — up
    to twice that where it would hold fewer than 160 rows of every key,
    :func:`~multihead.hf.route.at_least_rows` —, a share of the free memory on CUDA). A streamed
    chunk's keys end after the last one any of its rows may see (K <= S; the keys after it have
    weight 0). ``transient``: the callback keeps nothing of a chunk's tensors once it returns (it
    copies what it keeps): a streamed layer's maps are then made in buffers its next chunk reuses,
    and the next streamed layer's — faster on a CPU, and a kept ``chunk.weights`` would be
    overwritten; the capture holds them (one chunk's maps) until :meth:`release` or its end.
    """

    reads = True
    #: the row sums the callback can take instead of a layer's map (set by its caller, e.g. per batch:
    #: :meth:`~multihead.hf.route.Attachment.summary`); None: the maps
    summary_request: SummaryRequest | None = None
    #: where chunks are handed over (set on entering: the first of
    #: :func:`~multihead.hf.placement.model_devices`; None for a model traced on meta by a plan)
    device = None
    _given_bytes: int | None = None

    def __init__(self, model: ModelLike, callback: LayerCallback, *, at: str | Sequence[str] | None = None,
                 stack: str | None = None, chunk: int | None = None, budget: int = MAP_BUDGET,
                 chunk_bytes: int | None = None, transient: bool = False) -> None:
        if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
            raise ValueError(f"chunk must be a positive number of query rows; got {chunk!r}")
        if not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budget must be a positive number of bytes; got {budget!r}")
        if at is not None and stack is not None:
            raise ValueError("give at= or stack=, not both")
        self.model = as_module(model)
        self.callback = callback
        if chunk_bytes is not None and (not isinstance(chunk_bytes, int) or chunk_bytes < 1):
            raise ValueError(f"chunk_bytes must be a positive number of bytes; got {chunk_bytes!r}")
        self.rows = chunk
        self.transient = bool(transient)
        self.budget = budget
        self.chunk_bytes = chunk_bytes
        self.sites = find_sites(self.model)
        stacks = sorted({s.stack for s in self.sites})
        if stack is not None and stack not in stacks:
            raise ValueError(f"the model has no {stack!r} stack; it has {stacks}")
        self.where = select(self.model, at if at is not None else stack, sites=self.sites)

    @property
    def stack(self) -> str:
        """The stack of the captured layers (the first one's, when several are captured)."""
        return self.where[0][0].stack

    def output_projection(self, layer: int) -> Tensor | None:
        """W^O of a captured layer, (D, H·Dv), or None when it cannot be found."""
        for site, at in self.where:
            if at == layer:
                return site.output_weight()
        return None

    def site_of(self, layer: int) -> AttentionSite | None:
        return next((site for site, at in self.where if at == layer), None)

    def __enter__(self):
        # where the callback gets every chunk: the first of the model's devices (a device map's main one), where a
        # reader's sums live; a layer that the map put on another GPU hands its chunks over there (as
        # the model hands its hidden states from layer to layer), so no reader ever meets two devices —
        # each chunk then no larger than any of the devices takes, unless the caller said its bytes
        if self._handle is not None:  # entered already: attached as it is
            return self
        devices = model_devices(self.model)
        self.device = devices[0] if devices else None
        self._given_bytes = self.chunk_bytes
        if len(devices) > 1 and self.chunk_bytes is None:
            self.chunk_bytes = min(route.chunk_bytes(d) for d in devices)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.chunk_bytes = self._given_bytes

    def summary(self, site: AttentionSite, layer: int) -> SummaryRequest | None:
        return self.summary_request

    def read(self, chunk: AttentionChunk) -> None:
        self.callback(chunk.to(self.device) if self.device is not None else chunk)
