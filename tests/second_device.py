"""Two accelerators on a CPU, for tests of models on a GPU and split across GPUs.

accelerate runs each layer of a model split over two GPUs where its weights are, so the chunks of
its attention come from two devices; a reader that keeps its sums where the first chunk was and
adds a chunk from the other fails there ("Expected all tensors to be on the same device"), as does
code that mixes a GPU's tensors with the host's — and a machine without two GPUs never shows it.
Here :data:`FIRST` (``cpu:1``) and :data:`SECOND` (``cpu:2``) stand for two GPUs beside the host
(the plain CPU): their tensors are CPU tensors of a subclass whose ``device`` says ``cpu:1`` or
``cpu:2``, and inside :func:`devices` an operation that mixes devices raises as CUDA does —
except, as on CUDA, a 0-dimensional host tensor (a scalar) and a host index in ``x[index]``.
``.to(device)`` / ``.cpu()`` copy between them, ``copy_`` copies from any device, and a factory
given ``device=`` makes its tensor there.

:func:`place` puts a model's layers on them the way accelerate's hooks do: its weights moved,
each layer's inputs brought to its device before it runs, the modules after the layers' brought
back to the first. Their ``device.type`` is still ``cpu``: code that asks for CUDA by type (its
memory, its kernels) is not exercised, only where tensors are.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

HOST = torch.device("cpu")
FIRST = torch.device("cpu", 1)
SECOND = torch.device("cpu", 2)
#: methods that move a tensor to the device their arguments name
MOVES = {torch.Tensor.to, torch.Tensor.cpu}


@functools.cache
def _on(index: int) -> type:
    """The subclass of tensors on ``cpu:index``."""
    where = torch.device("cpu", index)

    class Elsewhere(torch.Tensor):
        @property
        def device(self) -> torch.device:  # what code reads to put things beside it
            return where

    Elsewhere.__name__ = Elsewhere.__qualname__ = f"On{index}"
    return Elsewhere


def _where(device: Any) -> torch.device | None:
    if isinstance(device, torch.Tensor):
        return device.device
    if isinstance(device, (str, torch.device)):
        return torch.device(device)
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu", device)
    return None  # a dtype, a flag, nothing


def _tag(tree: Any, device: torch.device) -> Any:
    """Every tensor of ``tree`` as one of ``device`` (its storage shared)."""
    cls = torch.Tensor if device.index is None else _on(device.index)

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or type(t) is cls:
            return t
        with torch._C.DisableTorchFunctionSubclass():
            return t.as_subclass(cls)

    return tree_map(one, tree)


def _real(device: Any) -> Any:
    """What the real CPU is told for ``device``."""
    return "cpu" if _where(device) is not None else device


def _tensors_in(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class Devices(TorchFunctionMode):
    """Raise where an operation mixes devices; move and make tensors as asked (see the module)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in MOVES:
            return _move(func, args, kwargs)
        if func is torch.Tensor.copy_:  # dst.copy_(src): from any device; dst stays where it is
            with torch._C.DisableTorchFunctionSubclass():
                func(*args, **kwargs)
            return args[0]
        target = _where(kwargs.get("device"))
        if target is not None:  # a factory, or new_* naming its device
            kwargs["device"] = "cpu"
            return _tag(func(*args, **kwargs), target)
        if func is torch.Tensor.__getitem__:
            tensors = [args[0], *(t for t in _tensors_in(args[1]) if t.device != HOST)]  # a host index is fine
        elif func is torch.Tensor.__setitem__:  # basic indexing copies the value from any device
            index = _tensors_in(args[1])
            value = [args[2]] if index and isinstance(args[2], torch.Tensor) else []
            tensors = [args[0], *(t for t in index if t.device != HOST), *value]
        else:
            tensors = _tensors_in((args, kwargs))
        places = {t.device for t in tensors if t.dim() > 0 or t.device != HOST}  # a host scalar goes anywhere
        if len(places) > 1:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                               f"{' and '.join(sorted(map(str, places)))}! ({getattr(func, '__name__', func)})")
        result = func(*args, **kwargs)
        if places and next(iter(places)) != HOST and func not in (torch.Tensor.__setitem__,):
            return _tag(result, next(iter(places)))  # a host scalar with a device's tensor: on the device
        return result


def _move(func: Any, args: tuple, kwargs: dict) -> Any:
    """``t.to(...)`` / ``t.cpu()``: a copy on the device named (itself where it is there already)."""
    source = args[0]
    if func is torch.Tensor.cpu:
        target = HOST
    else:
        target = next((d for d in map(_where, (*args[1:], kwargs.get("device"))) if d is not None), None)
    if target is None or target == source.device:
        return func(*args, **kwargs)  # a dtype only, or already there
    args = (source, *(_real(a) if _where(a) is not None else a for a in args[1:]))
    if "device" in kwargs:
        kwargs["device"] = _real(kwargs["device"])
    with torch._C.DisableTorchFunctionSubclass():
        moved = func(*args, **kwargs)
        if moved.data_ptr() == source.data_ptr():  # a move between devices copies
            moved = moved.clone()
    return _tag(moved, target)


@contextmanager
def devices() -> Iterator[None]:
    """Inside, :data:`FIRST` and :data:`SECOND` are devices of their own (see the module)."""
    with Devices():
        yield


def place(model: torch.nn.Module, layers: torch.nn.ModuleList, split: int | None = None) -> None:
    """Put ``model`` on :data:`FIRST` — and ``layers[split:]`` on :data:`SECOND` — as accelerate's
    device map does: parameters and buffers there, and every module's tensor arguments brought to
    its device before it runs, by an instance ``forward`` wrapping the module's own as accelerate's
    hooks do (the modules after the layers, such as the final norm, take theirs back to the first)."""
    second = {id(m) for layer in (layers[split:] if split is not None else []) for m in layer.modules()}
    for module in model.modules():
        device = SECOND if id(module) in second else FIRST
        _move_weights(module, device)
        module.forward = _bringing(module.forward, device)  # an instance forward, as accelerate's hooks wrap it


def _move_weights(module: torch.nn.Module, device: torch.device) -> None:
    """The module's own parameters and buffers (not its submodules') onto ``device``."""
    for name, p in list(module._parameters.items()):
        if p is not None:
            module._parameters[name] = torch.nn.Parameter(_tag(p.detach(), device), requires_grad=p.requires_grad)
    for name, b in list(module._buffers.items()):
        if b is not None:
            module._buffers[name] = _tag(b, device)


def _bringing(forward: Any, device: torch.device) -> Any:
    """``forward`` with every tensor argument brought to ``device`` first."""

    def one(t: Any) -> Any:
        return t.to(device) if isinstance(t, torch.Tensor) else t

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return forward(*tree_map(one, args), **tree_map(one, kwargs))

    return wrapped
