"""Everything that touches Hugging Face ``transformers``: local model folders, named attention sites,
the one routed attention call, capture and interventions at those sites, and adapters.

``transformers`` is imported lazily, so ``import multihead`` works without it.
"""

from .bert import BertAttentionAdapter, attention_from_bert, swap_bert_attention
from .capture import AttentionCapture
from .interventions import HeadGates, replace_attention
from .load import load, wrap
from .model import HFModel, ModelLike, as_module
from .paths import KNOWN_MODELS, model_path
from .placement import Placement, PlacementError
from .route import Attachment, AttentionChunk, attach
from .sites import AttentionSite, UnsupportedModelError, find_sites, select, site_names

__all__ = ["KNOWN_MODELS", "Attachment", "AttentionCapture", "AttentionChunk", "AttentionSite", "BertAttentionAdapter",
           "HFModel", "HeadGates", "ModelLike", "Placement", "PlacementError", "UnsupportedModelError", "as_module",
           "attach", "attention_from_bert", "find_sites", "load", "model_path", "replace_attention", "select",
           "site_names", "swap_bert_attention", "wrap"]
