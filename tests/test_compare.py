"""Comparing two reports: the Hungarian matching against brute force, a head gated off in B found
as exactly that, heads of a differently shaped model matched back to where they came from, and
reports of different corpora refused (or compared with a visible warning)."""

import copy
import dataclasses
import itertools
import json
import math
import random

import numpy as np
import pytest
import torch

import multihead as mh
from conftest import run_cli
from multihead.analysis.compare import assignment, compare
from multihead.analysis.report import Report
from multihead.analysis.sections import Sections
from multihead.data import sample_sentences
from multihead.hf.sites import find_sites


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (4, 6), (6, 4), (5, 5), (2, 7)])
def test_assignment_is_a_minimum_cost_matching(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        cost = rng.normal(size=shape)
        cols = assignment(cost)
        n, m = shape
        rows = [i for i in range(n) if cols[i] >= 0]
        assert len(rows) == min(n, m) and len({int(cols[i]) for i in rows}) == len(rows)
        got = sum(cost[i, cols[i]] for i in rows)
        if n <= m:
            best = min(sum(cost[i, p[i]] for i in range(n)) for p in itertools.permutations(range(m), n))
        else:
            best = min(sum(cost[p[j], j] for j in range(m)) for p in itertools.permutations(range(n), m))
        assert got == pytest.approx(best)


def test_assignment_agrees_with_scipy_on_a_large_matrix():
    optimize = pytest.importorskip("scipy.optimize")
    cost = np.random.default_rng(0).random((120, 150))
    rows, cols = optimize.linear_sum_assignment(cost)
    ours = assignment(cost)
    assert cost[np.arange(120), ours].sum() == pytest.approx(cost[rows, cols].sum())


TEXTS = sample_sentences(12)


@pytest.fixture(scope="module")
def reports(minilm):
    gated = dataclasses.replace(minilm, model=copy.deepcopy(minilm.model))
    site = find_sites(gated.model)[5]  # a last-layer head: nothing downstream attends differently
    with torch.no_grad():
        site.o.weight[:, 3 * site.head_dim:4 * site.head_dim] = 0
    a = mh.analyze(minilm, TEXTS, coreference=False, ablation=4)
    b = mh.analyze(gated, TEXTS, coreference=False, ablation=4)
    return a, b


@pytest.mark.slow
def test_a_head_gated_off_in_b_is_exactly_what_changed(reports):
    a, b = reports
    result = compare(a, b)
    assert result.matching == "index" and len(result.pairs) == 72 and not result.warnings
    assert [cb for _, cb in result.died()] == [(5, 3)] and result.appeared() == []
    assert result.label_changes() == []  # every head attends as before
    changed = {d["metric"] for d in result.metric_deltas() if abs(d["delta"]) > 1e-6}
    assert changed <= {"zero_ablation", "mean_ablation"}  # only what removing heads does to the objective
    top = result.metric_deltas(1)[0]
    assert top["a"] == (5, 3) and top["metric"] in ("zero_ablation", "mean_ablation")


@pytest.mark.slow
def test_heads_of_another_shape_are_matched_by_their_attention(reports):
    a, _ = reports
    rng = random.Random(0)
    kept = [a.head(layer, h) for layer in (0, 2, 4) for h in range(12)]
    rng.shuffle(kept)
    heads = [dataclasses.replace(r, layer=n // 8, head=n % 8) for n, r in enumerate(kept[:24])]
    origin = {(r.layer, r.head): (k.layer, k.head) for r, k in zip(heads, kept, strict=False)}
    b = Report(model="other", causal=a.causal, num_layers=3, num_heads=8, sentences=a.sentences, tokens=a.tokens,
               heads=heads, sections=Sections(corpus=a.sections.corpus))
    result = compare(a, b)
    assert result.matching.startswith("attention profile")
    assert {cb: ca for ca, cb, _ in result.pairs} == origin  # identical profiles: found again
    assert len(result.unmatched_a) == 72 - 24 and not result.unmatched_b
    assert any("Hungarian" in w for w in result.warnings)
    from multihead.render.compare import compare_page

    page = compare_page(result)  # the unmatched heads drawn as such, not as labels kept
    assert page.count('<td class="unmatched"') == 72 - 24 and "unmatched (no head of B)" in page


@pytest.mark.slow
def test_reports_of_different_corpora_are_refused_or_warned(minilm, reports, tmp_path, capsys):
    a, _ = reports
    other = mh.analyze(minilm, TEXTS[4:10], coreference=False)
    with pytest.raises(ValueError, match="different corpora"):
        compare(a, other)
    assert "different corpora" in compare(a, other, different_corpora=True).warnings[0]
    a.to_json(tmp_path / "a.json")
    other.to_json(tmp_path / "b.json")
    code, _, stderr = run_cli(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out",
                               str(tmp_path / "out")], capsys)
    assert code == 2 and "different corpora" in stderr and "Traceback" not in stderr
    code, stdout, _ = run_cli(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--different-corpora",
                               "--out", str(tmp_path / "out")], capsys)
    assert code == 0 and "warning: different corpora" in stdout
    page = (tmp_path / "out" / "compare.html").read_text()
    assert 'class="warning"' in page and "different corpora" in page and "<script" not in page
    saved = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert saved["schema"] == "multihead.compare/1" and saved["warnings"]
    code, _, stderr = run_cli(["compare", str(tmp_path / "missing.json"), str(tmp_path / "b.json")], capsys)
    assert code == 2 and "no such file" in stderr


@pytest.mark.slow
def test_compare_reads_report_folders_and_keeps_the_evidence_sections(reports, tmp_path):
    a, b = reports
    for name, report in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        report.to_json(tmp_path / name / "report.json")
    again = Report.from_json(tmp_path / "a" / "report.json")
    assert again.sections.ablation == a.sections.ablation
    assert again.sections.corpus.texts == len(TEXTS)
    result = compare(tmp_path / "a", tmp_path / "b")
    assert [cb for _, cb in result.died()] == [(5, 3)]
    from multihead.render.text import comparison_text

    assert "float32 on cpu" not in comparison_text(result)  # both ran alike: not said
    result.b = dataclasses.replace(result.b, placement="bfloat16 on cpu")  # a half-precision run against it
    head = comparison_text(result).splitlines()[:2]
    assert head[0].endswith("12, float32 on cpu)") and head[1].endswith("12, bfloat16 on cpu)"), head
    from multihead.render.compare import compare_page

    page = compare_page(result)
    assert "(6 × 12, float32 on cpu), B: " in page and "(6 × 12, bfloat16 on cpu);" in page
    assert not result.warnings and result.to_dict()["b"]["placement"] == "bfloat16 on cpu"
    half = tmp_path / "half"  # compared as read from a folder: the precisions apart said, and kept in compare.json
    half.mkdir()
    dataclasses.replace(b, placement="bfloat16 on cpu").to_json(half / "report.json")
    apart = compare(tmp_path / "a", half)
    assert apart.warnings == ["different precisions (float32 on cpu against bfloat16 on cpu): differences include "
                              "the lower one's rounding"]
    saved = apart.to_dict()
    assert (saved["a"]["placement"], saved["b"]["placement"]) == ("float32 on cpu", "bfloat16 on cpu")
    assert "warning: different precisions" in comparison_text(apart)
    assert "Labels changed (0 of 72)</h2><p>None: every matched head keeps its label." in page  # not an empty table


def test_estimated_ablation_effects_are_not_compared_as_measured_ones():
    """A report whose effects are attribution estimates but for a few heads measured exactly: compare
    read the estimates as effects — ranked L0.H6's estimate (-0.22; exact +0.08) as its largest change,
    and on the same weights over other texts found 27 heads "died". Only heads measured in both are
    compared for ablation, deaths and appearances, and a warning says so."""
    from multihead.analysis.report import HeadRecord
    from multihead.analysis.sections import Ablation, Corpus

    def report(effects: list[float], exact: list[tuple[int, int]]) -> Report:
        heads = [HeadRecord(0, h, "broad", [], {"entropy": 1.0, "zero_ablation": e}) for h, e in enumerate(effects)]
        sections = Sections(corpus=Corpus(texts=4, sha256="x" * 64), ablation=Ablation(
            "next-token loss", 3.0, 4, 40, ["zero"], unit="nats/token", method="attribution", exact=exact))
        return Report(model="m", causal=True, num_layers=1, num_heads=4, sentences=4, tokens=40, heads=heads,
                      sections=sections)

    a = report([0.5, 0.3, 0.2, -0.22], exact=[(0, 0), (0, 1)])
    b = report([0.5, 0.001, 0.0, 0.4], exact=[(0, 0), (0, 1), (0, 3)])
    result = compare(a, b)
    assert sum("first-order estimates" in w for w in result.warnings) == 2
    moved = {(d["a"], d["metric"]) for d in result.metric_deltas()}
    assert ((0, 3), "zero_ablation") not in moved and ((0, 2), "zero_ablation") not in moved  # estimated in A
    assert ((0, 1), "zero_ablation") in moved  # measured in both: 0.3 -> 0.001
    # its size in the spread of every head's effect (estimates too): one measured head's spread is none
    assert all(math.isfinite(d["spread_units"]) for d in result.metric_deltas())
    assert result.died() == [((0, 1), (0, 1))]  # not (0, 2): its 0.2 -> 0.0 were estimates
    assert result.appeared() == []


def test_a_label_reordered_is_kept_and_a_head_whose_effect_may_be_zero_never_died():
    """float32 against bfloat16 SmolLM2: "labels changed: 3 of 270", two of them self+sink -> sink+self
    (self 0.457 against sink 0.455: the parts listed by strength swapped on rounding); "died": L23.H1,
    whose effect in A was -0.0075 in [-0.019, +0.003] — removing it may have changed nothing there too."""
    from multihead.analysis.report import HeadRecord
    from multihead.analysis.sections import Ablation, Corpus
    from multihead.render.compare import compare_page
    from multihead.render.text import comparison_text

    def report(labels: list[str], effects: list[float], spans: list[tuple[float, float] | None]) -> Report:
        heads = [HeadRecord(0, h, label, [], {"entropy": 1.0, "zero_ablation": e},
                            intervals={} if span is None else {"zero_ablation": span})
                 for h, (label, e, span) in enumerate(zip(labels, effects, spans, strict=True))]
        sections = Sections(corpus=Corpus(texts=4, sha256="x" * 64), ablation=Ablation(
            "next-token loss", 3.0, 4, 40, ["zero"], unit="nats/token"))
        return Report(model="m", causal=True, num_layers=1, num_heads=4, sentences=4, tokens=40, heads=heads,
                      sections=sections)

    a = report(["self+sink", "previous", "broad", "broad"], [0.5, -0.1, 0.2, 0.3],
               [(0.4, 0.6), (-0.19, 0.03), (0.1, 0.3), None])
    b = report(["sink+self", "mixed", "broad", "broad"], [0.5, 0.001, 0.001, 0.001], [None] * 4)
    result = compare(a, b)
    assert [(ca, la, lb) for ca, _, la, lb in result.label_changes()] == [((0, 1), "previous", "mixed")]
    assert [(ca, la, lb) for ca, _, la, lb in result.reordered()] == [((0, 0), "self+sink", "sink+self")]
    assert result.died() == [((0, 2), (0, 2)), ((0, 3), (0, 3))]  # not L0.H1: its interval holds zero
    text = comparison_text(result)
    assert "labels changed: 1 of 4 heads" in text and "labels reordered only" in text and "L0.H0 self+sink" in text
    page = compare_page(result)
    assert "Labels changed (1 of 4)" in page and "zeroing it changes nothing in B" in page
