"""``mh.analyze(model, texts)``: per-head statistics of a real model over a whole corpus.

The one flow: the pipeline chooses its reducers (:mod:`multihead.analysis.stats`), runs one pass
of the model over the corpus feeding all of them (:func:`~.common.run_pass`), runs its probes
(induction, coreference, retrieval) and interventions (ablation, label evidence, what-if), and
builds the :class:`~multihead.analysis.report.Report` by keyword.

Batched and padding-aware (any batch size gives the same numbers), length-bucketed (texts of
similar length share a batch), and streaming: each layer's maps are reduced as soon as the
layer has run — and a layer whose map would pass the memory budget is handed over in chunks of
query rows — so peak memory is one chunk of one layer, whatever the corpus size or a text's
length. Every reducer streams: a 4,096-token line gets redundancy and syntax like a sentence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ...data import ARTICLE_SENTENCES
from ...hf.model import HFModel, require_loaded
from ...hf.route import chunk_bytes
from ...hf.sites import find_sites, main_stack
from ...inputs import UnknownTokens, check_texts, count_unknown_tokens, warn_unknown_tokens
from ...progress import counted, note, step
from .. import sections as S
from ..interventions.ablation import (
    AblationEffects,
    ablation_effects,
    attribution_effects,
    has_gradient,
    no_terms_reason,
    objective_name,
    objective_terms,
)
from ..interventions.evidence import PROBE as EVIDENCE_PROBE
from ..interventions.evidence import SYNTAX_TEXTS, TESTS, label_evidence
from ..interventions.whatif import check_what_if
from ..interventions.whatif import what_if as what_if_loss
from ..labels import SYNTAX_RULE, degenerate, flags_for, label_for, label_value, traits_for
from ..probes.coreference import CoreferenceExample, coreference_scores
from ..probes.induction import induction_scores, repeated_sequences
from ..probes.retrieval import PROBE as RETRIEVAL_PROBE
from ..probes.retrieval import probe_inputs, retrieval_scores
from ..probes.syntax import Parse, in_latin_script, parse_with_spacy, parses_for
from ..report import HeadRecord, Report
from ..stats.bootstrap import MIN_GROUPS, intervals, resample_weights, used_groups
from ..stats.heads import HeadStatistics
from ..stats.longcontext import LongContextStatistics
from ..stats.maps import EVIDENCE_TOP_K, LONG_TEXT, TextView, TextViews
from ..stats.redundancy import RedundancyStatistics, clusters, informative_groups, most_redundant
from ..stats.syntax import SyntaxStatistics, relation_keys
from ..stats.typical import TypicalTexts
from .common import (
    all_ranks,
    batch_work,
    check_finite,
    corpus_fingerprint,
    encode_corpus,
    process_group,
    run_pass,
    shard,
    text_batches,
)
from .memory_plan import check_plan, plan_devices
from .views import InputViews, head_views, text_views, token_views

#: Labels with an evidence test: their heads' ablation effects are measured exactly.
TESTED = ("induction", "previous", "syntactic")

__all__ = ["CLUSTER_JS", "INDUCTION_PROBE", "LONG_CONTEXT_TOKENS", "PAGE_TEXTS", "CorpusStatistics", "analyze",
           "collect_statistics", "default_views"]

#: Heads whose attention rows differ by at most this JS distance (base 2) on average are clustered.
CLUSTER_JS = 0.2
#: The induction probe of causal models: sequences, random tokens repeated once, seed.
INDUCTION_PROBE = {"count": 32, "length": 40, "seed": 0}
#: A corpus whose longest text has at least this many tokens gets the long-context statistics
#: (sinks, long-range mass, windows) and, for a causal language model, the retrieval probe.
LONG_CONTEXT_TOKENS = 512
#: How many texts the page keeps (it holds their maps): the articles' example sentences first.
PAGE_TEXTS = 4


@dataclass
class CorpusStatistics:
    """What one pass over a corpus found, reducer by reducer."""

    heads: HeadStatistics
    typical: TypicalTexts
    redundancy: RedundancyStatistics | None = None
    syntax: SyntaxStatistics | None = None
    long: LongContextStatistics | None = None
    views: TextViews | None = None
    unknown: UnknownTokens | None = None  # of the whole corpus (every rank counts all texts)
    not_parsed: int = 0  # texts spaCy's English pipeline was not given (not in Latin script), of the whole corpus

    @property
    def reducers(self) -> list[Any]:
        return [r for r in (self.heads, self.typical, self.long, self.redundancy, self.syntax, self.views)
                if r is not None]


def default_views(texts: Sequence[str]) -> list[int]:
    """The texts a report's page shows: the articles' example sentences in the corpus (at most
    :data:`PAGE_TEXTS`), else its first ``PAGE_TEXTS - 1`` texts."""
    articles = [i for i, t in enumerate(texts) if t in ARTICLE_SENTENCES]
    seen: set[str] = set()
    chosen = [i for i in articles if not (texts[i] in seen or seen.add(texts[i]))][:PAGE_TEXTS]
    return chosen or list(range(min(len(texts), PAGE_TEXTS - 1)))


def analyze(model: HFModel, texts: Sequence[str], *, batch_size: int = 32, truncate: bool = False,
            progress: bool | None = None, parses: Sequence[Parse] | str | None = None,
            coreference: bool | Sequence[CoreferenceExample] = True, induction: bool = True,
            redundancy: bool = True, targets: Sequence[str] | None = None, chunk: int | None = None,
            ablation: int = 0, what_if: str | None = None, views: Sequence[int] | None = None,
            long_context: bool | None = None, budget: int | None = None, exact_ablation: bool = False) -> Report:
    """Metrics, a label and flags for every (layer, head) of ``model`` over ``texts`` (a vision
    model's images: :func:`multihead.analysis.pipelines.vision.analyze_images`; an
    encoder-decoder model's three stacks: :func:`~multihead.analysis.pipelines.encdec.analyze_encoder_decoder`,
    with ``targets``).

    ``parses``: dependency parses of ``texts`` (one each), or ``"spacy"`` to parse them with
    spaCy, for the syntax scores; ``coreference``: score the shipped pronoun set (True) or these
    examples; ``induction``: for causal models, run the repeated-random-tokens probe;
    ``redundancy``: the head x head similarity (its all-pairs JS is the costliest part of a run).
    ``ablation``: also measure, on the first this many texts, every head's ``zero_ablation`` and
    ``mean_ablation`` effect on the model's own objective, and test the labels that have a test
    (section ``evidence``): exactly (each head removed, the objective rerun) for the heads whose
    label is tested or whose attention looks input-independent (is it degenerate?), estimated by
    attribution patching for the others (``exact_ablation``: every head exactly; an objective without
    a gradient, an encoder's 1 − cos, is always exact); texts of more than
    :data:`~multihead.analysis.stats.maps.LONG_TEXT` tokens are not ablated (the section says why).
    ``what_if``: a causal LM's loss change with its layers attending through ``"window=W,sinks=N"``
    (section ``what_if``). ``views``: corpus indices of the texts whose maps the page keeps
    (default :func:`default_views`; ``()``: none).
    ``long_context``: the long-context statistics (default: when a text passes
    :data:`LONG_CONTEXT_TOKENS` tokens). ``budget``: map bytes above which a layer is streamed in
    query chunks (``chunk``: at most this many rows per chunk, whatever the budget).

    Under ``torch.distributed`` (e.g. ``torchrun``) the corpus is sharded across the ranks and every
    rank returns the same merged report.

    Raises ValueError for an empty corpus, an empty text, a text longer than the model's
    positions (unless ``truncate``), or texts of which the tokenizer knows no token; warns when
    more than :data:`~multihead.inputs.UNKNOWN_WARN` of the tokens are unknown (the report's ``unknown_tokens``
    section records the share).
    """
    model = require_loaded(model, "analyze")
    if model.without_objective and (ablation or what_if is not None):
        asked = "ablation" if ablation else "what_if"
        raise ValueError(f"{asked} measures heads against a one-stack text model's own objective; {model.name} is "
                         f"{model.without_objective}")
    if model.processor is not None:  # a vision model: ``texts`` are its images
        from .vision import analyze_images

        report = analyze_images(model, texts, batch_size=batch_size, progress=progress)
        report.placement = model.placement
        return report
    texts = check_texts(texts)
    if model.is_encoder_decoder:  # three stacks; the probes and redundancy read single-stack models
        from .encdec import analyze_encoder_decoder

        report = analyze_encoder_decoder(model, texts, targets, batch_size=batch_size, truncate=truncate,
                                         progress=progress)
        warn_unknown_tokens(report.sections.unknown_tokens)
        report.placement = model.placement
        return report
    if targets is not None:
        raise ValueError("targets are read by encoder-decoder models only; this model has one stack")
    if not isinstance(ablation, int) or isinstance(ablation, bool) or ablation < 0:
        raise ValueError(f"ablation is a number of texts (0: off); got {ablation!r}")
    if what_if is not None:  # asked before the pass, not after it
        check_what_if(model, texts, what_if)
    chosen = default_views(texts) if views is None else list(views)
    if budget is None:  # the pipelines' rule, resolved here so the report can say it
        budget = chunk_bytes(model.device)
    # the page's views (of some texts) hold the probes' inputs too: read in the probes' own passes
    page, probe_views = bool(chosen), {}  # {probe: its views, or None where reading them failed}
    ablated = texts[:ablation]
    longest_ablated = max((len(ids) for ids in encode_corpus(model, ablated, truncate=True).ids), default=0) \
        if ablated else 0
    if ablated and longest_ablated > LONG_TEXT:  # said before the pass, not found in the report after it
        note(f"ablation: skipped — the ablated texts reach {longest_ablated:,} tokens, and it reads texts of at most "
             f"{LONG_TEXT} (the report says so)", progress=progress)
    corpus = collect_statistics(model, texts, batch_size=batch_size, truncate=truncate, progress=progress,
                                parses=parses, redundancy=redundancy, chunk=chunk, views=chosen,
                                long_context=long_context, budget=budget,
                                probes=model.is_causal and (induction or long_context is not False))
    means = dict(corpus.heads.result())
    sections = S.Sections(corpus=S.Corpus(**corpus_fingerprint(texts)))
    if corpus.long is not None:  # long inputs: how far each head looks
        means.update(corpus.long.result())
        sections.long_context = S.LongContext(corpus.long.longest, budget, chunk)
        if model.is_causal and model.has_lm_head:
            with step("retrieval probe (a needle copied from far back)", progress=progress):
                reader = InputViews(model, top_k=EVIDENCE_TOP_K) if page else None
                found = retrieval_scores(model, chunk=chunk, reader=reader)
                probe_views["retrieval"] = _read_views(reader, "retrieval", progress)
            means["retrieval"] = found.score
            sections.retrieval = S.Retrieval(**RETRIEVAL_PROBE, copy_steps=found.copy_steps, steps=found.steps)
    unknown = corpus.unknown
    if unknown is not None and unknown.token is not None:
        sections.unknown_tokens = S.UnknownTokens(unknown.count, unknown.total, round(unknown.share, 6), unknown.token)
        warn_unknown_tokens(sections.unknown_tokens)
    probe_items: dict[str, Tensor] = {}  # each probe's per-input scores {metric: (N, L, H)}, for their intervals
    if induction and model.is_causal:
        with step("induction probe", progress=progress):
            probe = INDUCTION_PROBE
            reader = InputViews(model) if page else None
            means.update(induction_scores(model, count=probe["count"], length=probe["length"], seed=probe["seed"],
                                          per_sequence=probe_items, reader=reader))
            probe_views["induction"] = _read_views(reader, "induction", progress)
        sections.induction = S.Induction(**INDUCTION_PROBE)
    coref_baseline = None
    if coreference is not False:
        with step("coreference probe", progress=progress):
            scores = coreference_scores(model, None if coreference is True else coreference, batch_size=batch_size)
        means["coreference"], means["coreference_mass"] = scores.accuracy, scores.mass
        if scores.per_example is not None:
            probe_items.update(coreference=scores.per_example["accuracy"], coreference_mass=scores.per_example["mass"])
        coref_baseline = scores.baseline
        sections.coreference = S.Coreference(scores.examples, scores.skipped, scores.baseline)
    syntax = corpus.syntax.result() if corpus.syntax is not None else None
    if syntax is not None or corpus.not_parsed:  # (none parsed at all: a section that says so)
        sections.syntax = S.Syntax(SYNTAX_RULE[0], {
            rel: S.Relation(syntax.count[rel], syntax.baseline[rel], syntax.baseline_offset[rel], syntax.accuracy[rel],
                            dict(zip(("layer", "head", "accuracy"), syntax.best(rel), strict=True)))
            for rel in (syntax.accuracy if syntax is not None else ())}, not_parsed=corpus.not_parsed)
    heads = _records(model, means, syntax, coref_baseline)
    labels = {(r.layer, r.head): r.label for r in heads}
    if ablated and longest_ablated > LONG_TEXT:
        sections.ablation = _skipped_ablation(model, f"the ablated texts reach {longest_ablated:,} tokens; each of "
                                                     f"{model.num_layers * model.num_heads} heads removed alone would "
                                                     f"rerun them (ablation reads texts of at most {LONG_TEXT} tokens)")
        ablated = []
    if ablated and not objective_terms(model, ablated, batch_size):  # e.g. one-token texts of a causal LM
        sections.ablation = _skipped_ablation(model, no_terms_reason(model))
        ablated = []
    if ablated:
        effects = _ablation(model, ablated, heads, exact=exact_ablation, batch_size=batch_size, progress=progress)
        sections.ablation = effects.section()
        _add_effects(heads, effects)
    _add_intervals(heads, corpus.heads, model.is_causal, syntax, coref_baseline, corpus.syntax)
    for name, items in probe_items.items():  # a probe's score: bootstrap over its inputs (sequences, examples)
        low, high = intervals(items, torch.ones_like(items))
        for r in heads:
            lo, hi = float(low[r.layer, r.head]), float(high[r.layer, r.head])
            if math.isfinite(lo) and math.isfinite(hi):  # none over fewer than MIN_GROUPS inputs
                r.intervals[name] = (lo, hi)
    sections.typical = corpus.typical.result().section(labels, texts)
    if ablated:  # labels with evidence: each label's behaviour, with its head removed
        n = max(ablation, SYNTAX_TEXTS)  # relations need more tokens than the ablation's texts hold
        with step("testing the labels by ablation", progress=progress):
            found = label_evidence(model, labels, texts[:n],
                                   parses=parses if isinstance(parses, str) else
                                   (list(parses)[:n] if parses is not None else None),
                                   batch_size=batch_size)
        sections.evidence = S.Evidence(dict(TESTS), min(n, len(texts)), dict(EVIDENCE_PROBE),
                                       [e.record() for e in found])
    if what_if is not None:
        with step(f"what if: {what_if}, every layer and each alone", progress=progress):
            sections.what_if = what_if_loss(model, texts, what_if, progress=progress).section()
    if corpus.redundancy is not None:
        sinks = {(r.layer, r.head) for r in heads if "sink" in r.label.split("+") or "sink" in r.traits}
        sections.redundancy = redundancy_section(corpus.redundancy.result(), model.num_heads, sinks=sinks)
    shown = corpus.views.result() if corpus.views is not None else []
    typical_maps = {}
    if shown:  # the page also holds the inputs that define the labels: each can be opened on its evidence
        with step("the labels' evidence texts for the page", progress=progress):
            shown += evidence_views(model, texts, sections.typical, heads, {v.text for v in shown},
                                    induction=induction and model.is_causal,
                                    retrieval=sections.retrieval is not None, probe_views=probe_views)
            wanted: dict[int, set[tuple[int, int]]] = {}
            for entry in sections.typical.heads if sections.typical is not None else []:
                for index, _, _ in entry.texts:
                    wanted.setdefault(int(index), set()).add((entry.layer, entry.head))
            typical_maps = head_views(model, texts, wanted)
    return Report(model=model.name, causal=model.is_causal, num_layers=model.num_layers, num_heads=model.num_heads,
                  sentences=corpus.heads.sentences, tokens=corpus.heads.tokens, heads=heads, sections=sections,
                  stack=main_stack(find_sites(model.model)), placement=model.placement, views=shown,
                  head_views=typical_maps)


def _skipped_ablation(model: HFModel, why: str) -> S.Ablation:
    """The ablation section of a run that ablated no head, saying ``why``."""
    objective = objective_name(model)
    return S.Ablation(objective, float("nan"), 0, 0, [], skipped=why, unit=S.unit_of(objective))


def _read_views(reader: InputViews | None, probe: str, progress: bool | None) -> list[TextView] | None:
    """A probe's page views as its reader kept them (None: none kept — the page makes them in a pass
    of their own, after saying why where the reading failed)."""
    if reader is None:
        return None
    if reader.failed is not None:
        note(f"the {probe} probe's view for the page is made in a pass of its own: reading it in the probe's failed "
             f"({' '.join(str(reader.failed).split())[:200]})", progress=progress)
    return reader.result()


def evidence_views(model: HFModel, texts: Sequence[str], typical: S.Typical | None, heads: list[HeadRecord],
                   shown: set[str], *, induction: bool, retrieval: bool = False,
                   probe_views: dict[str, list[TextView]] | None = None) -> list:
    """The views of the inputs that define the labels, for the page (every head's own map on its
    typical texts is kept apart, :func:`~.views.head_views`): the induction probe's first sequence
    (its repeated random tokens; causal models), the retrieval probe's first trial (long inputs:
    ``retrieval``) and an example of every relation a head is labelled by (the text its syntax head
    is most typical on), each marked with what it is (``extra["purpose"]``). ``probe_views``: a
    probe's view read in its own pass ({"induction" or "retrieval": [view]}, :class:`~.views.InputViews`);
    one not there (or None) takes a pass of its own."""
    out = []
    probe_views = probe_views or {}
    if induction:
        probe = probe_views.get("induction")
        if probe is None:
            ids, _ = repeated_sequences(model.tokenizer, count=1, length=INDUCTION_PROBE["length"],
                                        seed=INDUCTION_PROBE["seed"])
            probe = token_views(model, ids.tolist())
        for view in probe:
            view.extra["purpose"] = "induction probe: random tokens, repeated"
            view.extra["top_k"] = EVIDENCE_TOP_K
        out += probe
    if retrieval:  # the retrieval probe's first trial: a needle in a haystack, copied at the end
        ids, first, _ = probe_inputs(model.tokenizer)[0]
        probe = probe_views.get("retrieval")
        for view in token_views(model, [ids], top_k=EVIDENCE_TOP_K) if probe is None else probe:
            view.extra["purpose"] = f"retrieval probe: the needle at token {first}, copied at the end"
            out.append(view)
    if typical is not None:
        labelled = {(r.layer, r.head): r.label for r in heads}
        examples: dict[str, tuple[int, tuple[int, int]]] = {}  # relation -> (its first syntax head's text, head)
        for entry in typical.heads:
            label = labelled.get((entry.layer, entry.head), "")
            if label.startswith("syntactic:") and entry.texts:
                examples.setdefault(label.removeprefix("syntactic:"),
                                    (int(entry.texts[0][0]), (entry.layer, entry.head)))
        purpose: dict[int, str] = {}
        for rel, (i, (layer, head)) in sorted(examples.items()):  # an example of every relation a head is labelled by
            if texts[i] not in shown and len(model.tokenizer(texts[i], verbose=False)["input_ids"]) <= LONG_TEXT:
                purpose.setdefault(i, f"example of {rel} (typical of L{layer}.H{head})")
        chosen = list(purpose)
        if chosen:
            for i, view in zip(chosen, text_views(model, [texts[i] for i in chosen]), strict=True):
                view.extra["purpose"], view.extra["top_k"] = purpose[i], EVIDENCE_TOP_K
                out.append(view)
    return out


def _ablation(model: HFModel, texts: list[str], heads: list[HeadRecord], *, exact: bool, batch_size: int,
              progress: bool | None) -> AblationEffects:
    """Every head's ablation effect: exactly for all (``exact``, or an objective without a gradient),
    else estimated by attribution patching and exact for the heads whose labels are tested or whose
    attention looks input-independent (the degenerate test needs their exact effect and its interval)."""
    L, H = model.num_layers, model.num_heads
    if exact or not has_gradient(model):
        return ablation_effects(model, texts, batch_size=batch_size, progress=progress)
    with step(f"estimating every head's ablation effect (attribution patching, {len(texts)} texts)",
              progress=progress):
        estimate = attribution_effects(model, texts, batch_size=batch_size)
    cells = sorted({(r.layer, r.head) for r in heads if r.flags or r.label.split(":")[0] in TESTED})
    start = time.perf_counter()
    # with no head to ablate exactly it is still the intact run: the objective the effects are read against
    effects = ablation_effects(model, texts, heads=cells, modes=("zero", "mean") if cells else ("zero",),
                               batch_size=batch_size, progress=progress)
    if cells:
        seconds = (time.perf_counter() - start) / len(cells) * L * H
        note(f"exact ablation of {len(cells)} heads (tested labels, input-independent patterns); of all {L * H} "
             f"heads it would take about {seconds / 60:.1f} min: --exact-ablation", progress=progress)
    for mode, value in estimate.items():
        measured = getattr(effects, mode.removesuffix("_ablation"))
        if measured is None:
            measured = torch.full((L, H), math.nan, dtype=torch.float64)
            setattr(effects, mode.removesuffix("_ablation"), measured)
        missing = torch.isnan(measured)
        measured[missing] = value[missing]
    effects.method, effects.exact = "attribution", cells
    return effects


def _add_effects(heads: list[HeadRecord], effects: AblationEffects) -> None:
    """Each head's ablation effects and their intervals, and whether it is degenerate."""
    found = effects.metrics()
    bounds = effects.intervals()
    largest = float(torch.nan_to_num(found["zero_ablation"].abs()).max())
    for r in heads:
        for name, value in found.items():
            r.metrics[name] = float(value[r.layer, r.head])
            if name in bounds:
                low, high = (float(b[r.layer, r.head]) for b in bounds[name])
                if math.isfinite(low):
                    r.intervals[name] = (low, high)
        r.degenerate = degenerate(r.flags, r.metrics["zero_ablation"], r.intervals.get("zero_ablation"), largest)


def _add_intervals(heads: list[HeadRecord], stats: HeadStatistics, causal: bool, syntax,
                   coref_baseline: float | None, syntax_stats: SyntaxStatistics | None = None) -> None:
    """Each metric's bootstrap interval over texts and each label's stability: the share of
    resampled corpora (the metrics and the syntax scores resampled together, the probes' scores
    held) on which the head gets the same label. One text (one group) has neither: its resamples
    are all that text, so every label would be "100 % stable" by construction."""
    for name, (low, high) in stats.intervals().items():
        for r in heads:
            lo, hi = float(low[r.layer, r.head]), float(high[r.layer, r.head])
            if math.isfinite(lo) and math.isfinite(hi):
                r.intervals[name] = (lo, hi)
    used = used_groups(stats.group_counts)
    if int(used.sum()) < MIN_GROUPS:
        return
    weights = resample_weights(int(used.sum()))
    values = stats.resampled(weights)  # {metric: (R, L, H)}
    R = weights.shape[0]
    min_count = SYNTAX_RULE[0]
    scores = syntax_stats.resampled(weights, used, min_count) if syntax_stats is not None and syntax is not None \
        else None
    # per resample: [(relation, accuracy of every head (L·H,), baseline, count)], read per head below — only
    # where the head's accuracy reaches the syntax rule's minimum, below which label_for passes a relation
    # over (each head's dict of every relation, every resample, was half of this step's time)
    min_accuracy = SYNTAX_RULE[1]
    tables = None if scores is None else [[(rel, acc.flatten().tolist(), found.baseline[rel], found.count[rel])
                                           for rel, acc in found.accuracy.items()] for found in scores]
    width = next((acc.shape[-1] for found in scores or () for acc in found.accuracy.values()), 1)  # H of (L, H)
    names = list(values)
    for r in heads:
        same = 0
        at = r.layer * width + r.head  # the head's place in (L·H,)
        cell = list(zip(*(values[name][:, r.layer, r.head].tolist() for name in names), strict=True))  # (R, metrics)
        for k in range(R):
            metrics = dict(r.metrics)
            metrics.update(zip(names, cell[k], strict=True))
            per_relation = None if tables is None else {
                rel: (acc[at], base, n) for rel, acc, base, n in tables[k] if acc[at] >= min_accuracy}
            same += label_for(metrics, syntax=per_relation, coreference_baseline=coref_baseline,
                              causal=causal) == r.label
        r.stability = same / R


def _records(model: HFModel, means: dict, syntax, coref_baseline: float | None) -> list[HeadRecord]:
    heads = []
    causal = model.is_causal
    for layer in range(model.num_layers):
        for head in range(model.num_heads):
            metrics = {name: float(value[layer, head]) for name, value in means.items()}
            per_relation = None if syntax is None else {
                rel: (float(acc[layer, head]), syntax.baseline[rel], syntax.count[rel])
                for rel, acc in syntax.accuracy.items()}
            label = label_for(metrics, syntax=per_relation, coreference_baseline=coref_baseline, causal=causal)
            accuracy = per_relation[label.removeprefix("syntactic:")][0] if label.startswith("syntactic:") else None
            heads.append(HeadRecord(layer, head, label, flags_for(metrics, label), metrics,
                                    traits=traits_for(label, metrics, causal=causal),
                                    value=label_value(label, metrics, syntax_accuracy=accuracy)))
    return heads


#: Two sink heads count as a redundant pair only when their outputs are this similar too (cosine).
SINK_PAIR_COSINE = 0.8


def redundancy_section(red: RedundancyStatistics, H: int, *, sinks: set[tuple[int, int]] = frozenset()
                       ) -> S.Redundancy:
    """The report's redundancy section from the finished sums: pairs, clusters and Ward groups.
    ``sinks``: heads that park on the first token; a pair of two of them is listed only when their
    outputs are redundant too (cosine >= :data:`SINK_PAIR_COSINE`): attending alike to one token
    says little."""
    js, cosine = red.js(), red.cosine()
    found = informative_groups(js)
    sink = torch.zeros(js.shape[0], dtype=torch.bool)
    sink[[layer * H + h for layer, h in sinks]] = True
    allowed = ~(sink[:, None] & sink[None, :] & ~(cosine >= SINK_PAIR_COSINE))  # (N, N)
    return S.Redundancy(
        js_distance=js, cosine=cosine,
        pairs_js=most_redundant(js, H, k=10, distance=True, allowed=allowed),
        pairs_cosine=most_redundant(cosine, H, k=10, distance=False),
        clusters_js=[[(n // H, n % H) for n in group] for group in clusters(js, CLUSTER_JS)],
        cluster_threshold=CLUSTER_JS,
        groups_js={**found, "groups": [[(n // H, n % H) for n in group] for group in found["groups"]]},
        rows_js=int(red.js_count), rows_cosine=int(red.cos_count))


def collect_statistics(model: HFModel, texts: Sequence[str], *, batch_size: int = 32, truncate: bool = False,
                       progress: bool | None = None, parses: Sequence[Parse] | str | None = None,
                       redundancy: bool = True, chunk: int | None = None, views: Sequence[int] = (),
                       long_context: bool | None = None, budget: int | None = None,
                       probes: bool = False) -> CorpusStatistics:
    """One pass of the model over ``texts`` feeding every reducer :func:`analyze` reads.

    Under ``torch.distributed`` (e.g. ``torchrun``) the corpus is sharded across the ranks — rank
    r takes texts r, r + world, ... — and every rank returns the merged statistics of all; under
    ``torchrun`` with no process group yet, one is joined for the pass (gloo on the CPU, nccl with
    CUDA) and left after it, so a script calling ``mh.analyze`` needs no set-up of its own.
    ``parses="spacy"`` parses each rank's own texts, and only the part of each that is analysed
    (with ``truncate``, the tokens the model keeps). ``probes``: the induction and retrieval probes
    will follow the pass (as :func:`analyze` runs them): a long run's memory plan counts their
    passes and the page's views of their inputs.
    """
    texts = check_texts(texts)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    if isinstance(parses, str) and parses != "spacy":
        raise ValueError(f"parses must be a list of Parse or 'spacy'; got {parses!r}")
    if parses is not None and not isinstance(parses, str):
        parses = parses_for(texts, parses)
    encoded = encode_corpus(model, texts, truncate=truncate, offsets=parses is not None,
                            say_cut=progress is not False)
    unknown = count_unknown_tokens(encoded.ids, model.tokenizer)
    with process_group():  # under torchrun: its ranks share the corpus (joined here when no group exists yet)
        return _collect(model, texts, encoded, unknown, batch_size=batch_size, progress=progress, parses=parses,
                        redundancy=redundancy, chunk=chunk, views=views, long_context=long_context, budget=budget,
                        probes=probes)


def _collect(model: HFModel, texts: list[str], encoded, unknown: UnknownTokens, *, batch_size: int,
             progress: bool | None, parses, redundancy: bool, chunk: int | None, views: Sequence[int],
             long_context: bool | None, budget: int | None, probes: bool) -> CorpusStatistics:
    mine, sharded = shard(range(len(texts)))
    not_parsed = 0
    if parses == "spacy":
        # spaCy's pipeline is English: a text mostly in another script is not parsed (no junk tree scored),
        # judged on the part of each text that is analysed, over the whole corpus (every rank holds it all)
        analysed = [text[:_analysed_end(offsets)] for text, offsets in zip(texts, encoded.offsets, strict=True)]
        not_parsed = sum(not in_latin_script(text) for text in analysed)
        if not_parsed:
            note(f"syntax scores: {not_parsed} of {len(texts)} texts not parsed: not in Latin script (spaCy's "
                 "en_core_web_sm reads English)", progress=progress)
        if not_parsed == len(texts):
            parses = None  # no scores: the report's syntax section says why (its not_parsed)
        else:
            with step(f"parsing {counted(len(mine), 'text')} with spaCy", progress=progress):
                parsed = parse_with_spacy([analysed[i] for i in mine])
            parses = [None] * len(texts)
            for i, p in zip(mine, parsed, strict=True):
                parses[i] = p
    L, H = model.num_layers, model.num_heads
    longest = max(len(ids) for ids in encoded.ids)
    long = longest >= LONG_CONTEXT_TOKENS if long_context is None else long_context
    if longest >= LONG_CONTEXT_TOKENS:  # a long run: what it will hold, said first, and refused if it cannot fit
        kept = len(set(views) & set(mine))
        parsed = [parses[i] for i in mine if parses[i] is not None] if parses is not None else []
        try:  # one plan for each device the run computes on (a model spread over GPUs: each GPU's)
            found = plan_devices(model, longest, batch=min(batch_size, len(mine)), texts=len(mine),
                                 redundancy=redundancy, views=kept, probes=probes,
                                 relations=len(relation_keys(parsed, model.is_causal)),
                                 chunk=chunk, budget=budget)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:  # a model the trace cannot follow
            note(f"no memory plan for {model.name}: {' '.join(str(err).split())[:200]}", progress=progress)
        else:
            for each in found:
                note(str(each), progress=progress)
            for each in found:
                check_plan(each)
    corpus = CorpusStatistics(
        heads=HeadStatistics(L, H), typical=TypicalTexts(L, H),
        redundancy=RedundancyStatistics(L, H) if redundancy else None,
        syntax=SyntaxStatistics(L, H) if parses is not None else None,
        long=LongContextStatistics(L, H) if long else None,
        views=TextViews(L, H, {i: texts[i] for i in views if i in set(mine)}, model.tokenizer) if views else None,
        unknown=unknown, not_parsed=not_parsed)
    batches = text_batches(model, encoded, mine, batch_size, parses=parses)
    total = -(-len(mine) // batch_size)
    run_pass(model, batches, corpus.reducers, budget=budget, chunk=chunk, progress=progress, total=total,
             work=batch_work(encoded, mine, batch_size))
    if sharded:
        merged = iter(all_ranks(corpus.reducers))
        for name in ("heads", "typical", "long", "redundancy", "syntax", "views"):
            if getattr(corpus, name) is not None:
                setattr(corpus, name, next(merged))
    check_finite(corpus.heads, model.dtype)  # a NaN map refused in one line, not reported as metrics
    return corpus


def _analysed_end(offsets: Sequence[Sequence[int]]) -> int:
    """Where the analysed part of a text ends: the last character of its last kept token."""
    return max((int(end) for _, end in offsets), default=0)

