"""Does a head matter? The change in the model's own objective when that head alone is removed.

Two ablations, each of one head at a time, every other head intact:

* ``zero_ablation``: the head's output is multiplied by 0 before W^O;
* ``mean_ablation``: the head's output is replaced by its mean over all real token positions of
  the analysed texts (so the layer still receives the head's average contribution, only not
  the part that depends on the input).

The objective is the model's own:

* a causal language model: the mean next-token cross-entropy over the texts' real tokens (nats
  per token); the effect is ablated minus intact, so a head the model needs has a positive effect;
* an encoder with a masked-LM head: the masked-LM loss on a fixed 15 % of the real, non-special
  tokens (chosen with a seeded generator, the same in every run), likewise;
* an encoder without one (sentence-embedding models such as MiniLM): the mean over texts of
  ``1 − cos(pooled, pooled_intact)``, the pooled vector being the mean of the last hidden states
  over real tokens.

Many heads per forward pass: each batch of texts is repeated R times and replica r has its head
removed by per-example gates (L, R·B, H) (:class:`~multihead.hf.HeadGates`), so all L·H heads
take ⌈L·H / R⌉ passes over each batch instead of L·H.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...attn.memory import LiveBytes, available_memory
from ...hf.capture import AttentionCapture
from ...hf.interventions import HeadGates, gate_gradients_only, replica_gates, self_attention_sites
from ...hf.logits import on_rows, token_losses
from ...hf.model import HFModel, forward_replaced, require_loaded, right_padding
from ...hf.route import AttentionChunk
from ...progress import bar
from ..sections import Ablation, unit_of
from ..stats.bootstrap import LEVEL, intervals

__all__ = ["ABLATION_TOKENS", "AblationEffects", "ablation_effects", "attribution_effects", "blocks_of",
           "has_gradient", "no_terms_reason", "objective_name", "objective_terms", "passes", "recorded", "replayed"]

#: Tokens per forward pass (R replicas x B texts x T positions) the batched ablation aims for.
ABLATION_TOKENS = 8192
#: Share of real, non-special tokens masked for the masked-LM objective, and its seed.
MLM_SHARE, MLM_SEED = 0.15, 0


@dataclass
class AblationEffects:
    """Per head (L, H): the objective's change when that head alone is removed (NaN: not measured).

    ``per_text``: {mode: (L, H, N) summed change per text} and ``text_counts`` (N,) the terms each
    text adds to the objective's mean, for the bootstrap intervals over texts (:meth:`intervals`)."""

    zero: Tensor
    mean: Tensor | None
    objective: str
    intact: float
    texts: int
    tokens: int
    per_text: dict[str, Tensor] | None = None
    text_counts: Tensor | None = None
    #: "exact" (every head ablated), or how the heads not ablated were estimated ("attribution")
    method: str = "exact"
    #: with method "attribution": the heads ablated exactly
    exact: list[tuple[int, int]] | None = None

    def metrics(self) -> dict[str, Tensor]:
        out = {"zero_ablation": self.zero}
        if self.mean is not None:
            out["mean_ablation"] = self.mean
        return out

    def intervals(self, *, level: float = LEVEL) -> dict[str, tuple[Tensor, Tensor]]:
        """{"zero_ablation": ((L, H) low, (L, H) high), ...}: bootstrap over the ablated texts (NaN
        for heads not ablated one by one)."""
        if self.per_text is None or self.text_counts is None:
            return {}
        out = {}
        for mode, change in self.per_text.items():  # (L, H, N)
            sums = change.permute(2, 0, 1)  # (N, L, H)
            measured = ~torch.isnan(sums[0])  # (L, H)
            counts = self.text_counts.double()[:, None, None].expand_as(sums) * measured  # (N, L, H)
            low, high = intervals(torch.nan_to_num(sums), counts, level=level)
            out[f"{mode}_ablation"] = (low, high)
        return out

    def section(self) -> Ablation:
        return Ablation(self.objective, round(self.intact, 6), self.texts, self.tokens, sorted(self.metrics()),
                        unit=unit_of(self.objective), method=self.method, exact=self.exact)


def objective_name(model: HFModel) -> str:
    if model.is_causal:
        return "next-token cross-entropy (nats per token)"
    if _has_mlm_head(model):
        return f"masked-LM cross-entropy on {MLM_SHARE:.0%} of the tokens (nats per masked token)"
    return "1 - cosine of the mean-pooled last hidden state to the intact one (mean over texts)"


def ablation_effects(model: HFModel, texts: Sequence[str], *, modes: Sequence[str] = ("zero", "mean"),
                     heads: Sequence[tuple[int, int]] | None = None, batch_size: int = 16,
                     heads_per_pass: int | None = None, progress: bool | None = None) -> AblationEffects:
    """Zero- and mean-ablation effects of every head (or of ``heads``) of a text model on ``texts``.

    ``heads_per_pass``: how many heads one forward pass removes (each in its own copy of the
    batch); default: as many as keep a pass near :data:`ABLATION_TOKENS` tokens. The numbers do
    not depend on it (tested). Texts longer than the model's positions are truncated.
    """
    model = require_loaded(model, "ablation_effects")
    if model.processor is not None or model.is_encoder_decoder:
        raise ValueError("ablation effects read text models with one self-attention stack")
    unknown = set(modes) - {"zero", "mean"}
    if unknown or not modes:
        raise ValueError(f"modes must be some of 'zero', 'mean'; got {list(modes)!r}")
    texts = list(texts)
    if not texts:
        raise ValueError("ablation effects need at least one text")
    L, H = model.num_layers, model.num_heads
    cells = list(heads) if heads is not None else [(layer, h) for layer in range(L) for h in range(H)]
    for layer, h in cells:
        if not (0 <= layer < L and 0 <= h < H):
            raise ValueError(f"head ({layer}, {h}) is outside the model's {L} x {H} heads")
    batches, rows = _batches(model, texts, batch_size, with_indices=True)
    counts = torch.zeros(len(texts), dtype=torch.float64)  # the terms each text adds to the mean
    for batch, indices in zip(batches, rows, strict=True):
        counts[indices] = _counts(model, batch)
    tokens = int(counts.sum())
    if tokens == 0:
        raise ValueError(no_terms_reason(model))
    blocks = blocks_of(model)
    per_text = {mode: torch.zeros(len(cells), len(texts), dtype=torch.float64) for mode in modes}
    intact_sum = 0.0
    with torch.inference_mode():
        means = _head_means(model, batches) if "mean" in modes else None
        for batch, indices in bar(list(zip(batches, rows, strict=True)), desc="ablation", unit="batch",
                                  progress=progress):
            B, T = batch["input_ids"].shape
            R = heads_per_pass or max(1, ABLATION_TOKENS // (B * T))
            with recorded(blocks) as outputs:  # the intact run; its block outputs are replayed below each pass
                intact = _run(model, batch)  # (B,) summed losses or (B, D) pooled states
            if intact.dim() == 1:
                intact_sum += float(intact.sum())
            index = torch.tensor(indices)
            for mode in modes:
                for group in passes(cells, R):  # [(index into cells, (layer, head)), ...]
                    change = _ablated(model, batch, [cell for _, cell in group], intact, blocks, outputs,
                                      means if mode == "mean" else None)  # (R, B)
                    picked = torch.tensor([n for n, _ in group])
                    per_text[mode][picked[:, None], index[None, :]] += change.cpu()  # a pass's (R, B), once
            del outputs
    denominator = len(texts) if _objective(model) == "cosine" else tokens
    found: dict[str, Tensor] = {}
    kept: dict[str, Tensor] = {}
    for mode, changes in per_text.items():
        effect = torch.full((L, H), float("nan"), dtype=torch.float64)
        by_text = torch.full((L, H, len(texts)), float("nan"), dtype=torch.float64)
        for n, (layer, h) in enumerate(cells):
            effect[layer, h] = changes[n].sum() / denominator
            by_text[layer, h] = changes[n]
        found[mode], kept[mode] = effect, by_text
    return AblationEffects(found.get("zero", torch.full((L, H), float("nan"), dtype=torch.float64)),
                           found.get("mean"), objective_name(model), intact_sum / denominator, len(texts), tokens,
                           per_text=kept, text_counts=counts)


def attribution_effects(model: HFModel, texts: Sequence[str], *, modes: Sequence[str] = ("zero", "mean"),
                        batch_size: int = 16, budget: int | None = None) -> dict[str, Tensor]:
    """First-order estimates of :func:`ablation_effects` for every head at once (attribution
    patching): with gates ξ on every head, a head's ablation moves its ξ from 1 to 0, so the
    objective changes by about ``-∂objective/∂ξ`` — one forward and one backward pass per batch
    (and mode) for all heads. Mean ablation takes the gradient with the heads' mean outputs as the
    replacement (``out = ξ·out + (1 − ξ)·mean``).

    Loss objectives only: for an encoder without a language-model head the objective
    ``1 − cos`` is at its minimum in the intact model, its gradient is 0 and says nothing.
    Returns {"zero_ablation": (L, H), "mean_ablation": (L, H)} in the objective's units.

    A backward pass holds the activations of its whole batch: SmolLM2 ~0.86 GB a text of 500
    tokens, an 8B model several GB. So a batch's texts go through in parts that fit ``budget``
    bytes (default: :data:`GRADIENT_SHARE` of the free memory where the inputs go, on a CPU at most
    :data:`GRADIENT_BYTES`; where the free memory is unknown, whole batches): the longest text
    alone, its pass's peak of tensor bytes measured (:func:`_measured_pass`) and scaled to each
    batch's length, then as many texts a pass as fit. The gradients add up over the parts to the
    batch's (the objective is a sum over texts).
    """
    model = require_loaded(model, "attribution_effects")
    if _objective(model) == "cosine":
        raise ValueError("attribution patching needs a loss objective; 1 - cosine is at its minimum in the intact "
                         "model (gradient 0): measure this model with ablation_effects")
    texts = list(texts)
    if not texts:
        raise ValueError("attribution effects need at least one text")
    batches = _batches(model, texts, batch_size)
    tokens = sum(_count(model, batch) for batch in batches)
    if tokens == 0:
        raise ValueError(no_terms_reason(model))
    with torch.inference_mode():
        means = _head_means(model, batches) if "mean" in modes else None
    L, H = model.num_layers, model.num_heads
    found = {}
    device = torch.device(model.device)
    if budget is None:
        free = available_memory(device)
        cap = GRADIENT_BYTES if device.type == "cpu" else None  # measured on a CPU; a GPU's batches gain more
        budget = None if free is None else min(int(GRADIENT_SHARE * free), cap or free)
    # longest first: the longest text measured once, an upper bound for every shorter one (its pass's
    # bytes grow with its length T and its maps with T²: a text of T <= T0 takes at most T / T0 of it)
    batches = sorted(batches, key=lambda batch: -batch["input_ids"].shape[1])
    longest: tuple[int, int] | None = None  # (T0, the peak tensor bytes of one text of T0 real tokens)

    def backward(part: dict[str, Tensor]) -> None:
        (_run(model, part).sum() / tokens).backward()

    with gate_gradients_only(model.model):
        for mode in modes:
            gates = torch.ones(L, H, requires_grad=True)
            with HeadGates(model.model, gates, replacement=means.float() if mode == "mean" else None):
                for batch in batches:
                    B, T = batch["input_ids"].shape
                    last = B  # the texts run in parts below: all of them, or all but the longest, measured here
                    if budget is not None and longest is None and B > 1:
                        # the batch's longest text (its last: _buckets orders them by length) has all T tokens
                        longest = (T, _measured_pass(device, backward, _texts(batch, B - 1, B)))
                        last = B - 1
                    step = B
                    if budget is not None and longest is not None:
                        step = max(1, budget // max(1, longest[1] * T // longest[0]))
                    for first in range(0, last, step):
                        backward(_texts(batch, first, min(first + step, last)))
            found[f"{mode}_ablation"] = -gates.grad.double()
    return found


#: The share of the free memory where a model's inputs go that one backward pass of
#: :func:`attribution_effects` takes by default (the rest: what else the process and the device
#: hold), and on a CPU at most GRADIENT_BYTES: larger passes gain nothing there (SmolLM2 in float32
#: on 16 texts of 500 tokens: 105.6 s in one pass, 13.9 GB above the model; 73-82 s in parts of
#: 2 GiB, 3.4 GB; Intel Xeon with AMX, 2 threads).
GRADIENT_SHARE = 0.5
GRADIENT_BYTES = 2 << 30


def _texts(batch: dict[str, Tensor], first: int, stop: int) -> dict[str, Tensor]:
    """Texts ``first`` .. ``stop`` of a padded batch (every entry's rows)."""
    return {key: value[first:stop] for key, value in batch.items()}


def _measured_pass(device: torch.device, run, part: dict[str, Tensor]) -> int:
    """Run ``run(part)`` (a forward and backward pass) and return the most bytes of tensors on
    ``device``'s kind it held at once (:class:`~multihead.attn.memory.LiveBytes`: the tensors' own
    storage, on any device — not CUDA's peak statistic, which a caller may be reading)."""
    with LiveBytes(device.type) as live:
        run(part)
    return live.peak


def passes(cells: list[tuple[int, int]], R: int) -> list[list[tuple[int, tuple[int, int]]]]:
    """The heads in passes of at most R, each pass within one layer: a pass replays every block
    below its lowest layer, so mixing layers would recompute blocks a pass of its own skips."""
    by_layer: dict[int, list[tuple[int, tuple[int, int]]]] = {}
    for n, cell in enumerate(cells):
        by_layer.setdefault(cell[0], []).append((n, cell))
    return [heads[s:s + R] for _, heads in sorted(by_layer.items()) for s in range(0, len(heads), R)]


def has_gradient(model: HFModel) -> bool:
    """Whether the model's objective has a gradient to estimate ablations with (a loss; not 1 − cos)."""
    return _objective(model) != "cosine"


def objective_terms(model: HFModel, texts: Sequence[str], batch_size: int = 16) -> int:
    """How many terms ``texts`` give the model's ablation objective (:func:`objective_name`): the
    tokens a causal LM predicts (each text's after its first), the tokens masked for a masked LM, or
    one a text — from the tokenizer alone, no forward. 0: nothing to measure an ablation on."""
    return int(sum(_counts(model, batch).sum() for batch in _batches(model, list(texts), batch_size)))


def no_terms_reason(model: HFModel) -> str:
    """Why texts give the objective no term, and what would."""
    if _objective(model) == "next-token":
        return ("ablation effects need a token to predict: every text is a single token (a causal LM's "
                "loss is on the tokens after the first); give texts of two tokens or more")
    return (f"ablation effects need a masked token: none of the texts' tokens was drawn for the "
            f"masked-LM objective ({MLM_SHARE:.0%} of each text's tokens); give longer texts")


def _objective(model: HFModel) -> str:
    if model.is_causal:
        if not model.has_lm_head:  # ablation_effects / attribution_effects called on it in Python
            raise ValueError(f"ablation measures heads against the model's own objective; {model.name} is "
                             f"{model.HEADLESS}")
        return "next-token"
    return "masked-lm" if _has_mlm_head(model) else "cosine"


def _has_mlm_head(model: HFModel) -> bool:
    return model.has_lm_head and getattr(model.tokenizer, "mask_token_id", None) is not None


def _batches(model: HFModel, texts: list[str], batch_size: int, *, with_indices: bool = False):
    """The texts in padded batches of similar length; with ``with_indices``, also each batch's text indices."""
    tok = model.tokenizer
    limit = model.max_positions
    encoded = tok(texts, truncation=bool(limit), max_length=limit, verbose=False)["input_ids"]
    out, rows = [], []
    with right_padding(tok):
        for indices in _buckets([len(ids) for ids in encoded], batch_size):
            batch = dict(tok.pad({"input_ids": [encoded[i] for i in indices]}, return_tensors="pt"))
            if _objective(model) == "masked-lm":
                batch["labels"], batch["input_ids"] = _mlm_inputs(model, batch)
            out.append(batch)
            rows.append(indices)
    return (out, rows) if with_indices else out


#: A batch closes before padding would exceed this share of its real tokens: every ablation pass
#: computes its padding once per replica (measured: 64 Penn Treebank sentences in one batch were
#: 48 % padding).
MAX_PADDING = 0.1


#: ... unless it holds fewer tokens than this: a pass removes at most one layer's heads, so a batch
#: of a few short texts would make passes too small for efficient matrix products.
MIN_BATCH_TOKENS = 512


def _buckets(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Text indices in batches of at most ``batch_size`` of similar length, shortest first, each
    padded by at most :data:`MAX_PADDING` of its real tokens unless it is small (see
    :data:`MIN_BATCH_TOKENS`)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    real = 0
    for i in order:
        n = lengths[i]  # the longest so far: the batch would be padded to it
        padded = (len(out[-1]) + 1) * n if out else 0
        little = padded <= (1 + MAX_PADDING) * (real + n) or padded <= MIN_BATCH_TOKENS
        if out and len(out[-1]) < batch_size and little:
            out[-1].append(i)
            real += n
        else:
            out.append([i])
            real = n
    return out


def _mlm_inputs(model: HFModel, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Labels (-100 where not masked) and inputs with MLM_SHARE of the real, non-special tokens
    masked: each text's choice seeded by its own tokens, so it depends on nothing else (not on the
    texts batched with it, nor on its place in the corpus)."""
    ids = batch["input_ids"]
    special = torch.tensor([t in set(model.tokenizer.all_special_ids) for t in ids.flatten().tolist()]).view_as(ids)
    candidates = batch["attention_mask"].bool() & ~special
    draws = []
    for row, valid in zip(ids, batch["attention_mask"].bool(), strict=True):
        seed = MLM_SEED + zlib.crc32(row[valid].numpy().astype("<i8").tobytes())
        draws.append(torch.rand(ids.shape[1], generator=torch.Generator().manual_seed(seed)))
    draws = torch.stack(draws)  # (B, T)
    chosen = candidates & (draws < MLM_SHARE)
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return labels, torch.where(chosen, torch.full_like(ids, model.tokenizer.mask_token_id), ids)


def _run(model: HFModel, batch: dict[str, Tensor]) -> Tensor:
    """The model's per-example objective terms for ``batch``: (B,) summed losses, or (B, D) pooled states."""
    batch = {key: value.to(model.device) for key, value in batch.items()}  # where the model's inputs go
    ids, attention = batch["input_ids"], batch["attention_mask"]
    kind = _objective(model)
    if kind == "cosine":
        hidden = model.body(input_ids=ids, attention_mask=attention, **model.no_cache).last_hidden_state  # (B, T, D)
        keep = attention[..., None].to(hidden.device, hidden.dtype)  # a device map may end on another GPU
        return (hidden * keep).sum(1) / keep.sum(1).clamp_min(1)  # (B, D)
    if kind == "next-token":  # position t predicts token t + 1
        targets = torch.where(attention[:, 1:].bool(), ids[:, 1:], torch.full_like(ids[:, 1:], -100))
        targets = torch.cat([targets, torch.full_like(ids[:, :1], -100)], 1)  # (B, T)
    else:
        targets = batch["labels"]  # (B, T)
    scored = targets != -100  # (B, T) the positions the objective reads
    extra = {"use_cache": False} if kind == "next-token" else {}  # no cache: blocks may be replayed (_replayed)
    wanted = targets[scored]  # (N,) in the scored rows' order
    # the output layer only where a token is predicted, a part of the rows at a time (8,192 rows of a
    # 128k vocabulary's float32 logits would be 4 GB)
    loss = on_rows(model, dict(input_ids=ids, attention_mask=attention, **extra), scored,
                   lambda logits, part: token_losses(logits, wanted[part]))  # (N,)
    row = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(scored)[scored]  # (N,) each row's example
    return torch.zeros(ids.shape[0], dtype=torch.float64, device=loss.device).index_add_(
        0, row.to(loss.device), loss.double())  # (B,)


def _count(model: HFModel, batch: dict[str, Tensor]) -> int:
    """Terms the objective averages over in this batch: predicted tokens, masked tokens, or texts."""
    return int(_counts(model, batch).sum())


def _counts(model: HFModel, batch: dict[str, Tensor]) -> Tensor:
    """(B,) the terms each text of the batch adds: its predicted tokens, masked tokens, or 1."""
    kind = _objective(model)
    if kind == "next-token":
        return batch["attention_mask"][:, 1:].sum(-1).double()
    if kind == "masked-lm":
        return (batch["labels"] != -100).sum(-1).double()
    return torch.ones(batch["input_ids"].shape[0], dtype=torch.float64)


def _head_means(model: HFModel, batches: list[dict[str, Tensor]]) -> Tensor:
    """Every head's mean output (before W^O) over the real tokens of all batches: (L, H, Dv)."""
    sums: dict[int, Tensor] = {}
    valid_box: list[Tensor] = []

    def add(chunk: AttentionChunk) -> None:
        out = chunk.outputs  # (B, H, c, Dv)
        keep = valid_box[0][:, chunk.start:chunk.stop].to(out.device, out.dtype)[:, None, :, None]  # (B, 1, c, 1) real
        total = (out * keep).sum(dim=(0, 2)).double()  # (H, Dv)
        layer = chunk.layer
        sums[layer] = total if layer not in sums else sums[layer] + total

    with AttentionCapture(model.model, add):
        for batch in batches:
            valid_box[:] = [batch["attention_mask"].bool()]
            # the base model alone: the heads' outputs need no logits
            model.body(input_ids=batch["input_ids"].to(model.device),
                       attention_mask=batch["attention_mask"].to(model.device), **model.no_cache)
    counted = sum(float(batch["attention_mask"].sum()) for batch in batches)
    return torch.stack([sums[layer] for layer in range(model.num_layers)]) / counted  # (L, H, Dv)


def _ablated(model: HFModel, batch: dict[str, Tensor], group: list[tuple[int, int]], intact: Tensor,
             blocks: list[nn.Module] | None, outputs: list, means: Tensor | None) -> Tensor:
    """The objective change of each text of the batch (its summed terms) for each head of ``group``
    removed alone: (len(group), B).

    The blocks below the group's lowest layer compute what they computed in the intact run, for
    every replica: they are not run again — each returns its intact output, repeated R times.
    """
    R, B = len(group), batch["input_ids"].shape[0]
    L, H = model.num_layers, model.num_heads
    gates = replica_gates(L, H, [[cell] for cell in group], B)
    repeated = {k: v.repeat(R, *([1] * (v.dim() - 1))) for k, v in batch.items()}
    lowest = min(layer for layer, _ in group)
    with HeadGates(model.model, gates, replacement=None if means is None else means.float()), \
            replayed(blocks[:lowest] if blocks else [], outputs or [], R):
        terms = _run(model, repeated)  # (R·B,) or (R·B, D)
    if terms.dim() == 2:  # pooled states: 1 - cosine to the intact ones
        change = 1 - F.cosine_similarity(terms.double(), intact.double().repeat(R, 1), dim=-1)
    else:
        change = terms - intact.repeat(R)
    return change.view(R, B)


def blocks_of(model: HFModel) -> list[nn.Module] | None:
    """The model's transformer blocks in layer order (block i holds attention site i), or None
    when they cannot be told apart (then every ablation pass runs every block)."""
    sites = self_attention_sites(model.model)
    for module in model.body.modules():
        if isinstance(module, nn.ModuleList) and len(module) == len(sites) == model.num_layers and all(
                any(m is site.module for m in block.modules()) for block, site in zip(module, sites, strict=True)):
            return list(module)
    return None


@contextlib.contextmanager
def recorded(blocks: list[nn.Module] | None):
    """Record what each block returns (detached), in order, while the context is open."""
    outputs: list = []
    if not blocks:
        yield outputs
        return
    handles = [b.register_forward_hook(lambda _m, _a, out: outputs.append(out)) for b in blocks]
    try:
        yield outputs
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def replayed(blocks: list[nn.Module], outputs: list, repeats: int):
    """Blocks that return their recorded output, each tensor repeated ``repeats`` times along the
    batch, instead of computing it (their input would be the same for every replica)."""

    def repeat(value):
        if isinstance(value, Tensor):
            return value.repeat(repeats, *([1] * (value.dim() - 1)))
        if isinstance(value, tuple):
            return tuple(repeat(v) for v in value)
        return value

    def returning(value):
        # repeated when called, not when the context opens: the model lets one block's output go at the
        # next's, so one replica-sized copy lives at a time, not one for every block replayed (on an 8B
        # model's last layer at 8,192 tokens a pass: 31 x 67 MB)
        return lambda *_args, **_kwargs: repeat(value)

    # each block's own instance forward kept aside, where it has one (accelerate's hooks of a device map wrap it so)
    with contextlib.ExitStack() as stack:
        for block, out in zip(blocks, outputs, strict=False):
            stack.enter_context(forward_replaced(block, returning(out)))
        yield
