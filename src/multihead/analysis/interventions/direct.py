"""Direct logit attribution: how much each head writes, straight into the answer's logit.

In a decoder the last position's residual stream is a sum: the embedding, every head's output
through W^O, every MLP's output. Its logits are ``W_U · norm(x)``. With the final norm's scale
frozen at its value in the run (as is standard: the norm is then linear), each head's share of
the logit difference is

    DLA(l, h) = (W_U[answer] − W_U[wrong]) · (g ⊙ P(W^O_h · o_{l,h})) / s

where ``o_{l,h}`` is the head's output at the last position (before W^O), ``W^O_h`` its columns
of the output projection, ``g`` the norm's gain, ``P`` centring (LayerNorm; identity for
RMSNorm) and ``s`` the norm's scale on the actual residual stream. The norm's bias, the LM head's
bias and a final logit soft-cap (Gemma 2) belong to no head and are left out: DLA is in logits
before any soft-cap. It measures only the direct path — a head that works through later layers
(as most do) can matter without a large DLA; activation patching measures both.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...hf.interventions import self_attention_sites
from ...hf.model import HFModel, require_loaded
from ...hf.placement import weights_of
from ...hf.sites import UnsupportedModelError
from .final import final_norm, frozen_norm
from .runs import clean_run, single_token, text_ids

__all__ = ["direct_logit_attribution", "head_attribution"]


def direct_logit_attribution(model: HFModel, text: str, answer: str, wrong: str) -> Tensor:
    """(L, H) float64: each head's direct contribution to logit(answer) − logit(wrong) after ``text``."""
    model = require_loaded(model, "direct_logit_attribution")
    if not model.is_causal:
        raise ValueError("direct logit attribution reads decoders (the answer follows the last token)")
    if not model.has_lm_head:
        raise ValueError(f"direct logit attribution reads the words' output embedding; {model.name} is "
                         f"{model.HEADLESS}")
    ids = text_ids(model, text)
    a, b = single_token(model.tokenizer, answer, "answer"), single_token(model.tokenizer, wrong, "wrong")
    position = ids.shape[1] - 1
    run = clean_run(model, ids, position, a, b, residual=True)
    return head_attribution(model, run.outputs[:, 0, :, position], run.residual, a, b)


def head_attribution(model: HFModel, heads: Tensor, residual: Tensor, a: int, b: int) -> Tensor:
    """(L, H) DLA of heads' outputs at one position, (L, H, Dv) before W^O, given the final norm's
    input there, ``residual`` (D,), which freezes its scale; ``a``, ``b``: the two answers' ids."""
    unembed = getattr(model.model, "get_output_embeddings", lambda: None)()
    if unembed is None:
        raise UnsupportedModelError(f"{type(model.model).__name__} has no output embedding (LM head) to attribute to")
    w_of = {layer: site.output_weight() for site in self_attention_sites(model.model) for layer in site.layers}
    with torch.inference_mode():
        gain, centred, scale = frozen_norm(final_norm(model), residual)
        with weights_of(unembed):  # an offloaded LM head is read here, not run
            answer_row, wrong_row = unembed.weight[a].cpu(), unembed.weight[b].cpu()  # (D,) each
        direction = (answer_row - wrong_row).double() * gain.double()  # (D,)
        found = torch.zeros(model.num_layers, model.num_heads, dtype=torch.float64)
        for layer in range(model.num_layers):
            w_o = w_of.get(layer)
            if w_o is None:
                raise UnsupportedModelError(f"layer {layer} has no output projection W^O to follow")
            out = heads[layer].double().cpu()  # (H, Dv)
            H, Dv = out.shape
            written = torch.einsum("dhv,hv->hd", w_o.double().cpu().view(-1, H, Dv), out)  # (H, D)
            if centred:
                written = written - written.mean(-1, keepdim=True)
            found[layer, :H] = written @ direction / scale  # (H,)
    return found
