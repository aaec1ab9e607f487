"""Where a model runs and in what precision: dtype, device, an accelerate device map, memory limits
and offload — each checked before any weight is read, every problem one line.

:class:`Placement` is what a user asks for (strings, as the command line gives them);
:func:`resolve` turns it, with the model's config, into the arguments of transformers'
``from_pretrained``. ``dtype="auto"`` is the checkpoint's own dtype on an accelerator and float32
on a CPU (bfloat16 on a CPU without bf16 units is slower than float32, and every analysis sums in
float32 anyway). A model dispatched by accelerate (``device_map``) runs where its map says; its
inputs go to :func:`input_device`, and weights read directly (direct logit attribution reads the
unembedding) are brought in from the CPU or disk for the read by :func:`weights_of`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import check_writable

__all__ = ["DEVICE_MAPS", "DTYPES", "OFFLOAD_PREFIX", "NotFiniteError", "Placement", "PlacementError",
           "accelerate_device", "auto_dtype", "device_named", "dtype_named", "execution_devices",
           "give_back_swapped_weights", "input_device", "is_offloaded", "mapped_places", "mapped_weights",
           "memory_entries", "model_devices", "parse_max_memory", "resident_bytes", "resolve", "resolve_device",
           "resolve_dtype", "swapped_weights_saved_by_name", "weights_of"]

#: The dtypes a model may be loaded in ("auto": see the module).
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: The name of the folder of a process's own inside an ``offload_folder`` (then its pid and a random
#: part): :func:`~multihead.files.scratch_folder`.
OFFLOAD_PREFIX = "multihead-offload-"
#: accelerate's strategies for a device map computed from the free memory.
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[a-zA-Z]+)\s*$")


class PlacementError(ValueError):
    """A placement that cannot run here: ``parameter`` (dtype, device, device_map, max_memory or
    offload_folder) and what is wrong with it, read as one line: ``device 'cuda' is not available ...``."""

    def __init__(self, parameter: str, detail: str) -> None:
        super().__init__(f"{parameter} {detail}")
        self.parameter, self.detail = parameter, detail


class NotFiniteError(ValueError):
    """What a model computed held NaN or inf — in float16 most often its numbers passing the dtype's
    range — read as one line naming what and the precision that would hold it (:meth:`of`)."""

    @classmethod
    def of(cls, what: str, dtype: Any) -> NotFiniteError:
        """The error for ``what`` (e.g. "the attention of 8 heads in layers 1-3") of a model in ``dtype``."""
        import torch

        name = str(dtype).removeprefix("torch.")
        if dtype == torch.float16:
            cause = ("the model's numbers pass float16's range (65,504) — run it in bfloat16 or float32 "
                     "(--dtype bfloat16)")
        elif dtype == torch.bfloat16:
            cause = ("the model's weights or activations hold NaN or inf — a float32 run (--dtype float32) shows "
                     "whether the precision is the cause")
        else:
            cause = "the model's weights or activations hold NaN or inf"
        return cls(f"{what} held NaN or inf in {name}: {cause}")


@dataclass(frozen=True)
class Placement:
    """Where and how a model is loaded, as a user names it.

    ``dtype``: one of :data:`DTYPES` or a ``torch.dtype``; ``device``: ``auto``, ``cpu``,
    ``cuda``, ``cuda:N`` or ``mps``; ``device_map``: one of :data:`DEVICE_MAPS` or accelerate's
    dict (module name -> device), instead of ``device``; ``max_memory``: per device, e.g.
    ``"0=20GiB,cpu=60GiB"`` or ``{0: "20GiB", "cpu": "60GiB"}`` (with ``device_map``);
    ``offload_folder``: where weights that fit nowhere go (with ``device_map``).
    """

    dtype: Any = "auto"
    device: str = "auto"
    device_map: str | dict | None = None
    max_memory: str | dict | None = None
    offload_folder: str | Path | None = None

    def check(self) -> None:
        """Raise :class:`PlacementError` for what is wrong whatever the machine and the model: a
        device or device map that is not one, memory sizes in no unit, flags that contradict
        each other, an offload folder that cannot be written. Needs no torch (the command line asks
        before loading anything); :func:`resolve` asks it first, then what only torch and the
        model's config can tell (a GPU that is not there, a dtype it cannot run)."""
        if self.device_map is None:
            if self.max_memory is not None or self.offload_folder is not None:
                what = "max_memory" if self.max_memory is not None else "offload_folder"
                raise PlacementError(what, "places a model across devices: give device_map='auto' (--device-map auto) "
                                     "too")
            _device_form(str(self.device).strip())
            return
        if str(self.device).strip() not in ("auto", ""):
            raise PlacementError("device", f"{self.device!r} and a device_map ({self.device_map!r}) both place the "
                                 "model: give one of them")
        if isinstance(self.device_map, str) and self.device_map not in DEVICE_MAPS:
            raise PlacementError("device_map", f"{self.device_map!r} is not one of {', '.join(DEVICE_MAPS)} (or "
                                 "accelerate's dict of module -> device)")
        memory_entries(self.max_memory)
        if self.offload_folder is not None:
            folder = Path(self.offload_folder)
            if folder.is_symlink() and not folder.exists():
                raise PlacementError("offload_folder", f"{folder} is a link to {folder.readlink()}, which is not "
                                     "there: give a folder")
            if folder.exists() and not folder.is_dir():
                raise PlacementError("offload_folder", f"{folder} exists and is not a folder")
            try:
                check_writable(folder)
            except ValueError as err:
                raise PlacementError("offload_folder", str(err)) from err


#: The devices a user may name (``cuda:N`` any index): what :func:`resolve_device` then looks for.
_DEVICE = re.compile(r"^(auto|cpu(:0)?|mps|cuda(:\d+)?)$")


def _device_form(text: str) -> None:
    """PlacementError unless ``text`` names a device multihead runs models on (whether it is
    there is :func:`resolve_device`'s question)."""
    if not _DEVICE.match(text):
        raise PlacementError("device", f"{text!r} is not a device: expected auto, cpu, cuda, cuda:N or mps")


def resolve_device(name: str | Any) -> Any:
    """``name`` as a ``torch.device`` that is there; ValueError naming what is available otherwise.
    ``auto``: the first CUDA GPU, else Apple's MPS, else the CPU."""
    import torch

    text = str(name).strip()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = device_named(text)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise PlacementError("device", f"{text!r} is not available: torch {torch.__version__} sees no CUDA GPU "
                                 "on this machine; use cpu (or auto)")
        if device.index is not None and device.index >= count:
            raise PlacementError("device", f"{text!r} is not available: this machine has {count} CUDA GPU(s), "
                             f"cuda:0 to cuda:{count - 1}")
        return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    if device.type == "mps" and not _mps_available():
        raise PlacementError("device", f"{text!r} is not available: this machine has no Apple GPU (MPS); use cpu "
                             "(or auto)")
    return device


def _mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def checkpoint_dtype(config: Any) -> Any:
    """The dtype the checkpoint's config names (``dtype`` / ``torch_dtype``), or None."""
    import torch

    for name in ("dtype", "torch_dtype"):
        value = getattr(config, name, None)
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
            return getattr(torch, value)
    return None


def auto_dtype(config: Any, *, accelerated: bool) -> Any:
    """``dtype="auto"``: the checkpoint's own dtype (its config's) on an accelerator, float32 on a
    CPU — and float32 for a checkpoint in a dtype models are not loaded in (float64, float8)."""
    import torch

    chosen = (checkpoint_dtype(config) or torch.float32) if accelerated else torch.float32
    return chosen if chosen in (torch.float32, torch.bfloat16, torch.float16) else torch.float32


def dtype_named(dtype: Any, config: Any = None, *, accelerated: bool) -> Any:
    """``dtype`` — one of :data:`DTYPES`, a ``torch.dtype``, or float64 (the reference precision, by
    name or dtype) — as the ``torch.dtype`` it names, whatever device is there (:func:`resolve_dtype`
    then asks the device); ``auto``/None: the config's own on an accelerator (``accelerated``),
    float32 on a CPU. PlacementError naming the choices otherwise."""
    import torch

    if isinstance(dtype, torch.dtype):
        chosen = dtype
    elif dtype is None or dtype == "auto":
        chosen = auto_dtype(config, accelerated=accelerated)
    elif isinstance(dtype, str) and (dtype.removeprefix("torch.") in (*DTYPES, "float64")):
        chosen = getattr(torch, dtype.removeprefix("torch."))
    else:
        raise PlacementError("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)} (or float64, the reference)")
    if chosen not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise PlacementError("dtype", f"{chosen} is not one multihead runs models in: expected "
                             f"{', '.join(DTYPES[1:])} (or float64, the reference)")
    return chosen


def device_named(device: Any) -> Any:
    """``device`` (a name or a ``torch.device``) as a ``torch.device`` of a kind multihead runs models on,
    whether or not this machine has it (a plan for a GPU elsewhere); PlacementError naming the forms."""
    import torch

    if isinstance(device, torch.device):
        return device
    text = str(device).strip()
    _device_form(text)
    if text == "auto":
        return resolve_device(text)
    device = torch.device(text)
    return torch.device("cpu") if device.type == "cpu" else device  # cpu:0 is the CPU (a model's tensors say "cpu")


def resolve_dtype(dtype: Any, device: Any, config: Any = None, *, accelerated: bool | None = None) -> Any:
    """``dtype`` as a ``torch.dtype`` the device can run; ValueError naming the choices otherwise.

    ``auto``: the checkpoint's own dtype (its config's) when the model runs on an accelerator
    (``accelerated``; by default: ``device`` is not the CPU), float32 on a CPU.
    """
    import torch

    chosen = dtype_named(dtype, config, accelerated=device.type != "cpu" if accelerated is None else accelerated)
    if device.type == "cuda" and chosen == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        major, minor = torch.cuda.get_device_capability(device)
        raise PlacementError("dtype", "bfloat16 needs a GPU with bfloat16 units (compute capability 8.0, Ampere, or "
                             f"newer); {torch.cuda.get_device_name(device)} has {major}.{minor}: use float16 or "
                             "float32")
    return chosen


def parse_max_memory(spec: str | dict | None) -> dict[int | str, int] | None:
    """``"0=20GiB,cpu=60GiB"`` (or a dict of the same) as accelerate's ``max_memory``: GPU index or
    ``cpu``/``mps``/``disk`` -> bytes. ValueError naming the entry and the expected form, or a GPU
    this machine does not have."""
    out = memory_entries(spec)
    gpus = [d for d in out or {} if isinstance(d, int)]
    if gpus:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        missing = [g for g in gpus if g >= count]
        if missing:
            have = f"{count} CUDA GPU(s)" if count else "no CUDA GPU"
            raise PlacementError("max_memory", f"names GPU {missing[0]}, but this machine has {have}")
    return out


def memory_entries(spec: str | dict | None) -> dict[int | str, int] | None:
    """:func:`parse_max_memory` without asking which GPUs are there (no torch)."""
    if spec is None:
        return None
    if isinstance(spec, str):
        pairs = []
        for item in spec.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise PlacementError("max_memory", f"{spec!r}: expected DEVICE=SIZE pairs such as '0=20GiB,cpu=60GiB'")
            pairs.append((key.strip(), value.strip()))
    elif isinstance(spec, dict):
        pairs = [(str(k), v) for k, v in spec.items()]
    else:
        raise PlacementError("max_memory", f"is a {type(spec).__name__}: expected '0=20GiB,cpu=60GiB' or a dict")
    out: dict[int | str, int] = {}
    for key, value in pairs:
        device: int | str
        if key.isdigit():
            device = int(key)
        elif key.startswith("cuda:") and key[5:].isdigit():
            device = int(key[5:])
        elif key in ("cpu", "mps", "disk"):
            device = key
        else:
            raise PlacementError("max_memory", f"names device {key!r}: expected a GPU index (0, 1, ...), cpu, mps or "
                                 "disk")
        if device in out:  # "cpu=30MiB,cpu=40MiB", or "0=…" beside "cuda:0=…": which one was meant is not ours to guess
            raise PlacementError("max_memory", f"gives {key!r} a size twice ({spec!r}): expected each device once, "
                                 "such as '0=20GiB,cpu=60GiB'")
        out[device] = _bytes(key, value)
    return out


def _bytes(key: str, value: Any) -> int:
    try:
        return size_in_bytes(value)
    except ValueError as err:
        raise PlacementError("max_memory", f"{key}={value!r}: {err}") from None


def size_in_bytes(value: Any) -> int:
    """A size in bytes: a number of them (an int, or a float such as 24e9), or text such as ``"24GB"``,
    ``"20GiB"``, ``"500 MB"`` (units B, KB, MB, GB, TB in powers of 1,000, KiB … TiB in powers of 1,024);
    ValueError saying the form."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 1 <= value < float("inf"):
            raise ValueError(f"a size must be a positive number of bytes; got {value!r}")
        return int(value)  # 24e9 as well as 24 * 10**9
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():  # "cpu=209715200": bytes
        return size_in_bytes(int(value.strip()))
    match = _SIZE.match(str(value))
    unit = match["unit"].lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError("expected a size such as 20GiB or 500MB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB) or a "
                         "number of bytes")
    size = int(float(match["number"]) * _UNITS[unit])
    if size <= 0:
        raise ValueError("a size must be positive")
    return size


def resolve(placement: Placement, config: Any) -> tuple[dict[str, Any], Any]:
    """``from_pretrained``'s placement arguments for ``placement`` (dtype, device_map, max_memory,
    offload_folder) and the device the model's inputs go to; ValueError (one line) for a
    combination that cannot run here."""
    import torch

    placement.check()
    if placement.device_map is None:
        device = resolve_device(placement.device)
        dtype = resolve_dtype(placement.dtype, device, config)
        # straight onto the device (no float32 copy on the CPU first); the CPU loads as it always has
        kwargs: dict[str, Any] = {"dtype": dtype}
        if device.type != "cpu":
            kwargs["device_map"] = {"": device}
        return kwargs, device
    try:
        import accelerate  # noqa: F401  (transformers dispatches through it)
    except ImportError:
        raise PlacementError("device_map", "needs accelerate: pip install 'multihead[scale]'") from None
    max_memory = parse_max_memory(placement.max_memory)
    accelerated = torch.cuda.is_available() or _mps_available() or any(isinstance(d, int) for d in max_memory or {})
    dtype = resolve_dtype(placement.dtype, torch.device("cpu"), config, accelerated=accelerated)
    kwargs = {"dtype": dtype, "device_map": placement.device_map}
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    if placement.offload_folder is not None:
        kwargs["offload_folder"] = str(Path(placement.offload_folder))
    return kwargs, None


def input_device(model: Any) -> Any:
    """The device a model's inputs go to: its input embeddings' (for a dispatched model, where its
    map puts them; the CPU for weights offloaded to disk), else its first parameter's."""
    import torch

    device_map = getattr(model, "hf_device_map", None)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    for p in (embeddings.parameters() if embeddings is not None else ()):
        if p.device.type != "meta":
            return p.device
    if device_map:
        first = next(iter(device_map.values()))
        return torch.device("cpu") if first == "disk" else accelerate_device(first)
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def accelerate_device(key: Any) -> Any:
    """A device as accelerate names it in a map or ``max_memory`` (an integer: that CUDA GPU) as a
    ``torch.device``."""
    import torch

    return torch.device("cuda", key) if isinstance(key, int) else torch.device(key)


def execution_devices(device_map: dict) -> list[Any]:
    """The devices a model under accelerate's ``device_map`` computes on: its accelerators
    (accelerate's integers for CUDA GPUs, or names), its main one first — the lowest GPU index, as
    ``dispatch_model`` takes it, where the weights it keeps on the host or disk are swapped in and
    run — then the others in the map's order; the CPU alone when the map names no accelerator."""
    import torch

    gpus = [d for d in device_map.values() if d not in ("cpu", "disk")]
    named = list(dict.fromkeys(accelerate_device(d) for d in gpus))
    if not named:
        return [torch.device("cpu")]
    # accelerate's main device, where host and disk weights run: its lowest GPU index (dispatch_model)
    ints = [d for d in gpus if isinstance(d, int)]
    main = torch.device("cuda", min(ints)) if ints else named[0]
    return [main, *(d for d in named if d != main)]


def mapped_weights(model: Any, device_map: dict) -> dict[Any, int]:
    """Bytes of ``model``'s weights (meta tensors will do) on each of :func:`execution_devices`
    while it runs under ``device_map``: those its map puts there, and on the first device the
    largest module kept on the host or disk, swapped in for its forward (one at a time). Tied
    weights count once."""

    devices = execution_devices(device_map)
    found = dict.fromkeys(devices, 0)
    offloaded: dict[str, int] = {}
    seen: set[int] = set()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        key = max((k for k in device_map if k == "" or name == k or name.startswith(k + ".")), key=len, default=None)
        if key is None:
            continue
        place, size = device_map[key], tensor.numel() * tensor.element_size()
        if place == "disk" or (place == "cpu" and devices[0].type != "cpu"):  # swapped in where it runs
            offloaded[key] = offloaded.get(key, 0) + size
        else:
            found[accelerate_device(place)] += size
    found[devices[0]] += max(offloaded.values(), default=0)
    return found


def model_devices(model: Any) -> list[Any]:
    """The devices a model computes on: its device map's :func:`execution_devices`, else those its
    weights are on (meta aside)."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        return execution_devices(device_map)
    return list(dict.fromkeys(p.device for p in model.parameters() if p.device.type != "meta"))


def is_offloaded(model: Any) -> bool:
    """Whether accelerate keeps some of the model's weights off their execution device (on the CPU
    or disk, brought in for each forward): those weights cannot be edited in place."""
    return any(_offloading(m) for m in model.modules())


def give_back_swapped_weights(model: Any) -> int:
    """Give the heap's freed pages back after each forward of a module whose weights accelerate
    swaps in from disk or the host to run on the CPU, once its hook has dropped them again; returns
    how many modules are hooked (once each, however often it is called; a hook whose module no
    longer swaps, its accelerate hook removed, does nothing). Swapped-in weights come from the C
    heap between the pass's own buffers; freed, they leave holes the next module's weights and
    buffers seldom fill exactly, and the heap grows module by module: a random Gemma3 of 132M
    parameters, 60 % of them on disk, held 2.0-2.1 GiB at the end of its pass over 2,851 tokens in
    three of five runs, against 1.1-1.2 GiB with these hooks or with glibc's mmap threshold fixed.
    A module swapped onto a GPU is not hooked: its weights are not in the host's heap."""
    hooked = 0
    for module in model.modules():
        if _swapped_onto_cpu(module) and not getattr(module, "_multihead_gives_back", False):
            module.register_forward_hook(_give_back)
            module._multihead_gives_back = True
            hooked += 1
    return hooked


def _swapped_onto_cpu(module: Any) -> bool:
    if not _offloading(module):
        return False
    runs_on = getattr(module._hf_hook, "execution_device", None)
    return runs_on is not None and accelerate_device(runs_on).type == "cpu"


def _give_back(module: Any, args: Any, output: Any) -> None:
    # attn is torch's side of the package: this module answers the command line before torch loads
    from ..attn.heap import give_back_freed

    if _offloading(module):  # after accelerate's own post-forward, which drops the swapped-in weights
        give_back_freed()


#: The attribute of a model that holds the head gates acting on it (:class:`~multihead.hf.interventions.HeadGates`,
#: a weak set): what its placement says of them.
GATES_ACTING = "_multihead_gates_acting"


def gated_heads(model: Any) -> list[tuple[int, int]]:
    """The (layer, head) cells the gates acting on ``model`` turn down (a gate below 1 for some
    example) or make uniform, sorted; [] where none act."""
    cells: set[tuple[int, int]] = set()
    for gates in list(getattr(model, GATES_ACTING, None) or ()):
        values = gates.values.detach()
        down = values < 1 if values.dim() == 2 else (values < 1).any(1)  # (L, H), of (L, H) or (L, B, H)
        cells.update((int(layer), int(head)) for layer, head in down.nonzero().tolist())
        cells.update(gates.uniform_heads)
    return sorted(cells)


def placement_words(model: Any) -> str:
    """Where and in what precision ``model`` (a module) runs, in words: ``bfloat16 on cuda:0``,
    ``float32 on cpu + disk (device map)`` — its first floating-point weight's dtype."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    dtype = str(dtype).removeprefix("torch.")
    places = mapped_places(model)
    return f"{dtype} on {places} (device map)" if places else f"{dtype} on {input_device(model)}"


def mapped_places(model: Any) -> str | None:
    """Where accelerate's device map put a model's weights, in words (``cpu + disk``, ``cuda:0 +
    cuda:1 + cpu``; every weight on disk: ``cpu, its weights on disk``, where it runs said too), or
    None for a model on one device without offload."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map or (len(set(device_map.values())) <= 1 and "disk" not in device_map.values()):
        return None
    places = list(dict.fromkeys(f"cuda:{d}" if isinstance(d, int) else str(d) for d in device_map.values()))
    if places == ["disk"]:
        return f"{execution_devices(device_map)[0]}, its weights on disk"
    return " + ".join(places)


def resident_bytes(model: Any, device: Any) -> int | None:
    """Bytes of a device-mapped model's weights on ``device`` while it runs: the parameters and
    buffers kept there, and the largest module accelerate swaps in there for its forward (one at a
    time: its offloaded weights brought in, then released) — None for a model without a device map."""
    import torch

    if not getattr(model, "hf_device_map", None):
        return None
    device = torch.device(device)
    kept: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device == device:
            kept[id(tensor)] = tensor.numel() * tensor.element_size()
    swapped = 0
    for module in model.modules():
        if not _offloading(module):
            continue
        runs_on = module._hf_hook.execution_device
        if accelerate_device(runs_on) == device:
            swapped = max(swapped, sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()]
                                       if id(t) not in kept))
    return sum(kept.values()) + swapped


@contextmanager
def weights_of(module: Any) -> Iterator[None]:
    """Inside, the weights of ``module`` and its submodules are real tensors even when accelerate
    offloads them (each offloading hook's weights brought to its execution device for the read,
    then released again)."""
    offloaded = [m for m in module.modules() if _offloading(m)]
    if not offloaded:
        yield
        return
    from accelerate.utils import align_module_device

    with ExitStack() as stack:
        for m in offloaded:
            stack.enter_context(align_module_device(m))
        yield


@dataclass(frozen=True)
class _SavedByName:
    """A swapped-in weight (or a view of it) as autograd keeps it: where to read it again."""

    hook: Any  # the module's accelerate hook: its weights_map reads the weight from the disk or the host
    name: str  # the weight's name within the hooked module
    dtype: Any  # the weight's dtype as the forward had it (accelerate casts to the module's own)
    device: Any
    size: tuple[int, ...]  # the saved view of it: W itself, or W.t() as a product saves it
    stride: tuple[int, ...]
    offset: int


@contextmanager
def swapped_weights_saved_by_name(model: Any) -> Iterator[None]:
    """Inside, a backward pass through a model whose weights accelerate offloads holds one module's
    swapped-in weights at a time, as its forward does — not every one the forward swapped in.

    An offload hook brings a module's weights in (read from the disk or copied from the host) for
    its forward and drops them after; but autograd saves the weights a product needs for the
    gradient of its input, and those fresh tensors then live until the backward pass reaches them:
    every offloaded weight of the pass at once (a random Gemma3-shaped model of 755M parameters in
    bfloat16, 42 % of its weights on disk: the ablation estimate of eight sentences peaked at 2,249
    MiB, 1,437 MiB with this; the model in memory 2,296). Here a weight that takes no gradient is
    saved by its name and read again from the hook's ``weights_map`` when its product's backward
    runs. Gradients are the same to the bit (the weights are the same numbers); a model without
    offloading hooks is untouched."""
    import torch

    hooked = [m for m in model.modules() if _offloading(m)]
    if not hooked:
        yield
        return
    from accelerate.utils import named_module_tensors

    # a weight's bytes -> (the module holding it, its attribute there, the hook, its name in the hooked module)
    by_bytes: dict[int, list[tuple[Any, str, Any, str]]] = {}
    for module in hooked:
        hook = module._hf_hook
        for name, tensor in named_module_tensors(module, include_buffers=hook.offload_buffers,
                                                 recurse=hook.place_submodules, remove_non_persistent=True):
            owner, _, leaf = name.rpartition(".")
            holder = module.get_submodule(owner) if owner else module
            by_bytes.setdefault(tensor.numel() * tensor.element_size(), []).append((holder, leaf, hook, name))

    def pack(saved: Any) -> Any:
        # what is kept must not refer to ``saved`` itself: a saved output's grad_fn would refer back to it,
        # a cycle never freed where the backward does not reach its node (torch's saved_tensors_hooks)
        if not isinstance(saved, torch.Tensor) or saved.requires_grad or saved.layout != torch.strided \
                or saved.device.type == "meta":
            return saved.detach() if isinstance(saved, torch.Tensor) else saved
        storage = saved.untyped_storage()
        for holder, leaf, hook, name in by_bytes.get(storage.nbytes(), ()):
            weight = getattr(holder, leaf, None)  # the one swapped in now, while its module runs; else on meta
            if (weight is not None and weight.device.type != "meta" and weight.dtype == saved.dtype
                    and storage.nbytes() > 0 and weight.untyped_storage().data_ptr() == storage.data_ptr()):
                return _SavedByName(hook, name, weight.dtype, saved.device, tuple(saved.size()),
                                    tuple(saved.stride()), saved.storage_offset())
        return saved.detach()

    def unpack(saved: Any) -> Any:
        if not isinstance(saved, _SavedByName):
            return saved
        weight = saved.hook.weights_map[saved.name].to(device=saved.device, dtype=saved.dtype)  # as its forward read it
        return weight.as_strided(saved.size, saved.stride, saved.offset)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def _offloading(module: Any) -> bool:
    """Whether accelerate's hook on ``module`` swaps its weights in for each forward."""
    return bool(getattr(getattr(module, "_hf_hook", None), "offload", False))
