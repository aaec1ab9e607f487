"""Compare two report.json files metric by metric: the before/after check of a redesign.

``python tools/compare_reports.py BEFORE AFTER [--tolerance 1e-6]`` (each a report.json or the
report folder holding it) prints the worst absolute
difference per metric (and of the redundancy's matrices) and every label, flag, evidence mark, row
count or cluster that differs; exit 1 when any does.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def load(path: str) -> dict:
    found = Path(path) / "report.json" if Path(path).is_dir() else Path(path)
    data = json.loads(found.read_text(encoding="utf-8"))
    sections = data.get("sections", data)  # schema 2 nests the sections; schema 1 had them at the top
    marks = {(e["layer"], e["head"]): e["mark"] for e in (sections.get("evidence") or {}).get("heads", [])}
    heads = {(h["layer"], h["head"]): h for h in data["heads"]}
    redundancy = sections.get("redundancy") or {}
    return {"heads": heads, "marks": marks, "redundancy": redundancy}


def compare(before: dict, after: dict, tolerance: float) -> tuple[dict[str, float], list[str]]:
    worst: dict[str, float] = {}
    problems: list[str] = []
    if set(before["heads"]) != set(after["heads"]):
        problems.append("the reports list different heads")
        return worst, problems
    for cell, a in before["heads"].items():
        b = after["heads"][cell]
        name = f"L{cell[0]}.H{cell[1]}"
        if a["label"] != b["label"]:
            problems.append(f"{name}: label {a['label']} -> {b['label']}")
        if sorted(a["flags"]) != sorted(b["flags"]):
            problems.append(f"{name}: flags {a['flags']} -> {b['flags']}")
        if set(a["metrics"]) != set(b["metrics"]):
            problems.append(f"{name}: metrics {sorted(set(a['metrics']) ^ set(b['metrics']))} only in one report")
        for metric, x in a["metrics"].items():
            y = b["metrics"].get(metric)
            if (x is None) != (y is None):
                problems.append(f"{name} {metric}: {x} -> {y}")
                continue
            if x is None:
                continue
            diff = abs(x - y)
            worst[metric] = max(worst.get(metric, 0.0), diff)
            if diff > tolerance and not math.isclose(x, y, rel_tol=tolerance):
                problems.append(f"{name} {metric}: {x} -> {y} (|diff| {diff:.2e})")
    # the redundancy's head-by-head matrices (JS distance over the sampled rows, output cosine) and clusters
    for matrix in ("js_distance", "cosine"):
        a, b = before["redundancy"].get(matrix), after["redundancy"].get(matrix)
        if (a is None) != (b is None):
            problems.append(f"redundancy {matrix}: in one report only")
        elif a is not None:
            diffs = [abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True)
                     if x is not None and y is not None]
            worst[f"redundancy {matrix}"] = max(diffs, default=0.0)
            if worst[f"redundancy {matrix}"] > max(tolerance, 1e-4):  # the JSON keeps 4 digits of them
                problems.append(f"redundancy {matrix}: |diff| up to {worst[f'redundancy {matrix}']:.2e}")
    for key in ("rows_js", "clusters_js"):
        if before["redundancy"].get(key) != after["redundancy"].get(key):
            problems.append(f"redundancy {key}: {str(before['redundancy'].get(key))[:60]} -> "
                            f"{str(after['redundancy'].get(key))[:60]}")
    if before["marks"] != after["marks"]:
        changed = sorted(set(before["marks"].items()) ^ set(after["marks"].items()))
        problems.append(f"evidence marks differ: {changed[:10]}")
    return worst, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--tolerance", type=float, default=1e-6)
    args = parser.parse_args()
    worst, problems = compare(load(args.before), load(args.after), args.tolerance)
    for metric, diff in sorted(worst.items()):
        print(f"{metric:24s} worst |diff| {diff:.2e}")
    for line in problems:
        print("DIFF " + line)
    print(f"{len(problems)} differences beyond {args.tolerance:g}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
