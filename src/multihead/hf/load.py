"""Load a local Hugging Face model with its tokenizer, offline: ``mh.hf.load("minilm")``, a folder,
or a model id the local Hugging Face cache holds."""

from __future__ import annotations

import json
import logging
import os
import pickle
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from ..files import scratch_folder
from .halflinear import raise_half_linears
from .model import HFModel
from .paths import KNOWN_MODELS, model_name, model_path
from .placement import OFFLOAD_PREFIX, Placement, PlacementError, give_back_swapped_weights, resolve
from .sites import find_sites, main_stack
from .version import require_transformers

__all__ = ["check_room", "empty_model", "is_causal_config", "is_language_model", "load", "max_positions",
           "model_class", "quiet_logger", "wrap"]


def load(name_or_path: str | Path = "minilm", *, dtype: Any = "auto", device: str = "auto",
         device_map: str | dict | None = None, max_memory: str | dict | None = None,
         offload_folder: str | Path | None = None, placement: Placement | None = None) -> HFModel:
    """Load ``"minilm"`` (all-MiniLM-L6-v2 from its PyPI package), ``"smollm2"``, a local model
    folder, or a model id (``"Qwen/Qwen2.5-7B"``, ``"org/name@revision"``) the local Hugging Face
    cache holds (:func:`~multihead.hf.paths.model_path`).

    Where and how (:mod:`multihead.hf.placement`, or all of it as one ``placement``): ``dtype``
    ``auto`` (the checkpoint's own on an accelerator, float32 on a CPU), ``float32``,
    ``bfloat16``, ``float16`` or a ``torch.dtype``; ``device`` ``auto`` (a CUDA GPU, else MPS, else
    the CPU), ``cpu``, ``cuda``, ``cuda:N``, ``mps``; or ``device_map`` (``"auto"`` or accelerate's
    dict) with ``max_memory`` (``"0=20GiB,cpu=60GiB"``) and ``offload_folder`` to spread a model
    over GPUs, the CPU and disk. Every problem is one ValueError line before a weight is read.

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
    if str(name_or_path) not in KNOWN_MODELS:
        model_path(name_or_path)  # a folder that is not there, or no model's: said before transformers' import (2 s)
    try:
        from transformers import AutoConfig, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as err:  # pragma: no cover - the hf extra is missing
        raise FileNotFoundError("Hugging Face models need transformers: run `pip install 'multihead[hf]'`") from err
    require_transformers()
    hf_logging.disable_progress_bar()
    path = model_path(name_or_path)
    shown = model_name(name_or_path, path)
    try:
        config = AutoConfig.from_pretrained(path)
    except (ValueError, KeyError) as err:
        raise ValueError(_config_problem(path, err)) from err
    loader = model_class(config)
    _check_weights(path)
    tokenizer = None
    if not (path / "preprocessor_config.json").is_file() and any((path / n).is_file() for n in TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(path)  # a text model's: checked before a weight is read
        _check_vocabulary(tokenizer, config, path)
        _give_padding_token(tokenizer, config, path)
    if placement is None:
        placement = Placement(dtype="auto" if dtype is None else dtype, device=device, device_map=device_map,
                              max_memory=max_memory, offload_folder=offload_folder)
    where, _ = resolve(placement, config)
    where.update(_base_without_pooler(loader, config, path))  # the model the checks below measure, too
    if "max_memory" in where:
        check_room(config, where, shown)
    if isinstance(where.get("device_map"), dict):
        _check_covered(config, where, shown)
    offloaded_to, remove_offloaded = None, None
    if "offload_folder" in where:
        # accelerate writes a weight's file over whatever of that name the folder holds: the weights
        # go to a new folder of this process's own inside it, removed with the model (or at exit)
        offloaded_to, remove_offloaded = scratch_folder(where["offload_folder"], OFFLOAD_PREFIX)
        where["offload_folder"] = str(offloaded_to)
    try:
        model = _from_pretrained(loader, path, where, placement, shown)
    except BaseException:
        if remove_offloaded is not None:
            remove_offloaded()
        raise
    if remove_offloaded is not None:
        # when the model goes, or at the interpreter's exit (the CLI leaves through it on a signal too)
        weakref.finalize(model, remove_offloaded)
    sites = find_sites(model)  # one line naming the architecture when its attention cannot be seen exactly
    stack = _stack(model, sites)
    processor = None
    if stack == "vision":  # images in, through the folder's image processor
        tokenizer, processor = None, _image_processor(path)
    else:
        _check_tokenizer(path)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(path)
            _check_vocabulary(tokenizer, model.config, path)
            _give_padding_token(tokenizer, model.config, path)
    loaded = _wrapped(model, tokenizer, sites, stack, name=shown, path=path, processor=processor)
    loaded.offloaded_to = offloaded_to
    return loaded


def _from_pretrained(loader: Any, path: Path, where: dict[str, Any], placement: Placement, shown: str) -> Any:
    """``loader.from_pretrained(path, **where)`` in eval mode, its failures as one ValueError line."""
    try:
        # torch's note on a pickle's protocol precedes our own line on it; accelerate's note that
        # offloaded weights sit on the meta device is what offloading means (the placement says so)
        # transformers' load report lists a task checkpoint's heads the base model leaves out (a
        # classifier: what loading the base means); weights it lacks are said below, in one line
        with warnings.catch_warnings(), quiet_logger("accelerate.big_modeling"), \
                _dropped("transformers.modeling_utils", "LOAD REPORT"):
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            model, info = loader.from_pretrained(path, output_loading_info=True, **where)
    except ValueError as err:  # accelerate's word for a map that leaves weights nowhere
        if "offload" not in str(err):
            raise
        raise PlacementError("max_memory", f"{placement.max_memory!r} does not hold {shown}: give an offload "
                             "folder (--offload-folder DIR) for the rest, or more memory") from err
    except (OSError, RuntimeError, pickle.UnpicklingError, EOFError) as err:
        if "ignore_mismatched_sizes" in str(err):  # weights of other shapes than the config makes
            raise ValueError(_mismatch_problem(loader, path, where)) from err
        raise ValueError(_weights_problem(path, err)) from err
    except Exception as err:  # safetensors' own error type, raised for a truncated or foreign file
        if type(err).__name__ != "SafetensorError":
            raise
        raise ValueError(_weights_problem(path, err)) from err
    missing = sorted(info.get("missing_keys") or ())
    _check_offloaded_are_stored(model, missing, shown)
    unused = _unused(model, info.get("unexpected_keys") or ())
    if unused:
        warnings.warn(f"{shown}: {len(unused)} weight{'s' if len(unused) > 1 else ''} of the checkpoint "
                      f"{'have' if len(unused) > 1 else 'has'} no place in the model its config.json makes and "
                      f"{'are' if len(unused) > 1 else 'is'} not used ({', '.join(unused[:3])}"
                      f"{', …' if len(unused) > 3 else ''}): is the config the one saved with these weights?",
                      stacklevel=3)
    _alias_tied_offloaded(model)
    if missing:
        warnings.warn(f"{shown}: {len(missing)} weight{'s' if len(missing) > 1 else ''} the checkpoint does not "
                      f"hold {'are' if len(missing) > 1 else 'is'} newly initialised (random): "
                      f"{', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}", stacklevel=3)
    return model.eval()


def _unused(model: Any, unexpected: Any) -> list[str]:
    """The checkpoint's weights transformers did not load that belong to the model's own modules
    (``model.layers.2.…`` of a config with two layers, a bias of a projection built without one):
    its config says another shape than its weights. Those of a module the model does not have (a
    task checkpoint's classifier or pooler, an LM head beside a base model) are what loading the
    base model means: not these."""
    from torch import nn

    modules = dict(model.named_modules())
    found = []
    for key in sorted(unexpected):
        parts = key.split(".")
        nearest = next((n for n in range(len(parts) - 1, 0, -1) if ".".join(parts[:n]) in modules), 0)
        # a weight of a module the model has (a bias the config turned off), or an entry past a
        # list's end (layers, experts beyond the config's count); a missing submodule of the base
        # (BERT's pooler beside a masked-LM head) is a task checkpoint's, as loading the base means
        if nearest and (nearest == len(parts) - 1 or isinstance(modules[".".join(parts[:nearest])], nn.ModuleList)):
            found.append(key)
    return found


def _mismatch_problem(loader: Any, path: Path, where: dict[str, Any]) -> str:
    """One line naming a checkpoint weight whose shape the config does not make: the safetensors'
    headers against the model the config builds on ``meta`` (transformers' own word points to a
    report that a command's quiet logging never shows)."""
    from transformers import AutoConfig

    stored = checkpoint_shapes(path) or {}
    empty = empty_model(AutoConfig.from_pretrained(path), where.get("dtype"), **_built(where))
    shapes = {name: tuple(t.shape) for name, t in empty.state_dict().items()}
    prefix = getattr(empty, "base_model_prefix", "") or ""
    found = []
    for key, shape in stored.items():
        for name in (key, f"{prefix}.{key}", key.removeprefix(f"{prefix}.")):
            if name in shapes:
                if shapes[name] != shape:
                    found.append(f"{key} is {shape} in the checkpoint, {shapes[name]} by the config")
                break
    which = (f": {found[0]}{f' (and {len(found) - 1} more)' if len(found) > 1 else ''}" if found else "")
    return (f"{path}: its weights are not the shapes its config.json makes{which}; the config belongs to another "
            "checkpoint — use the config.json saved with these weights")


def _check_offloaded_are_stored(model: Any, missing: Any, shown: str) -> None:
    """One line when a weight the checkpoint lacks (newly initialised) was offloaded to disk:
    accelerate reads an offloaded weight back from the checkpoint's files, so the forward would
    stop on it — raised at load, not a KeyError in the middle of a run."""
    on_disk = [name for name, device in (getattr(model, "hf_device_map", None) or {}).items() if device == "disk"]
    lost = [key for key in missing if any(key == name or key.startswith(name + ".") or not name for name in on_disk)]
    if lost:
        raise PlacementError("max_memory", f"offloads weights {shown}'s checkpoint does not hold ({lost[0]}, …: "
                             "newly initialised, so never written to disk): give the model more memory "
                             "(--max-memory) so that they stay in it")


def _alias_tied_offloaded(model: Any) -> None:
    """Give a tied weight (an LM head tied to the input embedding) its source's entry in the index
    of weights offloaded to disk: transformers writes one for a safetensors checkpoint read in place,
    none for a pickled one (``pytorch_model.bin``) whose weights accelerate wrote out — the head's
    forward then stopped on ``KeyError: 'lm_head.weight'`` (GPT-2's own checkpoints are such)."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if not isinstance(tied, dict) or not tied:
        return
    indexes = {}
    for module in model.modules():
        dataset = getattr(getattr(getattr(module, "_hf_hook", None), "weights_map", None), "dataset", None)
        index = getattr(dataset, "index", None)
        if isinstance(index, dict):
            indexes[id(index)] = index
    for index in indexes.values():
        for name, source in tied.items():
            if name not in index and source in index:
                index[name] = index[source]


def _base_without_pooler(loader: Any, config: Any, path: Path) -> dict[str, Any]:
    """``{"add_pooling_layer": False}`` where ``loader`` builds a base model with a pooler (BERT, ViT,
    DeiT…) from a checkpoint that holds none (saved with a task head without one: an image or token
    classifier): the pooler reads no attention, and a new one would be random weights — which
    accelerate cannot offload (it reads offloaded weights back from the checkpoint). Else ``{}``."""
    import inspect

    from transformers import AutoModel

    if loader is not AutoModel:
        return {}
    try:
        built = AutoModel._model_mapping[type(config)]
    except (KeyError, ValueError):
        return {}
    if "add_pooling_layer" not in inspect.signature(built.__init__).parameters:
        return {}
    names = checkpoint_names(path)
    if names is None or any(".pooler." in f".{name}" for name in names):
        return {}
    return {"add_pooling_layer": False}


def checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Each weight's shape as a model folder's safetensors store it (their headers only, every
    shard's); None for a pickled checkpoint or one that cannot be read."""
    from safetensors import safe_open

    index = "model.safetensors.index.json"
    files = _shards(path, index) if (path / index).is_file() else \
        ["model.safetensors"] if (path / "model.safetensors").is_file() else None
    if files is None:
        return None
    shapes = {}
    try:
        for file in files:
            with safe_open(str(path / file), framework="pt") as stored:
                shapes.update({key: tuple(stored.get_slice(key).get_shape()) for key in stored.keys()})
    except Exception:  # a truncated or foreign file: the load says so in one line
        return None
    return shapes


def checkpoint_names(path: Path) -> list[str] | None:
    """The weight names a model folder's safetensors hold (their headers only, or the index's
    weight map); None for a pickled checkpoint (its names would mean reading it)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            return list(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
        except (OSError, ValueError, AttributeError):
            return None
    single = path / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(single), framework="pt") as stored:
            return list(stored.keys())
    except Exception:  # a truncated or foreign file: the load itself says so in one line
        return None


def wrap(model: Any, tokenizer: Any, *, name: str, path: Path | None = None, processor: Any = None) -> HFModel:
    """A transformers model already in memory (built from a config, random weights, fine-tuned in
    this process) as :func:`load` gives one: its shape read from its attention sites. A model
    accelerate dispatched with weights it swaps in to run on the CPU gets, as from :func:`load`,
    a forward hook on each such module that gives the freed heap back
    (:func:`~multihead.hf.placement.give_back_swapped_weights`)."""
    require_transformers()
    sites = find_sites(model)  # one line naming the architecture when its attention cannot be seen exactly
    return _wrapped(model, tokenizer, sites, _stack(model, sites), name=name, path=path, processor=processor)


def _wrapped(model: Any, tokenizer: Any, sites: list, stack: str, *, name: str, path: Path | None,
             processor: Any) -> HFModel:
    layers = [s for s in sites if s.stack == stack]
    give_back_swapped_weights(model)
    raise_half_linears(model)  # half precision on a CPU without its units: float32 products, rounded once
    return HFModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        path=path if path is not None else Path(name),
        # causality as the model's own attention modules declare it, not from a class name
        is_causal=all(s.causal for s in layers),
        num_layers=sum(len(s.layers) for s in layers),
        num_heads=max(s.num_heads for s in layers),
        num_kv_heads=max(s.num_kv_heads for s in layers),
        max_positions=max_positions(model.config),
        processor=processor,
    )


def _stack(model: Any, sites: list) -> str:
    """The stack the shape fields describe: the encoder of an encoder-decoder model, else the main one."""
    return "encoder" if getattr(model.config, "is_encoder_decoder", False) else main_stack(sites)


#: Files a tokenizer is saved as (any one of them): a text model's folder without one has no tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model", "merges.txt")
#: Weight files transformers reads; a pickle (``.bin``) is read only with ``weights_only=True``.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


@contextmanager
def quiet_logger(logger_name: str) -> Iterator[None]:
    """Inside, the named logger says only errors."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def _dropped(logger_name: str, words: str) -> Iterator[None]:
    """Inside, the named logger's records containing ``words`` are dropped (but for a report of
    mismatched or unconverted weights, which transformers raises on) — a filter, not a level:
    transformers 5 runs a tensor-parallel check whose notes go to another logger when its
    modeling logger's level is raised."""
    def keep(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # a report transformers raises after ("look at the above report!") is the error's detail: kept
        return words not in message or "MISMATCH" in message or "CONVERSION" in message

    logger = logging.getLogger(logger_name)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def model_class(config: Any) -> Any:
    """The transformers auto class :func:`load` builds a model of ``config`` with: a causal
    language model with its LM head, an encoder with its masked-LM head, else the base model."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    return AutoModelForCausalLM if is_language_model(config) else \
        AutoModelForMaskedLM if _is_masked_language_model(config) else AutoModel


def empty_model(config: Any, dtype: Any, *, base: bool = False, **built: Any) -> Any:
    """A model of ``config`` on the ``meta`` device, in ``dtype`` — shapes without weights (what
    plans and checks measure); ``base``: the base model only (no LM head); ``built``: what its
    class takes beside the config (``add_pooling_layer=False``: as :func:`load` builds it)."""
    import torch
    from transformers import AutoModel

    auto = AutoModel if base else model_class(config)
    with suppress(KeyError, AttributeError, ValueError):
        # the model's module imported here, not under the meta device: with torch 2.6, transformers'
        # generation module reads a tensor's .item() as it is imported, which a meta tensor refuses
        auto._model_mapping[type(config)]
    with torch.device("meta"), warnings.catch_warnings(), quiet_logger("transformers.modeling_utils"):
        warnings.simplefilter("ignore")
        return auto.from_config(config, dtype=dtype, **built).eval()


def _built(where: dict[str, Any]) -> dict[str, Any]:
    """What of ``where`` (``from_pretrained``'s keywords) the model's class takes beside its config."""
    return {key: where[key] for key in ("add_pooling_layer",) if key in where}


def _check_covered(config: Any, where: dict, shown: str) -> None:
    """One line when a device map given as a dict names no module of the model, or leaves some of
    its weights without a device: transformers took such a map silently, the whole model on the CPU."""
    empty = empty_model(config, where["dtype"], **_built(where))
    modules = dict(empty.named_modules())
    tensors = {name for name, _ in empty.state_dict(keep_vars=True).items()}  # accelerate's maps name some
    keys = [str(k) for k in where["device_map"]]
    unknown = [k for k in keys if k and k not in modules and k not in tensors]
    if unknown:
        raise PlacementError("device_map", f"names {', '.join(map(repr, unknown[:3]))}, not a module of {shown} "
                             f"(its modules are named like {', '.join(repr(n) for n in list(modules)[1:3])}, …; "
                             "a weight by its own name)")
    if "" in keys:
        return
    left = [name for name, _ in empty.named_parameters()
            if not any(name == k or name.startswith(k + ".") for k in keys)]
    if left:
        example = ", ".join(f"{name!r}: 'cpu'" for name, _ in empty.named_children())
        raise PlacementError("device_map", f"places no device for {len(left):,} of {shown}'s weights ({left[0]}, …): "
                             f"give every module a device (such as {{{example}}}), or use 'auto'")


def check_room(config: Any, where: dict, shown: str) -> None:
    """One line when ``max_memory`` leaves no device (disk aside) room for even one of the model's
    blocks (accelerate never splits one): the model is built on the meta device to measure them."""
    from accelerate.utils import compute_module_sizes

    empty = empty_model(config, where["dtype"], **_built(where))
    blocks = set(getattr(empty, "_no_split_modules", None) or ())
    sizes = compute_module_sizes(empty, dtype=where["dtype"])
    candidates = [(sizes[name], type(m).__name__) for name, m in empty.named_modules() if type(m).__name__ in blocks]
    largest, kind = max(candidates, default=(0, ""))
    room = max((size for device, size in where["max_memory"].items() if device != "disk"), default=0)
    if largest and room < largest:
        raise PlacementError("max_memory", f"gives no device room for the largest block of {shown} that "
                             f"accelerate never splits ({kind}: {largest / 2**20:.1f} MiB in "
                             f"{str(where['dtype']).removeprefix('torch.')}); the most any device gets is "
                             f"{room / 2**20:.1f} MiB")


def _check_weights(path: Path) -> None:
    """One line for a folder without weights beside its config, or a sharded checkpoint with a
    shard its index names missing or cut short (the load blamed the index for it)."""
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"{path} holds no weights ({', '.join(WEIGHT_FILES[::2])}) beside its config.json")
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (path / index).is_file() and not any((path / name).is_file() for name in WEIGHT_FILES[::2]):
            _check_shards(path, index)


def _shards(path: Path, index: str) -> list[str] | None:
    """The shard files a sharded checkpoint's ``index`` names, or None where it is no index."""
    try:
        return sorted(set(json.loads((path / index).read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _check_shards(path: Path, index: str) -> None:
    shards = _shards(path, index) or []  # not an index: the load says so in one line
    for shard in shards:
        file = path / shard
        if not file.is_file():
            raise ValueError(f"{file} is missing: {index} names {len(shards)} shards and the folder lacks this one "
                             "(a download or copy that stopped?); fetch it again")
        problem = _safetensors_problem(file) if shard.endswith(".safetensors") else None
        if problem:
            raise ValueError(f"{file} cannot be read: {problem}; fetch it again")


def _safetensors_problem(file: Path) -> str | None:
    """Why a safetensors file cannot be read (cut short, not safetensors), from its header alone; None if it can."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt"):
            return None
    except Exception as err:  # safetensors' own error type
        return f"it is truncated or not safetensors ({' '.join(str(err).split())[:120]})"


def _image_processor(path: Path) -> Any:
    """The folder's image processor: transformers' auto class — or, where that class itself needs
    torchvision and it is not installed (transformers 5.17's does; 5.25's and 4.x's read images with
    PIL without it), the class its ``preprocessor_config.json`` names, in its PIL form where there
    is one: it reads the same images into the same pixels. One line when neither loads."""
    import transformers

    try:
        return transformers.AutoImageProcessor.from_pretrained(path)
    except ImportError as err:
        config = path / "preprocessor_config.json"
        name = json.loads(config.read_text()).get("image_processor_type", "") if config.is_file() else ""
        name = name.removesuffix("Fast")
        found = getattr(transformers, f"{name}Pil", None) or getattr(transformers, name, None) if name else None
        if found is None:
            first = " ".join(str(err).split())[:160]
            raise ValueError(f"{path}: its image processor cannot be loaded with transformers "
                             f"{transformers.__version__} ({first}); install torchvision") from err
        return found.from_pretrained(path)


def _check_tokenizer(path: Path) -> None:
    """One line for a text model's folder without a tokenizer (transformers would build an empty
    one, and every token would be [UNK])."""
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"no tokenizer in {path}: a text model's folder needs its tokenizer's files "
                         "(tokenizer.json, or vocab.txt / vocab.json and merges.txt / a SentencePiece model)")


def _give_padding_token(tokenizer: Any, config: Any, path: Path) -> None:
    """A padding token for a tokenizer without one (padding is masked, any token does): its end
    token, else the config's ``pad_token_id`` / ``eos_token_id`` (a folder with ``tokenizer.json``
    alone has neither token: every batch of texts stopped on "Asking to pad but the tokenizer does
    not have a padding token"); where neither names one, the first token (masked out all the same)."""
    if tokenizer.pad_token is not None:
        return
    if tokenizer.eos_token is not None:  # decoders often ship without a padding token
        tokenizer.pad_token = tokenizer.eos_token
        return
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(config, name, None)
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(value, int) and 0 <= value < len(tokenizer):
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(value)
            return
    if len(tokenizer):
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(0)


def _check_vocabulary(tokenizer: Any, config: Any, path: Path) -> None:
    """One line for a tokenizer that knows under half of the model's vocabulary: its vocabulary file
    is missing (a folder with only ``tokenizer_config.json`` gave BERT a tokenizer of 5 tokens, every
    word [UNK], and `prune` ran to the end at chance). A vocabulary padded for speed stays above half."""
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    known = len(tokenizer)
    if isinstance(vocab, int) and vocab > 0 and known < vocab / 2:
        raise ValueError(f"the tokenizer in {path} knows {known:,} tokens of the model's {vocab:,}: its vocabulary "
                         "file is missing (tokenizer.json, or vocab.txt / vocab.json and merges.txt / a "
                         "SentencePiece model), or it is another model's tokenizer")


def _weights_problem(path: Path, err: BaseException) -> str:
    """One line on why the folder's weights cannot be read, naming the file."""
    first = " ".join(str(err).split())[:200] or type(err).__name__
    files = [name for name in WEIGHT_FILES if (path / name).is_file()]
    name = path / (files[0] if files else "weights")
    if isinstance(err, pickle.UnpicklingError) or "weights_only" in first or "Unpickl" in first:
        return (f"{name} is a pickle that does not load with weights_only=True (it may run code when loaded): "
                "multihead reads safetensors, or plain-tensor pickles; refused")
    return f"{name} cannot be read: it is truncated or not a model's weights ({first})"


def is_causal_config(config: Any) -> bool:
    """Whether a model of ``config`` attends causally, read from the config alone (a decoder, or a
    model type transformers has causal-LM classes for and no masked-LM class), with or without its LM head."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if getattr(config, "is_encoder_decoder", False):
        return False
    kind = getattr(config, "model_type", None)
    return bool(getattr(config, "is_decoder", False)) or (
        kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def is_language_model(config: Any) -> bool:
    """Whether the folder holds a causal language model (loaded with its LM head): a decoder config,
    or an architecture transformers lists among its causal-LM classes (GPT2LMHeadModel, LlamaForCausalLM...)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    if getattr(config, "is_encoder_decoder", False):
        return False
    if not getattr(config, "architectures", None):  # a config made in code names no class: its type decides
        return is_causal_config(config)
    if bool(getattr(config, "is_decoder", False)) or _names_one_of(config, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        return True
    # a causal LM's base model saved alone (LlamaModel, Qwen2Model) with its output embedding tied to
    # the input one: its LM head is in the checkpoint, as the embedding (loaded so, nothing random)
    return bool(getattr(config, "tie_word_embeddings", False)) and _names_one_of(config, MODEL_MAPPING_NAMES) and \
        is_causal_config(config)


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


def max_positions(config: Any) -> int | None:
    """The most tokens a model of ``config`` reads (its position table or context length), or None."""
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
    if "custom code" in first or "trust_remote_code" in first:
        return (f"{path}: its model is custom code (auto_map in config.json), which multihead never runs "
                "(trust_remote_code stays off); it reads the architectures transformers itself implements")
    if "does not recognize" in first or "Unrecognized" in first or isinstance(err, KeyError):
        return (f"{path}: model_type {model_type!r} is not an architecture transformers {transformers.__version__} "
                "knows; multihead loads the models transformers can load")
    return f"{path}/config.json: {first}"
