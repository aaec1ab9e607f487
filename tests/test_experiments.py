"""The experiments: their data are what they say, and every --quick run writes its files."""

import json
import math

import pytest
import torch

from multihead.cli import main
from multihead.experiments import setting_for
from multihead.experiments.common import mean_std, welch_t
from multihead.experiments.induction import RepeatedText
from multihead.experiments.specialise import MaskedChars
from multihead.experiments.tasks import MultiRelation, Sentiment, make_task


def test_multi_relation_labels_are_partner_previous_and_next_payloads():
    task = MultiRelation()
    batch = task.train_batch(3, seed=1)
    ids, labels = batch["input_ids"], batch["labels"]
    T = task.seq_len
    symbol, payload = ids // task.payloads, ids % task.payloads
    for b in range(4):
        counts = torch.bincount(symbol[b], minlength=task.symbols)
        assert set(counts.tolist()) <= {0, 2}  # every symbol present occurs exactly twice
        for i in range(T):
            j = next(k for k in range(T) if k != i and symbol[b, k] == symbol[b, i])
            assert labels[b, i].tolist() == [payload[b, j], payload[b, (i - 1) % T], payload[b, (i + 1) % T]]
    assert torch.equal(ids, task.train_batch(3, seed=1)["input_ids"])
    assert not torch.equal(ids, task.train_batch(3, seed=2)["input_ids"])


def test_repeated_text_repeats_its_first_m_tokens_at_a_varying_offset():
    data = RepeatedText()
    batch = data.train_batch(0, seed=0)
    offsets = set()
    for b in range(16):
        row = torch.cat([batch["input_ids"][b], batch["labels"][b, -1:]])  # the T + 1 tokens
        copied = batch["copy"][b].nonzero().flatten()
        m = int(copied[0])
        assert data.seq_len // 4 <= m <= data.seq_len // 2 and torch.equal(copied, torch.arange(m, 2 * m - 1))
        assert torch.equal(row[m:2 * m], row[:m])  # the first m tokens, repeated right after them
        offsets.add(m)
    assert len(offsets) > 3
    held = data.held_out()[0]
    assert torch.equal(held["input_ids"], data.held_out()[0]["input_ids"])  # fixed held-out text


def test_masked_chars_mask_only_characters():
    data = MaskedChars()
    batch = data.train_batch(0, seed=0)
    chosen = batch["labels"] != -100
    assert (batch["input_ids"][:, 0] == data.CLS).all() and (batch["input_ids"][:, -1] == data.SEP).all()
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert 0.1 < chosen.float().mean() < 0.2
    assert ((batch["input_ids"] == data.MASK) <= chosen).all()


def test_sentiment_split_is_fixed_and_disjoint():
    task = Sentiment()
    assert len(task.splits["test"]) == 1000 and len(task.splits["train"]) == 3866
    assert task.splits["test"] == Sentiment().splits["test"]
    assert all(ids[0] == 2 and len(ids) <= task.max_len for ids, _ in task.splits["train"])


def test_task_models_have_equal_parameters_for_every_head_count():
    for name in ("lm-hamlet", "multi-relation", "sentiment"):
        task = make_task(name)
        sizes = {sum(p.numel() for p in task.build(h, 32, 2).parameters()) for h in (1, 2, 4, 8, 16, 32)}
        assert len(sizes) == 1, name
    with pytest.raises(ValueError, match="not divisible"):
        make_task("multi-relation").build(3, 32, 2)
    with pytest.raises(ValueError, match="unknown task"):
        make_task("translation")


def test_mean_std_and_welch_t():
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert mean_std([5.0]) == (5.0, 0.0)
    assert welch_t([2.0, 2.2, 2.4], [1.0, 1.2, 1.4]) == pytest.approx(1.0 / math.sqrt(0.04 / 3 * 2))
    with pytest.raises(ValueError, match="does not divide"):
        setting_for(True, heads=[3])


def test_a_result_is_strict_json_and_says_what_t_a_difference_needs(tmp_path):
    """One seed's Welch t (NaN) was written as a bare NaN, which strict JSON readers refuse, and the
    Markdown printed "+nan" under a sentence that put the needed |t| at "about 3" whatever the seeds."""
    from multihead.experiments.common import write_result
    from multihead.experiments.heads import _significance, _t

    write_result(tmp_path / "r", "heads", setting_for(True), {"t": {1: math.nan, 2: math.inf, 4: 1.5}}, "x", {}, 1.0)
    data = json.loads((tmp_path / "r" / "result.json").read_text(),
                      parse_constant=lambda name: pytest.fail(f"{name} in result.json"))
    assert data["t"] == {"1": None, "2": None, "4": 1.5}
    assert _significance(1).startswith("with one seed per point no t can be formed")
    assert "|t| ≥ 4.3" in _significance(2) and "|t| ≥ 2.8" in _significance(3) and "|t| ≥ 2.1" in _significance(20)
    assert _t(math.nan) == "n/a (one seed)" and _t(2.34) == "+2.3"


def test_the_redundancy_plot_names_its_head_counts():
    """Its x-axis read 2¹, 2², 2³ where the head counts are 2, 4, 8."""
    from multihead.experiments.heads import _redundancy_figure

    spread = {"js_mean": (0.5, 0.1), "js_min": (0.2, 0.1), "near_duplicate": (0.0, 0.0)}
    fig = _redundancy_figure({"lm": {2: spread, 4: spread, 8: spread}})
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4", "8"]


def _png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_every_quick_experiment_writes_json_markdown_and_plots(tmp_path, capsys):
    out = tmp_path / "ex"
    assert main(["experiment", "all", "--quick", "--out", str(out)]) == 0
    expected = {"heads": ["heads.png"], "one-vs-many": ["redundancy.png"], "induction": ["induction.png"],
                "specialise": ["specialise.png"], "prune-trained": ["prune-multi-relation-h4.png"]}
    for name, pngs in expected.items():
        data = json.loads((out / name / "result.json").read_text())
        assert data["schema"] == "multihead.experiment/1" and data["experiment"] == name
        assert data["setting"]["name"] == "quick"
        md = (out / name / "result.md").read_text()
        assert md.startswith(f"# Experiment `{name}` (quick setting)") and "|---|" in md
        assert all(_png(out / name / p) for p in pngs)
    heads = json.loads((out / "heads" / "result.json").read_text())
    assert set(heads["tasks"]) == {"lm-hamlet", "multi-relation", "sentiment"}
    assert set(heads["tasks"]["lm-hamlet"]["by_heads"]) == {"1", "4"}
    assert len(heads["tasks"]["sentiment"]["by_heads"]["4"]["values"]) == 2  # two seeds
    assert "Vaswani" in (out / "heads" / "result.md").read_text()
    # the sweep's depth, and the task that keeps one layer whatever it is
    assert "2 layers (multi-relation: 1 layer, by design)" in (out / "heads" / "result.md").read_text()
    curve = json.loads((out / "prune-trained" / "result.json").read_text())["curves"]["multi-relation"]["4"]
    assert curve["model"] == "4-head model" and curve["task"] == "multi-relation"  # its title: "4-head model: …"
    assert "formed at step None" not in capsys.readouterr().err
    # one-vs-many and prune-trained reused the sweep's models: 3 tasks x 2 h x 2 seeds, no more
    assert len(list((out / "runs").glob("*.safetensors"))) == 12
    ovm = json.loads((out / "one-vs-many" / "result.json").read_text())
    assert set(ovm["comparison"]) == set(heads["tasks"]) and ovm["redundancy"]["multi-relation"]["4"]
    ind = json.loads((out / "induction" / "result.json").read_text())
    assert len(ind["two_layer"]) == 2 and ind["one_layer_control"]["layers"] == 1
    assert len(ind["two_layer"][0]["induction"][0]) == 2  # (layers, heads) per checkpoint
    spec = json.loads((out / "specialise" / "result.json").read_text())
    assert [c["step"] for c in spec["checkpoints"]] == [0, 4, 8]
    assert sum(spec["checkpoints"][-1]["counts"].values()) == 8
    reports = out / "specialise" / "reports"  # every checkpoint's report: two of them side by side
    assert sorted(p.name for p in reports.iterdir()) == ["step-00000", "step-00004", "step-00008"]
    assert json.loads((reports / "step-00008" / "report.json").read_text())["placement"] == "float32 on cpu"
    capsys.readouterr()
    assert main(["compare", str(reports / "step-00000"), str(reports / "step-00008"), "--out",
                 str(out / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert "heads matched by index: 8 pairs" in printed and (out / "cmp" / "compare.html").is_file()
    # a rerun into the same folder replaces the results (they are ours), from the cached runs
    (out / "heads" / "result.md").write_text("stale")
    assert main(["experiment", "heads", "--quick", "--out", str(out)]) == 0
    again = json.loads((out / "heads" / "result.json").read_text())
    assert again["tasks"] == heads["tasks"]  # the same trained models, so the same numbers
    assert len(list((out / "runs").glob("*.safetensors"))) == 12  # nothing trained again
    assert (out / "heads" / "result.md").read_text().startswith("# Experiment `heads`")
    capsys.readouterr()


def test_experiment_cli_rejects_bad_input(tmp_path, cli_rejects, capsys):
    cases = [(["heads", "--quick", "--heads", "3"], "does not divide"), (["heads", "--quick", "--seeds", "0"], "seeds"),
             (["bogus"], "invalid choice"),
             # a flag the experiment does not read (it ran with its own settings, exit 0, not a word)
             (["induction", "--quick", "--heads", "2", "--seeds", "1"], "--seeds and --heads: induction does not "
                                                                        "read them"),
             (["specialise", "--quick", "--tasks", "sentiment"], "--tasks: specialise does not read it"),
             (["prune-trained", "--quick", "--seeds", "2"], "it reads --tasks, --heads"),
             # no device: one line, not torch's RuntimeError (or a meta tensor's .item() later)
             (["heads", "--quick", "--device", "gpu"], "--device 'gpu' is not a device: expected auto, cpu"),
             (["heads", "--quick", "--device", "meta"], "--device 'meta' is not a device")]
    if not torch.cuda.is_available():
        cases.append((["heads", "--quick", "--device", "cuda"], "sees no CUDA GPU on this machine"))
    cli_rejects("experiment", cases)
    foreign = tmp_path / "mine"
    (foreign / "heads").mkdir(parents=True)
    (foreign / "heads" / "notes.txt").write_text("keep")
    assert main(["experiment", "heads", "--quick", "--out", str(foreign)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (foreign / "heads" / "notes.txt").read_text() == "keep" and not (foreign / "runs").exists()
    (tmp_path / "file").write_text("x")
    assert main(["experiment", "heads", "--quick", "--out", str(tmp_path / "file")]) == 2
    assert "not a folder" in capsys.readouterr().err
