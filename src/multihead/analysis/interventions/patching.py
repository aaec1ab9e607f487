"""Activation patching: which heads carry what makes the clean answer win over the wrong one?

Two texts of the same length in tokens: a *clean* one, on which the model should prefer
``answer`` over ``wrong`` ("The capital of France is" → " Paris" rather than " Rome"), and a
*corrupt* one that differs only where it matters ("The capital of Italy is"). The logit
difference ``LD = logit(answer) − logit(wrong)`` is read where the answer is predicted: after the
last token (causal language models) or at the one mask token (masked language models).

Patching a head means running the corrupt text with that head's output (before W^O) replaced,
at every position, by its output in the clean run; every other head computes as usual on the
corrupt run's own inputs. The head's score is the share of the gap it restores:

    restored = (LD_patched − LD_corrupt) / (LD_clean − LD_corrupt)

1 means patching this head alone brings back the clean answer's whole advantage, 0 nothing,
negative values push the wrong way. Patching every head of every layer restores exactly 1
whenever the texts differ before the answer position: attention is the only path between
positions, so the answer position's residual stream is then the clean one.

``method="exact"`` patches each head in a forward pass of its own (many heads per pass through
per-example gates); ``method="attribution"`` estimates all of them from one forward and one
backward pass of the corrupt run (attribution patching: the change is about −∂LD/∂ξ for the gate
ξ that mixes ``ξ·corrupt + (1 − ξ)·clean``) — exact for a model linear in the patched head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ...data import PATCHING_EXAMPLES
from ...hf.interventions import HeadGates, gate_gradients_only, replica_gates
from ...hf.model import HFModel, require_loaded
from ...hf.sites import UnsupportedModelError
from ...inputs import text_tokens
from .direct import head_attribution
from .final import final_norm
from .runs import answer_position, check_answerable, clean_run, logit_diff, single_token, text_ids

__all__ = ["EXAMPLES", "PATCH_TOKENS", "SCHEMA", "Patching", "answer_position", "patch", "patch_heads",
           "single_token"]

SCHEMA = "multihead.patching/1"

#: Shipped examples: see :data:`multihead.data.PATCHING_EXAMPLES`.
EXAMPLES = PATCHING_EXAMPLES

#: Tokens one exact patching pass holds (replicas × text length).
PATCH_TOKENS = 4096
#: A clean-vs-corrupt gap smaller than this (in logits) leaves nothing to restore.
SMALLEST_GAP = 1e-4


@dataclass
class Patching:
    """Per head (L, H): the change of the logit difference when that head alone is patched."""

    tokens: list[str]
    corrupt_tokens: list[str]
    answer: str
    wrong: str
    #: the position (in tokens) whose prediction is read
    position: int
    clean_diff: float
    corrupt_diff: float
    #: LD_patched − LD_corrupt, (L, H)
    change: Tensor
    method: str
    #: direct logit attribution of each head in the clean run (decoders; None otherwise), (L, H)
    direct: Tensor | None = field(default=None)
    #: the smallest gap that is the model's preference, not rounding: SMALLEST_GAP, or ROUNDING_STEPS
    #: steps of the logits' dtype at their size (bfloat16 logits of 20: 0.6)
    resolution: float = SMALLEST_GAP
    #: the dtype the model computed its logits in
    dtype: str = "float32"

    @property
    def gap(self) -> float:
        return self.clean_diff - self.corrupt_diff

    def no_share(self) -> str | None:
        """Why the gap cannot be shared out (None when it can): the runs give the same logit
        difference, or differences within the rounding of the model's dtype."""
        if abs(self.gap) < SMALLEST_GAP:
            return (f"the clean and corrupt runs give the same logit difference ({self.clean_diff:.4g}): there is "
                    "nothing to restore; choose texts on which the model's preference differs")
        if abs(self.gap) < self.resolution:
            return (f"the clean and corrupt logit differences ({self.clean_diff:+.4f}, {self.corrupt_diff:+.4f}) are "
                    f"{abs(self.gap):.4f} apart, within {self.dtype}'s rounding of logits this size "
                    f"(±{self.resolution:.4f}): a share of that gap would be rounding noise; choose texts on which "
                    "the model's preference differs more, or run in float32")
        return None

    def within_rounding(self) -> Tensor:
        """(L, H) bool: the heads whose change of the logit difference is under :attr:`resolution`, so
        within the rounding of the model's logits (a bfloat16 SmolLM2's ±0.005 shares are one or two
        of its steps): a map draws them as nothing, not as a share."""
        return self.change.abs() < self.resolution

    def small_gap(self) -> str | None:
        """Why the shares are hard to read, where single heads move the logit difference far more than the
        clean and corrupt runs differ (a share beyond ±2), else None: the changes then say more."""
        if self.no_share() is not None:
            return None
        largest = float(self.change.abs().max()) if self.change.numel() else 0.0
        if largest <= 2 * abs(self.gap):
            return None
        return (f"shares beyond ±2: the clean and corrupt runs' logit differences are only {abs(self.gap):.4f} apart "
                f"(gap {self.gap:+.4f}) while single heads move it by up to {largest:.4f} — the texts barely differ "
                "for this model; read the changes (patching.json's \"change\") rather than the shares")

    def how(self) -> str:
        """How each head's change was found, in words that follow "restored": patched, or estimated
        (``method``)."""
        if self.method == "attribution":
            return ("as estimated by attribution patching (first order: one forward and one backward) of each "
                    "head's clean output into the corrupt run")
        return "by patching each head's clean output into the corrupt run"

    def rounding_words(self) -> str:
        """What a map's cells within the rounding (:meth:`within_rounding`) hide, in words."""
        share = f"; a share under ±{self.resolution / abs(self.gap):.3f}" if self.no_share() is None else ""
        return (f"a change under ±{self.resolution:.3g} logits, within {self.dtype}'s rounding of logits this "
                f"size{share}")

    @property
    def restored(self) -> Tensor:
        """(L, H) share of the clean-vs-corrupt gap each head restores; ValueError with
        :meth:`no_share`'s reason when there is no gap to share."""
        why = self.no_share()
        if why is not None:
            raise ValueError(why)
        return self.change / self.gap

    def top(self, n: int = 5) -> list[tuple[tuple[int, int], float]]:
        """The (at most) n heads restoring the largest share toward the clean run's logit difference, as
        ((layer, head), share): positive shares beyond the logits' rounding (:meth:`within_rounding`) only —
        a head the map draws as nothing is no answer, nor one that moves the other way."""
        share = self.restored.flatten()
        kept = (share > 0) & ~self.within_rounding().flatten()
        order = [int(i) for i in torch.argsort(share, descending=True) if kept[i]][:n]
        H = self.restored.shape[1]
        return [((i // H, i % H), float(share[i])) for i in order]

    def top_words(self, n: int = 5) -> str:
        """:meth:`top` as one line: "restore most: L9.H6 +0.412, …", or why no head is listed."""
        found = self.top(n)
        if not found:
            return "restore most: no head restores a share beyond the logits' rounding"
        return "restore most: " + ", ".join(f"L{layer}.H{h} {v:+.3f}" for (layer, h), v in found)

    def to_dict(self) -> dict:
        out = {"schema": SCHEMA, "tokens": self.tokens, "corrupt_tokens": self.corrupt_tokens, "answer": self.answer,
               "wrong": self.wrong, "position": self.position, "clean_diff": round(self.clean_diff, 6),
               "corrupt_diff": round(self.corrupt_diff, 6), "method": self.method, "dtype": self.dtype,
               "resolution": round(self.resolution, 6), "change": _rounded(self.change)}
        why = self.no_share()
        if why is None:
            out["restored"] = _rounded(self.restored)
        else:
            out["no_share"] = why
        if self.direct is not None:
            out["direct"] = _rounded(self.direct)
        return out


def patch(model: HFModel, clean: str, corrupt: str, answer: str, wrong: str, *, method: str = "exact",
          heads_per_pass: int | None = None) -> Patching:
    """Patch every head's clean output into the corrupt run, one head at a time (see the module).

    ``answer`` / ``wrong``: one token each, as the tokenizer writes it after the text (mind the
    leading space: " Paris"). For a decoder the result also carries each head's direct logit
    attribution in the clean run (:func:`~multihead.analysis.interventions.direct.direct_logit_attribution`).
    """
    if method not in ("exact", "attribution"):
        raise ValueError(f"method must be 'exact' or 'attribution'; got {method!r}")
    model = require_loaded(model, "patch")
    ids_clean, ids_corrupt, a, b, position = _prepared(model, clean, corrupt, answer, wrong)
    L, H = model.num_layers, model.num_heads
    attributable = model.is_causal and _has_final_norm(model)  # direct logit attribution reads it
    clean_pass = clean_run(model, ids_clean, position, a, b, residual=attributable)
    corrupt_pass = clean_run(model, ids_corrupt, position, a, b)  # the same kernel as the patched runs
    clean_out, clean_diff, corrupt_diff = clean_pass.outputs, clean_pass.diff, corrupt_pass.diff
    if method == "exact":
        R = heads_per_pass or max(1, PATCH_TOKENS // ids_clean.shape[1])
        cells = [[(layer, h)] for layer in range(L) for h in range(H)]
        diffs = torch.cat([_patched(model, ids_corrupt, position, a, b, clean_out, cells[s:s + R])
                           for s in range(0, len(cells), R)])  # (L·H,)
        change = (diffs.double() - corrupt_diff).view(L, H)
    else:
        gates = torch.ones(L, H, requires_grad=True)
        with gate_gradients_only(model.model), HeadGates(model.model, gates, replacement=clean_out):
            logit_diff(model, ids_corrupt, position, a, b).sum().backward()
        change = -gates.grad.double()
    # direct logit attribution from the clean run itself: its heads' outputs at the answer position
    direct = head_attribution(model, clean_out[:, 0, :, position], clean_pass.residual, a, b) if attributable else None
    tok = model.tokenizer
    dtype = str(clean_pass.dtype).removeprefix("torch.")
    return Patching(_tokens(tok, ids_clean, clean), _tokens(tok, ids_corrupt, corrupt), answer, wrong, position,
                    clean_diff, corrupt_diff, change, method, direct,
                    resolution=max(SMALLEST_GAP, clean_pass.rounding, corrupt_pass.rounding), dtype=dtype)


def patch_heads(model: HFModel, clean: str, corrupt: str, answer: str, wrong: str,
                heads: Sequence[tuple[int, int]]) -> float:
    """The corrupt run's logit difference with all of ``heads`` patched together (their clean
    outputs at every position); no heads: the corrupt run's own, every head: the clean run's."""
    model = require_loaded(model, "patch_heads")
    ids_clean, ids_corrupt, a, b, position = _prepared(model, clean, corrupt, answer, wrong)
    for layer, h in heads:
        if not (0 <= layer < model.num_layers and 0 <= h < model.num_heads):
            raise ValueError(f"head ({layer}, {h}) is outside the model's {model.num_layers} x {model.num_heads} heads")
    clean_out = clean_run(model, ids_clean, position, a, b).outputs
    return float(_patched(model, ids_corrupt, position, a, b, clean_out, [list(heads)])[0])


def _prepared(model: HFModel, clean: str, corrupt: str, answer: str,
              wrong: str) -> tuple[Tensor, Tensor, int, int, int]:
    """Token ids of both texts (1, T), the two answers' ids and where the answer is read — or a
    ValueError naming what is wrong with the input."""
    if model.processor is not None or model.is_encoder_decoder:
        raise ValueError("activation patching reads text models with one self-attention stack")
    check_answerable(model)  # before the texts: a model with no answer to read is the first thing wrong
    tok = model.tokenizer
    ids_clean, ids_corrupt = text_ids(model, clean), text_ids(model, corrupt)
    if ids_clean.shape != ids_corrupt.shape:
        raise ValueError(
            f"the clean and corrupt texts must have the same number of tokens (each head's output is swapped position "
            f"by position); clean has {ids_clean.shape[1]}: {_tokens(tok, ids_clean, clean)}, corrupt has "
            f"{ids_corrupt.shape[1]}: {_tokens(tok, ids_corrupt, corrupt)}")
    a, b = single_token(tok, answer, "answer"), single_token(tok, wrong, "wrong")
    if a == b:
        raise ValueError(f"answer and wrong are the same token ({answer!r}); patching needs two different answers")
    position = answer_position(model, ids_clean)
    if answer_position(model, ids_corrupt) != position:
        raise ValueError("the corrupt text must hold its mask token where the clean text does")
    return ids_clean, ids_corrupt, a, b, position


def _has_final_norm(model: HFModel) -> bool:
    try:
        final_norm(model)
    except UnsupportedModelError:
        return False
    return True


def _patched(model: HFModel, ids_corrupt: Tensor, position: int, a: int, b: int, clean_out: Tensor,
             groups: list[list[tuple[int, int]]]) -> Tensor:
    """(len(groups),) logit differences of the corrupt run, each with one group of heads patched
    (each group in its own copy of the text, one forward pass for all)."""
    L, _, H = clean_out.shape[:3]
    gates = replica_gates(L, H, groups, 1)
    fill = clean_out.expand(-1, len(groups), -1, -1, -1)  # (L, R, H, T, Dv), a view
    with torch.inference_mode(), HeadGates(model.model, gates, replacement=fill):
        return logit_diff(model, ids_corrupt.expand(len(groups), -1), position, a, b)  # (R,)


def _tokens(tokenizer, ids: Tensor, text: str) -> list[str]:
    return text_tokens(tokenizer, ids[0].tolist(), text)


def _rounded(values: Tensor) -> list[list[float]]:
    return [[round(float(v), 6) for v in row] for row in values]
