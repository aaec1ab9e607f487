"""``heads`` and ``one-vs-many``: how many heads help, and one big head against many small ones.

``heads`` trains every task at a fixed d_model and depth for h ∈ {1, 2, 4, 8, 16, 32}
(d_k = d_model / h, so parameters and FLOPs per step are the same for every h), with several
seeds and the same number of steps and examples per run, and puts the means beside Vaswani et
al. (2017), Table 3 (A).

``one-vs-many`` compares one head of d_model with h heads of d_model / h (the same parameters)
on the same runs, and measures how alike the heads of a layer become as h grows (the analysis
module's Jensen–Shannon distance between attention rows and cosine of residual contributions).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from .common import RunRecord, Setting, mean_std, pick_device, trained_run, welch_t, write_result
from .tasks import ExperimentTask, make_task

__all__ = ["VASWANI_TABLE3_A", "run_heads", "run_one_vs_many", "sweep"]

#: Vaswani et al. 2017, Table 3 row (A) and the base model: h -> (d_k, dev PPL, dev BLEU), EN-DE newstest2013.
VASWANI_TABLE3_A = {1: (512, 5.29, 24.9), 4: (128, 5.00, 25.5), 8: (64, 4.92, 25.8), 16: (32, 4.91, 25.8),
                    32: (16, 5.01, 25.4)}


def sweep(setting: Setting, tasks: dict[str, ExperimentTask], out: Path, device: str = "auto"
          ) -> dict[str, dict[int, list[RunRecord]]]:
    """Every (task, h, seed) run of the setting, trained or loaded from ``out/runs``."""
    dev = pick_device(device)
    return {name: {h: [trained_run(task, setting, h, seed, out / "runs", dev)[0] for seed in range(setting.seeds)]
                   for h in setting.heads} for name, task in tasks.items()}


def _fmt(values: list[float], digits: int = 3) -> str:
    m, s = mean_std(values)
    return "—" if math.isnan(m) else f"{round(m, digits) + 0.0:.{digits}f} ± {s:.{digits}f}"  # never -0.000


def _metric_values(records: list[RunRecord], key: str) -> list[float]:
    return [r.metrics[key] for r in records]


def run_heads(setting: Setting, out: Path, device: str = "auto") -> Path:
    start = time.perf_counter()
    tasks = {name: make_task(name) for name in setting.tasks}
    runs = sweep(setting, tasks, out, device)
    summary: dict[str, dict] = {}
    for name, by_h in runs.items():
        task = tasks[name]
        summary[name] = {"metric": task.metric, "lower_is_better": task.lower_is_better, "by_heads": {
            h: {"d_k": setting.dim // h, "values": _metric_values(rs, task.metric),
                **dict(zip(("mean", "std"), mean_std(_metric_values(rs, task.metric)), strict=True)),
                "accuracy": _metric_values(rs, "accuracy"), "seconds": [r.seconds for r in rs],
                "parameters": rs[0].parameters} for h, rs in by_h.items()}}
        best = (min if task.lower_is_better else max)(by_h, key=lambda h: summary[name]["by_heads"][h]["mean"])
        summary[name]["best_heads"] = best
        sign = -1 if task.lower_is_better else 1
        summary[name]["t_vs_best"] = {h: sign * welch_t(_metric_values(by_h[best], task.metric),
                                                        _metric_values(rs, task.metric))
                                      for h, rs in by_h.items() if h != best}
    md = _heads_markdown(setting, runs, tasks, summary)
    data = {"tasks": summary, "vaswani_table3_a": {h: {"d_k": v[0], "ppl": v[1], "bleu": v[2]}
                                                   for h, v in VASWANI_TABLE3_A.items()},
            "_device": pick_device(device)}
    return write_result(out / "heads", "heads", setting, data, md, {"heads": _heads_figure(setting, summary)},
                        time.perf_counter() - start)


#: Student's t at the two-sided 5 % level for 1-20 degrees of freedom (beyond: 2.09 down to the normal's 1.96).
T_CRITICAL = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23,
              2.20, 2.18, 2.16, 2.14, 2.13, 2.12, 2.11, 2.10, 2.09, 2.09)


def _significance(seeds: int) -> str:
    """What |t| a difference needs at the 5 % level with ``seeds`` runs a point (Welch's degrees of
    freedom at most 2·(seeds − 1), reached when both spreads are equal)."""
    if seeds < 2:
        return "with one seed per point no t can be formed: run --seeds 2 or more"
    df = 2 * (seeds - 1)
    needed = T_CRITICAL[min(df, len(T_CRITICAL)) - 1]
    return (f"with {seeds} seeds per point Welch's t has at most {df} degrees of freedom, so a difference needs "
            f"|t| ≥ {needed:.1f} to be significant at the 5% level (more where the spreads differ)")


def _t(t: float) -> str:
    return "n/a (one seed)" if math.isnan(t) else f"{t:+.1f}"


def _heads_markdown(setting: Setting, runs, tasks, summary) -> str:
    names = list(runs)
    head = "| h | d_k | " + " | ".join(f"{n}: {tasks[n].metric} {'↓' if tasks[n].lower_is_better else '↑'}"
                                       for n in names) + " | Vaswani d_k | Vaswani PPL ↓ | Vaswani BLEU ↑ |"
    fixed = {n: t.layers for n, t in tasks.items() if getattr(t, "layers", setting.layers) != setting.layers}
    depth = f"{setting.layers} layers" + "".join(f" ({n}: {k} layer{'s' if k > 1 else ''}, by design)"
                                                  for n, k in fixed.items())
    lines = [f"d_model = {setting.dim}, {depth}, {setting.seeds} seeds per point (mean ± sample "
             f"std), the same steps × batch for every h: " + ", ".join(f"{n} {setting.steps[n]} steps" for n in names)
             + f"; AdamW, peak lr {setting.lr:g}, warm-up 10% then cosine. Vaswani et al. 2017, Table 3 (A) is "
             "EN→DE translation at d_model = 512 (newstest2013 dev set).", "", head,
             "|" + "---|" * (2 + len(names) + 3)]
    for h in setting.heads:
        cells = [_fmt(summary[n]["by_heads"][h]["values"]) for n in names]
        v = VASWANI_TABLE3_A.get(h)
        vas = [str(v[0]), f"{v[1]:.2f}", f"{v[2]:.1f}"] if v else ["—", "—", "—"]
        lines.append(f"| {h} | {setting.dim // h} | " + " | ".join(cells) + " | " + " | ".join(vas) + " |")
    lines += ["", "Accuracy (↑) of the same runs:", "",
              "| h | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for h in setting.heads:
        lines.append(f"| {h} | " + " | ".join(_fmt(summary[n]["by_heads"][h]["accuracy"]) for n in names) + " |")
    lines += ["", "Best h per task, and Welch's t of the best h against every other (positive: the best is "
              f"better; {_significance(setting.seeds)}):", ""]
    for n in names:
        ts = ", ".join(f"h={h}: {_t(t)}" for h, t in summary[n]["t_vs_best"].items()) or "no other h"
        lines.append(f"- {n}: best h = {summary[n]['best_heads']}; t vs best: {ts}")
    seconds = sum(r.seconds for by_h in runs.values() for rs in by_h.values() for r in rs)
    lines += ["", f"Training time of all {sum(len(rs) for by_h in runs.values() for rs in by_h.values())} runs: "
              f"{seconds / 60:.1f} min (each run's own wall time when it was trained, in `result.json`)."]
    return "\n".join(lines)


def _heads_figure(setting: Setting, summary: dict):
    from ..plotting import new_figure

    names = list(summary)
    fig, axes = new_figure(1, len(names) + 1, figsize=(4 * (len(names) + 1), 3.4))
    for ax, name in zip(axes, names, strict=False):
        hs = list(setting.heads)
        means = [summary[name]["by_heads"][h]["mean"] for h in hs]
        stds = [summary[name]["by_heads"][h]["std"] for h in hs]
        ax.errorbar(hs, means, yerr=stds, marker="o", capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(hs, [str(h) for h in hs])
        ax.set_xlabel("heads h (d_k = d_model / h)")
        ax.set_ylabel(summary[name]["metric"] + (" (lower is better)" if summary[name]["lower_is_better"] else ""))
        ax.set_title(name)
    ax = axes[-1]
    hs = sorted(VASWANI_TABLE3_A)
    ax.plot(hs, [VASWANI_TABLE3_A[h][2] for h in hs], marker="s", color="tab:red")
    ax.set_xscale("log", base=2)
    ax.set_xticks(hs, [str(h) for h in hs])
    ax.set_xlabel("heads h")
    ax.set_ylabel("BLEU")
    ax.set_title("Vaswani et al. Table 3 (A)")
    fig.tight_layout()
    return fig


def run_one_vs_many(setting: Setting, out: Path, device: str = "auto", many: int | None = None) -> Path:
    """``many``: the head count set against one head (default 8, or the largest of the setting's)."""
    start = time.perf_counter()
    many = many or (8 if 8 in setting.heads else max(setting.heads))
    if many not in setting.heads or 1 not in setting.heads or many == 1:
        raise ValueError(f"one-vs-many needs h=1 and h={many} > 1 among the sweep's head counts {setting.heads}")
    tasks = {name: make_task(name) for name in setting.tasks}
    runs = sweep(setting, tasks, out, device)
    comparison, redundancy = {}, {}
    for name, by_h in runs.items():
        task = tasks[name]
        one, lots = _metric_values(by_h[1], task.metric), _metric_values(by_h[many], task.metric)
        sign = -1 if task.lower_is_better else 1
        comparison[name] = {"metric": task.metric, "one": one, "many": lots, "heads": many,
                            "advantage_of_many": sign * (mean_std(lots)[0] - mean_std(one)[0]),
                            "t": sign * welch_t(lots, one)}
        if by_h[1][0].extra.get("per_relation"):
            comparison[name]["per_relation"] = {
                h: {rel: mean_std([r.extra["per_relation"][rel] for r in by_h[h]])[0]
                    for rel in by_h[h][0].extra["per_relation"]} for h in (1, many)}
        redundancy[name] = {h: {key: mean_std([r.redundancy[key] for r in rs]) for key in rs[0].redundancy}
                            for h, rs in by_h.items() if h > 1 and rs[0].redundancy}
    md = _one_vs_many_markdown(setting, runs, comparison, redundancy, many)
    data = {"comparison": comparison, "redundancy": redundancy, "_device": pick_device(device)}
    return write_result(out / "one-vs-many", "one-vs-many", setting, data, md,
                        {"redundancy": _redundancy_figure(redundancy)}, time.perf_counter() - start)


def _one_vs_many_markdown(setting: Setting, runs, comparison, redundancy, many: int) -> str:
    params = {name: by_h[1][0].parameters for name, by_h in runs.items()}
    lines = [f"One head with d_k = {setting.dim} against {many} heads with d_k = {setting.dim // many}: the same "
             f"parameters (W^Q, W^K, W^V, W^O are d_model × d_model either way) and the same training "
             f"({setting.seeds} seeds each).", "",
             f"| task | parameters | metric | 1 head | {many} heads | advantage of {many} heads | Welch t |",
             "|---|---|---|---|---|---|---|"]
    for name, c in comparison.items():
        assert runs[name][many][0].parameters == params[name]
        lines.append(f"| {name} | {params[name]:,} | {c['metric']} | {_fmt(c['one'])} | {_fmt(c['many'])} | "
                     f"{c['advantage_of_many']:+.3f} | {_t(c['t'])} |")
    for name, c in comparison.items():
        if "per_relation" in c:
            rels = list(c["per_relation"][1])
            lines += ["", f"{name}: held-out accuracy of each relation (mean over seeds)", "",
                      "| heads | " + " | ".join(rels) + " |", "|---|" + "---|" * len(rels)]
            for h in (1, many):
                lines.append(f"| {h} | " + " | ".join(f"{c['per_relation'][h][r]:.3f}" for r in rels) + " |")
    lines += ["", "How alike the heads of a layer are, by h (mean ± std over seeds; held-out batches):", "",
              "- `js_mean` / `js_min`: mean / smallest Jensen–Shannon distance between two same-layer heads' "
              "attention rows (0 = identical, 1 = disjoint)",
              "- `cos_mean`: mean cosine between two same-layer heads' contributions to the residual stream",
              "- `near_duplicate`: share of heads with a same-layer partner at JS distance < 0.2", ""]
    for name, by_h in redundancy.items():
        keys = list(next(iter(by_h.values())))
        lines += [f"{name}:", "", "| h | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for h, vals in by_h.items():
            lines.append(f"| {h} | " + " | ".join(f"{vals[k][0]:.3f} ± {vals[k][1]:.3f}" for k in keys) + " |")
        lines.append("")
    return "\n".join(lines)


def _redundancy_figure(redundancy: dict):
    from ..plotting import new_figure

    fig, axes = new_figure(1, 3, figsize=(12, 3.4))
    for key, ax, label in (("js_mean", axes[0], "mean JS distance, same-layer pairs"),
                           ("js_min", axes[1], "smallest JS distance, same-layer pairs"),
                           ("near_duplicate", axes[2], "share of near-duplicate heads (JS < 0.2)")):
        for name, by_h in redundancy.items():
            hs = sorted(by_h)
            ax.errorbar(hs, [by_h[h][key][0] for h in hs], yerr=[by_h[h][key][1] for h in hs], marker="o",
                        capsize=3, label=name)
        hs = sorted({h for by_h in redundancy.values() for h in by_h})
        ax.set_xscale("log", base=2)
        ax.set_xticks(hs, [str(h) for h in hs])  # the head counts themselves, not 2¹…2³
        ax.set_xlabel("heads h")
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig

