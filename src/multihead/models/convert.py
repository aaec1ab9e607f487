"""Real weights into our models: a Hugging Face BERT-family checkpoint into :class:`Encoder`."""

from __future__ import annotations

import torch
from torch import nn

from .transformer import Encoder, ModelConfig

__all__ = ["encoder_from_bert"]


def encoder_from_bert(bert: nn.Module) -> Encoder:
    """Our :class:`Encoder` with the exact weights of a transformers ``BertModel`` (MiniLM, BERT, ...).

    Gives the same last hidden states (tested on all-MiniLM-L6-v2 to 1e-5, padding included).
    """
    c = getattr(bert, "config", None)
    if c is None or not hasattr(bert, "embeddings") or not hasattr(bert, "encoder"):
        raise TypeError(f"expected a transformers BertModel-like module; got {type(bert).__name__}")
    if getattr(c, "hidden_act", "gelu") not in ("gelu", "relu"):
        raise ValueError(f"activation {c.hidden_act!r} is not supported (gelu or relu)")
    if getattr(c, "position_embedding_type", "absolute") != "absolute":
        raise ValueError("only absolute (learned) position embeddings are supported")
    config = ModelConfig("encoder", c.num_hidden_layers, c.num_attention_heads, c.hidden_size, c.intermediate_size,
                         vocab=c.vocab_size, max_len=c.max_position_embeddings, activation=c.hidden_act,
                         token_types=c.type_vocab_size, pooler=getattr(bert, "pooler", None) is not None,
                         dropout=c.hidden_dropout_prob, eps=c.layer_norm_eps)
    ours = Encoder(config).to(dtype=next(bert.parameters()).dtype)
    e = bert.embeddings
    pairs: list[tuple[nn.Module, nn.Module]] = [
        (ours.embeddings.tokens, e.word_embeddings), (ours.embeddings.positions, e.position_embeddings),
        (ours.embeddings.types, e.token_type_embeddings), (ours.embeddings.norm, e.LayerNorm)]
    for mine, layer in zip(ours.layers, bert.encoder.layer, strict=True):
        a = layer.attention
        pairs += [(mine.attn.q_proj, a.self.query), (mine.attn.k_proj, a.self.key), (mine.attn.v_proj, a.self.value),
                  (mine.attn.out_proj, a.output.dense), (mine.norm1, a.output.LayerNorm),
                  (mine.ffn.up, layer.intermediate.dense), (mine.ffn.down, layer.output.dense),
                  (mine.norm2, layer.output.LayerNorm)]
    if ours.pooler is not None:
        pairs.append((ours.pooler, bert.pooler.dense))
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.load_state_dict(theirs.state_dict())
    return ours.train(bert.training)
