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


def test_bench_long_workers_measure_our_kernel():
    times = bench_long.timing_worker(["ours local", "dense SDPA"], 512, "fwd+bwd")
    assert len(times["ours local"]) == len(times["dense SDPA"]) >= 3
    memory = bench_long.memory_worker("ours local", 512, "forward")
    assert memory["peak_bytes"] >= 0 and memory["working_bytes"] >= 0
