"""Shared strategies and helpers for the tests."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

from multihead import masks

settings.register_profile("default", deadline=None, print_blob=True)
settings.register_profile("ci", deadline=None, print_blob=True, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

MASK_KINDS = ("none", "causal", "padding", "bool", "float", "causal&padding", "bool&float")


@st.composite
def mask_cases(draw, B: int, H: int, T: int, S: int, kinds=MASK_KINDS, never_empty: bool = False):
    """A Mask of a drawn kind for (B, H, T, S).

    With ``never_empty`` every query row keeps at least one key (peers such as
    nn.MultiheadAttention return NaN for fully masked rows).
    """
    kind = draw(st.sampled_from(kinds))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    low = 1 if never_empty else 0
    lengths = torch.randint(low, S + 1, (B,), generator=g)
    dense = torch.rand(B, 1, T, S, generator=g) > 0.4
    if never_empty:
        dense[..., 0] = True
    bias = torch.randn(1, H, T, S, generator=g, dtype=torch.float64)
    parts = {
        "none": None,
        "causal": masks.causal(),
        "padding": masks.padding(lengths),
        "bool": masks.from_tensor(dense),
        "float": masks.from_tensor(bias),
        "causal&padding": masks.causal() & masks.padding(lengths),
        "bool&float": masks.from_tensor(dense) & masks.from_tensor(bias),
    }
    return kind, parts[kind]


def cast_mask(mask, dtype):
    """The same mask with any float bias cast to ``dtype`` (tests build biases in float64)."""
    if isinstance(mask, masks.FromTensor) and mask.has_bias:
        return masks.from_tensor(mask.tensor.to(dtype))
    if isinstance(mask, masks.And):
        return cast_mask(mask.a, dtype) & cast_mask(mask.b, dtype)
    return mask


@pytest.fixture
def cli_rejects(tmp_path):
    """Run ``multihead COMMAND ARGS --out tmp/o`` for each (args, words) case: exit 2, one line naming the
    problem, no traceback, nothing written."""
    import subprocess
    import sys

    def check(command: str, cases: list[tuple[list[str], str]]) -> None:
        out = tmp_path / "o"
        for args, words in cases:
            done = subprocess.run([sys.executable, "-m", "multihead.cli", command, *args, "--out", str(out)],
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 2 and words in done.stderr, (args, done.stderr)
            assert "Traceback" not in done.stderr, (args, done.stderr)
        assert not out.exists()

    return check
