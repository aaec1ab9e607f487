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
from torch import Tensor, nn

from ..hf.capture import AttentionCapture
from ..hf.load import HFModel, require_loaded
from ..hf.sites import UnsupportedModelError

__all__ = ["direct_logit_attribution", "final_norm", "head_attribution"]


def direct_logit_attribution(model: HFModel, text: str, answer: str, wrong: str) -> Tensor:
    """(L, H) float64: each head's direct contribution to logit(answer) − logit(wrong) after ``text``."""
    from .patching import _clean_run, _ids, single_token

    model = require_loaded(model, "direct_logit_attribution")
    if not model.is_causal:
        raise ValueError("direct logit attribution reads decoders (the answer follows the last token)")
    ids = _ids(model, text)
    a, b = single_token(model.tokenizer, answer, "answer"), single_token(model.tokenizer, wrong, "wrong")
    position = ids.shape[1] - 1
    _, outputs, residual = _clean_run(model, ids, position, a, b, residual=True)
    return head_attribution(model, outputs[:, 0, :, position], residual, a, b)


def head_attribution(model: HFModel, heads: Tensor, residual: Tensor, a: int, b: int) -> Tensor:
    """(L, H) DLA of heads' outputs at one position, (L, H, Dv) before W^O, given the final norm's
    input there, ``residual`` (D,), which freezes its scale; ``a``, ``b``: the two answers' ids."""
    unembed = getattr(model.model, "get_output_embeddings", lambda: None)()
    if unembed is None:
        raise UnsupportedModelError(f"{type(model.model).__name__} has no output embedding (LM head) to attribute to")
    capture = AttentionCapture(model.model, lambda *_: None)  # not entered: it only names each layer's W^O
    with torch.inference_mode():
        gain, centred, scale = _frozen(final_norm(model), residual.float())
        direction = (unembed.weight[a] - unembed.weight[b]).double() * gain.double()  # (D,)
        found = torch.zeros(model.num_layers, model.num_heads, dtype=torch.float64)
        for layer in range(model.num_layers):
            w_o = capture.output_projection(layer)
            if w_o is None:
                raise UnsupportedModelError(f"layer {layer} has no output projection W^O to follow")
            out = heads[layer].double()  # (H, Dv)
            H, Dv = out.shape
            written = torch.einsum("dhv,hv->hd", w_o.double().view(-1, H, Dv), out)  # (H, D)
            if centred:
                written = written - written.mean(-1, keepdim=True)
            found[layer, :H] = written @ direction / scale  # (H,)
    return found


def final_norm(model: HFModel) -> nn.Module:
    """The norm between the last block and the LM head (``norm``, ``ln_f``, OPT's
    ``decoder.final_layer_norm``...): the last module of the base model, outside its blocks, that
    is a norm by class or by name."""
    from .ablation import _blocks

    inside = {id(m) for block in _blocks(model) or [] for m in block.modules()}
    norms = [m for name, m in model.body.named_modules() if id(m) not in inside and name and
             ("norm" in type(m).__name__.lower() or "norm" in name.rsplit(".", 1)[-1] or name.endswith("ln_f"))]
    if not norms:
        raise UnsupportedModelError(f"{type(model.body).__name__} has no final norm module (norm, ln_f, "
                                    "final_layer_norm...) before its LM head")
    return norms[-1]


def _frozen(norm: nn.Module, x: Tensor) -> tuple[Tensor, bool, float]:
    """The final norm as a linear map at ``x`` (D,): (gain (D,), centred, scale) such that
    norm(v) ≈ gain ⊙ P(v) / scale + bias for the actual residual stream — checked against the
    module's own output, so a norm of another form is refused rather than misread."""
    with torch.no_grad():
        want = norm(x[None].to(next(norm.parameters(), x).dtype)).float()[0]  # (D,)
    D = x.shape[0]
    weight = getattr(norm, "weight", None)
    bias = getattr(norm, "bias", None)
    eps = next((float(getattr(norm, n)) for n in ("eps", "variance_epsilon", "epsilon") if hasattr(norm, n)), 1e-6)
    ones = torch.ones(D)
    gains = [ones] if weight is None else [weight.detach().float(), 1 + weight.detach().float()]  # Gemma: 1 + w
    shift = bias.detach().float() if isinstance(bias, Tensor) else torch.zeros(D)
    tolerance = 1e-4 * (1 + float(want.abs().max()))
    for centred in (False, True):
        v = x - x.mean() if centred else x
        scale = float(torch.sqrt((v * v).mean() + eps))
        for gain in gains:
            if float((gain * v / scale + shift - want).abs().max()) <= tolerance:
                return gain, centred, scale
    if isinstance(norm, nn.Identity) or float((x - want).abs().max()) <= tolerance:
        return ones, False, 1.0
    raise UnsupportedModelError(f"the final norm {type(norm).__name__} is neither a LayerNorm nor an RMSNorm as "
                                "multihead knows them; its direct logit attribution cannot be read exactly")
