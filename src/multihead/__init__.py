"""multihead: multi-head attention you can trust and run long, and a view into every head.

>>> import multihead as mh
>>> attn = mh.MultiHeadAttention(embed_dim=512, num_heads=8)
>>> y = attn(x, mask=mh.masks.causal())

Every documented name is reachable from here: the layer and kernels (``mh.MultiHeadAttention``,
``mh.attention``, ``mh.masks``, ``mh.KVCache``), the analysis (``mh.analyze``, ``mh.Report``),
heads (``mh.head_importance``, ``mh.prune_heads``) and the subpackages ``mh.hf``, ``mh.inputs``,
``mh.analysis``, ``mh.heads``, ``mh.models``, ``mh.render``, ``mh.io``, ``mh.viz``, ``mh.jobs``,
``mh.train``, ``mh.experiments``, ``mh.data``. docs/architecture.md draws their layers.

Names are imported on first use (PEP 562), so ``import multihead`` costs nothing until something
is touched — the CLI can take over Ctrl-C before torch loads. The kernels and the layer live in
the subpackage ``multihead.attn`` (``multihead.attention`` is the function, not a module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_names

__version__ = "0.1.0"

#: Public name -> the module that defines it ("" = the name is itself a subpackage or module).
_NAMES = {
    **dict.fromkeys(("BACKENDS", "AttentionMemoryError", "BackendChoice", "KVCache", "MemoryEstimate",
                     "MultiHeadAttention", "attention", "estimate_memory", "explain_backend"), ".attn"),
    **dict.fromkeys(("Report", "analyze", "compare", "patch"), ".analysis"),
    **dict.fromkeys(("head_importance", "prune_heads"), ".heads"),
    **{sub: "" for sub in ("analysis", "attn", "data", "experiments", "heads", "hf", "inputs", "io", "jobs", "masks",
                           "models", "render", "train", "viz")},
}

__all__ = [
    "BACKENDS",
    "AttentionMemoryError",
    "BackendChoice",
    "KVCache",
    "MemoryEstimate",
    "MultiHeadAttention",
    "Report",
    "__version__",
    "analysis",
    "analyze",
    "attention",
    "attn",
    "compare",
    "data",
    "estimate_memory",
    "experiments",
    "explain_backend",
    "head_importance",
    "heads",
    "hf",
    "inputs",
    "io",
    "jobs",
    "masks",
    "models",
    "patch",
    "prune_heads",
    "render",
    "train",
    "viz",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names come from __getattr__
    from . import analysis, attn, data, experiments, heads, hf, inputs, io, jobs, masks, models, render, train, viz
    from .analysis import Report, analyze, compare, patch
    from .attn import (
        BACKENDS,
        AttentionMemoryError,
        BackendChoice,
        KVCache,
        MemoryEstimate,
        MultiHeadAttention,
        attention,
        estimate_memory,
        explain_backend,
    )
    from .heads import head_importance, prune_heads


__getattr__, __dir__ = lazy_names(__name__, _NAMES)
