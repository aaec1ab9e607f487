"""multihead: multi-head attention you can trust and run long, and a view into every head.

>>> import multihead as mh
>>> attn = mh.MultiHeadAttention(embed_dim=512, num_heads=8)
>>> y = attn(x, mask=mh.masks.causal())
"""

from . import analysis, heads, hf
from .analysis import Report, analyze
from .attention import (
    BACKENDS,
    AttentionMemoryError,
    BackendChoice,
    MemoryEstimate,
    MultiHeadAttention,
    attention,
    estimate_memory,
    explain_backend,
    masks,
)
from .heads import head_importance, prune_heads

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "AttentionMemoryError",
    "BackendChoice",
    "MemoryEstimate",
    "MultiHeadAttention",
    "Report",
    "__version__",
    "analysis",
    "analyze",
    "attention",
    "estimate_memory",
    "explain_backend",
    "head_importance",
    "heads",
    "hf",
    "masks",
    "prune_heads",
]
