"""Tiny, randomly initialised transformers models of many architectures, built in the tests (no
downloads) with weights drawn wide enough that heads differ, and architecture features (sliding
windows, soft-capping, sinks) set so they act on short inputs."""

from __future__ import annotations

import torch
import transformers

from conftest import release

#: Architectures transformers moved onto its attention interface, and from which of its versions:
#: refused before, supported since (docs/analysis.md says both).
SUPPORTED_SINCE = {"falcon": (5, 25)}


def _since(name: str) -> str:
    return "supported" if release(transformers.__version__) >= SUPPORTED_SINCE[name] else "refused"


SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=120,
             max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
SEQ2SEQ = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
               encoder_ffn_dim=64, decoder_ffn_dim=64, decoder_start_token_id=1)

#: name -> (transformers model_type, config overrides, what multihead does with it)
ARCHITECTURES: dict[str, tuple[str, dict, str]] = {
    "bert": ("bert", {}, "supported"),
    "roberta": ("roberta", {}, "supported"),
    "distilbert": ("distilbert", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64), "supported"),
    "albert": ("albert", dict(embedding_size=16), "supported"),
    "electra": ("electra", dict(embedding_size=16), "supported"),
    "gpt2": ("gpt2", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64), "supported"),
    "gpt-neox": ("gpt_neox", {}, "supported"),
    "llama (GQA)": ("llama", dict(num_key_value_heads=2), "supported"),
    "mistral (sliding window 4)": ("mistral", dict(num_key_value_heads=2, sliding_window=4), "supported"),
    "qwen2": ("qwen2", dict(num_key_value_heads=2), "supported"),
    "qwen3": ("qwen3", dict(num_key_value_heads=2, head_dim=8), "supported"),
    "gemma": ("gemma", dict(num_key_value_heads=2, head_dim=8), "supported"),
    "gemma2 (window 4, softcap 1)": ("gemma2", dict(num_key_value_heads=2, head_dim=8, sliding_window=4,
                                                    attn_logit_softcapping=1.0, query_pre_attn_scalar=8),
                                     "supported"),
    "gemma3 (window 4, local and global layers)": ("gemma3_text", dict(num_key_value_heads=2, head_dim=8,
                                                                       sliding_window=4, query_pre_attn_scalar=8,
                                                                       layer_types=["sliding_attention",
                                                                                    "full_attention"]),
                                                    "supported"),
    "phi": ("phi", {}, "supported"),
    "phi3": ("phi3", dict(num_key_value_heads=2), "supported"),
    "opt": ("opt", dict(ffn_dim=64, word_embed_proj_dim=32), "supported"),
    "mixtral (experts)": ("mixtral", dict(num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1),
                          "supported"),
    "qwen3-moe (experts)": ("qwen3_moe", dict(num_key_value_heads=2, head_dim=8, num_experts=2,
                                              num_experts_per_tok=1, moe_intermediate_size=16), "supported"),
    "deepseek-v3 (latent K/V, Dv 6 < Dk 8)": ("deepseek_v3", dict(num_key_value_heads=4, q_lora_rank=16,
                                                                  kv_lora_rank=16, qk_rope_head_dim=4,
                                                                  qk_nope_head_dim=4, v_head_dim=6,
                                                                  n_routed_experts=2, num_experts_per_tok=1,
                                                                  moe_intermediate_size=16, first_k_dense_replace=1,
                                                                  n_group=1, topk_group=1), "supported"),
    "gpt-oss (sinks)": ("gpt_oss", dict(num_key_value_heads=2, head_dim=8, num_local_experts=2,
                                        num_experts_per_tok=1, sliding_window=4), "supported"),
    "vit": ("vit", dict(image_size=16, patch_size=4, num_channels=3), "supported"),
    "t5": ("t5", dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0),
           "encoder-decoder"),
    "bart": ("bart", SEQ2SEQ, "encoder-decoder"),
    "deberta-v2": ("deberta-v2", {}, "refused"),
    "falcon": ("falcon", {}, _since("falcon")),  # its fused Q/K/V: gated, not pruned
    "bloom": ("bloom", dict(n_embed=32, n_layer=2, n_head=4), "refused"),
    "swin (windows of patches)": ("swin", dict(image_size=16, patch_size=2, embed_dim=16, depths=[1, 1],
                                              num_attention_heads=[2, 4], window_size=2), "refused"),
}


#: Architectures whose kernels take no float64 (mixtures of experts: grouped matmuls).
FLOAT32_ONLY = ("gpt_oss", "mixtral", "qwen3_moe", "deepseek_v3")


def build(name: str, dtype: torch.dtype = torch.float64, seed: int = 0):
    """The tiny model (eval mode, ``dtype``) of ``ARCHITECTURES[name]``, with wide random weights."""
    from transformers import AutoConfig, AutoModel

    model_type, overrides, _ = ARCHITECTURES[name]
    if model_type in FLOAT32_ONLY:
        dtype = torch.float32
    config = AutoConfig.for_model(model_type, **{**SMALL, **overrides})
    config.attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModel.from_config(config, attn_implementation="eager").to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() >= 2 and "norm" not in pname.lower():
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
            elif "sinks" in pname:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def inputs(name: str, model, B: int = 2, T: int = 10) -> dict:
    """A padded batch for ``model`` (the second example shorter), as keyword arguments."""
    g = torch.Generator().manual_seed(1)
    if ARCHITECTURES[name][0] == "vit":
        size = model.config.image_size
        return {"pixel_values": torch.randn(B, 3, size, size, generator=g, dtype=model.dtype)}
    ids = torch.randint(3, model.config.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, T - 3:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if getattr(model.config, "is_encoder_decoder", False):
        batch["decoder_input_ids"] = torch.randint(3, model.config.vocab_size, (B, T - 2), generator=g)
    return batch
