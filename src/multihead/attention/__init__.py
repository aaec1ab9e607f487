"""Attention kernels, masks and the multi-head layer."""

from . import masks
from .kernels import BACKENDS, BackendChoice, attention, explain_backend
from .layer import MultiHeadAttention

__all__ = ["BACKENDS", "BackendChoice", "MultiHeadAttention", "attention", "explain_backend", "masks"]
