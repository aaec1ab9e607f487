"""Load a local Hugging Face model with its tokenizer, offline: ``mh.hf.load("minilm")``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .model import HFModel
from .paths import KNOWN_MODELS, model_path
from .sites import find_sites, main_stack

__all__ = ["load"]


def load(name_or_path: str | Path = "minilm", *, dtype: Any = None) -> HFModel:
    """Load ``"minilm"`` (all-MiniLM-L6-v2 from its PyPI package) or a local model folder.

    Encoders (BERT family) load with ``AutoModel``, or with ``AutoModelForMaskedLM`` when the folder
    names a masked-LM architecture (``BertForMaskedLM``...: its LM head is then the objective of
    :mod:`multihead.analysis.interventions.ablation` and the answer of patching); causal language
    models (``is_decoder``, or an architecture among transformers' causal-LM classes such as
    ``GPT2LMHeadModel``) with
    ``AutoModelForCausalLM``. Causality, layers and heads are read from the model's attention
    sites (:mod:`multihead.hf.sites`). Nothing is fetched from a hub. Raises
    :class:`~multihead.hf.sites.UnsupportedModelError` (one line) for models whose attention
    multihead cannot see exactly. An encoder–decoder model (T5, BART) loads with its three stacks
    (its shape fields describe the encoder).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as err:  # pragma: no cover - the hf extra is missing
        raise FileNotFoundError("Hugging Face models need transformers: run `pip install 'multihead[hf]'`") from err
    hf_logging.disable_progress_bar()
    path = model_path(name_or_path)
    try:
        config = AutoConfig.from_pretrained(path)
    except (ValueError, KeyError) as err:
        raise ValueError(_config_problem(path, err)) from err
    loader = AutoModelForCausalLM if _is_language_model(config) else \
        AutoModelForMaskedLM if _is_masked_language_model(config) else AutoModel
    model = loader.from_pretrained(path, dtype=dtype or torch.float32).eval()
    sites = find_sites(model)  # one line naming the architecture when its attention cannot be seen exactly
    # the shape fields describe the encoder of an encoder-decoder model; its other stacks come from its sites
    stack = "encoder" if getattr(config, "is_encoder_decoder", False) else main_stack(sites)
    layers = [s for s in sites if s.stack == stack]
    tokenizer, processor = None, None
    if stack == "vision":  # images in, through the folder's image processor
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token is None:  # decoders often ship without one; padding is masked anyway
            tokenizer.pad_token = tokenizer.eos_token
    return HFModel(
        model=model,
        tokenizer=tokenizer,
        name=str(name_or_path) if str(name_or_path) in KNOWN_MODELS else path.name,
        path=path,
        # causality as the model's own attention modules declare it, not from a class name
        is_causal=all(s.causal for s in layers),
        num_layers=sum(len(s.layers) for s in layers),
        num_heads=max(s.num_heads for s in layers),
        num_kv_heads=max(s.num_kv_heads for s in layers),
        max_positions=_max_positions(config),
        processor=processor,
    )


def _is_language_model(config: Any) -> bool:
    """Whether the folder holds a causal language model (loaded with its LM head): a decoder config,
    or an architecture transformers lists among its causal-LM classes (GPT2LMHeadModel, LlamaForCausalLM...)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if getattr(config, "is_encoder_decoder", False):
        return False
    return bool(getattr(config, "is_decoder", False)) or _names_one_of(config, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _is_masked_language_model(config: Any) -> bool:
    """Whether the folder holds an encoder saved with its masked-LM head (``BertForMaskedLM``...)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return not getattr(config, "is_encoder_decoder", False) and _names_one_of(config, MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def _names_one_of(config: Any, mapping: Any) -> bool:
    """Whether one of the config's architectures is a class of transformers' auto ``mapping``
    (model type -> class name, or a tuple of them)."""
    names: set[str] = set()
    for value in mapping.values():
        names.update([value] if isinstance(value, str) else value)
    return any(a in names for a in config.architectures or ())


def _max_positions(config: Any) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _config_problem(path: Path, err: Exception) -> str:
    """One line on why transformers cannot read ``path``'s config.json."""
    import transformers

    try:
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return f"{path}/config.json is not a readable JSON object"
    if model_type is None:
        return f"{path}/config.json names no model_type (expected e.g. \"bert\" or \"llama\")"
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if "does not recognize" in first or "Unrecognized" in first or isinstance(err, KeyError):
        return (f"{path}: model_type {model_type!r} is not an architecture transformers {transformers.__version__} "
                "knows; multihead loads the models transformers can load")
    return f"{path}/config.json: {first}"
