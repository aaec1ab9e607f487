"""The training harness: exact resume after a real kill, and 2 processes equal 1."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import run_cli
from multihead.train import load_config

CONFIG = """
out = "{out}"
seed = 3
steps = {steps}
[model]
layers = 1
heads = 4
dim = 32
hidden = 64
[data]
source = "hamlet"
seq_len = 32
batch_size = 8
[optim]
lr = 3e-3
warmup = 5
[run]
checkpoint_every = {every}
log_every = 5
grad_monitor = {monitor}
"""


def _config(tmp_path, name, steps=40, every=5, monitor=False):
    path = tmp_path / f"{name}.toml"
    path.write_text(CONFIG.format(out=tmp_path / name, steps=steps, every=every, monitor=str(monitor).lower()))
    return path


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1")


def _torchrun(config):
    """Two ranks of ``multihead.train``; on failure the ranks' own words (the head of stderr) and
    the launcher's verdict (its tail), since a rank that aborts says why only in the former."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--standalone", "-m", "multihead.train", str(config)],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr[:2500] + "\n[...]\n" + done.stderr[-1200:]


def _weights(tmp_path, name):
    return load_file(str(tmp_path / name / "checkpoint" / "model.safetensors"))


# Train, and SIGKILL this very process once 12 steps are done: two steps after the checkpoint of
# step 10, so the resumed run must redo steps 11 and 12 exactly as the whole run did them.
KILL_AT = """
import os, signal, sys
from multihead.train import load_config, train

def on_step(step):
    if step == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)

train(load_config(sys.argv[1]), on_step=on_step)
"""


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_weights(tmp_path):
    cmd = [sys.executable, "-m", "multihead.train"]
    subprocess.run([*cmd, str(_config(tmp_path, "whole", monitor=True))], check=True, env=_env(), timeout=300)
    state = tmp_path / "killed" / "checkpoint" / "state.pt"
    killed = subprocess.run([sys.executable, "-c", KILL_AT, str(_config(tmp_path, "killed", monitor=True)), "12"],
                            env=_env(), timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert torch.load(state, weights_only=True)["step"] == 10  # the last checkpoint before the kill
    subprocess.run([*cmd, str(_config(tmp_path, "killed", monitor=True))], check=True, env=_env(), timeout=300)
    whole, resumed = _weights(tmp_path, "whole"), _weights(tmp_path, "killed")
    assert whole.keys() == resumed.keys()
    for key in whole:
        assert torch.equal(whole[key], resumed[key]), key
    # both logs as the whole run's: the steps after the checkpoint, run again, logged once (the heads'
    # gradient norms once kept the killed run's steps 11-12 beside their rerun)
    for log in ("metrics.jsonl", "grads.jsonl"):
        steps = [json.loads(line)["step"] for line in (tmp_path / "killed" / log).read_text().splitlines()]
        assert steps == [json.loads(line)["step"] for line in (tmp_path / "whole" / log).read_text().splitlines()]
        assert len(steps) == len(set(steps)) > 0, log


@pytest.mark.slow
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path):
    subprocess.run([sys.executable, "-m", "multihead.train", str(_config(tmp_path, "one", steps=15, every=15))],
                   check=True, env=_env(), timeout=300)
    _torchrun(_config(tmp_path, "two", steps=15, every=15))
    one, two = _weights(tmp_path, "one"), _weights(tmp_path, "two")
    # W^K's bias gets a zero gradient in exact arithmetic (softmax ignores a constant added to every
    # score), so AdamW's normalised steps follow rounding noise there; every other weight must agree.
    for key in one:
        if not key.endswith("k_proj.bias"):
            torch.testing.assert_close(two[key], one[key], atol=2e-5, rtol=1e-4)
    assert (tmp_path / "two" / "metrics.jsonl").read_text().count("\n") >= 3


def test_bad_configs_fail_clearly(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('steps = 3\n')
    with pytest.raises(ValueError, match="missing 'out'"):
        load_config(bad)
    bad.write_text('out = "x"\nsteps = 0\n')
    with pytest.raises(ValueError, match="steps must be positive; got 0"):
        load_config(bad)
    bad.write_text('out = "x"\n[data]\nsource = "wiki"\n')
    with pytest.raises(ValueError, match=r"data\.source"):
        load_config(bad)
    bad.write_text('out = "x"\nstpes = 3\n')
    with pytest.raises(ValueError, match="unknown key 'stpes'; did you mean 'steps'"):
        load_config(bad)
    for section, line, words in (("optim", "learning_rate = 1e9", r"unknown key \[optim\] 'learning_rate'"),
                                 ("model", "layres = 1", r"unknown key \[model\] 'layres'; did you mean 'layers'"),
                                 ("model", "layers = 'two'", r"\[model\] layers must be an integer; got 'two'"),
                                 ("optim", "lr = -1.0", r"\[optim\] lr must be positive"),
                                 ("run", "fsdp = 1", r"\[run\] fsdp must be true or false")):
        bad.write_text(f'out = "x"\n[{section}]\n{line}\n')
        with pytest.raises(ValueError, match=words):  # a typo inside a section is named, never trained around
            load_config(bad)
    code, _, err = run_cli(["train", str(tmp_path / "none.toml")], capsys)
    assert code == 2 and "none.toml" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_fsdp_two_processes_smoke_test_equals_one_process(tmp_path):
    pytest.importorskip("torch.distributed.fsdp")
    if tuple(int(n) for n in torch.__version__.split(".")[:2]) < (2, 7):
        pytest.skip("FSDP2 on the CPU: torch 2.6's fails in its first all-gather ('Stream' object has no attribute "
                    "'record_event'; measured), 2.13's runs")
    subprocess.run([sys.executable, "-m", "multihead.train", str(_config(tmp_path, "one", steps=6, every=6))],
                   check=True, env=_env(), timeout=300)
    path = _config(tmp_path, "fsdp", steps=6, every=6)
    path.write_text(path.read_text() + "fsdp = true\n")
    _torchrun(path)
    one, two = _weights(tmp_path, "one"), _weights(tmp_path, "fsdp")
    assert one.keys() == two.keys()
    for key in one:
        if not key.endswith("k_proj.bias"):  # see the DDP test
            torch.testing.assert_close(two[key], one[key], atol=2e-5, rtol=1e-4)


END_RANK = """
import atexit, os, sys
from multihead.train import end_rank

atexit.register(lambda: print("finalised", flush=True))
sys.stdout.write("buffered line")  # no newline, no flush: end_rank must flush it
sys.stderr = open(sys.stderr.fileno(), "w", buffering=1 << 16, closefd=False)  # block-buffered: flushed by end_rank
sys.stderr.write("buffered error")
sys.exit(end_rank(3))
"""


@pytest.mark.slow
@pytest.mark.parametrize("world", ["1", "2"])
def test_a_torchrun_rank_ends_without_the_interpreter_teardown_and_loses_no_output(world):
    # Under torchrun the teardown is where gloo's worker thread can abort the rank (see end_rank),
    # so a rank skips it (no atexit line) yet keeps its buffered output and its exit code.
    done = subprocess.run([sys.executable, "-c", END_RANK], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, WORLD_SIZE=world))
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("buffered line") and done.stderr.startswith("buffered error"), done.stderr
    assert ("finalised" in done.stdout) == (world == "1"), done.stdout


def test_a_run_trains_in_bfloat16_mixed_precision_on_the_cpu(tmp_path):
    """[run] precision = "bfloat16": autocast forward, float32 weights and loss; the loss falls as in float32."""
    from multihead.train import train

    path = _config(tmp_path, "bf16", steps=12, every=0)
    path.write_text(path.read_text().replace("[run]\n", '[run]\nprecision = "bfloat16"\ndevice = "cpu"\n'))
    model = train(load_config(path))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    losses = [json.loads(line)["loss"] for line in (tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


@pytest.mark.slow
def test_device_and_dtype_on_the_command_line_replace_the_configs(tmp_path, capsys):
    """`multihead train --device/--dtype` (and `python -m multihead.train`, what torchrun starts):
    the config's [run] device and precision replaced; a device that is not here, float16 or a
    precision other than the folder's run: one line, exit 2, nothing written."""
    path = _config(tmp_path, "flags", steps=2, every=2)
    out = tmp_path / "flags"
    for flags, words in ((["--device", "cuda:7"], "--device: device 'cuda:7' is not"),
                         (["--device", "tpu"], "expected auto, cpu, cuda, cuda:N or mps"),
                         (["--dtype", "float16"], "float16 training needs loss scaling: use bfloat16")):
        if flags == ["--device", "cuda:7"] and torch.cuda.device_count() > 7:
            continue
        code, _, err = run_cli(["train", str(path), *flags], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()
    code, _, err = run_cli(["train", str(path), "--device", "cpu", "--dtype", "bfloat16", "-q"], capsys)
    assert code == 0, err
    record = json.loads((out / "run.json").read_text())
    assert record["identity"]["precision"] == "bfloat16" and record["run"]["device"] == "cpu"
    # the folder is a bfloat16 run's: the config's own float32 may not resume it, in either entry point
    code, _, err = run_cli(["train", str(path)], capsys)
    assert code == 2 and ("its precision is 'bfloat16', this config's 'float32'); choose another folder, or resume "
                          "it with --dtype bfloat16") in err, err
    done = subprocess.run([sys.executable, "-m", "multihead.train", str(path)], capture_output=True, text=True,
                          env=_env(), timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "its precision is 'bfloat16'" in done.stderr
    done = subprocess.run([sys.executable, "-m", "multihead.train", str(path), "--dtype", "bfloat16", "--device",
                           "cpu"], capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr  # with its own precision it resumes (and finds its steps done)
    done = subprocess.run([sys.executable, "-m", "multihead.train", str(path), "--dtype", "float16"],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 2 and "float16 training needs loss scaling" in done.stderr, done.stderr
    # and the reverse: a float32 run's folder is not a bfloat16 config's
    path.write_text(path.read_text().replace(str(out), str(tmp_path / "f32")))
    assert run_cli(["train", str(path), "-q"], capsys)[0] == 0
    code, _, err = run_cli(["train", str(path), "--dtype", "bfloat16"], capsys)
    assert code == 2 and "its precision is 'float32', this config's 'bfloat16'" in err, err


def test_a_run_logs_the_rate_each_step_used_and_says_what_a_rerun_trains(tmp_path, capsys):
    """metrics.jsonl logged the rate after each step's update (step 0: the peak, not warm-up's
    half; the last step 0.0); a finished run run again said "trained 6 steps"; a resumed run off a
    terminal said nothing of resuming; raising `steps` changed the schedule without a word."""
    from multihead.train import warmup_cosine

    path = _config(tmp_path, "lr", steps=6, every=3)
    path.write_text(path.read_text().replace("warmup = 5", "warmup = 2").replace("log_every = 5", "log_every = 1"))
    code, out, err = run_cli(["train", str(path), "--device", "cpu"], capsys)
    assert code == 0 and out.strip().splitlines()[-1].startswith("trained 6 steps: weights in "), out
    logged = [json.loads(line) for line in (tmp_path / "lr" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(6))
    for r in logged:
        assert r["lr"] == pytest.approx(3e-3 * warmup_cosine(r["step"], 2, 6)), r
    assert logged[0]["lr"] == pytest.approx(1.5e-3) and logged[-1]["lr"] > 0

    code, out, err = run_cli(["train", str(path), "--device", "cpu"], capsys)
    assert code == 0 and "nothing trained: " in out and "holds all 6 steps" in out, out
    assert "holds 6 steps, all of the 6 this config asks for: nothing to train" in err, err
    path.write_text(path.read_text().replace("steps = 6", "steps = 10"))
    code, out, err = run_cli(["train", str(path), "--device", "cpu"], capsys)
    assert code == 0 and "trained steps 7-10 of 10 (resumed at step 6)" in out, out
    assert "resuming " in err and "at step 6 of 10" in err, err
    assert "was a run of 6 steps: its learning rate from step 6 on follows the schedule of 10 steps" in err, err
    logged = [json.loads(line) for line in (tmp_path / "lr" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(10))
    for r in logged[6:]:  # the resumed steps at the 10-step schedule's rates, the first of them too (it was 0.0)
        assert r["lr"] == pytest.approx(3e-3 * warmup_cosine(r["step"], 2, 10)), r
    # fewer steps than the folder holds: nothing trained, and the record keeps its 10
    path.write_text(path.read_text().replace("steps = 10", "steps = 4"))
    code, out, err = run_cli(["train", str(path), "--device", "cpu"], capsys)
    assert code == 0 and "holds 10 steps, all of the 4 this config asks for" in err, err
    assert json.loads((tmp_path / "lr" / "run.json").read_text())["steps"] == 10


def test_a_checkpoint_without_its_state_is_never_trained_over(tmp_path, capsys):
    """checkpoint/state.pt gone (deleted, an FSDP run's): the run started over in silence and wrote
    a fresh model over the trained one, and a fresh log over its metrics."""
    path = _config(tmp_path, "lost", steps=4, every=2)
    assert run_cli(["train", str(path), "--device", "cpu"], capsys)[0] == 0
    (tmp_path / "lost" / "checkpoint" / "state.pt").unlink()
    before = {p: p.read_bytes() for p in (tmp_path / "lost").rglob("*") if p.is_file()}
    path.write_text(path.read_text().replace("steps = 4", "steps = 6"))
    code, _, err = run_cli(["train", str(path), "--device", "cpu"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "checkpoint holds a checkpoint (complete, model.safetensors) without state.pt" in err, err
    assert "train into a new folder" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in (tmp_path / "lost").rglob("*") if p.is_file()} == before
    # a run that saved no checkpoint at all starts over, and says so
    shutil.rmtree(tmp_path / "lost" / "checkpoint")
    code, _, err = run_cli(["train", str(path), "--device", "cpu"], capsys)
    assert code == 0 and "holds a run that saved no checkpoint: starting it over from step 0" in err, err


def test_a_runs_model_loads_from_its_folder_and_the_commands_say_how(tmp_path, capsys):
    """`analyze --model RUN` said only 'has no config.json'; rebuilding the model by hand was the way."""
    import multihead as mh

    path = _config(tmp_path, "own", steps=2, every=2)
    assert run_cli(["train", str(path), "--device", "cpu"], capsys)[0] == 0
    run = mh.train.load_run(tmp_path / "own")
    model, saved = run.model, _weights(tmp_path, "own")
    assert all(torch.equal(value, saved[name]) for name, value in model.state_dict().items())
    assert not model.training
    assert mh.train.load_run(tmp_path / "own" / "checkpoint").model.state_dict().keys() == saved.keys()
    ids = run.encode("To be, or not")
    assert ids.shape == (1, 13) and run.decode(ids) == "To be, or not"
    with pytest.raises(ValueError, match=r"'€' is not among the \d+ characters this run trained on"):
        run.encode("€")
    maps = []
    with mh.hf.AttentionCapture(model, lambda chunk: maps.append(chunk.weights.clone())), torch.no_grad():
        model(ids)
    assert [tuple(m.shape) for m in maps] == [(1, 4, 13, 13)]
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(1, 4, 13))
    for where in (tmp_path / "own", tmp_path / "own" / "checkpoint"):
        code, _, err = run_cli(["analyze", "hi", "--model", str(where), "--out", str(tmp_path / "r")], capsys)
        assert code == 2 and err.strip().splitlines() == [
            f"multihead analyze: error: {where} holds a multihead train run, not a Hugging Face model folder (the "
            f"commands read those): load it in Python, mh.train.load_run({str(where)!r}) (its model and its "
            "characters), and read its heads with mh.hf.AttentionCapture (docs/training.md)"], err
    with pytest.raises(ValueError, match="holds no multihead train run"):
        mh.train.load_run(tmp_path)
    (tmp_path / "listed").mkdir()
    (tmp_path / "listed" / "run.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"run\.json is not a multihead run's record"):
        mh.train.load_run(tmp_path / "listed")
