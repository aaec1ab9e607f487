"""One way to find a model's attention: its *sites*.

A site is one attention module as the rest of multihead sees it — which stack it belongs to
(``encoder``, ``decoder``, ``cross``, ``vision``), its layer within that stack, whether it is
self- or cross-attention, its projections, its query and key/value heads, head size, and
whether it is causal. Capture, head gates, importance, the gradient monitor and physical pruning
all read sites from :func:`find_sites`; none recognises modules on its own.

Two kinds of module are sites:

* transformers attention modules that compute through transformers' attention interface
  (``ALL_ATTENTION_FUNCTIONS``: BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA, GPT-2, GPT-NeoX,
  Llama, Mistral, Qwen, Gemma, Phi, OPT, GPT-OSS, T5, BART, ViT, Whisper, ...) — found by what
  their ``forward`` does, not by their names, so new architectures that follow the interface
  are found too;
* :class:`~multihead.MultiHeadAttention` layers of our own models.

Attention modules that compute attention by themselves (DeBERTa-v2 and Bloom; Falcon before
transformers 5.25, which moved it onto the interface) cannot be routed through the capture exactly:
:func:`find_sites` refuses them with one line naming the architecture.

Names: each layer of a stack has a name people can guess, ``STACK.LAYER`` — ``encoder.3``,
``decoder.17``, ``cross.2``, ``vision.5`` — the same for our own layers and transformers' layers.
Capture, gates, mean/patched replacements and mask replacements are all attached at those names
(:mod:`multihead.hf.route`); :func:`select` turns names or a stack into the (site, layer) pairs.

Stacks: in an encoder–decoder model (``config.is_encoder_decoder``) the encoder's
self-attention is ``encoder``, the decoder's ``decoder`` and the decoder's attention over the
encoder ``cross``; a vision model's (pixel inputs) single stack is ``vision``; otherwise a
model's self-attention is ``decoder`` when causal, ``encoder`` when not. Layers are numbered
0, 1, ... within each stack in module order (transformers' ``layer_idx`` is not used: BART's
encoder and decoder both count from 0).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from ..attn.layer import MultiHeadAttention
from ..models.blocks import DecoderBlock
from .model import ModelLike, as_module, is_conv1d
from .placement import weights_of

__all__ = ["STACKS", "AttentionSite", "UnsupportedModelError", "find_sites", "main_stack", "select", "site_names"]

#: Stack names, in the order reports list them.
STACKS = ("encoder", "decoder", "cross", "vision")

# Projection attribute names, in the order they are tried (first match wins).
_Q = ("q_proj", "query", "q_lin", "q", "query_proj")
_K = ("k_proj", "key", "k_lin", "k", "key_proj")
_V = ("v_proj", "value", "v_lin", "v", "value_proj")
_O = ("o_proj", "out_proj", "out_lin", "o", "dense", "c_proj")
_QKV = ("qkv_proj", "c_attn", "query_key_value", "Wqkv")
_CROSS_NAMES = ("encoder_attn", "crossattention", "cross_attn", "encdecattention", "cross_attention")


class UnsupportedModelError(ValueError):
    """A model whose attention multihead cannot see exactly; the message is one line naming it."""


@dataclass(eq=False)
class AttentionSite:
    """One attention module of a model, as capture, gates, importance and pruning see it."""

    name: str  # qualified module name ("" for the model itself)
    module: nn.Module
    stack: str  # one of STACKS
    layer: int  # 0-based, within the stack
    kind: str  # "self" | "cross"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool
    q: nn.Module | None = None
    k: nn.Module | None = None
    v: nn.Module | None = None
    o: nn.Module | None = None  # W^O (BERT keeps it on the block's output: ``output.dense``)
    qkv: nn.Module | None = None  # a fused Q/K/V projection (GPT-2, GPT-NeoX, Phi-3)
    ours: bool = False  # a multihead MultiHeadAttention
    #: how many consecutive layers this one module computes (ALBERT shares its layers' weights)
    repeats: int = 1

    @property
    def layers(self) -> range:
        """The layers of the stack this site computes: one, or ``repeats`` consecutive ones."""
        return range(self.layer * self.repeats, (self.layer + 1) * self.repeats)

    @property
    def names(self) -> list[str]:
        """The names of the layers this site computes: ``["decoder.17"]`` (ALBERT's shared module: several)."""
        return [f"{self.stack}.{layer}" for layer in self.layers]

    def output_weight(self):
        """W^O as (D, H·Dv) — an nn.Linear's weight, or the transpose of transformers' Conv1D (GPT-2) —
        or None when the site has no output projection multihead can find."""
        o = self.o
        if not isinstance(o, nn.Linear) and not is_conv1d(o):
            return None
        if o.weight.device.type == "meta":  # offloaded by accelerate: a copy, read in for the moment
            with weights_of(o):
                weight = o.weight.detach().clone()
        else:
            weight = o.weight
        return weight if isinstance(o, nn.Linear) else weight.T

    def __repr__(self) -> str:
        kv = f" / {self.num_kv_heads} kv" if self.num_kv_heads != self.num_heads else ""
        heads = f"{self.num_heads} heads{kv}"
        return (f"AttentionSite({self.stack}.{self.layer} {self.kind}{' causal' if self.causal else ''}, "
                f"{heads} of {self.head_dim}, {type(self.module).__name__} at {self.name or '<model>'!r})")


def find_sites(model: ModelLike) -> list[AttentionSite]:
    """Every attention site of ``model``, in module order.

    Raises :class:`UnsupportedModelError` (one line) when the model has attention modules that
    do not compute through transformers' attention interface, or no attention at all.
    """
    module = as_module(model)
    ours = [(n, m) for n, m in module.named_modules() if isinstance(m, MultiHeadAttention)]
    if ours:
        return _our_sites(module, ours)
    config = getattr(module, "config", None)
    found = [(n, m) for n, m in module.named_modules() if _computes_through_interface(type(m))]
    blind = _blind_attention(module, {id(m) for _, m in found})
    if blind:
        kinds = sorted({type(m).__name__ for _, m in blind})
        raise UnsupportedModelError(
            f"{type(module).__name__}: its attention ({', '.join(kinds)}) computes outside transformers' attention "
            "interface, so multihead cannot see its maps exactly; supported are models whose attention goes through "
            "it (BERT, RoBERTa, DistilBERT, ALBERT, GPT-2, Llama, Mistral, Qwen, Gemma, Phi, OPT, T5, BART, ViT, ...) "
            "and models built from multihead's own layer")
    if not found:
        raise UnsupportedModelError(f"{type(module).__name__} has no attention layer multihead can find")
    windowed = _windowed_type(config)
    if windowed:
        raise UnsupportedModelError(
            f"{type(module).__name__} ({windowed}): its attention runs within windows of patches — each call a "
            "batch of windows, each its own small map — not over the image, so its heads cannot be read as "
            "attention over the image's patches; supported are vision models that attend over all of them (ViT, "
            "DeiT, BEiT, DINOv2, ...)")
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    vision = "pixel_values" in _forward_inputs(type(module)) and not encoder_decoder
    sites: list[AttentionSite] = []
    counts: dict[str, int] = {}
    for name, m in found:
        kind = "cross" if _is_cross(name, m) else "self"
        causal = bool(getattr(m, "is_causal", False)) and kind == "self"
        if kind == "cross":
            stack = "cross"
        elif encoder_decoder:
            stack = "encoder" if _in_part(name, "encoder") else "decoder"
        elif vision:
            stack = "vision"
        else:
            stack = "decoder" if causal else "encoder"
        layer = counts.get(stack, 0)
        counts[stack] = layer + 1
        sites.append(_hf_site(module, name, m, stack, layer, kind, causal, config))
    _shared_layers(sites, config)
    return sites


#: Model types whose attention runs over windows of an image's patches (a shifted grid of them,
#: or a neighbourhood), each window a batch row of its own: their maps are the windows', not the image's.
WINDOWED_TYPES = frozenset({"swin", "swinv2", "donut-swin", "maskformer-swin", "swin2sr", "dinat", "nat", "hiera",
                            "vitdet"})


def _windowed_type(config: object) -> str | None:
    """The model type of ``config``, or of a config inside it (a vision-encoder-decoder's
    ``encoder``, a vision tower's ``vision_config``), that attends within windows
    (:data:`WINDOWED_TYPES`); None when none does."""
    from transformers import PretrainedConfig

    waiting, seen = [config], set()
    while waiting:
        each = waiting.pop()
        if id(each) in seen:
            continue
        seen.add(id(each))
        kind = getattr(each, "model_type", None)
        if kind in WINDOWED_TYPES:
            return kind
        waiting += [value for value in getattr(each, "__dict__", {}).values() if isinstance(value, PretrainedConfig)]
    return None


def _shared_layers(sites: list[AttentionSite], config) -> None:
    """ALBERT-style weight sharing: fewer attention modules than layers, each run several times."""
    total = getattr(config, "num_hidden_layers", None)
    self_sites = [s for s in sites if s.kind == "self"]
    stacks = {s.stack for s in self_sites}
    if isinstance(total, int) and len(stacks) == 1 and self_sites and total > len(self_sites) \
            and total % len(self_sites) == 0:
        for s in self_sites:
            s.repeats = total // len(self_sites)


def main_stack(sites: list[AttentionSite]) -> str:
    """The stack a single-stack analysis reads: the one self-attention stack of the model.

    Raises :class:`UnsupportedModelError` for models with several (encoder–decoder)."""
    stacks = [s for s in STACKS if any(site.stack == s and site.kind == "self" for site in sites)]
    if len(stacks) != 1:
        raise UnsupportedModelError(
            f"the model has {len(stacks)} self-attention stacks ({', '.join(stacks) or 'none'}); this analysis "
            "reads models with one (encoder-only, decoder-only or vision)")
    return stacks[0]


def site_names(model: ModelLike) -> list[str]:
    """Every attention layer's name (``encoder.0``, ..., ``cross.5``), in module order."""
    return [name for site in find_sites(model) for name in site.names]


def select(model: ModelLike, at: str | Sequence[str] | None = None, *,
           sites: list[AttentionSite] | None = None) -> list[tuple[AttentionSite, int]]:
    """The (site, layer) pairs ``at`` names: a stack (``"decoder"``: all its layers), layer names
    (``"decoder.3"`` or a list of them), or None for the model's one self-attention stack.
    ValueError (one line) for a name the model does not have, listing what it has."""
    sites = find_sites(model) if sites is None else sites
    if at is None:
        at = main_stack(sites)
    wanted = [at] if isinstance(at, str) else list(at)
    layers = {name: (site, layer) for site in sites for name, layer in zip(site.names, site.layers, strict=True)}
    stacks = [s for s in STACKS if any(site.stack == s for site in sites)]
    found: list[tuple[AttentionSite, int]] = []
    for name in wanted:
        if name in stacks:
            found += [(site, layer) for site in sites if site.stack == name for layer in site.layers]
        elif name in layers:
            found.append(layers[name])
        else:
            counts = ", ".join(f"{s}.0..{s}.{sum(len(x.layers) for x in sites if x.stack == s) - 1}" for s in stacks)
            raise ValueError(f"the model has no attention site {name!r}; it has the stacks {', '.join(stacks)} "
                             f"({counts})")
    unique = list(dict.fromkeys((id(site), layer) for site, layer in found))
    by_id = {id(site): site for site, _ in found}
    return [(by_id[i], layer) for i, layer in unique]


# --------------------------------------------------------------------------- helpers


@functools.cache
def _computes_through_interface(cls: type) -> bool:
    """Whether ``cls.forward`` calls transformers' attention interface (ALL_ATTENTION_FUNCTIONS)."""
    # transformers' own classes and remote-code ones (``transformers_modules.*``)
    if not issubclass(cls, nn.Module) or not cls.__module__.startswith("transformers"):
        return False
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source or "attention_interface" in source


@functools.cache
def _forward_inputs(cls: type) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return ()


def _blind_attention(model: nn.Module, sites: set[int]) -> list[tuple[str, nn.Module]]:
    """Attention modules that hold projections but neither are a site nor contain one."""
    blind = []
    for name, m in model.named_modules():
        cls = type(m).__name__
        if "Attention" not in cls or id(m) in sites or cls.endswith(("Output", "Layer")):
            continue
        if not any(isinstance(c, nn.Linear) or is_conv1d(c) for c in m.children()):
            continue
        if any(id(sub) in sites for sub in m.modules()):  # a wrapper around a site (BertAttention)
            continue
        if any(name.startswith(b + ".") for b, _ in blind):  # inside one already named
            continue
        blind.append((name, m))
    return blind


def _is_cross(name: str, m: nn.Module) -> bool:
    if getattr(m, "is_cross_attention", False):
        return True
    parts = name.lower().split(".")
    return any(p in _CROSS_NAMES for p in parts) or "Cross" in type(m).__name__


def _in_part(name: str, part: str) -> bool:
    return part in name.split(".")


def _first(m: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    for n in names:
        child = getattr(m, n, None)
        if isinstance(child, nn.Module) and (isinstance(child, nn.Linear) or is_conv1d(child)):
            return child
    return None


def _out_features(p: nn.Module) -> int:
    if isinstance(p, nn.Linear):
        return p.out_features
    return int(p.weight.shape[1])  # transformers' Conv1D stores (in, out)


def _hf_site(model: nn.Module, name: str, m: nn.Module, stack: str, layer: int, kind: str, causal: bool,
             config) -> AttentionSite:
    q, k, v = _first(m, _Q), _first(m, _K), _first(m, _V)
    qkv = None if q is not None else _first(m, _QKV)
    o = _first(m, _O)
    if o is None and "." in name:  # BERT, ViT: W^O sits on the block's output module
        parent = model.get_submodule(name.rpartition(".")[0])
        o = getattr(getattr(parent, "output", None), "dense", None)
    head_dim = _int_attr(m, ("head_dim", "attention_head_size", "head_size", "key_value_proj_dim", "d_kv"))
    heads = _int_attr(m, ("num_heads", "num_attention_heads", "n_heads", "n_head"))
    if heads is None and q is not None and head_dim:
        heads = _out_features(q) // head_dim
    if heads is None:
        heads = _config_heads(config, stack)
    if head_dim is None:
        width = _out_features(q) if q is not None else (_out_features(qkv) // 3 if qkv is not None else None)
        head_dim = (width or int(getattr(config, "hidden_size", 0))) // heads
    kv_heads = heads
    groups = getattr(m, "num_key_value_groups", None)
    if isinstance(groups, int) and groups > 0:
        kv_heads = heads // groups
    elif k is not None and head_dim:
        kv_heads = _out_features(k) // head_dim
    return AttentionSite(name, m, stack, layer, kind, int(heads), int(kv_heads), int(head_dim), causal,
                         q=q, k=k, v=v, o=o, qkv=qkv)


def _int_attr(m: nn.Module, names: tuple[str, ...]) -> int | None:
    for n in names:
        value = getattr(m, n, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _config_heads(config, stack: str) -> int:
    names = {"encoder": ("encoder_attention_heads",), "decoder": ("decoder_attention_heads",),
             "cross": ("decoder_attention_heads",)}.get(stack, ())
    for n in (*names, "num_attention_heads", "num_heads", "n_head", "n_heads"):
        value = getattr(config, n, None)
        if isinstance(value, int) and value > 0:
            return value
    raise UnsupportedModelError(f"cannot tell how many heads {type(config).__name__} has")


def _our_sites(model: nn.Module, layers: list[tuple[str, MultiHeadAttention]]) -> list[AttentionSite]:
    """Our own layers as sites: a layer of one of our decoder blocks is ``decoder`` (causal), its
    cross-attention ``cross``; any other layer ``encoder`` (a ``cross…`` name: ``cross``)."""
    sites = []
    counts: dict[str, int] = {}
    for name, m in layers:
        parent_name, _, own = name.rpartition(".")
        parent = model.get_submodule(parent_name) if name and parent_name else None
        in_decoder = isinstance(parent, DecoderBlock)
        kind = "cross" if (in_decoder and own == "cross") or (
            not in_decoder and any(p.startswith("cross") for p in name.lower().split("."))) else "self"
        stack = "cross" if kind == "cross" else "decoder" if in_decoder else "encoder"
        layer = counts.get(stack, 0)
        counts[stack] = layer + 1
        sites.append(AttentionSite(name, m, stack, layer, kind, m.num_heads, m.num_kv_heads, m.head_dim,
                                   stack == "decoder", q=m.q_proj, k=m.k_proj, v=m.v_proj, o=m.out_proj, ours=True))
    return sites
