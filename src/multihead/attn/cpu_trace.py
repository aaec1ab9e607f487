"""Whose paths work on a device takes: this machine's CPU's, or — on ``meta``, within a memory plan's
trace of a CPU run (:func:`traced_as_cpu`) — the same ones, so that the trace holds the buffers the
run will hold (the AMX tiles' attention, the compiled softmax, a half product's padded keys) and not
those of a device the plan is not for."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

__all__ = ["runs_as_cpu", "traced_as_cpu"]

#: Whether a trace on ``meta`` stands for a CPU run here (a memory plan's).
_TRACED_AS_CPU: contextvars.ContextVar[bool] = contextvars.ContextVar("traced_as_cpu", default=False)


@contextlib.contextmanager
def traced_as_cpu(on: bool = True) -> Iterator[None]:
    """Within it (``on``), work on ``meta`` takes the paths a CPU run of this machine takes."""
    token = _TRACED_AS_CPU.set(on)
    try:
        yield
    finally:
        _TRACED_AS_CPU.reset(token)


def runs_as_cpu(device: torch.device) -> bool:
    """Whether work on ``device`` takes this machine's CPU's paths and buffers: the CPU, or ``meta``
    under :func:`traced_as_cpu` (a memory plan's trace)."""
    return device.type == "cpu" or (device.type == "meta" and _TRACED_AS_CPU.get())
