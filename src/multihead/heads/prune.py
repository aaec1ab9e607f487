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

import json
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from ..attn.layer import MultiHeadAttention
from ..hf.gates import self_attention_modules
from ..hf.load import ModelLike, as_module

__all__ = ["PRUNED_FILE", "count_heads", "load_pruned", "prune_heads", "save_pruned"]

PRUNED_FILE = "pruned_heads.json"


def _linear(*args: object, **kwargs: object) -> nn.Linear:
    with warnings.catch_warnings():  # a layer with every head pruned has zero-size weights, by design
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        return nn.Linear(*args, **kwargs)


def _take_rows(linear: nn.Linear, rows: Tensor) -> nn.Linear:
    new = _linear(linear.in_features, len(rows), bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            new.bias.copy_(linear.bias[rows])
    new.weight.requires_grad_(linear.weight.requires_grad)
    return new


def _take_columns(linear: nn.Linear, cols: Tensor) -> nn.Linear:
    new = _linear(len(cols), linear.out_features, bias=linear.bias is not None,
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


def _prune_bert(block: nn.Module, pruned: list[int]) -> None:
    inner, dense = block.self, block.output.dense
    H, Dk = int(inner.num_attention_heads), int(inner.attention_head_size)
    kept = [h for h in range(H) if h not in pruned]
    rows = _head_rows(kept, Dk)
    block.output.dense = _take_columns(dense, rows)
    if not kept:
        block.self = _NoHeads(dense.out_features, False, None)
        return
    inner.query, inner.key, inner.value = (_take_rows(getattr(inner, n), rows) for n in ("query", "key", "value"))
    inner.num_attention_heads = len(kept)
    inner.all_head_size = len(kept) * Dk


def _prune_llama(parent: nn.Module, name: str, attn: nn.Module, pruned: list[int]) -> None:
    Dk = int(attn.head_dim)
    H = attn.q_proj.out_features // Dk
    Hkv = attn.k_proj.out_features // Dk
    kept = [h for h in range(H) if h not in pruned]
    if not kept:
        bias = attn.o_proj.bias
        setattr(parent, name, _NoHeads(attn.o_proj.out_features, True, bias))
        return
    kv = _kv_plan(kept, H, Hkv)
    attn.q_proj = _take_rows(attn.q_proj, _head_rows(kept, Dk))
    attn.k_proj = _take_rows(attn.k_proj, _head_rows(kv, Dk))
    attn.v_proj = _take_rows(attn.v_proj, _head_rows(kv, Dk))
    attn.o_proj = _take_columns(attn.o_proj, _head_rows(kept, Dk))
    attn.num_key_value_groups = len(kept) // len(kv)
    for attr, value in (("num_heads", len(kept)), ("num_key_value_heads", len(kv))):
        if hasattr(attn, attr):
            setattr(attn, attr, value)


def prune_heads(model: ModelLike, heads: Mapping[int, Iterable[int]]) -> nn.Module:
    """Remove ``heads[layer]`` from each layer, in place; returns the module.

    ``model``: what :func:`multihead.hf.load` returns, or a bare module (ours or transformers').
    """
    model = as_module(model)
    ours = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if ours:
        for layer, hs in heads.items():
            if not 0 <= int(layer) < len(ours):
                raise ValueError(f"layer {layer} out of range; the model has {len(ours)} attention layers")
            _prune_ours(ours[int(layer)], _check_heads(hs, ours[int(layer)].num_heads, f"layer {layer}"))
        return model
    modules = self_attention_modules(model)
    names = {id(m): n for n, m in model.named_modules()}
    for layer, hs in heads.items():
        if not 0 <= int(layer) < len(modules):
            raise ValueError(f"layer {layer} out of range; the model has {len(modules)} attention layers")
        attn = modules[int(layer)]
        parent_name, _, child = names[id(attn)].rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if all(isinstance(getattr(attn, n, None), nn.Linear) for n in ("query", "key", "value")) and \
                isinstance(getattr(getattr(parent, "output", None), "dense", None), nn.Linear):
            _prune_bert(parent, _check_heads(hs, int(attn.num_attention_heads), f"layer {layer}"))
        elif all(isinstance(getattr(attn, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            _prune_llama(parent, child, attn, _check_heads(hs, attn.q_proj.out_features // int(attn.head_dim),
                                                           f"layer {layer}"))
        else:
            raise TypeError(f"layer {layer} ({type(attn).__name__}) is neither BERT-style nor Llama-style attention")
    return model


def count_heads(model: ModelLike) -> list[int]:
    """Heads left in each attention layer."""
    model = as_module(model)
    ours = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if ours:
        return [m.num_heads for m in ours]
    counts = []
    for module in model.modules():
        if isinstance(module, _NoHeads):
            counts.append(0)
        elif getattr(module, "layer_idx", None) is not None and hasattr(module, "config"):
            q = getattr(module, "query", None) or getattr(module, "q_proj", None)
            dim = getattr(module, "attention_head_size", None) or getattr(module, "head_dim", None)
            if isinstance(q, nn.Linear) and dim:
                counts.append(q.out_features // int(dim))
    return counts


def save_pruned(model: ModelLike, folder: str | Path, heads: Mapping[int, Iterable[int]], *,
                base: str | None = None) -> Path:
    """Weights as safetensors plus which heads were pruned (and from which base model)."""
    from safetensors.torch import save_file

    model = as_module(model)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    record = {"base": base, "pruned_heads": {str(k): sorted(int(h) for h in v) for k, v in heads.items()}}
    (folder / PRUNED_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return folder


def load_pruned(model: ModelLike, folder: str | Path) -> nn.Module:
    """Prune a freshly built/loaded base ``model`` as recorded in ``folder`` and load its weights."""
    from safetensors.torch import load_file

    model = as_module(model)
    folder = Path(folder)
    if not (folder / PRUNED_FILE).is_file():
        raise FileNotFoundError(f"{folder} holds no pruned model ({PRUNED_FILE} is missing)")
    record = json.loads((folder / PRUNED_FILE).read_text(encoding="utf-8"))
    prune_heads(model, {int(k): v for k, v in record["pruned_heads"].items()})
    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    return model
