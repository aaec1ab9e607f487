"""The runs patching and direct logit attribution share: a text's ids, its answer position, the
logit difference of two answers there, and a run that keeps every head's output."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ...hf.capture import AttentionCapture
from ...hf.logits import on_rows
from ...hf.model import HFModel
from ...hf.route import AttentionChunk
from ...inputs import text_tokens
from .final import final_norm

__all__ = ["ROUNDING_STEPS", "Run", "answer_position", "check_answerable", "clean_run", "logit_diff", "logits_at",
           "single_token", "text_ids"]

#: Steps of the logits' dtype, at the size of the largest logit, within which two runs' logit
#: differences are rounding, not the model's preference: every layer rounds the residual stream the
#: logits are read from, so their error follows its scale (the largest logit), not the two answers'
#: own logits, which may be near 0. SmolLM2 (largest logit 19 to 32) and a random GPT-2-small shape
#: (2.2) in bfloat16 against float32, the three shipped examples: a run's difference moved 0.3 to 1.5
#: steps of the answers' logits, at most 0.6 of one step at the largest.
ROUNDING_STEPS = 4


class Run(NamedTuple):
    """What :func:`clean_run` keeps of one run."""

    #: logit(a) − logit(b) at the position
    diff: float
    #: every head's output, (L, 1, H, T, Dv)
    outputs: Tensor
    #: the final norm's input at the position, (D,), when asked for
    residual: Tensor | None
    #: how far rounding in the logits' dtype can move ``diff``: ROUNDING_STEPS · eps · max |logit| at the position
    rounding: float
    #: the least precise of the logits' dtype and the model's
    dtype: torch.dtype


def clean_run(model: HFModel, ids: Tensor, position: int, a: int, b: int, *, residual: bool = False) -> Run:
    """A run's logit difference, every head's output (L, 1, H, T, Dv) and — with ``residual`` — the
    final norm's input at ``position`` (D,), through the capture's kernel, as every patched run
    goes, so identical texts give identical numbers; and how far rounding may move the difference."""
    outputs: dict[int, Tensor] = {}
    seen: list[Tensor] = []

    def keep(chunk: AttentionChunk) -> None:
        out = chunk.outputs.detach()  # (1, H, c, Dv)
        layer = chunk.layer
        outputs[layer] = out if chunk.start == 0 else torch.cat([outputs[layer], out], 2)  # (1, H, T, Dv)

    hook = final_norm(model).register_forward_pre_hook(lambda _m, args: seen.append(args[0][0, position])) \
        if residual else None
    try:
        with torch.inference_mode(), AttentionCapture(model.model, keep):
            row = logits_at(model, ids, position)[0]  # (V,) in the logits' dtype
    finally:
        if hook is not None:
            hook.remove()
    stacked = torch.stack([outputs[layer] for layer in range(model.num_layers)])  # (L, 1, H, T, Dv)
    wide = row.float()  # as logit_diff forms the patched runs' differences
    # the least precise of the logits' dtype and the model's: a half model may give float32 logits (an
    # upcast head) read from a residual stream rounded in its own dtype
    dtype = row.dtype
    if model.dtype is not None and torch.finfo(model.dtype).eps > torch.finfo(dtype).eps:
        dtype = model.dtype
    rounding = ROUNDING_STEPS * torch.finfo(dtype).eps * float(wide.abs().max())
    return Run(float(wide[a] - wide[b]), stacked, seen[-1] if seen else None, rounding, dtype)


def single_token(tokenizer, text: str, name: str) -> int:
    """The id of ``text`` as one token (without special tokens); ValueError naming its pieces otherwise."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = text_tokens(tokenizer, ids, text, add_special_tokens=False)  # '很' as 很₁ 很₂, not 'å¾' 'Ī'
        raise ValueError(f"{name} {text!r} is {len(ids)} tokens {pieces} for this tokenizer; give one token "
                         "(mind the leading space, e.g. ' Paris')")
    return int(ids[0])


def check_answerable(model: HFModel) -> None:
    """One line unless ``model`` predicts words (a causal LM, or an encoder with its masked-LM
    head): what a patched or attributed answer is read from."""
    if model.is_causal and not model.has_lm_head:
        raise ValueError(f"{model.name} is {model.HEADLESS}: there is no answer to patch; use a causal or "
                         "masked language model")
    if not model.is_causal and (not model.has_lm_head or getattr(model.tokenizer, "mask_token_id", None) is None):
        raise ValueError(f"{model.name} has no language-model head (a sentence-embedding encoder?): there is no "
                         "answer to patch; use a causal or masked language model")


def answer_position(model: HFModel, ids: Tensor) -> int:
    """Where the answer is predicted in ``ids`` (1, T): after the last token of a causal model, at
    the one mask token of a masked language model."""
    check_answerable(model)
    if model.is_causal:
        return ids.shape[1] - 1
    mask_id = model.tokenizer.mask_token_id
    where = (ids[0] == mask_id).nonzero().flatten().tolist()
    if len(where) != 1:
        raise ValueError(f"a masked language model's text needs exactly one {model.tokenizer.mask_token} where the "
                         f"answer goes; found {len(where)}")
    return where[0]


def text_ids(model: HFModel, text: str) -> Tensor:
    if not isinstance(text, str) or not text.strip():
        raise ValueError("patching needs a non-empty clean and corrupt text")
    ids = model.tokenizer(text, return_tensors="pt")["input_ids"]  # (1, T)
    if model.max_positions and ids.shape[1] > model.max_positions:
        raise ValueError(f"the text is {ids.shape[1]} tokens; {model.name} reads at most {model.max_positions}")
    return ids.to(model.device)


def logits_at(model: HFModel, ids: Tensor, position: int) -> Tensor:
    """(B, V) the logits at ``position``, in the model's logits' dtype."""
    extra = {"use_cache": False} if model.is_causal else {}
    at = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)  # (B, T): the one position of each text
    at[:, position] = True
    # that position's logits alone (hf.logits.on_rows): a patched run makes no (B, T, V) block
    return on_rows(model, dict(input_ids=ids, attention_mask=torch.ones_like(ids), **extra), at,
                   lambda logits, _part: logits)  # (B, V)


def logit_diff(model: HFModel, ids: Tensor, position: int, a: int, b: int) -> Tensor:
    """(B,) logit(a) − logit(b) at ``position``, in float32."""
    row = logits_at(model, ids, position).float()  # (B, V)
    return row[:, a] - row[:, b]


