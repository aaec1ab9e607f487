"""`torchrun -m multihead.cli analyze` shards the corpus across 2 CPU processes and gives the
one-process report; rank 0 alone prints and writes it."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import run_cli

pytest.importorskip("transformers", reason="the hf extra is not installed")

TEXTS = ["The animal didn't cross the street because it was too tired.", "Heads specialise.",
         "小明把蛋糕递给小红，因为她不饿了。", "A much longer sentence about attention heads and their patterns.",
         "Short one.", "The trophy doesn't fit into the suitcase because it is too large.", "Seven texts in all."]


@pytest.mark.slow
def test_two_ranks_under_torchrun_give_the_one_process_report(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    args = ["analyze", "--file", str(corpus), "--batch-size", "2", "--no-coreference", "--syntax", "spacy"]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           "-m", "multihead.cli", *args, "--out", str(tmp_path / "two")],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote ") == 1 and done.stdout.count("layer |") == 1  # rank 0 alone printed
    assert done.stderr.count("multihead: loading minilm …") == 1  # and said how the run went (each rank did)
    code, _, err = run_cli([*args, "--batch-size", "3", "--out", str(tmp_path / "one")], capsys)
    assert code == 0, err
    one = json.loads((tmp_path / "one" / "report.json").read_text())
    two = json.loads((tmp_path / "two" / "report.json").read_text())
    assert two["sentences"] == one["sentences"] == 7 and two["tokens"] == one["tokens"]
    for a, b in zip(one["heads"], two["heads"], strict=True):
        assert a["label"] == b["label"]
        for key, value in a["metrics"].items():
            assert b["metrics"][key] == pytest.approx(value, abs=1e-5), key
    js_one = torch.tensor(one["sections"]["redundancy"]["js_distance"])
    js_two = torch.tensor(two["sections"]["redundancy"]["js_distance"])
    torch.testing.assert_close(js_two, js_one, atol=2e-4, rtol=0)  # 4-digit rounding in the JSON
    # each rank parsed its own texts; the merged syntax counts are the whole corpus's
    for rel, d in one["sections"]["syntax"]["relations"].items():
        assert two["sections"]["syntax"]["relations"][rel]["count"] == d["count"], rel
        best = two["sections"]["syntax"]["relations"][rel]["best"]["accuracy"]
        assert best == pytest.approx(d["best"]["accuracy"], abs=1e-6)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["report.csv", "report.html", "report.json"]


SCRIPT = """
import json, sys
import torch.distributed as dist
import multihead as mh
texts = [line for line in open(sys.argv[1], encoding="utf-8").read().splitlines() if line]
report = mh.analyze(mh.hf.load("minilm"), texts, batch_size=2, coreference=False, views=())
assert not dist.is_initialized()  # joined for the pass, left after it
if int(__import__("os").environ["RANK"]) == 0:
    report.to_json(sys.argv[2])
"""


@pytest.mark.slow
def test_mh_analyze_under_torchrun_needs_no_set_up_of_its_own(tmp_path):
    """A script calling mh.analyze, run with torchrun: the library joins the process group itself."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           str(script), str(corpus), str(tmp_path / "two.json")],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import multihead as mh

    two = json.loads((tmp_path / "two.json").read_text())
    one = mh.analyze(mh.hf.load("minilm"), TEXTS, batch_size=2, coreference=False, views=())
    assert two["sentences"] == one.sentences == 7  # the ranks' halves merged
    for a, b in zip(one.heads, two["heads"], strict=True):
        assert a.label == b["label"]
        assert b["metrics"]["entropy"] == pytest.approx(a.metrics["entropy"], abs=1e-5)
