"""Attention kernels, memory estimates and the multi-head layer (masks: :mod:`multihead.masks`)."""

from .kernels import BACKENDS, BackendChoice, attention, explain_backend
from .layer import KVCache, MultiHeadAttention
from .memory import AttentionMemoryError, MemoryEstimate, estimate_memory

__all__ = [
    "BACKENDS",
    "AttentionMemoryError",
    "BackendChoice",
    "KVCache",
    "MemoryEstimate",
    "MultiHeadAttention",
    "attention",
    "estimate_memory",
    "explain_backend",
]
