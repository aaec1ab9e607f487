"""The numbers do not move: reports written before the redesign of the analysis (issue 25, commit
8d354c5), stored in tests/data/reports, against what the same commands write now — every metric of
every head within 1e-6, and labels, flags and evidence marks identical."""

import gzip
import json
import math
from pathlib import Path

import pytest

from multihead.jobs import analyze_job

STORED = Path(__file__).parent / "data" / "reports"


def _stored(name: str) -> dict:
    return json.loads(gzip.decompress((STORED / f"{name}.json.gz").read_bytes()))


def _differences(before: dict, after: dict) -> list[str]:
    """Every metric beyond 1e-6, every label, flag and evidence mark that is not the same."""
    problems = []
    new = {(h["layer"], h["head"]): h for h in after["heads"]}
    assert len(new) == len(before["heads"])
    for a in before["heads"]:
        b, name = new[(a["layer"], a["head"])], f"L{a['layer']}.H{a['head']}"
        if (a["label"], sorted(a["flags"])) != (b["label"], sorted(b["flags"])):
            problems.append(f"{name}: {a['label']} {a['flags']} -> {b['label']} {b['flags']}")
        if set(a["metrics"]) != set(b["metrics"]):
            problems.append(f"{name}: metrics {sorted(set(a['metrics']) ^ set(b['metrics']))} in one report only")
        for metric, x in a["metrics"].items():
            y = b["metrics"].get(metric)
            if (x is None) != (y is None) or (x is not None and not math.isclose(x, y, rel_tol=0, abs_tol=1e-6)):
                problems.append(f"{name} {metric}: {x} -> {y}")
    marks = [{(e["layer"], e["head"]): e["mark"] for e in (r or {}).get("heads", [])}
             for r in (before["evidence"], after["sections"].get("evidence"))]
    if marks[0] != marks[1]:
        problems.append(f"evidence marks: {sorted(set(marks[0].items()) ^ set(marks[1].items()))}")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize(("name", "options"), [
    ("minilm-demo", {}),  # `multihead analyze`: the demo corpus (304 texts), every default
    ("smollm2-sample100", {"model": "smollm2", "sample": 100, "ablation": 2}),
])
def test_a_report_equals_the_one_written_before_the_redesign(name, options, tmp_path):
    before = _stored(name)
    job = analyze_job(out=str(tmp_path / name), **options)
    after = json.loads((tmp_path / name / "report.json").read_text(encoding="utf-8"))
    assert (after["sentences"], after["tokens"]) == (before["sentences"], before["tokens"])
    assert job.report.sections.evidence is not None and before["evidence"]["heads"]  # marks to compare
    assert _differences(before, after) == []


def test_a_report_of_schema_1_is_read_and_written_back_as_schema_2(tmp_path):
    """The full report.json `multihead analyze` wrote before the redesign (schema 1, its sections
    beside the heads): every section typed, nothing lost on the way to schema 2."""
    from multihead.analysis.report import Report

    path = tmp_path / "report.json"
    old = json.loads(gzip.decompress((STORED / "minilm-demo.schema1.json.gz").read_bytes()))
    path.write_text(json.dumps(old), encoding="utf-8")
    report = Report.from_json(path)
    assert report.sections.evidence.heads and report.sections.syntax.relations["det"].count == old["syntax"][
        "relations"]["det"]["count"]
    assert report.redundancy.pairs_js[0][0] == tuple(old["redundancy"]["pairs_js"][0]["a"])
    again = report.to_dict()
    assert again["schema"] == "multihead.report/2" and again["heads"] == old["heads"]
    for name, section in again["sections"].items():
        assert section == old[name], name  # each section as schema 1 wrote it, now under "sections"
    assert set(again["sections"]) == {k for k in old if k not in ("schema", "model", "causal", "num_layers",
                                                                  "num_heads", "sentences", "tokens", "metrics",
                                                                  "stack", "heads")}
