"""Everything that touches Hugging Face ``transformers``: local model folders and adapters.

``transformers`` is imported lazily, so ``import multihead`` works without it.
"""

from .bert import BertAttentionAdapter, attention_from_bert, swap_bert_attention
from .capture import AttentionCapture
from .gates import HeadGates
from .load import HFModel, ModelLike, as_module, load
from .paths import KNOWN_MODELS, model_path

__all__ = ["KNOWN_MODELS", "AttentionCapture", "BertAttentionAdapter", "HFModel", "HeadGates", "ModelLike",
           "as_module", "attention_from_bert", "load", "model_path", "swap_bert_attention"]
