"""A keyword spotter built from our own layer (:mod:`multihead.models.speech`), analysed like any model:
every head of the trained spotter over the test voice's words, as a :class:`~multihead.Report`."""

from __future__ import annotations

import torch

from ...hf.capture import AttentionCapture
from ...inputs import Batch, TokenInfo
from ...models.speech import frames_batch
from ..labels import flags_for, label_for
from ..report import Report, head_records
from ..stats.base import dispatch
from ..stats.heads import HeadStatistics

__all__ = ["speech_report"]


def speech_report(result: dict, *, name: str = "keyword-spotter") -> Report:
    """The report of :func:`~multihead.models.speech.train_keyword_spotter`'s result on its test voice."""
    model, data = result["model"], result["data"]
    mean, std = result["normalisation"]
    idx = [i for i, v in enumerate(data.voices) if v == result["test_voice"]]
    frames, valid = frames_batch([data.features[i] for i in idx], mean, std)
    real = torch.cat([torch.ones(len(idx), 1, dtype=torch.bool), valid], 1)  # (B, 1 + T) [CLS] + frames
    first = torch.zeros_like(real)
    first[:, 0] = True
    none = torch.zeros_like(real)
    L, H = len(model.blocks), model.blocks[0].attn.num_heads
    stats = HeadStatistics(L, H)
    stats.begin_batch(Batch(TokenInfo(valid=real, first=first, separator=none, punctuation=none), idx))
    with AttentionCapture(model, dispatch([stats])), torch.no_grad():
        model(frames, valid)
    stats.end_batch()
    return Report(model=name, causal=False, num_layers=L, num_heads=H, sentences=stats.sentences, tokens=stats.tokens,
                  heads=head_records(stats.result(), label_for, flags_for), stack="encoder")
