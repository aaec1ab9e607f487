"""mh.analyze sharded across torch.distributed ranks gives the one-process result."""

import json
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

TEXTS = ["The animal didn't cross the street because it was too tired.", "Heads specialise.",
         "小明把蛋糕递给小红，因为她不饿了。", "A much longer sentence about attention heads and their patterns.",
         "Short one.", "The trophy doesn't fit into the suitcase because it is too large.", "Seven texts in all."]

WORKER = r"""
import json, os, sys, torch
import torch.distributed as dist
import multihead as mh
dist.init_process_group("gloo")
texts = json.loads(os.environ["MH_TEXTS"])
report = mh.analyze(mh.hf.load("minilm"), texts, batch_size=2, coreference=False)
if dist.get_rank() == 0:
    report.to_json(os.environ["MH_OUT"])
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_give_the_one_process_report(tmp_path):
    import subprocess

    import multihead as mh

    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = dict(os.environ, MH_TEXTS=json.dumps(TEXTS), MH_OUT=str(tmp_path / "two.json"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", "29533", str(worker)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((tmp_path / "two.json").read_text())
    one = json.loads(mh.analyze(mh.hf.load("minilm"), TEXTS, batch_size=3, coreference=False).to_json())
    assert two["sentences"] == one["sentences"] == 7 and two["tokens"] == one["tokens"]
    for a, b in zip(one["heads"], two["heads"], strict=True):
        assert a["label"] == b["label"]
        for key, value in a["metrics"].items():
            assert b["metrics"][key] == pytest.approx(value, abs=1e-5), key
    js_one = torch.tensor(one["redundancy"]["js_distance"])
    js_two = torch.tensor(two["redundancy"]["js_distance"])
    torch.testing.assert_close(js_two, js_one, atol=2e-4, rtol=0)  # 4-digit rounding in the JSON
