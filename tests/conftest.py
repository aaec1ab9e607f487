"""Shared strategies and helpers for the tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from packaging.version import Version

from multihead import masks

settings.register_profile("default", deadline=None, print_blob=True)
settings.register_profile("ci", deadline=None, print_blob=True, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

#: ``make test`` runs the suite in one pytest-xdist worker per CPU (``-n``, at most 4): each worker takes
#: one thread, and so do the processes it starts (CLI runs, torchrun) — two workers of two OpenMP
#: threads each on two cores spin against each other. Alone, a test run takes two threads.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER") is not None
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1 if XDIST_WORKER else max(1, min(2, torch.get_num_threads())))
# Without CUDA, the Triton kernels (attn/rowstats.py) are tested in Triton's interpreter on CPU tensors:
# it must be on before Triton is first imported (importing torch does not import it)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

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


def pytest_configure(config):
    """``--dist loadgroup`` refused where pytest-xdist cannot group: up to xdist 3.8 a group is a
    suffix xdist writes into each test's id, which pytest 9.2 no longer takes (xdist issue 1386) —
    every worker would build the shared SmolLM2 report again, in silence."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    import xdist

    if release(pytest.__version__) >= (9, 2) and release(xdist.__version__) <= (3, 8):
        raise pytest.UsageError(f"pytest-xdist {xdist.__version__} cannot group tests under pytest "
                                f"{pytest.__version__} (--dist loadgroup): install pytest<9.2, as make install does")


def release(version: str) -> tuple[int, ...]:
    """A package's (major, minor), as its version string says them."""
    return Version(version).release[:2]


def pytest_collection_modifyitems(config, items):
    """The tests of an xdist group first (the costliest work of the suite, done while the other
    workers take the rest, not after them); ``cuda`` tests run where a CUDA GPU is (never required
    by ``make test``), skipped elsewhere."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)  # stable: else as collected
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _progress_as_each_test_found_it():
    """A command run in this process (:func:`run_cli`) turns progress on and, off a terminal, holds
    its lines back for 10 s from then: a later test's own progress lines were held past its capsys
    read (a flake that came and went with the tests' order). After each test, the module's defaults."""
    yield
    from multihead import progress

    progress.set_enabled(False, terminal=True)


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 as mh.hf.load gives it, loaded once for the whole run (tests must not modify it)."""
    import multihead as mh

    return mh.hf.load("minilm")


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M as mh.hf.load gives it, loaded once for the whole run (tests must not modify it)."""
    import multihead as mh

    pytest.importorskip("gguf", reason="SmolLM2 needs gguf: pip install gguf accelerate")
    return mh.hf.load("smollm2")


#: The options of the stored SmolLM2 report of tests/data/reports (test_regression.py).
SMOLLM2_SAMPLE100 = {"model": "smollm2", "sample": 100, "ablation": 2, "exact_ablation": True}


#: The tests that read :func:`smollm2_sample100` run in one xdist worker (``--dist loadgroup``), so
#: that the costliest analysis of the suite is made once, not once a worker.
SHARES_SMOLLM2_SAMPLE100 = pytest.mark.xdist_group("smollm2-sample100")


@pytest.fixture(scope="session")
def smollm2_sample100(tmp_path_factory):
    """``multihead analyze --model smollm2 --sample 100 --ablation 2 --exact-ablation``, run once a
    session: the regression test compares its report with the stored one, the evidence and trust
    tests read its labels and their evidence (the costliest analysis of the suite, not run three times)."""
    from multihead.jobs import analyze_job

    out = tmp_path_factory.mktemp("smollm2-sample100") / "smollm2-sample100"
    return analyze_job(out=str(out), **SMOLLM2_SAMPLE100)


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """``multihead ARGS`` in this process: (exit status, stdout, stderr). argparse's own exits count."""
    from multihead.cli import main

    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cli_rejects(tmp_path, capsys):
    """Run ``multihead COMMAND ARGS --out tmp/o`` for each (args, words) case: exit 2, exactly one
    line on stderr naming the problem, no traceback, nothing written."""

    def check(command: str, cases: list[tuple[list[str], str]]) -> None:
        out = tmp_path / "o"
        for args, words in cases:
            code, _, err = run_cli([command, *args, "--out", str(out)], capsys)
            assert code == 2 and words in err, (args, err)
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (args, err)
        assert not out.exists()

    return check


def float_tolerance(want: torch.Tensor, *, ops: int) -> float:
    """An absolute tolerance for results computed in another order (another CPU's kernels, a GPU,
    a fused vs an unfused path): ``ops`` unit roundoffs of ``want``'s dtype times its largest
    magnitude. ``ops`` grows with the depth of the computation (a few for one matmul, hundreds
    for a stack of layers); exactness itself is tested in float64, where the same claims hold to 1e-10.
    A float64 ``want`` is taken as float32 work summed in float64 (the metrics' sums).
    """
    dtype = want.dtype if want.dtype in (torch.float16, torch.bfloat16) else torch.float32  # float64 sums of float32
    return ops * torch.finfo(dtype).eps * float(want.detach().abs().max())


#: Under CI (``CI=true``) what make test installs must be there: its absence fails, never skips.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(why: str, in_ci: str) -> NoReturn:
    """Skip the test for ``why`` — or, under CI, fail it for ``in_ci`` (what make test should have installed)."""
    if IN_CI:
        pytest.fail(f"CI=true but {in_ci}")
    pytest.skip(why)


def triton_kernels():
    """attn/rowstats.py where its kernels can run here — CUDA, else the CPU in Triton's interpreter —
    with the device to run them on; a skip without Triton, a failure under CI (make test installs it)."""
    from multihead.attn import rowstats

    for device in ("cuda", "cpu"):
        if rowstats.available(device):
            return rowstats, torch.device(device)
    missing("no Triton here: the row-statistics kernels cannot run (pip install triton)",
            "Triton is not installed (make test installs it: the dev extra)")


def needs_spacy() -> None:
    """A skip where spaCy and its English pipeline are not installed (the ``syntax`` extra) — a failure
    under CI, where make test installs them."""
    from multihead.analysis.probes.syntax import spacy_available

    if spacy_available():
        return
    missing("spaCy is not installed (pip install multihead[syntax])",
            "spaCy or en_core_web_sm is not installed (make test installs them: the syntax extra)")


def masking_case(masking: str, B: int, S: int):
    """The kernels' tests' masks by name: "none" (None), "causal", or "padded" — causal, and the last of
    B texts' keys after its first 3/4 of S are padding (its rows past them see fewer keys)."""
    from multihead import masks

    mask = None if masking == "none" else masks.causal()
    if masking == "padded":
        keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
        keep[-1, ..., 3 * S // 4:] = False
        mask = mask & masks.from_tensor(keep)
    return mask


def amx_tiles():
    """multihead.attn.fused with its AMX tiles' path (``attend``), or a skip on a CPU without AMX (an
    Intel Xeon of the Sapphire Rapids generation or later has them; nothing installs them) — a
    failure under CI when the CPU has them and the path did not build."""
    fused = compiled_softmax()
    if fused.tiles_available():
        return fused
    flags = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").is_file() else ""
    if " amx_bf16" in flags and " amx_tile" in flags and os.environ.get(fused.TILES_ENV, "1") != "0":
        missing("this CPU has AMX but the tiles' path did not build or Linux refused the tiles' state",
                "attn/softmax.c's AMX build (gcc >= 11 with -march=native) is not available on this AMX CPU")
    pytest.skip("no AMX on this CPU: bfloat16 attention takes oneDNN's products (the tiles' path is AMX's)")


def compiled_softmax():
    """The compiled softmax (multihead.attn.fused), or a skip where this CPU has neither AVX-512 nor AVX2
    (it is built only for those; the eager steps run elsewhere) — a failure under CI when it has and it
    did not build."""
    from multihead.attn import fused

    if fused.available():
        return fused
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        missing("no C compiler: the math kernel's eager softmax is its only path",
                "attn/softmax.c did not build on this AVX2 / AVX-512 CPU (gcc with -fopenmp)")
    pytest.skip("neither AVX-512 nor AVX2 on this CPU: the math kernel's eager softmax is its only path")
