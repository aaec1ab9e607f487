"""``mh.analyze(model, texts)``: per-head statistics of a real model over a whole corpus.

Batched and padding-aware (any batch size gives the same numbers), length-bucketed (texts
of similar length share a batch, so little padding is computed), and streaming: each layer's
maps are reduced into running sums as soon as the layer has run, so peak memory is one layer
of one batch, whatever the corpus size.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..hf.capture import AttentionCapture
from ..hf.load import HFModel
from .metrics import METRICS, HeadStatistics, TokenInfo
from .patterns import flags_for, label_for
from .redundancy import RedundancyStatistics, clusters, most_redundant
from .report import HeadRecord, Report

__all__ = ["CorpusStatistics", "analyze", "check_texts", "collect_statistics"]

#: Heads whose attention rows differ by at most this JS distance (base 2) on average are clustered.
CLUSTER_JS = 0.2


@dataclass
class CorpusStatistics:
    heads: HeadStatistics
    redundancy: RedundancyStatistics


def analyze(model: HFModel, texts: Sequence[str], *, batch_size: int = 32, truncate: bool = False,
            progress: bool = False) -> Report:
    """Metrics, a label and flags for every (layer, head) of ``model`` over ``texts``.

    Raises ValueError for an empty corpus, an empty text, or a text longer than the model's
    positions (unless ``truncate``).
    """
    corpus = collect_statistics(model, texts, batch_size=batch_size, truncate=truncate, progress=progress)
    stats = corpus.heads
    means = stats.means()
    heads = []
    for layer in range(model.num_layers):
        for head in range(model.num_heads):
            metrics = {name: float(means[name][layer, head]) for name in METRICS}
            heads.append(HeadRecord(layer, head, label_for(metrics), flags_for(metrics), metrics))
    js, cosine = corpus.redundancy.js(), corpus.redundancy.cosine()
    H = model.num_heads
    redundancy = {
        "js_distance": js,
        "cosine": cosine,
        "pairs_js": most_redundant(js, H, k=10, distance=True),
        "pairs_cosine": most_redundant(cosine, H, k=10, distance=False),
        "clusters_js": [[(n // H, n % H) for n in group] for group in clusters(js, CLUSTER_JS)],
        "cluster_threshold": CLUSTER_JS,
    }
    return Report(model.name, model.is_causal, model.num_layers, model.num_heads, stats.sentences, stats.tokens,
                  heads, redundancy)


def collect_statistics(model: HFModel, texts: Sequence[str], *, batch_size: int = 32, truncate: bool = False,
                       progress: bool = False) -> CorpusStatistics:
    """The running sums behind :func:`analyze` (head metrics mergeable across processes)."""
    texts = check_texts(texts)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    tok = model.tokenizer
    limit = model.max_positions
    encoded = tok(list(texts), truncation=bool(truncate and limit), max_length=limit if truncate else None)["input_ids"]
    if limit and not truncate:
        for i, ids in enumerate(encoded):
            if len(ids) > limit:
                raise ValueError(f"text {i + 1} has {len(ids)} tokens; the model takes at most {limit} "
                                 "(shorten it or use truncate=True / --truncate)")
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # length buckets: little padding
    stats = HeadStatistics(model.num_layers, model.num_heads)
    redundancy = RedundancyStatistics(model.num_layers, model.num_heads)
    special = {t for t in (tok.sep_token_id, tok.eos_token_id) if t is not None}
    punct_cache: dict[int, bool] = {}
    batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        def tqdm(x, **_):  # type: ignore[no-redef]
            return x
    info_box: list[TokenInfo] = []

    def on_layer(layer: int, weights: torch.Tensor, out: torch.Tensor, visible: torch.Tensor) -> None:
        stats.update(layer, weights, visible, info_box[0])
        redundancy.add_layer(layer, weights, out, capture.output_projection(layer), info_box[0].valid)

    saved_side = tok.padding_side
    tok.padding_side = "right"  # positions must not shift with padding (decoders count them from 0)
    try:
        capture = AttentionCapture(model.model, on_layer)
        with capture, torch.inference_mode():
            for batch_ids in tqdm(batches, desc="analyze", unit="batch", disable=not progress):
                ids = [encoded[i] for i in batch_ids]
                batch = tok.pad({"input_ids": ids}, return_tensors="pt")
                info = _token_info(batch["input_ids"], batch["attention_mask"].bool(), special, tok, punct_cache)
                info_box[:] = [info]
                stats.add_batch(info)
                model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                redundancy.end_batch()
    finally:
        tok.padding_side = saved_side
    return CorpusStatistics(stats, redundancy)


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list; ValueError/TypeError naming the first empty or non-string one."""
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise ValueError("no text to analyze: give at least one non-empty text")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text {i + 1} is a {type(t).__name__}, expected str")
        if not t.strip():
            raise ValueError(f"text {i + 1} is empty or only whitespace")
    return texts


def _token_info(input_ids: torch.Tensor, valid: torch.Tensor, special: set[int], tok, cache: dict[int, bool]
                ) -> TokenInfo:
    first = torch.zeros_like(valid)
    first[torch.arange(valid.shape[0]), valid.long().argmax(-1)] = True
    first &= valid
    separator = torch.zeros_like(valid)
    for sid in special:
        separator |= input_ids == sid
    separator &= valid
    punct = torch.tensor([[_is_punct(int(t), tok, cache) for t in row] for row in input_ids.tolist()],
                         dtype=torch.bool) & valid
    return TokenInfo(valid=valid, first=first, separator=separator & ~first, punctuation=punct)


def _is_punct(token_id: int, tok, cache: dict[int, bool]) -> bool:
    if token_id not in cache:
        text = tok.convert_ids_to_tokens(token_id) or ""
        text = text.removeprefix("##").lstrip("Ġ▁")
        cache[token_id] = bool(text) and all(unicodedata.category(c).startswith("P") for c in text)
    return cache[token_id]
