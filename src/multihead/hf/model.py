"""What every function that takes a model accepts: :class:`HFModel` (what :func:`~multihead.hf.load`
returns: a model with its tokenizer and the shape of its attention) or a bare ``nn.Module``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from .placement import gated_heads, input_device, placement_words

__all__ = ["HFModel", "ModelLike", "as_module", "is_conv1d", "require_loaded", "right_padding", "takes"]


def is_conv1d(module: object) -> bool:
    """Whether ``module`` is transformers' ``Conv1D`` (GPT-2's projections: a linear layer whose weight
    is stored (in, out)) or a class made from it, without importing transformers."""
    return any(c.__name__ == "Conv1D" and c.__module__.startswith("transformers.")
               for c in type(module).__mro__)


def takes(module: nn.Module, argument: str) -> bool:
    """Whether ``module``'s forward takes ``argument`` (``use_cache``, ``logits_to_keep``...)."""
    return argument in inspect.signature(module.forward).parameters


@dataclass
class HFModel:
    """A loaded model, its tokenizer and the shape of its attention."""

    model: nn.Module
    tokenizer: Any
    name: str
    path: Path
    is_causal: bool
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_positions: int | None
    #: a vision model's image processor (its ``tokenizer`` is then None)
    processor: Any = None
    #: the folder of this process's own where accelerate wrote the weights offloaded to disk (inside
    #: the ``offload_folder`` the user named; removed with the model, or at exit); None without one
    offloaded_to: Path | None = None

    @property
    def body(self) -> nn.Module:
        """The base model (``model.base_model``): what reading attention needs, without an LM head."""
        return getattr(self.model, "base_model", self.model)

    @property
    def has_lm_head(self) -> bool:
        """Whether the model makes logits over words (a causal or masked language model's head):
        a base model's checkpoint (``LlamaModel``, ``BertModel``: an embedding model) has none, and
        nothing that reads a loss, an answer's logit or the words' embedding can run on it."""
        return getattr(self.model, "get_output_embeddings", lambda: None)() is not None

    #: What a decoder without an LM head is called in the one-line refusals of what needs one.
    HEADLESS = "a decoder loaded without a language-model head (a base model's checkpoint, e.g. an embedding model)"

    @property
    def without_objective(self) -> str | None:
        """What this model is, where it has no one-stack text objective to measure heads against
        (ablation, what-if, pruning): an encoder-decoder, a vision model, a decoder without its
        LM head; None for the models that have one."""
        if self.is_encoder_decoder:
            return "an encoder-decoder model"
        if self.processor is not None:
            return "a vision model"
        return self.HEADLESS if self.is_causal and not self.has_lm_head else None

    @property
    def no_cache(self) -> dict[str, bool]:
        """``{"use_cache": False}`` for a model whose forward takes it, else ``{}``: a reading pass
        generates nothing, and a decoder's KV cache would keep every layer's keys and values alive
        to the end of the pass (377 MB for SmolLM2 at 8k tokens, 4 GiB for Llama-3-8B at 32k)."""
        return {"use_cache": False} if takes(self.body, "use_cache") else {}

    @property
    def device(self) -> Any:
        """Where the model's inputs go (:func:`~multihead.hf.placement.input_device`)."""
        return input_device(self.model)

    @property
    def dtype(self) -> Any:
        """The dtype of the model's floating-point weights (the first one's)."""
        return next((p.dtype for p in self.model.parameters() if p.is_floating_point()), None)

    @property
    def placement(self) -> str:
        """Where and in what precision the model runs, in words: ``bfloat16 on cuda:0``, ``float32
        on cpu + disk (device map)`` — and the heads gated while head gates act on it (``float32 on
        cpu, 2 heads gated (L0.H1, L3.H5)``)."""
        where = placement_words(self.model)
        # head gates acting (mh.hf.HeadGates): a report of the gated model says so, and which heads
        gated = sorted(set(gated_heads(self.model)) | set(gated_heads(self.body)))
        if gated:
            named = ", ".join(f"L{layer}.H{head}" for layer, head in gated[:6]) + (", …" if len(gated) > 6 else "")
            where += f", {len(gated)} head{'s' if len(gated) > 1 else ''} gated ({named})"
        return where

    @property
    def is_encoder_decoder(self) -> bool:
        """An encoder–decoder model (T5, BART, ...): three stacks, encoder, decoder and cross."""
        return bool(getattr(getattr(self.model, "config", None), "is_encoder_decoder", False))


#: What every function that takes a model accepts: what :func:`load` returns, or a bare module.
ModelLike = HFModel | nn.Module


def as_module(model: ModelLike) -> nn.Module:
    """The ``nn.Module`` behind ``model``: an :class:`HFModel`'s ``.model``, or ``model`` itself."""
    if isinstance(model, HFModel):
        return model.model
    if isinstance(model, nn.Module):
        return model
    raise TypeError(f"expected a model from mh.hf.load(...) or a torch.nn.Module; got {type(model).__name__}")


def require_loaded(model: ModelLike, what: str) -> HFModel:
    """``model`` if it is what :func:`load` returns; TypeError saying so otherwise (``what`` needs the tokenizer)."""
    if isinstance(model, HFModel):
        return model
    raise TypeError(f"{what} needs the model with its tokenizer, as mh.hf.load(NAME_OR_FOLDER) returns it; "
                    f"got {type(model).__name__}")


@contextmanager
def right_padding(tokenizer: Any) -> Iterator[Any]:
    """Pad on the right while inside (positions then do not shift with padding); restore after."""
    saved = tokenizer.padding_side
    tokenizer.padding_side = "right"
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side = saved


@contextmanager
def forward_replaced(module: nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """While open, calling ``module`` runs ``forward`` instead of it: an instance ``forward``, which
    ``nn.Module.__call__`` takes (its hooks still run), restored after — also the one accelerate's
    hooks of a device map put there."""
    saved = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if saved is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = saved
