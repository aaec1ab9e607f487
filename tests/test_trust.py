"""Labels a researcher can trust: sinks named as such, degenerate only when removing a head changes
nothing, intervals that cover at their stated rate, confirmation above a baseline's spread, causal
syntax scored only where a head can look, and comparisons of what compares."""

import copy
import importlib
import math

import pytest
import torch

import multihead as mh
from conftest import SHARES_SMOLLM2_SAMPLE100, needs_spacy
from multihead.analysis.compare import compare
from multihead.analysis.interventions.evidence import Z, upper_bound
from multihead.analysis.labels import degenerate, describe, flags_for, label_codes, label_for, traits_for
from multihead.analysis.probes.syntax import Parse
from multihead.analysis.report import HeadRecord, Report
from multihead.analysis.sections import Ablation, Sections
from multihead.analysis.stats.bootstrap import intervals
from multihead.analysis.stats.heads import METRICS, HeadStatistics
from multihead.analysis.stats.syntax import _align
from multihead.render.text import comparison_text

BASE = {m: 0.0 for m in METRICS} | {"entropy_norm": 0.3, "local": 0.3}


def test_a_decoders_first_token_is_a_sink_an_encoders_is_special():
    stuck = BASE | {"cls": 0.93}
    assert label_for(stuck, causal=True) == "sink"
    assert label_for(stuck, causal=False) == "special-token"
    assert describe("sink", stuck) == "sink 0.93"
    assert flags_for(stuck, "sink") == ["stuck-on-first"]


def test_an_input_dependent_role_keeps_its_label_with_the_sink_as_a_trait():
    induction = BASE | {"cls": 0.92, "induction": 0.88}
    label = label_for(induction, causal=True)
    assert label == "induction" and traits_for(label, induction, causal=True) == ["sink"]
    assert flags_for(induction, label) == []  # never a degenerate candidate


def test_mixed_becomes_its_two_largest_components_when_they_hold_most_of_it():
    two = BASE | {"previous_token": 0.41, "cls": 0.33}
    assert label_for(two, causal=True) == "previous+sink"
    assert describe("previous+sink", two) == "previous 0.41 + sink 0.33"
    assert label_codes(["previous+sink"])["previous+sink"] == "PRV+SNK"
    spread = BASE | {"previous_token": 0.2, "cls": 0.2}
    assert label_for(spread, causal=True) == "mixed"


def test_degenerate_needs_a_flag_and_an_effect_within_the_noise():
    assert degenerate(["stuck-on-first"], 0.0004, (-0.003, 0.004), largest=0.4) is True
    assert degenerate(["stuck-on-first"], 0.08, (0.05, 0.12), largest=0.4) is False  # it matters
    assert degenerate(["stuck-on-first"], 0.002, (0.001, 0.003), largest=0.4) is True  # under 1 % of the largest
    assert degenerate([], 0.0, (0.0, 0.0), largest=0.4) is False
    assert degenerate(["uniform"], math.nan, None, largest=0.4) is None  # not measured: not called degenerate


def test_bootstrap_intervals_cover_the_full_corpus_value_at_their_rate(minilm):
    """Each text in its own group over 300 sentences; corpora of 60 texts drawn from them: the
    interval of each corpus holds the 300-text value about 95 % of the time (every head, metric, seed)."""
    from multihead.analysis.pipelines.common import encode_corpus, run_pass, text_batches
    from multihead.data import sample_sentences

    texts = sample_sentences(300)[:300]
    stats = HeadStatistics(minilm.num_layers, minilm.num_heads, groups=len(texts))
    encoded = encode_corpus(minilm, texts)
    run_pass(minilm, text_batches(minilm, encoded, range(len(texts)), 32), [stats], progress=False)
    sums, counts = stats.group_sums, stats.group_counts  # (N, M, L, H), one text each
    assert torch.allclose(sums.sum(0), stats.sums) and torch.allclose(counts.sum(0), stats.counts)
    full = sums.sum(0) / counts.sum(0)  # (M, L, H)
    covered = []
    for seed in range(40):
        draw = torch.randint(len(texts), (60,), generator=torch.Generator().manual_seed(1000 + seed))
        low, high = intervals(sums[draw], counts[draw], seed=seed)
        keep = ~torch.isnan(full) & (high > low)
        covered.append(((low <= full) & (full <= high))[keep].float().mean())
    rate = float(torch.stack(covered).mean())
    assert 0.88 <= rate <= 0.99, rate


def test_confirmation_needs_the_effect_above_the_baselines_spread():
    baseline = [0.05, -0.02, 0.11, 0.0, 0.07, -0.04, 0.03, 0.01]
    mean = sum(baseline) / len(baseline)
    sd = float(torch.tensor(baseline).std())
    assert upper_bound(baseline) == pytest.approx(mean + Z * sd)
    assert upper_bound(baseline, floor=0.5) == 0.5
    assert upper_bound([], floor=0.01) == 0.01


@pytest.mark.slow
@SHARES_SMOLLM2_SAMPLE100
def test_smollm2_induction_heads_are_induction_with_a_sink_and_a_planted_no_op_is_degenerate(smollm2,
                                                                                           smollm2_sample100):
    """On ordinary sentences SmolLM2's induction heads park on the first token: labelled induction
    (sink a trait), never degenerate; a sink head with its output zeroed is degenerate."""
    from multihead.data import sample_sentences

    texts = sample_sentences(40)
    report = smollm2_sample100.report  # 100 sentences, every head ablated exactly on 2 of them
    inductive = [r for r in report.heads if r.label == "induction"]
    assert len(inductive) >= 6
    assert all(not r.degenerate for r in inductive) and any("sink" in r.traits for r in inductive)
    assert {(18, 6), (17, 3)} <= {(r.layer, r.head) for r in inductive}
    assert all(0 <= r.stability <= 1 for r in report.heads)
    sink = next(r for r in report.heads if r.label == "sink" and r.flags and not r.degenerate)
    planted = copy.deepcopy(smollm2.model)
    d = planted.config.hidden_size // planted.config.num_attention_heads
    with torch.no_grad():
        planted.model.layers[sink.layer].self_attn.o_proj.weight[:, sink.head * d:(sink.head + 1) * d] = 0
    again = mh.analyze(mh.hf.wrap(planted, smollm2.tokenizer, name="planted"), texts, coreference=False,
                       ablation=3, redundancy=False, induction=False)  # each flagged head removed exactly on 3 texts
    record = again.head(sink.layer, sink.head)
    assert all(r.degenerate is not None for r in again.heads if r.flags)  # every candidate was measured exactly
    # zero to the last bit with torch 2.13's kernels; 2.6's round the batched ablated copies and the
    # intact run apart by 4.9e-7 nats (measured): no effect either way, far inside the noise
    assert record.degenerate is True and abs(record.metrics["zero_ablation"]) < 1e-5, record
    assert record in again.flagged()


def test_a_causal_head_is_not_scored_on_what_it_cannot_see():
    # "Two cats chase mice and dogs": nummod(Two <- cats), nsubj(cats <- chase), dobj(mice <- chase),
    # cc(and <- dogs), conj(dogs <- cats)
    words = ((0, 3), (4, 8), (9, 14), (15, 19), (20, 23), (24, 28))
    parse = Parse("Two cats chase mice and dogs", words, (1, 2, -1, 2, 5, 1),
                  ("nummod", "nsubj", "root", "dobj", "cc", "conj"))
    offsets = [list(words)]
    both = set(_align([parse], offsets, causal=False).keys)
    causal = set(_align([parse], offsets, causal=True).keys)
    assert both == {"nummod", "nummod>", "nsubj", "nsubj>", "dobj", "dobj>", "cc", "cc>", "conj", "conj>"}
    # a causal head sees earlier words only: a dependent before its governor cannot look up to it
    # (nummod, nsubj, cc), nor a governor down to a later dependent (dobj>, conj>); and the first
    # word is its sink, not a target (nummod>: cats -> Two)
    assert causal == {"nsubj>", "dobj", "cc>", "conj"}


def _report(name: str, causal: bool, objective: str, unit: str, effects: list[float]) -> Report:
    heads = []
    for h, effect in enumerate(effects):
        metrics = BASE | {"next_token": 0.1 * h, "cls": 0.2, "self": 0.1 * h, "zero_ablation": effect,
                          "mean_ablation": effect / 2}
        heads.append(HeadRecord(0, h, "mixed", [], metrics))
    return Report(model=name, causal=causal, num_layers=1, num_heads=len(effects), sentences=3, tokens=30,
                  heads=heads, sections=Sections(ablation=Ablation(objective, 0.0, 3, 30,
                                                                   ["mean_ablation", "zero_ablation"], unit=unit)))


def test_compare_across_objectives_and_architectures_compares_only_what_compares():
    a = _report("minilm", False, "1 - cosine of the mean-pooled last hidden state", "1 - cos", [0.27, 0.01, 0.0])
    b = _report("smollm2", True, "next-token cross-entropy (nats per token)", "nats/token", [33.9, 0.0, 12.0, 0.1])
    c = compare(a, b)
    ranked = {d["metric"] for d in c.metric_deltas()}
    assert not ranked & {"zero_ablation", "mean_ablation", "next_token", "sep", "cls"}, ranked
    assert {"zero_ablation_share", "mean_ablation_share", "self"} <= ranked
    assert set(c.excluded()) == {"zero_ablation", "mean_ablation", "next_token", "sep", "cls"}
    text = comparison_text(c)
    assert "not compared: zero_ablation (ablation effects in different units (1 - cos in A, nats/token in B)" in text
    died = [f"L{ca[0]}.H{ca[1]} ~ L{cb[0]}.H{cb[1]}" for ca, cb in c.died() if ca != cb]
    assert all(name in text for name in died)


def test_a_head_on_cls_with_the_rest_spread_is_cls_plus_broad():
    spread = BASE | {"cls": 0.43, "entropy_norm": 0.6, "punctuation": 0.05}
    assert label_for(spread) == "cls+broad"
    assert describe("cls+broad", spread) == "cls 0.43 + broad (entropy_norm 0.60)"
    assert label_codes(["cls+broad"])["cls+broad"] == "CLS+BRD"


def test_the_syntax_scores_resample_with_the_texts(minilm):
    """Drawing every text once gives the corpus's own syntax scores; the labels' stability reads
    the syntax resampled with the same draws as the metrics."""
    from multihead.analysis.pipelines.common import encode_corpus, run_pass, text_batches
    from multihead.analysis.probes.syntax import parse_with_spacy
    from multihead.analysis.stats.bootstrap import used_groups
    from multihead.analysis.stats.syntax import SyntaxStatistics
    from multihead.data import sample_sentences

    needs_spacy()
    texts = sample_sentences(40)
    heads, syntax = HeadStatistics(6, 12), SyntaxStatistics(6, 12)
    encoded = encode_corpus(minilm, texts, offsets=True)
    batches = text_batches(minilm, encoded, range(len(texts)), 16, parses=parse_with_spacy(texts))
    run_pass(minilm, batches, [heads, syntax], progress=False)
    used = used_groups(heads.group_counts)
    whole = syntax.result(min_count=5)
    again = syntax.resampled(torch.ones(1, int(used.sum()), dtype=torch.float64), used, min_count=5)[0]
    assert set(again.accuracy) == set(whole.accuracy)
    for rel in whole.accuracy:
        assert torch.allclose(again.accuracy[rel], whole.accuracy[rel]) and again.count[rel] == whole.count[rel]
        assert again.baseline[rel] == pytest.approx(whole.baseline[rel])


def test_each_labels_stability_is_label_for_on_every_resample(minilm):
    """A label's stability is the share of resampled corpora on which label_for, given every metric
    and every relation's syntax scores of that resample, gives the head its label — however
    _add_intervals gathers them."""
    from multihead.analysis.labels import SYNTAX_RULE, label_for
    from multihead.analysis.pipelines.analyze import _add_intervals, _records
    from multihead.analysis.pipelines.common import encode_corpus, run_pass, text_batches
    from multihead.analysis.probes.syntax import parse_with_spacy
    from multihead.analysis.stats.bootstrap import resample_weights, used_groups
    from multihead.analysis.stats.syntax import SyntaxStatistics
    from multihead.data import sample_sentences

    needs_spacy()
    texts = sample_sentences(48)
    stats, syntax_stats = HeadStatistics(6, 12), SyntaxStatistics(6, 12)
    encoded = encode_corpus(minilm, texts, offsets=True)
    run_pass(minilm, text_batches(minilm, encoded, range(len(texts)), 16, parses=parse_with_spacy(texts)),
             [stats, syntax_stats], progress=False)
    syntax = syntax_stats.result(min_count=SYNTAX_RULE[0])
    records = _records(minilm, dict(stats.result()), syntax, None)
    assert any(r.label.startswith("syntactic:") for r in records)  # the syntax rule is exercised
    _add_intervals(records, stats, False, syntax, None, syntax_stats)
    used = used_groups(stats.group_counts)
    weights = resample_weights(int(used.sum()))
    values = stats.resampled(weights)
    scores = syntax_stats.resampled(weights, used, SYNTAX_RULE[0])
    for r in records:
        same = 0
        for k in range(weights.shape[0]):
            metrics = {**r.metrics, **{name: float(v[k, r.layer, r.head]) for name, v in values.items()}}
            relations = {rel: (float(acc[r.layer, r.head]), scores[k].baseline[rel], scores[k].count[rel])
                         for rel, acc in scores[k].accuracy.items()}
            same += label_for(metrics, syntax=relations, causal=False) == r.label
        assert r.stability == same / weights.shape[0], (r.layer, r.head, r.label)
    assert len({r.stability for r in records}) > 3  # not all 0 or 1


@pytest.mark.slow
def test_compare_of_minilm_and_smollm2_ranks_no_ablation_across_units(minilm, smollm2):
    texts = ["The cat sat on the mat because it was warm.", "She gave him the book and he read it twice.",
             "Heads look at different words.", "The market fell after the news broke."]
    a = mh.analyze(minilm, texts, coreference=False, ablation=4, redundancy=False)
    b = mh.analyze(smollm2, texts, coreference=False, ablation=4, redundancy=False, induction=False)
    assert (a.sections.ablation.unit, b.sections.ablation.unit) == ("1 - cos", "nats/token")
    c = compare(a, b)
    assert c.matching.startswith("attention profile")
    ranked = [d["metric"] for d in c.metric_deltas()]
    assert "zero_ablation" not in ranked and "mean_ablation" not in ranked
    assert not {"next_token", "sep", "cls"} & set(ranked)
    text = comparison_text(c)
    assert "not compared: zero_ablation (ablation effects in different units" in text
    for ca, cb in c.died():
        assert (f"L{ca[0]}.H{ca[1]} ~ L{cb[0]}.H{cb[1]}" if ca != cb else f"L{ca[0]}.H{ca[1]}") in text


@pytest.mark.slow
def test_the_retrieval_probes_input_is_a_page_view(smollm2):
    from multihead.analysis.pipelines.analyze import evidence_views
    from multihead.analysis.probes.retrieval import NEEDLE, probe_inputs

    ids, first, second = probe_inputs(smollm2.tokenizer)[0]
    assert ids[first:first + NEEDLE] == ids[second:]  # the needle, copied at the end
    (view,) = evidence_views(smollm2, [], None, [], set(), induction=False, retrieval=True)
    assert view.extra["purpose"].startswith(f"retrieval probe: the needle at token {first}")
    assert len(view.tokens) == len(ids) and view.pooled is not None  # a long input: kept pooled


def _tiny_causal_lm(smollm2):
    """A random 2-layer Llama with SmolLM2's tokenizer: the probes' inputs, at little cost."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(smollm2.tokenizer), max_position_embeddings=2048)
    return mh.hf.wrap(LlamaForCausalLM(config).eval(), smollm2.tokenizer, name="tiny-llama")


def test_the_probes_page_views_are_read_in_their_own_passes(smollm2, monkeypatch):
    """The page's views of the induction probe's first sequence and the retrieval probe's first trial
    come from the probes' own passes (InputViews as their reader, given the ids each pass runs), equal
    to a pass of their own, and analyze's page takes them so (no further pass over the probes'
    inputs); a reader that fails leaves the probe's scores as they are and the page to its own pass."""
    from multihead.analysis.pipelines.views import InputViews, token_views
    from multihead.analysis.probes.induction import induction_scores, repeated_sequences
    from multihead.analysis.probes.retrieval import probe_inputs, retrieval_scores

    model = _tiny_causal_lm(smollm2)
    ids, _ = repeated_sequences(model.tokenizer, count=6, length=12, seed=3)
    reader = InputViews(model, keep=(0, 2))
    scores = induction_scores(model, count=6, length=12, seed=3, batch_size=4, reader=reader)  # batches of 4, 2
    assert reader.failed is None
    for got, want in zip(reader.result(), token_views(model, ids[[0, 2]].tolist()), strict=True):
        assert got.tokens == want.tokens and torch.equal(got.maps, want.maps)
    trial = probe_inputs(model.tokenizer, trials=2, haystack=520)[0][0]
    reader = InputViews(model, top_k=5)
    retrieval_scores(model, trials=2, haystack=520, chunk=64, reader=reader)  # a long input, streamed: pooled
    (got,), (want,) = reader.result(), token_views(model, [trial], top_k=5)
    assert got.pooled is not None and got.tokens == want.tokens
    for field in ("index", "values"):  # row by row: the same keys and bytes whatever the chunks
        assert torch.equal(getattr(got.pooled, field), getattr(want.pooled, field)), field
    # the largest weight of each cell within float32's rounding: a CPU's GEMM may sum a score's products in
    # another order for another number of rows (MKL on an Intel Xeon with AMX: 783 of 98,568 cells 4.7e-10 apart)
    torch.testing.assert_close(got.pooled.largest, want.pooled.largest, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(got.pooled.mass, want.pooled.mass)  # summed over chunks of 64 rows or one

    failing = InputViews(model, keep=(5,))  # the first batch holds 4 sequences: there is no sixth
    with pytest.raises(ValueError, match="keeps some of them"):
        induction_scores(model, count=6, length=12, seed=3, batch_size=4, reader=failing)
    failing = InputViews(model)
    read = failing([ids[0].tolist()])
    read(type("Chunk", (), {"weights": torch.zeros(2, 4, 24, 24)})())  # not the batch it was given: kept, not raised
    assert "a batch of 1 sequences of 25 tokens" in str(failing.failed) and failing.result() is None
    monkeypatch.setattr(InputViews, "_read", lambda self, chunk: setattr(self, "failed", RuntimeError("boom")))
    again = induction_scores(model, count=6, length=12, seed=3, batch_size=4, reader=InputViews(model))
    assert all(torch.equal(again[key], scores[key]) for key in scores)
    monkeypatch.undo()

    def no_pass(*args, **kwargs):
        raise AssertionError("a probe's input ran a pass of its own for the page")

    pipeline = importlib.import_module("multihead.analysis.pipelines.analyze")  # the module (its package
    monkeypatch.setattr(pipeline, "token_views", no_pass)  # exports the function of its name)
    monkeypatch.setattr(pipeline, "LONG_CONTEXT_TOKENS", 8)  # the retrieval probe on a short corpus
    report = pipeline.analyze(model, ["The cat sat on the mat. It was happy there."], coreference=False,
                              redundancy=False, parses=None)
    purposes = [v.extra.get("purpose", "") for v in report.views]
    assert any(p.startswith("induction probe") for p in purposes)
    assert any(p.startswith("retrieval probe") for p in purposes)


@pytest.mark.slow
def test_the_probes_scores_have_intervals_over_their_inputs(smollm2):
    """The induction probe's score is the mean of its sequences' scores, and its interval is the
    bootstrap over those sequences (the coreference scores likewise over their examples)."""
    from multihead.analysis.probes.coreference import coreference_scores
    from multihead.analysis.probes.induction import induction_scores

    each: dict = {}
    scores = induction_scores(smollm2, count=8, length=20, per_sequence=each)
    assert each["induction"].shape == (8, smollm2.num_layers, smollm2.num_heads)
    assert torch.allclose(each["induction"].mean(0), scores["induction"])
    low, high = intervals(each["induction"], torch.ones_like(each["induction"]))
    assert bool(((low <= scores["induction"] + 1e-12) & (scores["induction"] <= high + 1e-12)).all())
    found = coreference_scores(smollm2)
    assert torch.allclose(found.per_example["accuracy"].mean(0), found.accuracy)
    assert torch.allclose(found.per_example["mass"].mean(0), found.mass)


def test_a_head_at_the_dead_floor_does_not_die_or_appear_on_rounding():
    """Dead is at most 1 % of the largest effect, alive more than 2 %: a head that moves from 1.1 %
    to 0.9 % (SmolLM2's float32 against float16 report moved 15 such heads across the 1 % line)
    neither died nor appeared; one that falls from 3.4 % to 0.2 % died, one that rises from 0.5 %
    to 2.3 % appeared."""
    unit = ("next-token cross-entropy (nats per token)", "nats/token")
    a = _report("smollm2", True, *unit, [1.0, 0.011, 0.009, 0.034, 0.005, 0.5])
    b = _report("smollm2", True, *unit, [1.0, 0.009, 0.011, 0.002, 0.023, 0.5])
    c = compare(a, b)
    assert c.died() == [((0, 3), (0, 3))] and c.appeared() == [((0, 4), (0, 4))]
    text = comparison_text(c)
    assert "heads died (zeroing them changed the objective by more than 2% of A's largest effect, its interval " \
           "clear of zero, and by at most 1% of B's): L0.H3" in text and "heads appeared (the reverse): L0.H4" in text
