"""The training harness: exact resume after a real kill, and 2 processes equal 1."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

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
"""


def _config(tmp_path, name, steps=40, every=5):
    path = tmp_path / f"{name}.toml"
    path.write_text(CONFIG.format(out=tmp_path / name, steps=steps, every=every))
    return path


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1")


def _weights(tmp_path, name):
    return load_file(str(tmp_path / name / "checkpoint" / "model.safetensors"))


def test_a_killed_run_resumes_to_the_same_weights(tmp_path):
    cmd = [sys.executable, "-m", "multihead.train"]
    subprocess.run([*cmd, str(_config(tmp_path, "whole"))], check=True, env=_env(), timeout=300)
    state = tmp_path / "killed" / "checkpoint" / "state.pt"
    proc = subprocess.Popen([*cmd, str(_config(tmp_path, "killed"))], env=_env())
    deadline = time.time() + 120
    while time.time() < deadline:
        if state.is_file() and torch.load(state, weights_only=True)["step"] >= 10:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = torch.load(state, weights_only=True)["step"]
    assert 10 <= killed_at < 40, "the run was not killed midway"
    subprocess.run([*cmd, str(_config(tmp_path, "killed"))], check=True, env=_env(), timeout=300)
    whole, resumed = _weights(tmp_path, "whole"), _weights(tmp_path, "killed")
    assert whole.keys() == resumed.keys()
    for key in whole:
        assert torch.equal(whole[key], resumed[key]), key


def test_two_processes_equal_one_with_the_same_global_batch(tmp_path):
    subprocess.run([sys.executable, "-m", "multihead.train", str(_config(tmp_path, "one", steps=15, every=15))],
                   check=True, env=_env(), timeout=300)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", "29517", "-m", "multihead.train",
                           str(_config(tmp_path, "two", steps=15, every=15))],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    one, two = _weights(tmp_path, "one"), _weights(tmp_path, "two")
    # W^K's bias gets a zero gradient in exact arithmetic (softmax ignores a constant added to every
    # score), so AdamW's normalised steps follow rounding noise there; every other weight must agree.
    for key in one:
        if not key.endswith("k_proj.bias"):
            torch.testing.assert_close(two[key], one[key], atol=2e-5, rtol=1e-4)
    assert (tmp_path / "two" / "metrics.jsonl").read_text().count("\n") >= 3


def test_bad_configs_fail_clearly(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('steps = 3\n')
    with pytest.raises(ValueError, match="missing 'out'"):
        load_config(bad)
    bad.write_text('out = "x"\nsteps = 0\n')
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        load_config(bad)
    bad.write_text('out = "x"\n[data]\nsource = "wiki"\n')
    with pytest.raises(ValueError, match=r"data\.source"):
        load_config(bad)
    bad.write_text('out = "x"\nstpes = 3\n')
    with pytest.raises(ValueError, match="unknown keys"):
        load_config(bad)
    done = subprocess.run([sys.executable, "-m", "multihead.cli", "train", str(tmp_path / "none.toml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_fsdp_two_processes_smoke_test_equals_one_process(tmp_path):
    pytest.importorskip("torch.distributed.fsdp")
    subprocess.run([sys.executable, "-m", "multihead.train", str(_config(tmp_path, "one", steps=6, every=6))],
                   check=True, env=_env(), timeout=300)
    path = _config(tmp_path, "fsdp", steps=6, every=6)
    path.write_text(path.read_text() + "fsdp = true\n")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", "29521", "-m", "multihead.train", str(path)],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    one, two = _weights(tmp_path, "one"), _weights(tmp_path, "fsdp")
    assert one.keys() == two.keys()
    for key in one:
        if not key.endswith("k_proj.bias"):  # see the DDP test
            torch.testing.assert_close(two[key], one[key], atol=2e-5, rtol=1e-4)
