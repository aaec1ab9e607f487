"""The terminal text of every command: what ``multihead analyze``, ``patch``, ``compare`` print (a renderer).

Each function takes the data a command produced — a :class:`~multihead.Report`, a
:class:`~multihead.analysis.interventions.patching.Patching`, a
:class:`~multihead.analysis.compare.Comparison` — and returns the lines to print; labels, marks and
thresholds come from :mod:`multihead.analysis.labels`, as in every other view.
"""

from __future__ import annotations

from collections import Counter
from statistics import median

from ..analysis.compare import ALIVE_SHARE, DEAD_SHARE, Comparison, dead_heads, measured_heads, pair_name
from ..analysis.interventions.patching import Patching
from ..analysis.labels import FLAG_RULES, LABEL_RULES, LONG_RANGE_HEAD, MARKS, RETRIEVAL_HEAD, SINK_HEAD, WINDOW_KEPT
from ..analysis.report import Report
from ..analysis.sections import WhatIf
from ..analysis.stats.bootstrap import MIN_GROUPS, RESAMPLES
from ..progress import counted

__all__ = ["analyze_text", "comparison_text", "patching_table", "patching_text", "prune_text", "what_if_text"]


def analyze_text(report: Report, *, model_name: str | None = None, files: list | None = None) -> str:
    """What ``multihead analyze`` prints: the shape, the label map, then each section's summary
    (and the files written, when given)."""
    name = model_name or report.model
    shape = f"{report.num_layers} layers x {report.num_heads} heads" + (" (causal)" if report.causal else "")
    if report.stacks:
        shape = "; ".join(f"{r.stack} {r.num_layers} x {r.num_heads}" for r in (report, *report.stacks.values()))
    ran = f"; {report.placement}" if report.placement else ""  # the dtype and device(s) it ran in: "bfloat16 on cpu"
    if report.sections.images is not None:
        parts = [f"{name}: {report.num_layers} layers x {report.num_heads} heads; {report.sections.images.count} "
                 f"images, {report.tokens} patch rows{ran}\n", report.label_map()]
    else:
        # texts, not "sentences": a --document is one text of thousands of tokens
        size = f"{counted(report.sentences, 'text')}, {counted(report.tokens, 'token')}"
        parts = [f"{name}: {shape}; {size}{ran}\n", report.label_map()]
        if report.sections.what_if is not None:
            parts.append("\n" + what_if_text(report.sections.what_if))
        parts += [text for text in (_labels(report), _flags_and_redundancy(report), _probes(report), _ablation(report),
                                    _evidence(report), _long_context(report)) if text]
    if files:
        parts.append(f"\nwrote {', '.join(str(p) for p in files[:-1])} and {files[-1]}")
    return "\n".join(parts)


#: the metric each pattern flag is about (shown with the flag)
_FLAG_METRIC = {flag: key for flag, key, _ in FLAG_RULES}


def _flag_values(r) -> str:
    return ", ".join(f"{flag} ({_FLAG_METRIC.get(flag, flag)} {r.metrics.get(_FLAG_METRIC.get(flag, ''), 0):.2f})"
                     for flag in r.flags)


def _labels(report: Report) -> str:
    """How many heads have each label, the stability of the labels, and the sink trait."""
    if not report.heads:
        return ""
    counts = Counter(r.label for r in report.heads)
    lines = ["\nLabels (heads per label): " + ", ".join(f"{label} {n}" for label, n in counts.most_common())]
    roles = _roles(report)
    if roles:
        lines.append(roles)
    traits = Counter(t for r in report.heads for t in r.traits)
    if traits:
        lines.append("Traits beside the label: " + ", ".join(f"{t} {n}" for t, n in traits.most_common()))
    stable = [r.stability for r in report.heads if r.stability is not None]
    if stable:
        shaky = sorted((r for r in report.heads if r.stability is not None and r.stability < 0.8),
                       key=lambda r: r.stability)
        named = ", ".join(f"L{r.layer}.H{r.head} {r.label} {r.stability:.0%}" for r in shaky[:6])
        lines.append(f"Label stability (share of {RESAMPLES} corpora resampled from the texts that give the same "
                     f"label): median {median(stable):.0%}; {len(shaky)} heads below 80%" + (f": {named}" if named
                                                                                           else ""))
    elif report.sentences < MIN_GROUPS:
        lines.append(f"Label stability and intervals over texts: not measured, the corpus is "
                     f"{counted(report.sentences, 'text')} (the bootstrap resamples whole texts: give two or more)")
    return "\n".join(lines)


#: labels whose heads the terminal lists one by one with their values (the others are counted)
_LISTED = ("induction", "previous", "next", "self", "coreference", "syntactic")
#: the corpus metric a label's value is (its interval is shown beside it)
_DEFINING = {label: key for label, key, _ in LABEL_RULES}


def _roles(report: Report) -> str:
    """Every head with a role label, with the value that defines it, its mark and traits."""
    marks = report.marks()
    by_label: dict[str, list] = {}
    for r in report.heads:
        if r.label.split(":")[0] in _LISTED:
            by_label.setdefault(r.label, []).append(r)
    if not by_label:
        return ""
    lines = ["Heads with a role (the label's defining value [its 95% interval over the texts]; ✓ / ~ tested by "
             "ablation; how stable the label is when below 100%):"]
    for label, rows in sorted(by_label.items(), key=lambda kv: -len(kv[1])):
        rows = sorted(rows, key=lambda r: -(r.value if r.value is not None and r.value == r.value else 0))

        def one(r) -> str:
            value = "" if r.value is None or r.value != r.value else f" {r.value:.2f}"
            band = r.intervals.get(_DEFINING.get(r.label.split(":")[0], ""))
            if value and band:  # the bootstrap interval of the metric the label reads
                value += f" [{band[0]:.2f}, {band[1]:.2f}]"
            trait = f" (+{'/'.join(r.traits)})" if r.traits else ""
            shaky = f" (stable {r.stability:.0%})" if r.stability is not None and r.stability < 0.995 else ""
            return f"L{r.layer}.H{r.head}{value}{MARKS.get(marks.get((r.layer, r.head), ''), '')}{trait}{shaky}"

        lines.append(f"  {label}: " + ", ".join(one(r) for r in rows[:8]) + (f" … ({len(rows)})" if len(rows) > 8
                                                                             else ""))
    return "\n".join(lines)


def _flags_and_redundancy(report: Report) -> str:
    flagged = report.flagged()
    ablation = report.sections.ablation
    unit = (ablation.unit or "") if ablation is not None else ""
    ablated = ablation is not None and not ablation.skipped
    lines = [f"\nDegenerate heads ({len(flagged)}: attention input-independent and removing the head changes "
             f"nothing):" if flagged else "\nNo degenerate heads (input-independent attention whose removal changes "
                                          "nothing)." if ablated else
             "\nDegenerate heads (input-independent attention whose removal changes nothing): not tested, no head "
             "was ablated."]
    for r in flagged:
        effect = r.metrics.get("zero_ablation", float("nan"))
        band = r.intervals.get("zero_ablation")
        band = f" [{band[0]:+.4f}, {band[1]:+.4f}]" if band else ""
        lines.append(f"  L{r.layer}.H{r.head}: {_flag_values(r)}; zero-ablation {effect:+.4f} {unit}{band}")
    mattering = [r for r in report.heads if r.flags and r.degenerate is False]
    if mattering:
        shown = ", ".join(f"L{r.layer}.H{r.head} {r.metrics.get('zero_ablation', 0):+.4f}" for r in mattering[:6])
        lines.append(f"  not degenerate though input-independent, removing them matters ({len(mattering)}): {shown}"
                     + (" …" if len(mattering) > 6 else ""))
    untested = report.untested()
    if untested:
        shown = ", ".join(f"L{r.layer}.H{r.head} {_flag_values(r)}" for r in untested[:6])
        # the way to test them, where there is one: a text past ablation's length has none (said below)
        ablation = report.sections.ablation
        how = "the ablation was skipped, below" if ablation is not None and ablation.skipped else \
            "--ablation N tests them"
        lines.append(f"  input-independent attention, not tested by ablation ({len(untested)}; {how}): {shown}"
                     + (" …" if len(untested) > 6 else ""))
    red = report.redundancy
    if red is not None and red.pairs_js:
        rows = ""  # what the averages rest on (a report from before rows_cosine was kept: the JS's alone)
        if red.rows_js and red.rows_cosine == red.rows_js:
            rows = f"; over {counted(red.rows_js, 'query token')}"
        elif red.rows_js:
            rows = f"; JS over {counted(red.rows_js, 'query token')}" + (
                f", cosine over {red.rows_cosine:,}" if red.rows_cosine else "")
        lines.append("\nMost redundant head pairs (Jensen-Shannon distance of their attention, 0 = identical; "
                     f"cosine of their outputs after W^O; two sink heads only when their outputs are alike too{rows}):")
        for a, b, js in red.pairs_js[:5]:
            lines.append(f"  L{a[0]}.H{a[1]} ~ L{b[0]}.H{b[1]}: JS {js:.3f}, cosine "
                         f"{red.cosine_of(a, b, report.num_heads):.2f}")
        groups = red.clusters_js or []
        if groups:
            def names(group: list) -> str:
                heads = " ".join(f"L{x[0]}.H{x[1]}" for x in group[:8])
                return heads + (f" … ({len(group)} heads)" if len(group) > 8 else "")

            shown = "; ".join(names(g) for g in groups[:3])
            lines.append(f"  {len(groups)} clusters (JS <= {red.cluster_threshold}), largest first: {shown}")
    return "\n".join(lines)


def _probes(report: Report) -> str:
    lines = []
    by_metric = {}
    for key in ("induction", "coreference"):
        if report.heads and key in report.heads[0].metrics:
            by_metric[key] = sorted(report.heads, key=lambda r, k=key: -(r.metrics[k] or 0))[:3]
    if "induction" in by_metric:
        top = ", ".join(f"L{r.layer}.H{r.head} {r.metrics['induction']:.2f}" for r in by_metric["induction"])
        lines.append(f"\nInduction (attention to the token after the earlier copy, repeated random tokens): {top}")
    coref = report.sections.coreference
    if "coreference" in by_metric and coref is not None:
        skipped = coref.skipped_unknown_tokens
        note = f", {skipped} skipped: pronoun or antecedent unknown to the tokenizer" if skipped else ""
        top = ", ".join(f"L{r.layer}.H{r.head} {r.metrics['coreference']:.2f}" for r in by_metric["coreference"])
        examples = counted(coref.examples, "example")
        lines.append(f"Coreference (pronoun -> antecedent among candidates, {examples}{note}): {top}; "
                     f"nearest-mention baseline {coref.baseline_nearest:.2f}")
    syntax = report.sections.syntax
    if syntax:
        rows = [(rel, d) for rel, d in syntax.relations.items() if d.count >= syntax.min_count and d.beats()]
        rows = sorted(rows, key=lambda kv: kv[1].baseline - kv[1].best["accuracy"])[:8]
        unread = (f"{counted(syntax.not_parsed, 'text')} not parsed: not in Latin script (spaCy's en_core_web_sm "
                  "reads English)")
        if syntax.not_parsed and not syntax.relations:
            lines.append(f"Syntax: not scored; {unread}")
        else:
            if syntax.not_parsed:
                lines.append(f"Syntax: {unread}")
            if rows:
                lines.append("Syntax (dependent -> governor; rel> is governor -> dependent), the relations whose best "
                             "head beats the best fixed offset by more than the sampling interval (95%):")
            else:
                lines.append("Syntax: no relation's best head beats the best fixed offset by more than the sampling "
                             "interval (95%)")
        for rel, d in rows:
            b = d.best
            lines.append(f"  {rel:10s} n={d.count:<5d} L{b['layer']}.H{b['head']} {b['accuracy']:.2f}  "
                         f"baseline {d.baseline:.2f} (offset {d.baseline_offset:+d}), margin needed "
                         f"{d.margin_needed():.2f}")
    return "\n".join(lines)


def _ablation(report: Report) -> str:
    """The heads whose removal changes the model's own objective most."""
    section = report.sections.ablation
    if section is None or not report.heads:
        return ""
    if section.skipped:
        return f"\nAblation skipped: {section.skipped}."
    intact = "" if section.objective.startswith("1 - cosine") else f"; intact {section.intact:.4f}"
    how = ""
    if section.method == "attribution":
        how = (f"; exact for {len(section.exact or [])} heads (tested labels, input-independent attention), "
               f"estimated by attribution patching (a first-order gradient estimate) for the others: * marks exact")
    exact = {tuple(c) for c in section.exact or []}
    lines = [f"\nAblation ({section.objective}, {counted(section.texts, 'text')}{intact}{how}), "
             f"the heads whose removal changes it most (in {section.unit or 'the objective'}):"]
    for key in section.modes:
        heads = sorted(report.heads, key=lambda r, k=key: -abs(r.metrics.get(k) or 0))[:6]

        def shown(r, key=key) -> str:
            star = "*" if section.method == "attribution" and (r.layer, r.head) in exact else ""
            low, high = r.intervals.get(key, (None, None))
            band = f" [{low:+.4f}, {high:+.4f}]" if low is not None else ""
            return f"L{r.layer}.H{r.head}{star} {r.metrics[key]:+.4f}{band}"

        lines.append(f"  {key}: " + ", ".join(shown(r) for r in heads))
    return "\n".join(lines)


def _evidence(report: Report) -> str:
    """The labels tested by ablation, confirmed or attention-only, with the measured values."""
    section = report.sections.evidence
    if section is None or not section.heads:
        return ""
    lines = [f"\nLabels tested by ablation ({MARKS['confirmed']} confirmed: the behaviour needs the head; "
             f"{MARKS['attention-only']} attention-only):"]
    for label in sorted({e.label for e in section.heads}):
        rows = [e for e in section.heads if e.label == label]

        def cell(e) -> str:
            spread = "" if e.baseline_mean is None else \
                f" vs {e.baseline_heads} random heads {e.baseline_mean:+.4f} ± {e.baseline_sd:.4f}"
            return f"L{e.layer}.H{e.head} {MARKS[e.mark]} {e.value:+.4f} (needs > {e.threshold:+.4f}{spread})"

        unit = f" ({rows[0].unit})" if rows[0].unit else ""
        lines.append(f"  {label}{unit}: " + ", ".join(cell(e) for e in rows))
    return "\n".join(lines)


def _long_context(report: Report) -> str:
    """The long-context heads: sinks, retrieval, long-range, windowable."""
    section = report.sections.long_context
    if section is None or not report.heads:
        return ""

    def top(metric: str, n: int = 6, floor: float = 0.0) -> str:
        heads = sorted((r for r in report.heads if (r.metrics.get(metric) or 0) > floor),
                       key=lambda r: -(r.metrics[metric] or 0))[:n]
        return ", ".join(f"L{r.layer}.H{r.head} {r.metrics[metric]:.2f}" for r in heads) or "none"

    sinks = [r for r in report.heads if (r.metrics.get("sink_first") or 0) >= SINK_HEAD]
    kept = [r for r in report.heads
            if (r.metrics.get("window_256") or 0) + (r.metrics.get("sink_first4") or 0) >= WINDOW_KEPT]
    how = f"streamed in chunks of {section.chunk} rows" if section.chunk else "streamed where a layer's map passes " \
        f"{(section.budget_bytes or 0) >> 20} MiB"
    lines = [f"\nLong context ({section.longest_tokens:,} tokens, {how}):",
             f"  attention sinks (>= {SINK_HEAD:.0%} on the first token): {len(sinks)} of {len(report.heads)} heads; "
             f"most: {top('sink_first')}"]
    probe = report.sections.retrieval
    if probe is not None and not probe.copy_steps:  # every head's score is 0 of 0 copies: unmeasured, not "none"
        lines.append(f"  retrieval heads (copy a needle from far back): not measured, the model copied the needle "
                     f"on none of the probe's {probe.steps} steps")
    elif "retrieval" in report.heads[0].metrics:
        lines.append(f"  retrieval heads (copy a needle from far back): {top('retrieval', floor=RETRIEVAL_HEAD)}")
    lines.append(f"  long-range heads (mass beyond 1,024 tokens, the first 4 aside): "
                 f"{top('long_1024_past_sinks', floor=LONG_RANGE_HEAD)}")
    lines.append(f"  heads a window of ±256 with 4 sinks would keep >= {WINDOW_KEPT:.0%} of: {len(kept)} of "
                 f"{len(report.heads)}")
    return "\n".join(lines)


def what_if_text(change: WhatIf) -> str:
    """The what-if section as a table: the loss with every layer, and with each layer alone, windowed."""
    every = change.loss_all_layers
    lines = [f"What if the model attended with {change.mask}? Mean next-token loss over {change.tokens} tokens "
             f"(nats): intact {change.loss:.4f}, every layer {every:.4f} ({_change(change.delta_all_layers)})",
             "layer alone | loss   | change"]
    lines += [f"{layer:11d} | {change.loss + d:.4f} | {_change(d)}" for layer, d in enumerate(change.delta_per_layer)]
    return "\n".join(lines)


def _change(value: float) -> str:
    """A change to 4 places, signed; one that rounds to nothing is +0.0000, never -0.0000."""
    return f"{round(value, 4) + 0.0:+.4f}"


def patching_text(result: Patching, model: str, answer: str, wrong: str) -> str:
    """What ``multihead patch`` prints: the texts, the logit differences, the head map, the top DLA."""
    lines = [f"{model}: clean {'|'.join(result.tokens)}; corrupt {'|'.join(result.corrupt_tokens)}",
             f"logit({answer!r}) - logit({wrong!r}): clean {result.clean_diff:+.4f}, "
             f"corrupt {result.corrupt_diff:+.4f} (gap {result.gap:+.4f})\n", patching_table(result)]
    if result.small_gap() is not None:
        lines.append(f"note: {result.small_gap()}")
    if result.direct is not None:
        # by size, either sign: a head pushing hard toward the wrong answer matters as much (once only the positive)
        top = sorted(((float(result.direct[layer, h]), layer, h) for layer in range(result.direct.shape[0])
                      for h in range(result.direct.shape[1])), key=lambda x: -abs(x[0]))[:5]
        lines.append("direct logit attribution (clean run), largest in size: " + ", ".join(
            f"L{layer}.H{h} {v:+.3f}" for v, layer, h in top))
    return "\n".join(lines)


def patching_table(result: Patching) -> str:
    """The layer x head map of restored shares (or of the change in logits when the runs leave no
    gap), with the five heads that restore most."""
    why = result.no_share()
    if why is None:
        values, what = result.restored, f"share of the clean-vs-corrupt logit difference restored {result.how()}"
    else:
        values, what = result.change, f"change of the logit difference {result.how()}; no shares: {why}"
    L, H = values.shape
    noise = result.within_rounding()
    lines = [what]
    if bool((noise & (values.abs() >= 0.0005)).any()):  # a half dtype's logits: say what "." hides beside zeros
        lines.append(f"(\".\": {result.rounding_words()})")
    elif bool((values.abs() < 0.0005).any()):
        lines.append('(".": under ±0.0005)')
    lines.append("layer | " + " ".join(f"h{h:<5d}" for h in range(H)))
    for layer in range(L):
        lines.append(f"{layer:5d} | " + " ".join(
            f"{float(v):+.3f}" if abs(float(v)) >= 0.0005 and not quiet else "   .  "
            for v, quiet in zip(values[layer], noise[layer], strict=True)))
    if what.startswith("share"):
        lines.append(result.top_words(5))
    return "\n".join(lines)


def comparison_text(c: Comparison, deltas: int = 10) -> str:
    """What ``multihead compare`` prints."""
    ran_a, ran_b = (f", {p}" if p else "" for p in c.placements())
    lines = [f"A: {c.a_name} ({c.a.model}, {c.a.num_layers} x {c.a.num_heads}{ran_a})",
             f"B: {c.b_name} ({c.b.model}, {c.b.num_layers} x {c.b.num_heads}{ran_b})",
             f"heads matched by {c.matching}: {len(c.pairs)} pairs"
             + (f"; unmatched: {len(c.unmatched_a)} of A, {len(c.unmatched_b)} of B"
                if c.unmatched_a or c.unmatched_b else "")]
    lines += [f"warning: {w}" for w in c.warnings]
    changes = c.label_changes()
    lines.append(f"\nlabels changed: {len(changes)} of {len(c.pairs)} heads")
    for ca, cb, la, lb in changes[:30]:
        lines.append(f"  {pair_name(ca, cb)}: {la} -> {lb}")
    if len(changes) > 30:
        lines.append(f"  ... and {len(changes) - 30} more (compare.json)")
    reordered = c.reordered()
    if reordered:
        lines.append("labels reordered only (the same parts, listed by strength: near-equal ones swap): "
                     + ", ".join(f"{pair_name(ca, cb)} {la} -> {lb}" for ca, cb, la, lb in reordered[:10])
                     + (", …" if len(reordered) > 10 else ""))
    if dead_heads(c.a) is None or dead_heads(c.b) is None:
        unmeasured = [name for name, r in ((c.a_name, c.a), (c.b_name, c.b)) if measured_heads(r) == set()]
        lines.append(f"\nheads died / appeared: {', '.join(unmeasured)} measured no head's effect exactly (its "
                     "effects are estimates: analyze --exact-ablation)" if unmeasured else
                     "\nheads died / appeared: needs ablation effects in both reports (analyze --ablation N)")
    else:
        lines.append(f"\nheads died (zeroing them changed the objective by more than {ALIVE_SHARE:.0%} of A's largest "
                     f"effect, its interval clear of zero, and by at most {DEAD_SHARE:.0%} of B's): "
                     f"{', '.join(pair_name(ca, cb) for ca, cb in c.died()) or 'none'}")
        shown = ", ".join(pair_name(ca, cb) for ca, cb in c.appeared()) or "none"
        lines.append(f"heads appeared (the reverse): {shown}")
    excluded = c.excluded()
    if excluded:
        lines.append("\nnot compared: " + "; ".join(f"{name} ({why})" for name, why in excluded.items()))
    lines.append("\nlargest metric changes (B - A; in units of the metric's spread over A's heads):")
    for d in c.metric_deltas(deltas):
        lines.append(f"  {pair_name(d['a'], d['b'])} {d['metric']}: "
                     f"{d['before']:.4g} -> {d['after']:.4g} ({d['delta']:+.4g}, {d['spread_units']:+.2f})")
    return "\n".join(lines)


def prune_text(job, threshold: float) -> str:
    """What ``multihead prune`` prints (``job``: :class:`multihead.jobs.PruneJob`): the curve's table,
    the largest fraction prunable within ``threshold`` of the unpruned metric, what was written."""
    metric, curve = job.task.metric_name, job.curve
    lines = [f"{job.model.name}, task {job.task.name} ({metric}), {curve.total_heads} heads\n", curve.table()]
    if job.best is None:
        lines.append(f"\nNo step kept {metric} within {threshold:.0%} of the unpruned {curve.baseline:.4f}.")
    else:
        lines.append(f"\nLargest fraction prunable within {threshold:.0%} of the unpruned {metric}: "
                     f"{job.best.fraction_pruned:.2f} ({job.best.heads_pruned} of {curve.total_heads} heads; "
                     f"{job.best.metric:.4f} vs {curve.baseline:.4f})")
    if job.saved is not None:
        lines.append(f"saved the pruned model to {job.saved}")
    lines.append(f"wrote {job.folder / 'curve.json'} and {job.folder / 'curve.png'}")
    return "\n".join(lines)
