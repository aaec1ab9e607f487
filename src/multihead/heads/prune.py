"""Physical head pruning: the rows of W^Q, W^K, W^V and the columns of W^O of pruned heads go.

``prune_heads(model, {layer: [head, ...]})`` shrinks, in place:

* our :class:`~multihead.MultiHeadAttention` layers (numbered by their order in the model),
* Hugging Face BERT-family attention blocks (``.self.query/key/value``, ``.output.dense``),
* Llama/GPT-style attention modules (``q_proj``/``k_proj``/``v_proj``/``o_proj``), grouped-query
  included.

With grouped-query attention a key/value head goes when every query head reading it goes. If
the kept query heads leave groups of unequal sizes, the layer's key/value heads are repeated
once per kept query head (exact; the layer then stores more K/V rows than before — prune whole
groups to avoid it). A layer that loses every head keeps working: its attention adds only
W^O's bias (zero for Llama).

The outputs for the kept heads equal the gated model's (ξ = 0 on the pruned heads) to float
precision (tested on our layer, MiniLM and SmolLM2). A pruned transformers model no longer
matches its config, so save it with :func:`save_pruned` and load it with :func:`load_pruned`.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from ..attn.layer import MultiHeadAttention
from ..files import StagedFiles
from ..hf.halflinear import RaisedHalfLinear
from ..hf.interventions import self_attention_sites
from ..hf.model import ModelLike, as_module
from ..hf.placement import is_offloaded
from ..hf.sites import AttentionSite, UnsupportedModelError, find_sites

__all__ = ["PRUNED_FILE", "count_heads", "load_pruned", "prune_heads", "save_pruned"]

PRUNED_FILE = "pruned_heads.json"


def _linear(like: nn.Linear, *args: object, **kwargs: object) -> nn.Linear:
    # a half model's raised linear layers stay raised (hf.halflinear); any other becomes a plain one
    kind = RaisedHalfLinear if type(like) is RaisedHalfLinear else nn.Linear
    with warnings.catch_warnings():  # a layer with every head pruned has zero-size weights, by design
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        return kind(*args, **kwargs)


def _take_rows(linear: nn.Linear, rows: Tensor) -> nn.Linear:
    new = _linear(linear, linear.in_features, len(rows), bias=linear.bias is not None,
                  device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            new.bias.copy_(linear.bias[rows])
    new.weight.requires_grad_(linear.weight.requires_grad)
    return new


def _take_columns(linear: nn.Linear, cols: Tensor) -> nn.Linear:
    new = _linear(linear, len(cols), linear.out_features, bias=linear.bias is not None,
                  device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[:, cols])
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    return new


def _head_rows(heads: Iterable[int], dim: int) -> Tensor:
    return torch.tensor([h * dim + d for h in heads for d in range(dim)], dtype=torch.long)


def _kv_plan(kept: list[int], num_heads: int, num_kv_heads: int) -> list[int]:
    """The key/value head each kept query head reads after pruning, as a list of old kv indices
    (one entry per new kv head)."""
    group = num_heads // num_kv_heads
    by_kv: dict[int, list[int]] = {}
    for h in kept:
        by_kv.setdefault(h // group, []).append(h)
    sizes = {len(v) for v in by_kv.values()}
    if len(sizes) <= 1:
        return sorted(by_kv)
    return [h // group for h in kept]  # unequal groups: one kv head per query head


def _check_heads(heads: Iterable[int], num_heads: int, where: str) -> list[int]:
    heads = sorted({int(h) for h in heads})
    bad = [h for h in heads if not 0 <= h < num_heads]
    if bad:
        raise ValueError(f"{where}: heads {bad} out of range; this layer has heads 0..{num_heads - 1}")
    return heads


def _prune_ours(layer: MultiHeadAttention, pruned: list[int]) -> None:
    H, Hkv, Dk = layer.num_heads, layer.num_kv_heads, layer.head_dim
    kept = [h for h in range(H) if h not in pruned]
    kv = _kv_plan(kept, H, Hkv) if kept else []
    layer.q_proj = _take_rows(layer.q_proj, _head_rows(kept, Dk))
    layer.k_proj = _take_rows(layer.k_proj, _head_rows(kv, Dk))
    layer.v_proj = _take_rows(layer.v_proj, _head_rows(kv, Dk))
    gates = layer.head_gates[kept] if kept else layer.head_gates[:0]
    out = _take_columns(layer.out_proj, _head_rows(kept, Dk))
    layer.out_proj = out
    layer.head_gates = gates
    layer.num_heads, layer.num_kv_heads = len(kept), len(kv)


class _NoHeads(nn.Module):
    """The attention of a layer whose heads were all pruned: contributes nothing before W^O."""

    def __init__(self, hidden_size: int, returns_output_projection: bool, bias: Tensor | None) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.returns_output_projection = returns_output_projection
        self.register_buffer("bias", bias.detach().clone() if bias is not None else None)

    def forward(self, hidden_states: Tensor, *args: object, **kwargs: object) -> tuple[Tensor, None]:
        B, T = hidden_states.shape[:2]
        if not self.returns_output_projection:  # BERT: W^O (output.dense) follows, with 0 inputs
            return hidden_states.new_zeros(B, T, 0), None
        out = hidden_states.new_zeros(B, T, self.hidden_size)
        return (out + self.bias if self.bias is not None else out), None


#: Attributes transformers attention modules keep their head counts and widths in.
_HEAD_COUNTS = ("num_heads", "num_attention_heads", "n_heads", "n_head")
_WIDTHS = ("all_head_size", "inner_dim", "embed_dim_heads")


def _prune_site(model: nn.Module, site: AttentionSite, pruned: list[int]) -> None:
    """Shrink one transformers attention site: rows of W^Q/W^K/W^V, columns of W^O."""
    attn, Dk = site.module, site.head_dim
    if site.qkv is not None:
        raise TypeError(f"{type(attn).__name__} keeps Q, K and V in one fused projection; physical pruning takes "
                        "separate ones — gate its heads instead (HeadGates)")
    if not all(isinstance(p, nn.Linear) for p in (site.q, site.k, site.v, site.o)):
        raise TypeError(f"{type(attn).__name__} has no separate Linear W^Q, W^K, W^V and W^O whose rows are its heads "
                        "(e.g. low-rank latent keys and values, as DeepSeek's multi-head latent attention): "
                        "physical pruning cuts those rows — gate its heads instead (HeadGates)")
    if hasattr(attn, "has_relative_attention_bias"):
        raise TypeError(f"{type(attn).__name__} (T5) shares one relative position bias of all heads across its "
                        "layers, so one layer's heads cannot be removed alone; gate them instead (HeadGates)")
    H, Hkv = site.num_heads, site.num_kv_heads
    kept = [h for h in range(H) if h not in pruned]
    names = {id(m): n for n, m in model.named_modules()}
    o_on_block = not any(site.o is c for c in attn.children())  # BERT, ViT: W^O on the block's output
    parent_name, _, child = site.name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if o_on_block:
        holder_name, _, o_name = names[id(site.o)].rpartition(".")
        setattr(model.get_submodule(holder_name), o_name, _take_columns(site.o, _head_rows(kept, Dk)))
    if not kept:
        bias = None if o_on_block else site.o.bias
        setattr(parent, child, _NoHeads(site.o.out_features, not o_on_block, bias))
        return
    kv = _kv_plan(kept, H, Hkv)
    for proj, heads in ((site.q, kept), (site.k, kv), (site.v, kv)):
        attr = next(n for n, c in attn.named_children() if c is proj)
        setattr(attn, attr, _take_rows(proj, _head_rows(heads, Dk)))
    if not o_on_block:
        attr = next(n for n, c in attn.named_children() if c is site.o)
        setattr(attn, attr, _take_columns(site.o, _head_rows(kept, Dk)))
    for attr, param in list(attn.named_parameters(recurse=False)):  # per-head vectors (GPT-OSS's sink logits)
        if param.dim() == 1 and param.shape[0] == H:
            setattr(attn, attr, nn.Parameter(param.detach()[kept].clone(), requires_grad=param.requires_grad))
    for attr in _HEAD_COUNTS:
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, len(kept))
    for attr in _WIDTHS:
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, len(kept) * Dk)
    if isinstance(getattr(attn, "num_key_value_groups", None), int):
        attn.num_key_value_groups = len(kept) // len(kv)
    if isinstance(getattr(attn, "num_key_value_heads", None), int):
        attn.num_key_value_heads = len(kv)


#: Why a model dispatched with CPU or disk offload is not pruned: accelerate keeps copies of its
#: weights off the device and swaps them in per forward, so an in-place rewrite is not what runs.
OFFLOADED = ("pruning rewrites the attention weights in place, but accelerate keeps part of this model offloaded "
             "(on the CPU or disk, swapped in for each forward); load it without --max-memory/--offload-folder")


def prune_heads(model: ModelLike, heads: Mapping[int, Iterable[int]], *, stack: str | None = None) -> nn.Module:
    """Remove ``heads[layer]`` from each layer of one stack (default: the model's only
    self-attention stack), in place; returns the module.

    ``model``: what :func:`multihead.hf.load` returns, or a bare module (ours or transformers').
    Raises TypeError for attention whose projections are fused (GPT-2's ``c_attn``): gate those.
    """
    model = as_module(model)
    if is_offloaded(model):
        raise ValueError(OFFLOADED)
    sites = self_attention_sites(model, stack)
    for layer, hs in heads.items():
        if not 0 <= int(layer) < len(sites):
            raise ValueError(f"layer {layer} out of range; the model has {len(sites)} attention layers")
        site = sites[int(layer)]
        if site.repeats > 1:
            raise TypeError(f"{type(site.module).__name__} computes {site.repeats} layers with one set of weights "
                            "(shared, as in ALBERT): pruning a head would prune it in all of them")
        pruned = _check_heads(hs, site.num_heads, f"layer {layer}")
        if site.ours:
            _prune_ours(site.module, pruned)
        else:
            _prune_site(model, site, pruned)
    return model


def count_heads(model: ModelLike, *, stack: str | None = None) -> list[int]:
    """Heads left in each attention layer of one self-attention stack (default: the model's only
    one; an encoder-decoder's ``"encoder"`` or ``"decoder"``, else ValueError naming its stacks)."""
    model = as_module(model)
    if any(isinstance(m, MultiHeadAttention) for m in model.modules()):
        return [m.num_heads for m in model.modules() if isinstance(m, MultiHeadAttention)]
    counts = []
    names = {id(m): n for n, m in model.named_modules()}
    live = {names[id(s.module)]: s.num_heads for s in self_attention_sites_or_empty(model, stack)}
    # a layer pruned away is the stack's where its name is a live layer's but for the layer number
    # (`model.layers.N.self_attn`); with no live layer left, where its name holds the stack's
    patterns = {_layer_pattern(name) for name in live}
    for name, module in model.named_modules():
        if isinstance(module, _NoHeads) and (stack is None or (_layer_pattern(name) in patterns if patterns
                                                               else stack in name.split("."))):
            counts.append((name, 0))
        elif name in live:
            counts.append((name, live[name]))
    return [n for _, n in counts]


def _layer_pattern(name: str) -> str:
    """A module's name with its layer numbers as ``#``: the same for every layer of one stack."""
    return ".".join("#" if part.isdigit() else part for part in name.split("."))


def self_attention_sites_or_empty(model: nn.Module, stack: str | None = None) -> list[AttentionSite]:
    """The stack's sites; none where every layer is pruned away (the model has no attention left)."""
    try:
        sites = find_sites(model)
    except UnsupportedModelError:
        if any(isinstance(m, _NoHeads) for m in model.modules()):
            return []  # every layer pruned away
        raise
    return self_attention_sites(model, stack, sites=sites)


def save_pruned(model: ModelLike, folder: str | Path, heads: Mapping[int, Iterable[int]], *,
                base: str | None = None, staged: StagedFiles | None = None) -> Path:
    """Weights as safetensors plus which heads were pruned (and from which base model). Weights the
    model ties (a decoder's LM head and its embedding) are saved once, as safetensors' ``save_model``
    keeps them, and tied again by :func:`load_pruned`. ``staged``: files staged with others, to be
    committed with them (`multihead prune`'s curve), instead of committed here."""
    from safetensors.torch import save_model

    model = as_module(model)
    folder = Path(folder)
    record = {"base": base, "pruned_heads": {str(k): sorted(int(h) for h in v) for k, v in heads.items()}}
    with contextlib.nullcontext(staged) if staged is not None else StagedFiles() as files:
        # weights and record replace an earlier pruned model together
        files.folder(folder)
        save_model(model, str(files.stage(folder / "model.safetensors")), force_contiguous=True)
        files.stage(folder / PRUNED_FILE, json.dumps(record, indent=1))
        if staged is None:
            files.commit()
    return folder


def load_pruned(model: ModelLike, folder: str | Path) -> nn.Module:
    """Prune a freshly built/loaded base ``model`` as recorded in ``folder`` and load its weights."""
    from safetensors.torch import load_model

    model = as_module(model)
    folder = Path(folder)
    if not (folder / PRUNED_FILE).is_file():
        raise FileNotFoundError(f"{folder} holds no pruned model ({PRUNED_FILE} is missing)")
    record = json.loads((folder / PRUNED_FILE).read_text(encoding="utf-8"))
    prune_heads(model, {int(k): v for k, v in record["pruned_heads"].items()})
    # every weight, tied ones from the one saved
    missing, unexpected = load_model(model, folder / "model.safetensors", strict=False)
    # a pooler saved before `mh.hf.load` left out the random one of a checkpoint without one (an image
    # or token classifier's): never read, nothing to load it into
    pooler_left_out = getattr(model, "pooler", None) is None
    unexpected = [key for key in unexpected if not (key.startswith("pooler.") and pooler_left_out)]
    if missing or unexpected:
        raise ValueError(f"{folder / 'model.safetensors'} does not fit the base model pruned as {PRUNED_FILE} says "
                         f"({len(missing)} weights missing, such as {', '.join(sorted(missing)[:2]) or '-'}; "
                         f"{len(unexpected)} unexpected, such as {', '.join(sorted(unexpected)[:2]) or '-'}): "
                         "load it onto the base it was pruned from")
    return model
