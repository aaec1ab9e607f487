"""A training run's TOML config read and checked (:func:`load_config`): every section's keys, their
types and ranges, the device and precision — without torch until the device is asked for, so a
typo in a config is answered at once. The format is in :mod:`multihead.train`'s docstring."""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .data import TEXT_SOURCES
from .hf.placement import PlacementError, resolve_device

__all__ = ["KEYS", "PRECISIONS", "TrainConfig", "load_config"]


@dataclass
class TrainConfig:
    out: Path
    seed: int = 0
    steps: int = 100
    model: dict = field(default_factory=lambda: {"layers": 2, "heads": 4, "dim": 64, "hidden": 256})
    data: dict = field(default_factory=lambda: {"source": "hamlet", "seq_len": 64, "batch_size": 16})
    optim: dict = field(default_factory=lambda: {"lr": 3e-3, "weight_decay": 0.01, "warmup": 10})
    run: dict = field(default_factory=lambda: {"checkpoint_every": 50, "log_every": 10, "grad_monitor": False})
    #: write into a folder that holds files of another origin (never over this run's own names)
    force: bool = False

    def identity(self) -> dict:
        """What makes two runs the same run (a resume must match it): the seed, model, data and
        optimiser — and the precision when it is not float32 (the device may change on a resume)."""
        found = {"seed": self.seed, "model": dict(self.model), "data": dict(self.data), "optim": dict(self.optim)}
        if self.run.get("precision", "float32") != "float32":
            found["precision"] = self.run["precision"]
        return found


#: Every key a config may set, per section, with the type it must have.
KEYS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "": {"out": str, "seed": int, "steps": int, "model": dict, "data": dict, "optim": dict, "run": dict},
    "model": {"layers": int, "heads": int, "dim": int, "hidden": int, "dropout": (int, float)},
    "data": {"source": str, "seq_len": int, "batch_size": int},
    "optim": {"lr": (int, float), "weight_decay": (int, float), "warmup": int},
    "run": {"checkpoint_every": int, "log_every": int, "grad_monitor": bool, "tensorboard": bool, "fsdp": bool,
            "device": str, "precision": str},
}
#: ``[run] precision``: float32 throughout, or bfloat16 mixed precision (autocast; the weights and
#: the optimiser stay float32). float16 would need loss scaling: bfloat16 does not.
PRECISIONS = ("float32", "bfloat16")
#: Keys whose value must be positive (the rest only >= 0 where they are numbers).
POSITIVE = {"steps", "layers", "heads", "dim", "hidden", "seq_len", "batch_size", "lr", "log_every"}


def load_config(path: str | Path, *, force: bool = False, device: str | None = None,
                dtype: str = "auto") -> TrainConfig:
    """Read and check a TOML config; ValueError naming the file and the first bad key — an unknown
    key with the closest known one, a value of the wrong type or range.

    ``device`` and ``dtype`` (the command line's ``--device`` and ``--dtype``) replace ``[run]
    device`` and ``[run] precision``; dtype ``auto`` keeps the config's precision (float32 unless it
    says bfloat16), and float16 is refused: mixed precision in float16 needs loss scaling.
    """
    if dtype not in ("auto", *PRECISIONS):
        hint = "; float16 training needs loss scaling: use bfloat16 (mixed precision)" if dtype == "float16" else ""
        raise ValueError(f"--dtype must be auto, {' or '.join(PRECISIONS)} for training; got {dtype!r}{hint}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such config file" if not path.exists() else f"{path} is a folder, expected "
                         "a TOML file")
    try:
        raw = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start})") from err
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML ({err})") from err
    _check_keys(path, "", raw)
    if "out" not in raw:
        raise ValueError(f"{path}: missing 'out' (the run's folder)")
    for section in ("model", "data", "optim", "run"):
        _check_keys(path, section, raw.get(section, {}))
    c = TrainConfig(out=Path(raw["out"]), force=force)
    for key in ("seed", "steps"):
        if key in raw:
            setattr(c, key, raw[key])
    for section in ("model", "data", "optim", "run"):
        getattr(c, section).update(raw.get(section, {}))
    if device is not None:
        c.run["device"] = device
    if dtype != "auto":
        c.run["precision"] = dtype
    if c.data["source"] not in TEXT_SOURCES:
        raise ValueError(f"{path}: data.source must be 'hamlet' or 'treebank'; got {c.data['source']!r}")
    if c.run.get("precision", "float32") not in PRECISIONS:
        raise ValueError(f"{path}: [run] precision must be one of {', '.join(PRECISIONS)}; got {c.run['precision']!r}")
    if c.model["dim"] % c.model["heads"]:
        raise ValueError(f"{path}: model.heads ({c.model['heads']}) must divide model.dim ({c.model['dim']})")
    try:  # last: asking for a device loads torch (every other check answers before it)
        resolve_device(c.run.get("device", "auto"))
    except PlacementError as err:
        raise ValueError(f"--device: {err}" if device is not None else f"{path}: [run] {err}") from None
    return c


def _check_keys(path: Path, section: str, values: dict) -> None:
    where = f"[{section}] " if section else ""
    known = KEYS[section]
    for key, value in values.items():
        if key not in known:
            # a near spelling ('layres'), or the abbreviation the config uses ('learning_rate' -> 'lr')
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.5) or \
                [k for k in known if k == "".join(word[:1] for word in key.split("_"))]
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
            raise ValueError(f"{path}: unknown key {where}{key!r}{hint}")
        want = known[key]
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            kind = {int: "an integer", str: "a string", dict: "a table", bool: "true or false"}.get(want, "a number")
            raise ValueError(f"{path}: {where}{key} must be {kind}; got {value!r}")
        if isinstance(value, int | float) and not isinstance(value, bool) and (
                value < 0 or (key in POSITIVE and value <= 0)):
            raise ValueError(f"{path}: {where}{key} must be {'positive' if key in POSITIVE else '>= 0'}; got {value!r}")
