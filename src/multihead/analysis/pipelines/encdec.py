"""Encoder–decoder models (T5, BART, Marian, ...): three stacks in one report.

The encoder reads each source text; the decoder reads a target teacher-forced — by default the
same text (its tokens shifted right behind the model's decoder start token), or one target per
source. In the same forward pass the encoder's self-attention, the decoder's (causal)
self-attention and the decoder's cross-attention over the encoder are captured as three stacks:
the report's own heads are the encoder's, ``report.stacks["decoder"]`` and
``report.stacks["cross"]`` the others. Self-attention stacks get the usual metrics and labels
(:mod:`multihead.analysis.stats.heads`); cross-attention gets its own
(:mod:`multihead.analysis.stats.cross`: entropy, alignment, mass on the source's special tokens).
Positions count real tokens only. Cross-attention labels: :data:`multihead.analysis.labels.CROSS_RULES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch

from ...hf.capture import AttentionCapture
from ...hf.model import HFModel, right_padding
from ...hf.sites import find_sites
from ...inputs import Batch, check_texts, count_unknown_tokens, token_info
from ...progress import bar
from .. import sections as S
from ..labels import cross_label, flags_for, label_for
from ..report import Report, head_records
from ..stats.base import dispatch
from ..stats.cross import CrossStatistics
from ..stats.heads import HeadStatistics
from .common import check_finite, encode_corpus, return_freed_memory

__all__ = ["STACKS", "analyze_encoder_decoder"]

#: The three stacks of an encoder-decoder model, as its report lists them.
STACKS = ("encoder", "decoder", "cross")


def analyze_encoder_decoder(model: HFModel, texts: Sequence[str], targets: Sequence[str] | None = None, *,
                            batch_size: int = 32, truncate: bool = False,
                            progress: bool | None = None) -> Report:
    """The three stacks of an encoder–decoder ``model`` over ``texts`` (targets: teacher-forced),
    in one pass: each stack's layers feed that stack's reducers."""
    texts = check_texts(texts)
    targets = check_texts(targets) if targets is not None else list(texts)
    if len(targets) != len(texts):
        raise ValueError(f"got {len(targets)} targets for {len(texts)} texts; give one target per text")
    sites = find_sites(model.model)
    shape = {stack: (len({s.layer for s in sites if s.stack == stack}),
                     max(s.num_heads for s in sites if s.stack == stack)) for stack in STACKS}
    tok = model.tokenizer
    source = encode_corpus(model, texts, truncate=truncate, say_cut=True).ids
    target = encode_corpus(model, targets, truncate=truncate, what="target", say_cut=True).ids
    unknown = count_unknown_tokens([*source, *target], tok)
    config = model.model.config
    start = next((t for t in (getattr(config, "decoder_start_token_id", None), tok.pad_token_id) if t is not None), 0)
    decoder = [[start, *ids[:-1]] for ids in target]  # teacher forcing: each position predicts the next
    reducers = {"encoder": HeadStatistics(*shape["encoder"]), "decoder": HeadStatistics(*shape["decoder"]),
                "cross": CrossStatistics(*shape["cross"])}
    punct: dict[int, bool] = {}
    order = sorted(range(len(texts)), key=lambda i: len(source[i]))
    batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    captures = [AttentionCapture(model.model, dispatch([reducers[stack]]), at=stack) for stack in STACKS]
    with right_padding(tok), captures[0], captures[1], captures[2], torch.inference_mode():
        for rows in bar(batches, desc="analyze", unit="batch", progress=progress):
            src = tok.pad({"input_ids": [source[i] for i in rows]}, return_tensors="pt")
            dec = tok.pad({"input_ids": [decoder[i] for i in rows]}, return_tensors="pt")
            src_info = token_info(src["input_ids"], src["attention_mask"].bool(), tok, punct)
            dec_info = token_info(dec["input_ids"], dec["attention_mask"].bool(), tok, punct)
            reducers["encoder"].begin_batch(Batch(src_info, rows))
            reducers["decoder"].begin_batch(Batch(dec_info, rows))
            reducers["cross"].begin_batch(Batch(dec_info, rows, keys=src_info))
            to = model.device
            model.body(input_ids=src["input_ids"].to(to), attention_mask=src["attention_mask"].to(to),
                       decoder_input_ids=dec["input_ids"].to(to), decoder_attention_mask=dec["attention_mask"].to(to))
            for reducer in reducers.values():
                reducer.end_batch()
            return_freed_memory()
    for stack in STACKS:  # a NaN map refused in one line, not reported as metrics
        check_finite(reducers[stack], model.dtype, stack=stack)
    sections = S.Sections()
    if unknown.token is not None:
        sections.unknown_tokens = S.UnknownTokens(unknown.count, unknown.total, round(unknown.share, 6), unknown.token)
    reports = {stack: Report(model=model.name, causal=stack == "decoder", num_layers=shape[stack][0],
                             num_heads=shape[stack][1], sentences=reducers[stack].sentences,
                             tokens=reducers[stack].tokens,
                             heads=head_records(reducers[stack].result(),
                                                partial(label_for, causal=stack == "decoder"), flags_for,
                                                causal=stack == "decoder"), stack=stack)
               for stack in ("encoder", "decoder")}
    decoded = reducers["decoder"]
    reports["cross"] = Report(model=model.name, causal=False, num_layers=shape["cross"][0],
                              num_heads=shape["cross"][1], sentences=decoded.sentences, tokens=decoded.tokens,
                              heads=head_records(reducers["cross"].result(), cross_label), stack="cross")
    main = reports["encoder"]
    main.sections = sections
    main.stacks = {"decoder": reports["decoder"], "cross": reports["cross"]}
    return main
