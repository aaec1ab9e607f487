"""multihead: multi-head attention you can trust and run long, and a view into every head.

>>> import multihead as mh
>>> attn = mh.MultiHeadAttention(embed_dim=512, num_heads=8)
>>> y = attn(x, mask=mh.masks.causal())
"""

from . import hf
from .attention import BACKENDS, BackendChoice, MultiHeadAttention, attention, explain_backend, masks

__version__ = "0.1.0"

__all__ = [
           "BACKENDS",
           "BackendChoice",
           "MultiHeadAttention",
           "__version__",
           "attention",
           "explain_backend",
           "hf",
           "masks",
]
