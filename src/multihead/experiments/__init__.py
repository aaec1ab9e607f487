"""Experiments that test claims about heads: ``multihead experiment NAME [--quick]``.

| name | question |
|---|---|
| ``heads`` | how does the number of heads (at fixed d_model) change the result? |
| ``one-vs-many`` | one head of d_model against h heads of d_model / h; how alike do heads become? |
| ``induction`` | do induction heads form, and when (2-layer attention-only model; 1 layer as control)? |
| ``specialise`` | when do local / previous / broad heads appear while an encoder trains? |
| ``prune-trained`` | how many heads of the ``heads`` models can be pruned? |

Each writes ``OUT/NAME/result.json``, ``result.md`` and PNG plots; trained sweep models are
cached in ``OUT/runs`` and reused by later experiments.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .names import EXPERIMENTS, TASKS

if TYPE_CHECKING:
    from .common import Setting

__all__ = ["EXPERIMENTS", "TASKS", "run_experiment", "run_experiments", "setting_for"]


def setting_for(quick: bool, *, tasks: list[str] | None = None, seeds: int | None = None,
                heads: list[int] | None = None) -> Setting:
    """The quick or full setting, with the sweep's tasks, seeds or head counts overridden."""
    from .common import SETTINGS  # torch and the models load with the experiments, not with the command line

    s = SETTINGS["quick" if quick else "full"]
    if tasks:
        bad = [t for t in tasks if t not in TASKS]
        if bad:
            raise ValueError(f"unknown task {bad[0]!r}: expected one of {', '.join(TASKS)}")
        s = replace(s, tasks=tuple(tasks))
    if seeds is not None:
        if seeds < 1:
            raise ValueError(f"seeds must be at least 1; got {seeds}")
        s = replace(s, seeds=seeds)
    if heads:
        bad = [h for h in heads if h < 1 or s.dim % h]
        if bad:
            raise ValueError(f"h={bad[0]} does not divide d_model={s.dim}: choose a divisor")
        s = replace(s, heads=tuple(sorted(set(heads))))
    return s


def run_experiment(name: str, out: str | Path, *, setting: Setting | None = None, device: str = "auto") -> Path:
    """Run one experiment; returns the folder with its result.json, result.md and plots."""
    from .common import SETTINGS

    out = Path(out)
    setting = setting or SETTINGS["full"]
    if name == "heads":
        from .heads import run_heads

        return run_heads(setting, out, device)
    if name == "one-vs-many":
        from .heads import run_one_vs_many

        return run_one_vs_many(setting, out, device)
    if name == "induction":
        from .induction import run_induction

        return run_induction(setting, out, device)
    if name == "specialise":
        from .specialise import run_specialise

        return run_specialise(setting, out, device)
    if name == "prune-trained":
        from .prune import run_prune_trained

        return run_prune_trained(setting, out, device)
    raise ValueError(f"unknown experiment {name!r}: expected one of {', '.join(EXPERIMENTS)}")


#: The sweep's flags each experiment reads (the others' settings are their own).
READS: dict[str, tuple[str, ...]] = {"heads": ("--tasks", "--seeds", "--heads"),
                                     "one-vs-many": ("--tasks", "--seeds", "--heads"),
                                     "induction": (), "specialise": (), "prune-trained": ("--tasks", "--heads")}


def run_experiments(name: str, out: str | Path, *, quick: bool = False, tasks: list[str] | None = None,
                    seeds: int | None = None, heads: list[int] | None = None, device: str = "auto",
                    force: bool = False) -> Iterator[Path]:
    """``multihead experiment NAME`` (or ``all``): every output folder checked and the device found
    before anything trains, then each experiment run in order; yields each one's folder."""
    from ..files import OutputFolderError, check_output_folder
    from .common import SCHEMA, pick_device

    if name != "all":  # a flag the experiment does not read is said, not silently dropped
        given = [flag for flag, value in (("--tasks", tasks), ("--seeds", seeds), ("--heads", heads))
                 if value is not None and flag not in READS[name]]
        if given:
            reads = ", ".join(READS[name]) or "none of --tasks, --seeds, --heads"
            raise ValueError(f"{' and '.join(given)}: {name} does not read {'it' if len(given) == 1 else 'them'} "
                             f"(its settings are fixed; docs/experiments.md); it reads {reads}")
    setting = setting_for(quick, tasks=tasks, seeds=seeds, heads=heads)
    pick_device(device)  # a bad device fails before any training
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    names = EXPERIMENTS if name == "all" else (name,)
    for n in names:
        try:
            check_output_folder(out / n, schema=SCHEMA, marker="result.json", force=force)
        except OutputFolderError as err:
            raise ValueError(f"--out {err}") from err
    for n in names:
        yield run_experiment(n, out, setting=setting, device=device)
