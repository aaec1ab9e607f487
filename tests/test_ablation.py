"""Ablation effects: the change in a model's own objective when one head is removed, batched through
per-example gates, against physical pruning, one head per pass, and heads that write nothing."""

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import multihead as mh
from multihead.analysis.interventions.ablation import ablation_effects
from multihead.hf.sites import find_sites

pytestmark = pytest.mark.slow

TEXTS = ["The animal didn't cross the street because it was too tired.", "Heads look.",
         "A longer sentence about how every head of a model looks at the words around it, near and far.",
         "Stocks fell sharply on Monday."]
HEADS = [(0, 1), (3, 5), (5, 11), (2, 0)]


def _pooled(model, texts):
    enc = model.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.body(**enc).last_hidden_state
    keep = enc["attention_mask"][..., None].float()
    return (hidden * keep).sum(1) / keep.sum(1)


def test_batched_effects_equal_one_head_per_pass_and_physical_pruning(minilm):
    batched = ablation_effects(minilm, TEXTS, heads=HEADS, batch_size=3)
    single = ablation_effects(minilm, TEXTS, heads=HEADS, batch_size=3, heads_per_pass=1)
    for a, b in ((batched.zero, single.zero), (batched.mean, single.mean)):
        got, want = a[tuple(zip(*HEADS, strict=True))], b[tuple(zip(*HEADS, strict=True))]
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    assert batched.objective.startswith("1 - cosine") and batched.texts == 4
    intact = _pooled(minilm, TEXTS)
    for layer, h in HEADS[:2]:  # the head physically removed: the same change of the sentence vectors
        pruned = dataclasses.replace(minilm, model=copy.deepcopy(minilm.model))
        mh.heads.prune_heads(pruned.model, {layer: [h]})
        want = float((1 - F.cosine_similarity(_pooled(pruned, TEXTS), intact, dim=-1)).mean())
        assert batched.zero[layer, h].item() == pytest.approx(want, abs=1e-6)
        assert want > 0
    assert torch.isnan(batched.zero[1, 1])  # not asked for


def test_a_head_whose_output_projection_is_zero_has_no_effect(minilm):
    model = dataclasses.replace(minilm, model=copy.deepcopy(minilm.model))
    layer, h = 3, 5
    site = find_sites(model.model)[layer]
    with torch.no_grad():
        site.o.weight[:, h * site.head_dim:(h + 1) * site.head_dim] = 0
    found = ablation_effects(model, TEXTS[:2], heads=[(layer, h), (3, 6)])
    assert abs(found.zero[layer, h].item()) < 1e-9 and abs(found.mean[layer, h].item()) < 1e-9
    assert found.zero[3, 6].item() > 1e-6  # its neighbour still writes


def test_a_causal_models_objective_is_its_own_next_token_loss(smollm2):
    text = "The capital of France is Paris, and the capital of Italy is Rome."
    found = ablation_effects(smollm2, [text], heads=[(18, 6), (0, 0)], modes=("zero",))
    ids = smollm2.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = float(smollm2.model(input_ids=ids, labels=ids).loss)
    assert found.intact == pytest.approx(want, rel=1e-5)
    assert found.tokens == ids.shape[1] - 1 and found.mean is None
    assert torch.isfinite(found.zero[18, 6]) and torch.isfinite(found.zero[0, 0])


def test_estimated_effects_with_no_head_to_ablate_exactly_still_read_the_intact_objective(smollm2):
    """analyze ablates exactly only the heads with tested labels; where none has one (a random-weight
    model: every head 'broad'), the section once printed 'intact nan' and counted 0 tokens."""
    from multihead.analysis.pipelines.analyze import _ablation, _add_effects
    from multihead.analysis.report import HeadRecord

    text = "The capital of France is Paris, and the capital of Italy is Rome."
    heads = [HeadRecord(layer, h, "broad", [], {}) for layer in range(smollm2.num_layers)
             for h in range(smollm2.num_heads)]
    effects = _ablation(smollm2, [text], heads, exact=False, batch_size=16, progress=False)
    ids = smollm2.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = float(smollm2.model(input_ids=ids, labels=ids).loss)
    assert effects.method == "attribution" and effects.exact == []
    assert effects.intact == pytest.approx(want, rel=1e-5) and effects.tokens == ids.shape[1] - 1
    assert effects.section().intact == pytest.approx(want, abs=1e-5)
    for change in effects.metrics().values():  # every head estimated
        assert change.shape == (30, 9) and torch.isfinite(change).all()
    for low, high in effects.intervals().values():  # no head ablated one by one: no interval, not an error
        assert torch.isnan(low).all() and torch.isnan(high).all()
    _add_effects(heads, effects)
    assert all(not r.intervals and math.isfinite(r.metrics["zero_ablation"]) for r in heads)


def test_single_token_texts_give_a_causal_lm_nothing_to_ablate_and_analyze_says_so(smollm2):
    """A causal LM's objective is its loss on the tokens after each text's first: one-token texts
    give it no term. ablation_effects refuses them in one line (it divided by zero), the count is
    the tokenizer's alone, and analyze skips its ablation with the reason instead of failing after
    its whole pass; a corpus with one longer text is measured on that text's tokens."""
    from multihead.analysis.interventions.ablation import objective_terms
    from multihead.render.text import analyze_text

    words = ["hello", "world"]
    assert [len(ids) for ids in smollm2.tokenizer(words)["input_ids"]] == [1, 1]
    assert objective_terms(smollm2, words) == 0
    assert objective_terms(smollm2, ["hello there", "world"]) == 1
    with pytest.raises(ValueError, match=r"every text is a single token.*two tokens or more"):
        ablation_effects(smollm2, words, heads=[(0, 0)], modes=("zero",))
    with pytest.raises(ValueError, match=r"every text is a single token.*two tokens or more"):
        mh.analysis.attribution_effects(smollm2, words)  # its gradients were NaN, divided by 0 tokens
    found = ablation_effects(smollm2, ["hello there", "world"], heads=[(0, 0)], modes=("zero",))
    assert found.tokens == 1 and torch.isfinite(found.zero[0, 0]) and found.text_counts.tolist() == [1.0, 0.0]
    report = mh.analyze(smollm2, words, ablation=2, coreference=False, induction=False, progress=False)
    section = report.sections.ablation
    assert section.skipped.startswith("ablation effects need a token to predict") and section.modes == []
    assert "Ablation skipped: ablation effects need a token to predict" in analyze_text(report)


def test_bad_requests_are_refused(minilm):
    with pytest.raises(ValueError, match="outside the model's 6 x 12 heads"):
        ablation_effects(minilm, TEXTS, heads=[(6, 0)])
    with pytest.raises(ValueError, match="modes must be some of"):
        ablation_effects(minilm, TEXTS, modes=("random",))


def test_replaying_the_blocks_below_a_head_changes_no_number(smollm2, monkeypatch):
    from multihead.analysis.interventions import ablation

    texts = ["The capital of France is Paris.", "When Mary and John went to the store, John gave a drink to"]
    heads = [(18, 6), (25, 3), (2, 1)]
    assert ablation.blocks_of(smollm2) is not None  # SmolLM2's blocks are found and replayed
    replayed = ablation_effects(smollm2, texts, heads=heads)
    monkeypatch.setattr(ablation, "blocks_of", lambda model: None)
    every_block = ablation_effects(smollm2, texts, heads=heads)
    for a, b in ((replayed.zero, every_block.zero), (replayed.mean, every_block.mean)):
        index = tuple(zip(*heads, strict=True))
        torch.testing.assert_close(a[index], b[index], atol=2e-5, rtol=1e-4)


def test_a_pass_replaying_every_block_below_the_last_holds_one_replicated_output_not_one_a_block(smollm2):
    """A pass ablating the last layer's nine heads replays 29 blocks' outputs nine times over; made
    as each block is called, one replica-sized copy lives at a time — made all when the replay
    began, 29 of them (~72 MB here) did."""
    from multihead.attn.memory import LiveBytes

    texts = ["Stocks fell sharply on Monday as traders sold shares of the largest banks in the city.",
             "The committee met on Tuesday and agreed to postpone the vote until the spring.",
             "Rain fell all night and the river rose over its banks by the morning.",
             "She wrote three letters to the editor before anyone in the office replied."]
    peaks = {}
    for layer in (0, 29):
        with LiveBytes("cpu") as counted:
            ablation_effects(smollm2, texts, heads=[(layer, h) for h in range(9)], heads_per_pass=9, modes=("zero",))
        peaks[layer] = counted.peak
    B, T = 4, max(len(smollm2.tokenizer(t)["input_ids"]) for t in texts)
    every_block = 29 * 9 * B * T * smollm2.model.config.hidden_size * 4  # each block's output, nine copies
    assert peaks[29] < peaks[0] + every_block / 4, (peaks, every_block)


def test_attribution_equals_exact_ablation_for_a_model_linear_in_the_head(smollm2, minilm):
    # The last layer's heads write into the residual stream that only the final norm and the
    # unembedding read: the objective is smooth in ξ, and near ξ = 1 the first-order estimate
    # must track the exact change; for a head whose W^O is scaled down 1000x the model is linear
    # in it to within 1e-6 and the two agree.
    from multihead.analysis.interventions.ablation import attribution_effects

    model = dataclasses.replace(smollm2, model=copy.deepcopy(smollm2.model))
    site = find_sites(model.model)[29]
    h = 4
    with torch.no_grad():
        site.o.weight[:, h * site.head_dim:(h + 1) * site.head_dim] *= 1e-3
    texts = ["The capital of France is Paris.", "Stocks fell sharply on Monday as traders sold."]
    exact = ablation_effects(model, texts, heads=[(29, h)])
    estimate = attribution_effects(model, texts)
    for key, want in (("zero_ablation", exact.zero), ("mean_ablation", exact.mean)):
        assert estimate[key][29, h].item() == pytest.approx(want[29, h].item(), abs=1e-6, rel=1e-2), key
    with pytest.raises(ValueError, match="loss objective"):  # 1 - cosine: gradient 0 at the intact model
        attribution_effects(minilm, texts)


def test_the_output_layer_reads_only_the_predicted_positions(smollm2):
    """Padded texts of different lengths: each text's summed loss is HF's own loss on it alone, and
    the unembedding sees exactly the predicted rows (not the padding, not the last position)."""
    from multihead.analysis.interventions import ablation

    texts = ["The capital of France is Paris.", "Heads look at words.",
             "When Mary and John went to the store, John gave a drink to Mary."]
    batch = ablation._batches(smollm2, texts, batch_size=8)[0]
    assert batch["input_ids"].shape[0] == 3 and not bool(batch["attention_mask"].all())  # padded
    seen = []
    handle = smollm2.model.get_output_embeddings().register_forward_hook(lambda m, a, out: seen.append(out.shape))
    try:
        with torch.no_grad():
            sums = ablation._run(smollm2, batch)
    finally:
        handle.remove()
    assert seen == [(1, int(batch["attention_mask"][:, 1:].sum()), smollm2.model.config.vocab_size)]
    for b in range(3):
        n = int(batch["attention_mask"][b].sum())
        ids = batch["input_ids"][b:b + 1, :n]
        with torch.no_grad():
            want = float(smollm2.model(input_ids=ids, labels=ids).loss) * (n - 1)
        assert float(sums[b]) == pytest.approx(want, rel=1e-4)


def test_batches_are_length_buckets_with_little_padding():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from multihead.analysis.interventions.ablation import MAX_PADDING, MIN_BATCH_TOKENS, _buckets

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.integers(1, 300), min_size=1, max_size=60), st.integers(1, 16))
    def check(lengths, batch_size):
        found = _buckets(lengths, batch_size)
        assert sorted(i for b in found for i in b) == list(range(len(lengths)))
        for b in found:
            real, padded = sum(lengths[i] for i in b), len(b) * max(lengths[i] for i in b)
            assert len(b) <= batch_size
            assert padded <= (1 + MAX_PADDING) * real or padded <= MIN_BATCH_TOKENS

    check()


def test_a_masked_lm_masks_each_text_the_same_in_any_batch(tmp_path):
    """BERT with its masked-LM head (random, tiny): the objective is its own MLM loss, and which
    tokens are masked depends on the text, not on the texts batched with it."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from multihead.analysis.interventions import ablation

    minilm_dir = mh.hf.load("minilm").path
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128)
    BertForMaskedLM(config).eval().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = mh.hf.load(tmp_path)
    assert ablation.objective_name(model).startswith("masked-LM")
    texts = [*TEXTS, "One more sentence to change how the others are batched together here."]
    alone = [ablation._batches(model, [t], 1)[0] for t in texts]
    together = ablation._batches(model, texts, 8)
    masks = {}
    for batch in together:
        for row, label in zip(batch["input_ids"], batch["labels"], strict=True):
            masks[tuple(row.tolist())] = label
    for i, one in enumerate(alone):
        key = tuple(one["input_ids"][0].tolist())
        padded = next(k for k in masks if k[:len(key)] == key and not any(k[len(key):]))
        assert torch.equal(masks[padded][:len(key)], one["labels"][0]), i
    effects = ablation_effects(model, texts, heads=[(0, 1), (1, 3)], modes=("zero",))
    want, count = 0.0, 0
    for one in alone:
        n = int((one["labels"] != -100).sum())
        if n == 0:  # a short text may have no token masked (HF's loss would be 0 / 0)
            continue
        with torch.no_grad():
            out = model.model(input_ids=one["input_ids"], labels=one["labels"])
        want, count = want + float(out.loss) * n, count + n
    assert effects.tokens == count and effects.intact == pytest.approx(want / count, rel=1e-5)


def test_the_ablation_estimate_goes_through_a_batch_in_parts_that_fit_its_budget(smollm2, monkeypatch):
    """A backward pass holds its whole batch's activations (SmolLM2: ~0.86 GB a text of 500 tokens),
    so the estimate splits a batch to fit its budget: the first text of a padded length alone,
    its peak measured, then as many texts a pass as the budget holds — with the same gradients as
    the batch whole. Without a budget (free memory unknown) a batch is one pass, as before."""
    from multihead.analysis.interventions import ablation

    texts = ["The cat sat on the mat because it was tired of the dog.",
             "The dog sat on the rug because it was tired of the cat.",
             "A bird sat on the roof because it was tired of the wind.",
             "The man sat on the bench because he was tired of the walk.",
             "The girl sat on the step because she was tired of the rain."]
    passes: list[int] = []
    run = ablation._run
    monkeypatch.setattr(ablation, "_run", lambda model, batch: (passes.append(len(batch["input_ids"])),
                                                                run(model, batch))[1])
    monkeypatch.setattr(ablation, "available_memory", lambda device: None)
    whole = ablation.attribution_effects(smollm2, texts)
    assert passes == [5, 5]  # one batch, one pass for each mode (the heads' means: the base model alone)
    passes.clear()
    measured = []
    measure = ablation._measured_pass
    monkeypatch.setattr(ablation, "_measured_pass", lambda device, go, part: measured.append(measure(device, go, part))
                        or measured[-1])
    alone = ablation.attribution_effects(smollm2, texts, budget=1)  # less than any text: one text a pass
    assert passes == [1] * 10 and len(measured) == 1 and measured[0] > 10 * 2**20  # measured once, for both
    passes.clear()
    pairs = ablation.attribution_effects(smollm2, texts, budget=2 * measured[0] + measured[0] // 2)
    assert passes == [1, 2, 2, 2, 2, 1]  # zero: 1 measured, then 2 + 2; mean: 2 + 2 + 1
    passes.clear()
    # by default: half the free memory (on a CPU at most ablation.GRADIENT_BYTES)
    monkeypatch.setattr(ablation, "available_memory", lambda device: 5 * measured[0])
    default = ablation.attribution_effects(smollm2, texts)
    assert passes == [1, 2, 2, 2, 2, 1]
    for got in (alone, pairs, default):  # within float32's slack: sums in other orders on other batches
        for mode, want in whole.items():
            torch.testing.assert_close(got[mode], want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def test_the_ablation_estimate_measures_its_longest_text(smollm2, monkeypatch):
    """The budget's measure is the pass of the longest text (every one of its batch's padded positions
    real: a shorter text's output layer reads only its real rows, and would be measured short), once
    for all batches; shorter batches are scaled from it."""
    from multihead.analysis.interventions import ablation

    texts = ["Yes.", "The cat sat.",
             "The dog sat on the rug because it was tired of the cat and the rain and the wind.", "A bird flew.",
             "Long ago, in a land far away, there lived a king who had three daughters and a dragon."]
    parts = []
    measure = ablation._measured_pass
    monkeypatch.setattr(ablation, "_measured_pass", lambda device, go, part: parts.append(part)
                        or measure(device, go, part))
    ablation.attribution_effects(smollm2, texts, batch_size=2, budget=1 << 40)
    (part,) = parts  # once
    mask = part["attention_mask"]
    # the longest batch of two or more texts (a lone text runs whole, there is nothing to split)
    T = max(b["input_ids"].shape[1] for b in ablation._batches(smollm2, texts, 2) if len(b["input_ids"]) > 1)
    assert mask.shape == (1, T) and bool(mask.all())
