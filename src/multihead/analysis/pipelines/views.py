"""A few texts as the page and the figures show them: their maps (or pooled attention), rollout and flow.

:func:`text_views` runs one pass over the texts with a :class:`~multihead.analysis.stats.maps.TextViews`
reducer — the same one :func:`~multihead.analysis.analyze` runs beside its statistics; a short
text's view solves its attention rollout and flow when asked (:mod:`multihead.analysis.rollout`).
:func:`attention_maps` and :func:`rollout` are the one-text forms. :class:`InputViews` keeps the
views of a probe's inputs from the probe's own pass (the page shows them without a second forward).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from ...hf.capture import LayerCallback
from ...hf.model import HFModel, require_loaded
from ...hf.route import AttentionChunk
from ...inputs import check_texts
from ..rollout import FLOW_TOKENS, attention_flow, attention_rollout
from ..stats.maps import HEAD_VIEW_TOKENS, LONG_TEXT, HeadMaps, HeadView, TextView, TextViews
from .common import Encoded, encode_corpus, refuse_not_finite, run_pass, text_batches

__all__ = ["InputViews", "Rollout", "attention_maps", "head_views", "rollout", "text_views", "token_views"]

def text_views(model: HFModel, texts: Sequence[str], *, long: int = LONG_TEXT, top_k: int | None = None,
               chunk: int | None = None) -> list[TextView]:
    """The :class:`TextView` of each text (its whole maps, or pooled above ``long`` tokens; rollout
    and flow for short ones, solved when asked). Texts longer than the model's positions are refused."""
    model = require_loaded(model, "text_views")
    texts = check_texts(texts)
    encoded = encode_corpus(model, texts, truncate=None)  # no cutting here: the error says shorten it
    views = TextViews(model.num_layers, model.num_heads, dict(enumerate(texts)), model.tokenizer, long=long,
                      top_k=top_k)
    run_pass(model, text_batches(model, encoded, range(len(texts)), 1), [views], chunk=chunk, desc="views",
             progress=False)
    return _finite(views.result(), model)


def token_views(model: HFModel, ids: Sequence[Sequence[int]], *, top_k: int | None = None) -> list[TextView]:
    """The :class:`TextView` of token sequences given as ids (a probe's input, e.g. the induction
    probe's repeated random tokens): their text is what the tokenizer decodes."""
    model = require_loaded(model, "token_views")
    ids = [list(map(int, seq)) for seq in ids]
    texts = {i: model.tokenizer.decode(seq) for i, seq in enumerate(ids)}
    views = TextViews(model.num_layers, model.num_heads, texts, model.tokenizer, long=LONG_TEXT, top_k=top_k)
    run_pass(model, text_batches(model, Encoded(ids, None), range(len(ids)), 1), [views], desc="views",
             progress=False)
    return _finite(views.result(), model)


def _finite(views: list[TextView], model: HFModel) -> list[TextView]:
    """``views``, where every map (or a long text's pooled block sums) is finite; else the one-line
    :class:`~multihead.hf.placement.NotFiniteError` naming the first text's heads that are not —
    a page of NaN maps drawn as if they were attention says nothing true."""
    for n, view in enumerate(views, 1):
        held = view.maps if view.maps is not None else None if view.pooled is None else view.pooled.mass
        if held is not None:  # (L, H, ...)
            refuse_not_finite(~held.flatten(2).isfinite().all(-1), model.dtype, on=f"text {n}")
    return views


class InputViews:
    """The :class:`TextView` of token sequences read from another's pass over them — a probe's,
    which calls this with its first batch's token ids (one list a sequence, of one length: no
    padding) and hands each chunk of that batch's every layer to the callback it gets back — instead
    of a pass of their own (a :data:`~multihead.hf.capture.BatchReader`).

    ``keep``: which sequences of the batch become views; ``top_k``: weights kept a row of a pooled
    one. The page's view is a by-product of the probe: a failure while reading it is kept, not
    raised (the probe's scores go on), and :meth:`result` then says None — its caller makes the view
    in a pass of its own, as without a reader."""

    def __init__(self, model: HFModel, *, keep: Sequence[int] = (0,), top_k: int | None = None) -> None:
        self._model = require_loaded(model, "InputViews")
        self._keep, self._top_k = list(keep), top_k
        self._views: TextViews | None = None
        self._shape = (0, 0)  # (B, T) of the batch whose chunks come
        self.failed: Exception | None = None

    def __call__(self, ids: Sequence[Sequence[int]]) -> LayerCallback:
        ids = [list(map(int, seq)) for seq in ids]
        if not ids or len({len(seq) for seq in ids}) != 1 or not set(self._keep) <= set(range(len(ids))):
            raise ValueError(f"InputViews reads a batch of token sequences of one length and keeps some of them; got "
                             f"lengths {sorted({len(seq) for seq in ids})} and keep {self._keep}")
        model = self._model
        self._shape = (len(ids), len(ids[0]))
        texts = {i: model.tokenizer.decode(ids[i]) for i in self._keep}
        self._views = TextViews(model.num_layers, model.num_heads, texts, model.tokenizer, long=LONG_TEXT,
                                top_k=self._top_k)
        (batch,) = text_batches(model, Encoded(ids, None), range(len(ids)), len(ids))  # one length: in order
        self._views.begin_batch(batch.to(model.device))
        return self._read

    def _read(self, chunk: AttentionChunk) -> None:
        if self.failed is not None:
            return
        B, T = self._shape
        try:
            if chunk.weights is None or chunk.weights.shape[0] != B or chunk.weights.shape[-1] > T:
                shape = None if chunk.weights is None else tuple(chunk.weights.shape)
                raise ValueError(f"InputViews reads the maps of a batch of {B} sequences of {T} tokens; got a chunk "
                                 f"of {shape}")
            self._views.update(chunk)
        except Exception as err:  # the probe's pass goes on without its page view
            self.failed = err
            self._views = None  # what it kept so far: released

    def result(self) -> list[TextView] | None:
        """The kept sequences' views (in ``keep``'s order), once the pass has run — None where no
        pass was read or the reading failed (:attr:`failed`)."""
        if self._views is None:
            return None
        self._views.end_batch()
        return self._views.result()


def head_views(model: HFModel, texts: Sequence[str], wanted: dict[int, set[tuple[int, int]]]
               ) -> dict[tuple[int, int, int], HeadView]:
    """Single heads' maps on single texts: ``wanted`` maps an index of ``texts`` to the (layer,
    head) cells to keep there (one pass over those texts; :class:`~multihead.analysis.stats.maps.HeadMaps`),
    texts of at most :data:`~multihead.analysis.stats.maps.HEAD_VIEW_TOKENS` tokens only — a longer
    one is not run at all (a document's own pass, for nothing kept, had taken a quarter of its run)."""
    model = require_loaded(model, "head_views")
    chosen = sorted(wanted)
    encoded = encode_corpus(model, [texts[i] for i in chosen], truncate=True) if chosen else Encoded([], None)
    short = [n for n, ids in enumerate(encoded.ids) if len(ids) <= HEAD_VIEW_TOKENS]
    chosen, encoded = [chosen[n] for n in short], Encoded([encoded.ids[n] for n in short], None)
    if not chosen:
        return {}
    maps = HeadMaps({n: wanted[i] for n, i in enumerate(chosen)}, {n: texts[i] for n, i in enumerate(chosen)},
                    model.tokenizer)
    run_pass(model, text_batches(model, encoded, range(len(chosen)), 16), [maps], desc="views", progress=False)
    out = {}
    for (n, layer, head), view in maps.result().items():
        view.text = chosen[n]
        out[(chosen[n], layer, head)] = view
    return out


def attention_maps(model: HFModel, text: str, *, max_tokens: int | None = None) -> tuple[list[str], Tensor]:
    """The tokens of ``text`` and every head's attention: (L, H, T, T) float32, captured layer by
    layer (a text of any length: its map is assembled from the streamed chunks). ``max_tokens``:
    cut the text there (default: the model's positions)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("attention_maps needs a non-empty text")
    model = require_loaded(model, "attention_maps")
    views = TextViews(model.num_layers, model.num_heads, {0: text}, model.tokenizer, long=math.inf)
    limit = max_tokens or model.max_positions
    tok = model.tokenizer
    ids = tok([text], truncation=limit is not None, max_length=limit, verbose=False)["input_ids"]
    run_pass(model, text_batches(model, Encoded(ids, None), [0], 1), [views], desc="maps", progress=False)
    view = views.result()[0]
    return view.tokens, view.maps


@dataclass
class Rollout:
    """One text's tokens, its rollout (L, T, T) and — for texts of at most FLOW_TOKENS — its flow
    (L, T, T), NaN at the layers it was not solved for (draw them: :func:`multihead.viz.rollout_grid`)."""

    tokens: list[str]
    rollout: Tensor
    flow: Tensor | None
    residual: float


def rollout(model: HFModel, text: str, *, flow: bool | None = None, flow_layers: list[int] | None = None,
            residual: float = 0.5) -> Rollout:
    """Capture every head's attention on ``text`` and roll it out through the layers. ``flow``:
    also solve attention flow (None: when the text has at most FLOW_TOKENS tokens) at
    ``flow_layers`` (default: the last layer — every layer costs about L/2 times more)."""
    tokens, maps = attention_maps(model, text)  # (L, H, T, T)
    if flow is None:
        flow = len(tokens) <= FLOW_TOKENS
    layers = flow_layers if flow_layers is not None else [maps.shape[0] - 1]
    return Rollout(tokens, attention_rollout(maps, residual=residual),
                   attention_flow(maps, residual=residual, layers=layers) if flow else None, residual)
