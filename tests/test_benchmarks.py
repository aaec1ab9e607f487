"""The benchmark scripts still run (their numbers are checked by people, in `make bench`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_layer
import bench_long


def test_bench_layer_quick_prints_its_tables(capsys):
    bench_layer.main(["--quick"])
    out = capsys.readouterr().out
    assert "ratio to torch" in out and "share of mm peak" in out and "Targets" in out


def test_bench_long_worker_measures_our_kernel():
    result = bench_long.worker("ours local", 1024, "fwd+bwd", 1)
    assert result["seconds"] > 0 and result["peak_bytes"] >= 0
