"""Head gates, importance and pruning (issue: which heads matter)."""

import pytest
import torch

import multihead as mh
from conftest import float_tolerance
from multihead.heads import (
    count_heads,
    head_importance,
    load_pruned,
    prune_heads,
    pruning_curve,
    save_pruned,
    spearman,
)
from multihead.hf.interventions import HeadGates
from multihead.hf.model import right_padding

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


def _gates_for(L, H, pruned):
    g = torch.ones(L, H)
    for layer, hs in pruned.items():
        g[layer, hs] = 0
    return g


# --- our layer ---------------------------------------------------------------------------------------------------

class _Stack(torch.nn.Module):
    def __init__(self, kv=None):
        super().__init__()
        self.layers = torch.nn.ModuleList([mh.MultiHeadAttention(24, 6, num_kv_heads=kv) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x, mask=mh.masks.causal())
        return x


@pytest.mark.parametrize("kv", [None, 3, 2])
@pytest.mark.parametrize("pruned", [{0: [1, 4], 1: [0]}, {0: [0, 1], 1: [0, 1, 2, 3, 4, 5]}, {1: [5, 2, 3]}])
def test_gate_zero_equals_physical_removal_on_our_layer(kv, pruned):
    torch.manual_seed(0)
    model = _Stack(kv).eval()
    x = torch.randn(2, 7, 24)
    with torch.no_grad(), HeadGates(model, values=_gates_for(2, 6, pruned)):
        gated = model(x)
    before = sum(p.numel() for p in model.parameters())
    prune_heads(model, pruned)
    with torch.no_grad():
        torch.testing.assert_close(model(x), gated, atol=float_tolerance(gated, ops=512), rtol=1e-5)
    assert count_heads(model) == [6 - len(pruned.get(layer, [])) for layer in range(2)]
    if kv is None:  # plain MHA: the parameter count drops (GQA with unequal groups left repeats K/V)
        assert sum(p.numel() for p in model.parameters()) < before


def test_per_example_gates_give_per_example_gradients_on_our_layer():
    torch.manual_seed(0)
    model = _Stack().double().eval()
    x = torch.randn(3, 5, 24, dtype=torch.float64)
    with HeadGates(model) as gates:
        values = torch.ones(2, 3, 6, dtype=torch.float64, requires_grad=True)
        gates.values = values
        model(x).square().sum(dim=(1, 2)).sum().backward()
        for b in range(3):  # example b's gradient, alone
            single = torch.ones(2, 1, 6, dtype=torch.float64, requires_grad=True)
            gates.values = single
            model(x[b:b + 1]).square().sum().backward()
            torch.testing.assert_close(values.grad[:, b], single.grad[:, 0])


# --- importance --------------------------------------------------------------------------------------------------

def _tiny_bert():
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertModel(config).double().eval()


def _batches(n=6, size=3, T=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (n, T), generator=g)
    mask = torch.ones(n, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[4, 3:] = 0
    target = torch.randn(n, 16, generator=g, dtype=torch.float64)
    return [{"input_ids": ids[s:s + size], "attention_mask": mask[s:s + size], "target": target[s:s + size]}
            for s in range(0, n, size)]


def _loss(outputs, batch):
    pooled = outputs.last_hidden_state[:, 0]  # (B, D)
    return (pooled - batch["target"]).square().sum(-1)  # (B,)


def test_importance_equals_finite_differences_of_each_example_loss():
    model = _tiny_bert()
    batches = _batches()
    got = head_importance(model, batches, _loss, normalize=False)
    want = torch.zeros(2, 4, dtype=torch.float64)
    eps = 1e-6
    with HeadGates(model) as gates, torch.no_grad():
        for batch in batches:
            for b in range(batch["input_ids"].shape[0]):
                one = {k: v[b:b + 1] for k, v in batch.items()}
                for layer in range(2):
                    for h in range(4):
                        values = torch.ones(2, 4, dtype=torch.float64)
                        values[layer, h] += eps
                        gates.values = values
                        up = _loss(model(input_ids=one["input_ids"], attention_mask=one["attention_mask"]), one)
                        values[layer, h] -= 2 * eps
                        down = _loss(model(input_ids=one["input_ids"], attention_mask=one["attention_mask"]), one)
                        want[layer, h] += ((up - down) / (2 * eps)).abs().item()
    torch.testing.assert_close(got.raw, want / 6, rtol=1e-5, atol=1e-8)
    assert got.examples == 6


def test_importance_does_not_depend_on_the_batch_size_and_normalises_per_layer():
    model = _tiny_bert()
    one = head_importance(model, _batches(size=1), _loss)
    three = head_importance(model, _batches(size=3), _loss)
    torch.testing.assert_close(one.raw, three.raw)
    torch.testing.assert_close(three.scores.norm(dim=-1), torch.ones(2, dtype=torch.float64))
    low = three.ranking()[0]
    assert three.scores[low[0], low[1]] == three.scores.min()
    assert all(p.requires_grad for p in model.parameters())  # restored


def test_spearman_matches_the_definition():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert spearman(a, a * 10) == pytest.approx(1)
    assert spearman(a, -a) == pytest.approx(-1)
    b = torch.tensor([2.0, 1.0, 4.0, 3.0, 5.0])
    assert spearman(a, b) == pytest.approx(0.8)  # 1 - 6·Σd²/(n(n²-1)) = 1 - 6·4/120
    assert spearman(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([1.0, 2.0, 3.0])) == pytest.approx(0.8660254)


# --- real models -------------------------------------------------------------------------------------------------

TEXTS = ["The animal didn't cross the street because it was too tired.", "Heads specialise.",
         "小明把蛋糕递给小红，因为她不饿了。"]


@pytest.mark.slow
def test_gate_zero_equals_pruning_on_minilm_and_saves_and_loads(minilm, tmp_path):
    model = transformers.AutoModel.from_pretrained(minilm.path).eval()
    batch = minilm.tokenizer(TEXTS, padding=True, return_tensors="pt")
    pruned = {0: [0, 5, 11], 2: list(range(12)), 5: [3]}
    with torch.no_grad(), HeadGates(model, values=_gates_for(6, 12, pruned)):
        gated = model(**batch).last_hidden_state
    with torch.no_grad():
        full = model(**batch).last_hidden_state
    before = sum(p.numel() for p in model.parameters())
    prune_heads(model, pruned)
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        got = model(**batch).last_hidden_state
    torch.testing.assert_close(got[valid], gated[valid], atol=float_tolerance(gated[valid], ops=512), rtol=1e-4)
    assert not torch.allclose(got[valid], full[valid], atol=1e-3)
    assert count_heads(model) == [9, 12, 0, 12, 12, 11]
    assert before - sum(p.numel() for p in model.parameters()) == 16 * (384 * 32 * 4 + 32 * 3)
    save_pruned(model, tmp_path / "p", pruned, base="minilm")
    again = load_pruned(transformers.AutoModel.from_pretrained(minilm.path).eval(), tmp_path / "p")
    with torch.no_grad():
        torch.testing.assert_close(again(**batch).last_hidden_state, got)


@pytest.mark.slow
def test_gate_zero_equals_pruning_on_smollm2_with_gqa(smollm2, tmp_path):
    lm = smollm2
    model = transformers.AutoModelForCausalLM.from_pretrained(lm.path).eval()
    with right_padding(lm.tokenizer) as tok:  # the shared model's tokenizer is left as it was
        batch = tok(TEXTS, padding=True, return_tensors="pt")
    # layer 0: a whole kv group (heads 0-2); layer 1: unequal groups; layer 7: every head; layer 29: one head
    pruned = {0: [0, 1, 2], 1: [0, 4], 7: list(range(9)), 29: [8]}
    with torch.no_grad(), HeadGates(model, values=_gates_for(30, 9, pruned)):
        gated = model(**batch).logits
    prune_heads(model, pruned)
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        got = model(**batch).logits
    torch.testing.assert_close(got[valid], gated[valid], atol=float_tolerance(gated[valid], ops=512), rtol=1e-4)
    assert count_heads(model)[:2] == [6, 7] and count_heads(model)[7] == 0
    attn0 = model.model.layers[0].self_attn
    assert attn0.k_proj.out_features == 2 * 64 and attn0.num_key_value_groups == 3
    # its LM head is its embedding (tied): saved once, tied again on loading (`prune --save-model` once failed)
    save_pruned(model, tmp_path / "p", pruned, base="smollm2")
    again = load_pruned(transformers.AutoModelForCausalLM.from_pretrained(lm.path).eval(), tmp_path / "p")
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(again(**batch).logits, got)


@pytest.mark.slow
def test_sentiment_task_importance_ablation_and_a_short_curve(minilm):
    from multihead.heads import SentimentTask, ablation_importance

    task = SentimentTask(minilm, train_size=256, test_size=96, batch_size=64)
    acc = task.evaluate()
    assert 0.6 < acc <= 1  # a linear probe on frozen MiniLM separates fresh from rotten
    imp = head_importance(minilm.model, task.batches("train"), task.loss)
    assert imp.scores.shape == (6, 12) and imp.examples == 256 and (imp.raw > 0).all()
    drop, base = ablation_importance(minilm.model, task.evaluate, heads=[(0, 0), (3, 5)])
    assert base == pytest.approx(acc) and drop.shape == (6, 12)
    assert not drop[0, 0].isnan() and not drop[3, 5].isnan() and int(drop.isnan().sum()) == 70
    # each drop is the metric with exactly that head gated off (a continuous metric, so any mix-up shows)
    batch = next(iter(task.batches("test")))

    def evaluate():
        with torch.no_grad():
            return -float(task.loss(minilm.model(**{k: batch[k] for k in ("input_ids", "attention_mask")}),
                                    batch).mean())

    drop, base = ablation_importance(minilm, evaluate, heads=[(0, 0), (3, 5)])
    for layer, h in [(0, 0), (3, 5)]:
        with HeadGates(minilm, values=_gates_for(6, 12, {layer: [h]})):
            assert float(drop[layer, h]) == pytest.approx(base - evaluate(), abs=1e-6)
    assert float(drop[0, 0]) != pytest.approx(float(drop[3, 5]), abs=1e-9)
    curve = pruning_curve(task, steps=2, per_step=0.25)
    assert [s.heads_pruned for s in curve.steps] == [18, 32]  # 25% of 72, then of the 54 left
    assert curve.baseline == pytest.approx(acc) and len(curve.steps[1].pruned) == 32
    assert minilm.model.config._attn_implementation != "multihead_capture"  # gates taken off


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_sentiment_task_on_a_half_precision_encoder_agrees_with_float32(dtype, minilm):
    """The float32 classifier met a bfloat16 model's embeddings: `mat1 and mat2 must have the
    same dtype` (prune --task sentiment --dtype bfloat16 ended in a traceback)."""
    from multihead.heads import SentimentTask

    half = mh.hf.load("minilm", dtype=dtype)
    sizes = dict(train_size=128, test_size=64, batch_size=64)
    task, full = SentimentTask(half, **sizes), SentimentTask(minilm, **sizes)
    assert task.classifier.weight.dtype == torch.float32
    assert abs(task.evaluate() - full.evaluate()) <= 4 / 64
    got = head_importance(half.model, task.batches("train"), task.loss)
    want = head_importance(minilm.model, full.batches("train"), full.loss)
    assert got.raw.isfinite().all() and (got.raw > 0).all()
    assert torch.corrcoef(torch.stack([got.raw.flatten(), want.raw.flatten()]))[0, 1] > 0.95


def test_a_model_that_scores_nothing_is_not_pruned_against_nothing():
    """A random-weight decoder scores 0 next-token accuracy: every step's share of the unpruned
    metric is 0/0, and "prunable within 99%" would hold at any fraction (once printed as nan and
    saved a pruned model). The curve stops after the baseline, in one line."""
    from pathlib import Path
    from types import SimpleNamespace

    from multihead.heads.curve import PruningCurve, PruningStep
    from multihead.hf.model import HFModel

    config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, vocab_size=64)
    tiny = HFModel(transformers.AutoModelForCausalLM.from_config(config).eval(), None, "tiny", Path("."), True,
                   2, 4, 8, 64)
    calls = []
    task = SimpleNamespace(name="lm", metric_name="next-token accuracy", model=tiny,
                           evaluate=lambda: calls.append("evaluate") or 0.0,
                           batches=lambda split: calls.append(split) or iter(()), loss=None)
    with pytest.raises(ValueError, match=r"the unpruned tiny scores 0\.0000 next-token accuracy .* prune a trained"):
        pruning_curve(task, steps=3)
    assert calls == ["evaluate"]  # refused before any importance pass
    curve = PruningCurve("lm", "next-token accuracy", "tiny", 8, 0.0, [PruningStep(1, 0.25, 2, 0.0, [(0, 0)])])
    assert "nan" not in curve.table() and curve.table().endswith("| 0.0000 | – |")


def test_cli_prune_rejects_bad_input_without_traceback(tmp_path, cli_rejects):
    cli_rejects("prune", [
        (["--task", "translation"], "invalid choice"),
        (["--threshold", "1.5"], "--threshold: must be in (0, 1]"),
        (["--threshold", "0"], "--threshold: must be in (0, 1]"),
        (["--steps", "0"], "--steps: must be a positive integer"),
        (["--per-step", "2"], "--per-step: must be in (0, 1]"),
        (["--steps", "two"], "--steps: must be a positive integer; got 'two'"),
        (["--model", str(tmp_path / "missing")], "neither a known name"),
    ])


@pytest.mark.slow
def test_cli_prune_on_minilm_writes_the_curve(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "p"
    (tmp_path / "minilm-folder").symlink_to(mh.hf.model_path("minilm"))  # a model folder named by a relative path
    done = subprocess.run([sys.executable, "-m", "multihead.cli", "prune", "--model", "minilm-folder", "--steps", "2",
                           "--per-step", "0.5", "--train-size", "64", "--test-size", "64", "--out", str(out),
                           "--save-model"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    curve = json.loads((out / "curve.json").read_text())
    kept = [s for s in curve["steps"] if s["metric"] >= 0.99 * curve["baseline"]]
    if kept:  # the printed verdict is the curve's own
        assert f"Largest fraction prunable within 99% of the unpruned accuracy: {kept[-1]['fraction_pruned']:.2f}" \
            in done.stdout, done.stdout
        assert (out / "model" / "model.safetensors").is_file()
        # its base recorded whole: the pruned folder is loaded onto it from anywhere
        assert json.loads((out / "model" / "pruned_heads.json").read_text())["base"] == str(
            (tmp_path / "minilm-folder").resolve())
    else:
        assert "No step kept accuracy within 99%" in done.stdout, done.stdout
    assert curve["schema"] == "multihead.pruning/1" and [s["heads_pruned"] for s in curve["steps"]] == [36, 54]
    assert curve["placement"] == "float32 on cpu"  # a bfloat16 curve is told apart
    png = (out / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # run again into it without --save-model: its pruned model would sit beside a curve it is not of —
    # refused before any work, the folder as it was
    (out / "model").mkdir(exist_ok=True)
    record = out / "model" / "pruned_heads.json"
    record.write_text(record.read_text() if record.is_file() else '{"base": "minilm", "pruned_heads": {}}')
    before = {f.name: f.read_bytes() for f in out.rglob("*") if f.is_file()}
    again = subprocess.run([sys.executable, "-m", "multihead.cli", "prune", "--steps", "1", "--out", str(out)],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert again.returncode == 2 and "holds an earlier run's pruned model" in again.stderr, again.stderr
    assert {f.name: f.read_bytes() for f in out.rglob("*") if f.is_file()} == before


def test_models_without_attention_and_bad_head_lists_fail_clearly():
    with pytest.raises(ValueError, match="has no attention layer multihead can find"):
        prune_heads(torch.nn.Sequential(torch.nn.Linear(2, 2)), {0: [0]})
    with pytest.raises(ValueError, match="has no attention layer multihead can find"):
        HeadGates(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"heads \[6\] out of range"):
        prune_heads(_Stack(), {0: [6]})
    with pytest.raises(ValueError, match="layer 2 out of range"):
        prune_heads(_Stack(), {2: [0]})


def test_the_language_model_task_scores_each_text_as_the_model_alone_does(smollm2):
    """Next-token accuracy and perplexity over padded batches (the logits of the predicting
    positions only, in parts) equal those of each text run alone with every logit made."""
    import math

    task = mh.heads.LanguageModelTask(smollm2, train_size=2, test_size=6, batch_size=4)
    right = total = 0
    nll = 0.0
    with torch.no_grad():
        for text in task.splits["test"]:
            ids = smollm2.tokenizer(text, return_tensors="pt")["input_ids"]  # (1, T)
            logits = smollm2.model(input_ids=ids).logits[0, :-1]  # (T-1, V)
            right += int((logits.argmax(-1) == ids[0, 1:]).sum())
            total += ids.shape[1] - 1
            nll += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
    assert task.evaluate() == pytest.approx(right / total, abs=1e-12)
    assert task.last_perplexity == pytest.approx(math.exp(nll / total), rel=1e-4)
    assert 0 < right < total


def test_a_model_pruned_in_place_or_saved_pruned_is_told_how_to_analyse_it(tmp_path):
    """A layer of 11 heads beside layers of 12 failed deep in the reducers (a size mismatch traceback);
    a saved pruned folder was "not a Hugging Face model folder" with no word of how to load it."""
    model = mh.hf.load("minilm")  # its own copy: pruned here
    prune_heads(model, {0: [3]})
    with pytest.raises(mh.hf.UnsupportedModelError, match=r"^minilm's layers have different numbers of heads \(12 "
                                                          r"in most, 11 in layer 0: pruned, or so built\).*HeadGates"):
        mh.analyze(model, TEXTS[:1])
    save_pruned(model, tmp_path / "p", {0: [3]}, base="minilm")
    with pytest.raises(FileNotFoundError, match=r"holds a model pruned by multihead prune .* "
                                                r"mh\.heads\.load_pruned\(mh\.hf\.load\('minilm'\), "):
        mh.hf.load(tmp_path / "p")


def test_the_pruning_steps_said_are_those_that_run():
    """'pruning step 8/12' for an 8-head model whose heads ran out at step 8: the count is the steps run."""
    from multihead.heads.curve import _steps_run

    assert _steps_run(8, 0.1, 12) == 8  # one head a step (10 % of fewer than 10 rounds to 0: one at least)
    assert _steps_run(72, 0.25, 2) == 2 and _steps_run(72, 0.5, 20) == 7  # pruning 36, 18, 9, 4 (4.5 to even), 2, 2, 1
    assert _steps_run(0, 0.1, 5) == 0


def test_a_report_of_a_model_with_its_heads_gated_says_which(minilm):
    """mh.analyze under HeadGates wrote a report like the whole model's: compare and view could not
    tell that six of its heads were off."""
    texts = ["The cat sat on the mat.", "Dogs bark at night."]
    values = torch.ones(6, 12)
    values[0, 1] = values[3, 5] = 0.0
    whole = mh.analyze(minilm, texts, coreference=False, ablation=0, progress=False)
    with HeadGates(minilm, values=values):
        gated = mh.analyze(minilm, texts, coreference=False, ablation=0, progress=False)
    assert whole.placement == minilm.placement == "float32 on cpu"  # the gates gone with their block
    assert gated.placement == "float32 on cpu, 2 heads gated (L0.H1, L3.H5)"
    found = mh.compare(whole, gated)
    assert f"{found.b_name} was analysed with 2 heads gated (L0.H1, L3.H5): those heads were turned down in its run" \
        in found.warnings, found.warnings
