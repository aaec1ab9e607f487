"""Encoder–decoder models (T5, BART, Marian, ...): three stacks in one report.

The encoder reads each source text; the decoder reads a target teacher-forced — by default the
same text (its tokens shifted right behind the model's decoder start token), or one target per
source. In the same forward pass the encoder's self-attention, the decoder's (causal)
self-attention and the decoder's cross-attention over the encoder are captured as three stacks:
the report's own heads are the encoder's, ``report.stacks["decoder"]`` and
``report.stacks["cross"]`` the others. Self-attention stacks get the usual metrics and labels
(:mod:`multihead.analysis.metrics`); cross-attention gets its own:

| key | definition for one decoder query row ``p_i`` over the source tokens |
|---|---|
| ``entropy`` / ``entropy_norm`` | as for self-attention, over the real source tokens |
| ``max_weight`` | ``max_j p_ij`` |
| ``diagonal_distance`` | ``Σ_j p_ij · |j − a(i)|``, ``a(i) = i · (n_src − 1)/(n_tgt − 1)`` the aligned position |
| ``aligned`` | ``Σ_{|j − a(i)| ≤ 1} p_ij``: mass within one token of the aligned position |
| ``source_special`` | mass on the source's special tokens (first token, separators / EOS) |

Positions count real tokens only. Cross-attention labels, first match: ``source-special``
(``source_special`` ≥ 0.5), ``aligned`` (``aligned`` ≥ 0.5), ``broad`` (``entropy_norm`` ≥ 0.8),
else ``mixed``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..hf.capture import AttentionCapture
from ..hf.load import HFModel, right_padding
from ..hf.sites import find_sites
from ..progress import bar
from .metrics import HeadStatistics, TokenInfo
from .patterns import flags_for, label_for
from .report import Report, head_records

__all__ = ["CROSS_METRICS", "CrossStatistics", "analyze_encoder_decoder", "cross_label"]

CROSS_METRICS = ("entropy", "entropy_norm", "max_weight", "diagonal_distance", "aligned", "source_special")


class CrossStatistics:
    """Running sums of the cross-attention metrics for an (L, H) grid of heads."""

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self.sums = torch.zeros(len(CROSS_METRICS), num_layers, num_heads, dtype=torch.float64)
        self.counts = torch.zeros(len(CROSS_METRICS), num_layers, num_heads, dtype=torch.float64)

    def update(self, layer: int, weights: Tensor, queries: TokenInfo, keys: TokenInfo) -> None:
        """weights (B, H, T, S): decoder queries (``queries``, T) over source keys (``keys``, S)."""
        B, H, T, _ = weights.shape
        p = weights.detach().float()  # (B, H, T, S)
        q_valid, k_valid = queries.valid.to(p.device), keys.valid.to(p.device)  # (B, T), (B, S)
        n_src = k_valid.sum(-1).float()  # (B,)
        n_tgt = q_valid.sum(-1).float()  # (B,)
        i = (q_valid.long().cumsum(-1) - 1).float()  # (B, T) position among real target tokens
        j = (k_valid.long().cumsum(-1) - 1).float()  # (B, S) position among real source tokens
        a = i * ((n_src - 1) / (n_tgt - 1).clamp_min(1))[:, None]  # (B, T) aligned source position
        offset = (j[:, None, :] - a[:, :, None]).abs()  # (B, T, S)
        offset = offset.masked_fill(~k_valid[:, None, :], 0.0)
        n_vis = k_valid.sum(-1, keepdim=True).float().expand(B, T)  # (B, T) keys each row may see
        entropy = -p.add(1e-30).log().mul(p).sum(-1)  # (B, H, T)
        special = (keys.first | keys.separator).to(p.device).float()  # (B, S)
        rows = q_valid[:, None, :].expand(B, H, T)
        informative = rows & (n_vis[:, None, :] > 1)
        values = {
            "entropy": (entropy, rows),
            "entropy_norm": (entropy / n_vis.clamp_min(2).log()[:, None, :], informative),
            "max_weight": (p.amax(-1), rows),
            "diagonal_distance": ((p * offset[:, None]).sum(-1), rows),
            "aligned": ((p * (offset[:, None] <= 1)).sum(-1), rows),
            "source_special": ((p * special[:, None, None, :]).sum(-1), rows),
        }
        for name, (value, where) in values.items():
            m = CROSS_METRICS.index(name)
            w = where.to(torch.float64)
            self.sums[m, layer] += (value.to(torch.float64) * w).sum(dim=(0, 2)).cpu()
            self.counts[m, layer] += w.sum(dim=(0, 2)).cpu()

    def means(self) -> dict[str, Tensor]:
        out = self.sums / self.counts.where(self.counts > 0, torch.full_like(self.counts, math.nan))
        return {name: out[k] for k, name in enumerate(CROSS_METRICS)}


def cross_label(metrics: dict[str, float]) -> str:
    """The label of a cross-attention head (rules in the module docstring)."""
    def at_least(key: str, threshold: float) -> bool:
        value = metrics.get(key, math.nan)
        return not math.isnan(value) and value >= threshold

    if at_least("source_special", 0.5):
        return "source-special"
    if at_least("aligned", 0.5):
        return "aligned"
    if at_least("entropy_norm", 0.8):
        return "broad"
    return "mixed"


def analyze_encoder_decoder(model: HFModel, texts: Sequence[str], targets: Sequence[str] | None = None, *,
                            batch_size: int = 32, truncate: bool = False,
                            progress: bool | None = None) -> Report:
    """The three stacks of an encoder–decoder ``model`` over ``texts`` (targets: teacher-forced)."""
    from .analyze import _token_info, check_texts, count_unknown_tokens

    texts = check_texts(texts)
    targets = check_texts(targets) if targets is not None else list(texts)
    if len(targets) != len(texts):
        raise ValueError(f"got {len(targets)} targets for {len(texts)} texts; give one target per text")
    sites = find_sites(model.model)
    shape = {stack: (len({s.layer for s in sites if s.stack == stack}),
                     max(s.num_heads for s in sites if s.stack == stack)) for stack in ("encoder", "decoder", "cross")}
    tok = model.tokenizer
    limit = model.max_positions
    cut = {"truncation": bool(truncate and limit), "max_length": limit if truncate else None, "verbose": False}
    source = tok(list(texts), **cut)["input_ids"]
    target = tok(list(targets), **cut)["input_ids"]
    if limit and not truncate:
        for i, ids in enumerate([*source, *target]):
            if len(ids) > limit:
                which = f"text {i + 1}" if i < len(source) else f"target {i - len(source) + 1}"
                raise ValueError(f"{which} has {len(ids)} tokens; the model takes at most {limit} "
                                 "(shorten it or use truncate=True / --truncate)")
    unknown = count_unknown_tokens([*source, *target], tok)
    config = model.model.config
    start = next((t for t in (getattr(config, "decoder_start_token_id", None), tok.pad_token_id) if t is not None), 0)
    decoder = [[start, *ids[:-1]] for ids in target]  # teacher forcing: each position predicts the next
    special = {t for t in (tok.sep_token_id, tok.eos_token_id) if t is not None}
    stats = {"encoder": HeadStatistics(*shape["encoder"]), "decoder": HeadStatistics(*shape["decoder"])}
    cross = CrossStatistics(*shape["cross"])
    infos: dict[str, TokenInfo] = {}
    cache: dict[int, bool] = {}

    def watch(stack: str):
        def on_layer(layer: int, weights: Tensor, out: Tensor, visible: Tensor) -> None:
            if stack == "cross":
                cross.update(layer, weights, infos["decoder"], infos["encoder"])
            else:
                stats[stack].update(layer, weights, visible, infos[stack])
        return on_layer

    order = sorted(range(len(texts)), key=lambda i: len(source[i]))
    batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    captures = [AttentionCapture(model.model, watch(stack), stack=stack) for stack in ("encoder", "decoder", "cross")]
    with right_padding(tok), captures[0], captures[1], captures[2], torch.inference_mode():
        for batch_ids in bar(batches, desc="analyze", unit="batch", progress=progress):
            src = tok.pad({"input_ids": [source[i] for i in batch_ids]}, return_tensors="pt")
            dec = tok.pad({"input_ids": [decoder[i] for i in batch_ids]}, return_tensors="pt")
            infos["encoder"] = _token_info(src["input_ids"], src["attention_mask"].bool(), special, tok, cache)
            infos["decoder"] = _token_info(dec["input_ids"], dec["attention_mask"].bool(), special, tok, cache)
            stats["encoder"].add_batch(infos["encoder"])
            stats["decoder"].add_batch(infos["decoder"])
            model.body(input_ids=src["input_ids"], attention_mask=src["attention_mask"],
                       decoder_input_ids=dec["input_ids"], decoder_attention_mask=dec["attention_mask"])
    sections = {}
    if unknown.token is not None:
        sections["unknown_tokens"] = {"count": unknown.count, "total": unknown.total,
                                      "share": round(unknown.share, 6), "token": unknown.token}
    reports = {stack: Report(model.name, stack == "decoder", *shape[stack], stats[stack].sentences,
                             stats[stack].tokens, head_records(stats[stack].means(), label_for, flags_for), None, {},
                             stack)
               for stack in ("encoder", "decoder")}
    reports["cross"] = Report(model.name, False, *shape["cross"], stats["decoder"].sentences, stats["decoder"].tokens,
                              head_records(cross.means(), cross_label), None, {}, "cross")
    main = reports["encoder"]
    main.sections = sections
    main.stacks = {"decoder": reports["decoder"], "cross": reports["cross"]}
    return main
