"""Everything that touches Hugging Face ``transformers``: local model folders and adapters.

``transformers`` is imported lazily, so ``import multihead`` works without it.
"""

from .bert import BertAttentionAdapter, attention_from_bert, swap_bert_attention
from .capture import AttentionCapture
from .gates import HeadGates
from .load import HFModel, ModelLike, as_module, load
from .paths import KNOWN_MODELS, model_path
from .replace import WhatIf, replace_attention, what_if
from .sites import AttentionSite, UnsupportedModelError, find_sites

__all__ = ["KNOWN_MODELS", "AttentionCapture", "AttentionSite", "BertAttentionAdapter", "HFModel", "HeadGates",
           "ModelLike", "UnsupportedModelError", "WhatIf", "as_module", "attention_from_bert", "find_sites", "load",
           "model_path", "replace_attention", "swap_bert_attention", "what_if"]
