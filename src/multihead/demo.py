"""``multihead demo``: the three steps of multi-head attention with their shapes, then the real model.

Step 1 projects and splits into heads, step 2 lets every head attend on its own, step 3
concatenates and mixes with W^O. Each step is written out by hand and checked against
:class:`multihead.MultiHeadAttention` and ``torch.nn.MultiheadAttention``; then our layer is
swapped into every self-attention of a real BERT model and compared with the original.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from . import masks
from .attn import MultiHeadAttention, estimate_memory, explain_backend

SENTENCE = "The animal didn't cross the street because it was too tired."


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def run_demo(model: str | None = "minilm") -> None:
    torch.manual_seed(0)
    B, T, D, H = 2, 12, 512, 8
    Dk = D // H
    layer = MultiHeadAttention(D, H).eval()
    x = torch.randn(B, T, D)
    print(f"Multi-head attention, d_model={D}, h={H} heads, d_k = d_model / h = {Dk}")
    print(f"input x {_shape(x)}   (batch B, tokens T, features d_model)\n")

    with torch.no_grad():
        # Step 1: project, then split the feature axis into H heads of Dk features.
        q = layer.q_proj(x).view(B, T, H, Dk).transpose(1, 2)  # (B, H, T, Dk)
        k = layer.k_proj(x).view(B, T, H, Dk).transpose(1, 2)  # (B, H, T, Dk)
        v = layer.v_proj(x).view(B, T, H, Dk).transpose(1, 2)  # (B, H, T, Dk)
        print("Step 1  project and split into heads")
        print(f"        Q = x·W^Q {_shape(layer.q_proj(x))} -> split -> {_shape(q)}  (B, H, T, d_k); K, V alike")

        # Step 2: every head runs scaled dot-product attention on its own.
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dk)  # (B, H, T, T)
        keep = masks.causal().materialize(T, T)  # (T, T)
        scores = scores.masked_fill(~keep, float("-inf"))
        weights = scores.softmax(dim=-1)  # (B, H, T, T)
        heads = weights @ v  # (B, H, T, Dk)
        print("Step 2  each head attends on its own (here with a causal mask)")
        print(f"        scores = Q·Kᵀ/√{Dk} {_shape(scores)}, softmax over keys, ·V -> {_shape(heads)}")

        # Step 3: concatenate the heads and mix them with W^O.
        concat = heads.transpose(1, 2).reshape(B, T, D)  # (B, T, H·Dk)
        out = layer.out_proj(concat)  # (B, T, D)
        print("Step 3  concatenate the heads and mix them with W^O")
        print(f"        concat {_shape(concat)} -> ·W^O -> output {_shape(out)}\n")

        ours, w = layer(x, mask=masks.causal(), need_weights=True)
        torch_mha = layer.to_torch()
        theirs, _ = torch_mha(x, x, x, attn_mask=~keep, need_weights=False)
    print("Checks")
    print(f"  by hand vs mh.MultiHeadAttention:               max |diff| = {(out - ours).abs().max():.2e}")
    print(f"  mh.MultiHeadAttention vs nn.MultiheadAttention: max |diff| = {(ours - theirs).abs().max():.2e}")
    print(f"  per-head weights {_shape(w)}, each row sums to 1: {bool(torch.allclose(w.sum(-1), torch.ones(1)))}")
    print("  backend for this call:", explain_backend(q, k, v, masks.causal()).backend,
          "| with weights:", explain_backend(q, k, v, masks.causal(), need_weights=True).backend)
    _long_input()
    if model is not None:
        print()
        _real_model(model)


def _long_input(T: int = 16384) -> None:
    """A 16k-token input with a Longformer mask: the kernel, its memory, and the dense cost."""
    layer = MultiHeadAttention(256, 8).eval()
    x = torch.randn(1, T, 256)
    mask = masks.window(256) | masks.global_tokens([0])
    q = torch.empty(1, 8, T, 32, device="meta")
    choice = explain_backend(q, q, q, mask)
    sparse = estimate_memory(q, q, q, mask)
    dense = estimate_memory(q, q, q, need_weights=True)
    start = time.perf_counter()
    with torch.no_grad():
        y = layer(x, mask=mask)
    print(f"\nLong input: T={T}, mask = window(256) | global_tokens([0])")
    print(f"  kernel: {choice.backend} ({choice.reason})")
    print(f"  output {_shape(y)} in {time.perf_counter() - start:.2f} s; memory {sparse}")
    print(f"  the same layer with dense weights would need {dense}")


def _real_model(name: str) -> None:
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from .hf import BertAttentionAdapter, model_path, swap_bert_attention

    path = model_path(name)
    hf_logging.disable_progress_bar()
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model: nn.Module = AutoModel.from_pretrained(path).eval()
    ours = swap_bert_attention(model)
    sentences = [SENTENCE, "小明把蛋糕递给小红，因为她不饿了。", "Heads specialise."]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    adapters = [m for m in ours.modules() if isinstance(m, BertAttentionAdapter)]
    for adapter in adapters:
        adapter.need_weights = True
    captured: list[torch.Tensor] = []
    hooks = [a.register_forward_hook(lambda _m, _i, out: captured.append(out[1])) for a in adapters]
    with torch.no_grad():
        reference = model(**batch).last_hidden_state
        swapped = ours(**batch).last_hidden_state
    for h in hooks:
        h.remove()
    valid = batch["attention_mask"].bool()
    diff = (reference - swapped)[valid].abs().max().item()
    L, H = len(adapters), adapters[0].attn.num_heads
    print(f"Real model: {path.name if name not in ('minilm',) else 'all-MiniLM-L6-v2'} "
          f"({L} layers x {H} heads), loaded offline in {time.perf_counter() - start:.1f} s")
    print(f"  our layer swapped into all {L} self-attentions; padded batch of {len(sentences)} sentences, "
          f"lengths {valid.sum(1).tolist()}")
    print(f"  last hidden states vs the unmodified model: max |diff| = {diff:.2e}")

    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    n = int(valid[0].sum())
    it = tokens.index("it")
    print(f"\n  Where does 'it' look? Most-attended token of each head, sentence: {SENTENCE!r}")
    print("  layer | " + " ".join(f"h{h:<7d}" for h in range(H)))
    for layer_idx, weights in enumerate(captured):
        row = weights[0, :, it, :n]  # (H, n)
        best = row.argmax(dim=-1)
        cells = " ".join(f"{tokens[j][:8]:<8s}" for j in best.tolist())
        print(f"  {layer_idx:5d} | {cells}")
