"""Labels, flags, thresholds, marks and their words — defined once, read by every renderer.

A label for every head, and flags for degenerate ones, from documented thresholds; the labels
of cross-attention and vision heads; the marks of tested labels (✓ / ~); the short code of each
label for maps; its colour; the words of the legend; the long-context thresholds.

Labels are tried in this order; the first whose rule holds wins:

| label | rule (token-weighted means, see :mod:`.metrics`; probes in :mod:`.induction`, |
|  | :mod:`.syntax`, :mod:`.coreference`) |
|---|---|
| ``induction`` | ``induction >= 0.3`` (causal models; the repeated-random-tokens probe) |
| ``self`` | ``self >= 0.5`` |
| ``previous`` | ``previous_token >= 0.5`` |
| ``next`` | ``next_token >= 0.5`` |
| ``syntactic:<rel>`` | for some relation seen ≥ 30 times: accuracy ≥ 0.5 and ≥ its fixed-offset |
|  | baseline + 0.15, and beyond the sampling interval (:func:`sampling_margin`); the |
|  | relation with the largest margin is named. A causal head is scored only on the |
|  | instances whose target it can see (at or before the query) |
| ``coreference`` | ``coreference >= 0.7`` and ≥ the nearest-mention baseline + 0.15 |
| ``sink`` | causal models: ``cls >= 0.6`` — the first token, whatever it is, as an attention sink |
|  | (Xiao et al.'s StreamingLLM); SmolLM2 has no BOS, its first token is a word |
| ``special-token`` | ``cls + sep >= 0.6`` (encoders: real [CLS]/[SEP]); causal: ``sep >= 0.6`` (EOS) |
| ``broad`` | ``entropy_norm >= 0.85`` (close to uniform over the visible keys) |
| ``local`` | ``local >= 0.7`` (after ``broad``: on short sentences a uniform head is local too) |
| ``A+B`` | the head's two largest components (:data:`COMPONENTS`: previous, self, next, sink or |
|  | cls, sep/eos, punctuation), largest first, when together they hold ``>= 0.5`` of its |
|  | attention and the second ``>= 0.15`` (e.g. ``previous+sink``) |
| ``mixed`` | none of the above |

Syntax comes before special-token on purpose: Clark et al. found heads that put most of their
weight on [SEP] yet, whenever they look at a word, look at its syntactic governor.

Every label has its defining value (:func:`label_value`, :func:`describe`): the metric its rule
reads (the relation's accuracy for a syntactic label, both masses for ``A+B``).

Traits (:func:`traits_for`) are secondary: a head whose label names an input-dependent role and
that also parks most of its attention on the first token carries the trait ``sink`` (SmolLM2's
induction heads do, on ordinary sentences).

Pattern flags (:func:`flags_for`, several may hold) say the attention looks input-independent:
``self-only`` (``self >= 0.9``), ``uniform`` (``entropy_norm >= 0.95``), ``stuck-on-sep``
(``sep >= 0.8``), ``stuck-on-first`` (``cls >= 0.9``); a head labelled with an input-dependent role
(:data:`ROLES`: induction, syntax, coreference) gets none. A flagged head is **degenerate**
(:func:`degenerate`) only when removing it also changes nothing: its zero-ablation effect's
bootstrap interval holds 0, or the effect is below :data:`NEGLIGIBLE` of the largest head's. A head
that matters is never degenerate; without ablation no head is called degenerate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from .sections import sampling_margin

__all__ = [
    "COMBINED",
    "COMPONENTS",
    "COREFERENCE_RULE",
    "CROSS_RULES",
    "FLAG_RULES",
    "LABEL_COLOURS",
    "LABEL_RULES",
    "LONG_RANGE_HEAD",
    "MARKS",
    "MARK_WORDS",
    "NEGLIGIBLE",
    "PATCH_RULES",
    "RETRIEVAL_HEAD",
    "ROLES",
    "SINK_HEAD",
    "SINK_RULE",
    "SYNTAX_RULE",
    "WINDOW_KEPT",
    "WITH_BROAD",
    "colour_of",
    "cross_label",
    "degenerate",
    "describe",
    "flags_for",
    "label_codes",
    "label_for",
    "label_value",
    "legend",
    "patch_label",
    "sampling_margin",
    "traits_for",
]

#: (label, metric or sum of metrics, threshold) — the simple rules, in order.
LABEL_RULES: tuple[tuple[str, str, float], ...] = (
    ("induction", "induction", 0.3),
    ("self", "self", 0.5),
    ("previous", "previous_token", 0.5),
    ("next", "next_token", 0.5),
    # syntactic:<rel> and coreference are tried here (they need a baseline), then sink (causal)
    ("special-token", "cls+sep", 0.6),
    ("broad", "entropy_norm", 0.85),
    ("local", "local", 0.7),
)
_BEFORE_PROBES = 4  # rules tried before syntax and coreference

#: min relation count, min accuracy, min margin over the fixed-offset baseline
SYNTAX_RULE = (30, 0.5, 0.15)
#: min accuracy, min margin over the nearest-mention baseline
COREFERENCE_RULE = (0.7, 0.15)

#: A causal head is a ``sink`` when at least this share of its attention is on the first token.
SINK_RULE = 0.6
#: The components of a head's attention that ``A+B`` labels name: label word -> metric (causal models
#: call the first token ``sink``, encoders ``cls``; ``eos`` / ``sep`` are the separator tokens).
COMPONENTS = {"previous": "previous_token", "self": "self", "next": "next_token", "sink": "cls", "cls": "cls",
              "eos": "sep", "sep": "sep", "punctuation": "punctuation"}
#: ``A+broad``: the largest component holds at least the first share, the rest spread (normalised entropy).
WITH_BROAD = (0.25, 0.5)
_CAUSAL_PARTS = ("previous", "self", "next", "sink", "eos", "punctuation")
_ENCODER_PARTS = ("previous", "self", "next", "cls", "sep", "punctuation")
#: ``A+B``: the two components together hold at least the first share, the second at least the second.
COMBINED = (0.5, 0.15)
#: Labels that name what a head does with its input (tested by probes): never pattern-flagged.
ROLES = ("induction", "syntactic", "coreference")
#: A flagged head's effect below this share of the largest head's effect counts as no change.
NEGLIGIBLE = 0.01

FLAG_RULES: tuple[tuple[str, str, float], ...] = (
    ("self-only", "self", 0.9),
    ("uniform", "entropy_norm", 0.95),
    ("stuck-on-sep", "sep", 0.8),
    ("stuck-on-first", "cls", 0.9),
)


def _value(metrics: dict[str, float], key: str) -> float:
    """The metric ``key`` (or the sum of ``a+b``'s), -inf where it is missing or NaN (no rule holds)."""
    if "+" in key:
        total = sum(metrics.get(k, math.nan) for k in key.split("+"))
    else:  # one metric: no split, no generator (a bootstrap's labels read ~400,000 of them)
        total = metrics.get(key, math.nan)
    return -math.inf if total != total else total + 0.0  # (+ 0.0: a -0.0 metric reads as 0.0, as a sum gives it)


def label_for(metrics: dict[str, float], *, syntax: dict[str, tuple[float, float, int]] | None = None,
              coreference_baseline: float | None = None, causal: bool = False) -> str:
    """The head's label (see the table above).

    ``syntax`` maps relation -> (this head's accuracy, baseline accuracy, count);
    ``coreference_baseline`` is the nearest-mention accuracy on the same examples; ``causal``:
    the model is a causal decoder (its first token is a sink, not a [CLS]).
    """
    for label, key, threshold in LABEL_RULES[:_BEFORE_PROBES]:
        if _value(metrics, key) >= threshold:
            return label
    if syntax:
        min_count, min_acc, margin = SYNTAX_RULE
        best = max(((acc - base, rel) for rel, (acc, base, n) in syntax.items()
                    if n >= min_count and acc >= min_acc and acc - base >= max(margin, sampling_margin(acc, base, n))),
                   default=None)
        if best is not None:
            return f"syntactic:{best[1]}"
    if coreference_baseline is not None:
        min_acc, margin = COREFERENCE_RULE
        acc = _value(metrics, "coreference")
        if acc >= min_acc and acc >= coreference_baseline + margin:
            return "coreference"
    if causal and _value(metrics, "cls") >= SINK_RULE:
        return "sink"
    for label, key, threshold in LABEL_RULES[_BEFORE_PROBES:]:
        if causal and label == "special-token":
            key = "sep"  # a decoder's first token is a sink (above), not a special token
        if _value(metrics, key) >= threshold:
            return label
    return _combined(metrics, causal) or "mixed"


def _parts(metrics: dict[str, float], causal: bool) -> list[tuple[float, str]]:
    """The head's components, largest first: [(mass, word)]."""
    names = _CAUSAL_PARTS if causal else _ENCODER_PARTS
    return sorted(((_value(metrics, COMPONENTS[n]), n) for n in names), reverse=True)


def _combined(metrics: dict[str, float], causal: bool) -> str | None:
    (a, first), (b, second) = _parts(metrics, causal)[:2]
    together, least = COMBINED
    if a + b >= together and b >= least:
        return f"{first}+{second}"
    share, spread = WITH_BROAD
    return f"{first}+broad" if a >= share and _value(metrics, "entropy_norm") >= spread else None


def label_value(label: str, metrics: dict[str, float], *, syntax_accuracy: float | None = None) -> float:
    """The value the label's rule read: its metric (``A+B``: the two masses together; a syntactic
    label: ``syntax_accuracy``, the head's accuracy on the relation; ``mixed``: its largest component)."""
    kind = label.split(":")[0]
    if kind == "syntactic":
        return math.nan if syntax_accuracy is None else float(syntax_accuracy)
    if "+" in label:
        return sum(_value(metrics, COMPONENTS[p]) for p in label.split("+") if p in COMPONENTS)
    rules = {name: key for name, key, _ in LABEL_RULES}
    key = {"sink": "cls", "coreference": "coreference"}.get(label) or rules.get(label)
    if key is None:  # mixed: the largest component
        return max(_value(metrics, COMPONENTS[n]) for n in _ENCODER_PARTS)
    value = _value(metrics, key)
    return math.nan if value == -math.inf else value


def describe(label: str, metrics: dict[str, float], value: float | None = None) -> str:
    """The label with its defining value in words: ``induction 0.88``, ``previous 0.41 + sink 0.33``."""
    if "+" in label:
        return " + ".join(f"{p} {_value(metrics, COMPONENTS[p]):.2f}" if p in COMPONENTS else
                          f"{p} (entropy_norm {_value(metrics, 'entropy_norm'):.2f})" for p in label.split("+"))
    value = label_value(label, metrics) if value is None else value
    if label == "mixed":
        return f"mixed (no rule holds; largest component {value:.2f})" if math.isfinite(value) else "mixed"
    return f"{label} {value:.2f}" if value is not None and math.isfinite(value) else label


def traits_for(label: str, metrics: dict[str, float], *, causal: bool = False) -> list[str]:
    """Secondary traits beside the label: ``sink`` (a causal head with at least :data:`SINK_HEAD` of
    its attention on the first token), ``special`` (an encoder head with that much on [CLS]/[SEP])."""
    parts = set(label.split("+"))
    if causal and "sink" not in parts and _value(metrics, "cls") >= SINK_HEAD:
        return ["sink"]
    if not causal and label != "special-token" and not parts & {"cls", "sep"} \
            and _value(metrics, "cls+sep") >= SINK_HEAD:
        return ["special"]
    return []


def flags_for(metrics: dict[str, float], label: str | None = None) -> list[str]:
    """The pattern flags that hold for these metrics (attention that looks input-independent);
    none for a head whose ``label`` names an input-dependent role (:data:`ROLES`)."""
    if label is not None and label.split(":")[0] in ROLES:
        return []
    return [flag for flag, key, threshold in FLAG_RULES if _value(metrics, key) >= threshold]


def degenerate(flags: list[str], effect: float, interval: tuple[float, float] | None, largest: float) -> bool | None:
    """Is a head degenerate? Its attention looks input-independent (``flags``) and removing it changes
    nothing: the ``interval`` of its zero-ablation ``effect`` holds 0, or ``|effect|`` is below
    :data:`NEGLIGIBLE` of the ``largest`` head's. None when the effect was not measured."""
    if not flags:
        return False
    if effect is None or not math.isfinite(effect):
        return None
    if interval is not None and all(math.isfinite(x) for x in interval) and interval[0] <= 0 <= interval[1]:
        return True
    return abs(effect) < NEGLIGIBLE * abs(largest)


# --------------------------------------------------------------------------- other stacks

#: Cross-attention labels, first match: (label, metric, threshold) (:mod:`multihead.analysis.stats.cross`).
CROSS_RULES: tuple[tuple[str, str, float], ...] = (
    ("source-special", "source_special", 0.5),
    ("aligned", "aligned", 0.5),
    ("broad", "entropy_norm", 0.8),
)
#: Vision-head labels, first match (:mod:`multihead.analysis.stats.patches`).
PATCH_RULES: tuple[tuple[str, str, float], ...] = (
    ("cls", "cls", 0.5),
    ("self", "self", 0.5),
    ("local", "local_3x3", 0.5),
    ("broad", "entropy_norm", 0.8),
)


def _first_rule(metrics: dict[str, float], rules: tuple[tuple[str, str, float], ...]) -> str:
    for label, key, threshold in rules:
        value = metrics.get(key, math.nan)
        if not math.isnan(value) and value >= threshold:
            return label
    return "mixed"


def cross_label(metrics: dict[str, float]) -> str:
    """The label of a cross-attention head (:data:`CROSS_RULES`, else ``mixed``)."""
    return _first_rule(metrics, CROSS_RULES)


def patch_label(metrics: dict[str, float]) -> str:
    """The label of a vision head (:data:`PATCH_RULES`, else ``mixed``)."""
    return _first_rule(metrics, PATCH_RULES)


# --------------------------------------------------------------------------- long context

#: A head is an attention sink when at least this share of its attention is on the first token.
SINK_HEAD = 0.5
#: A window of ±256 with 4 sinks "keeps" a head when the two together hold at least this share.
WINDOW_KEPT = 0.95
#: A long-range head puts more than this share of its attention beyond 1,024 tokens (the first 4 aside).
LONG_RANGE_HEAD = 0.05
#: A retrieval head's most-attended key is the needle's on more than this share of the steps the model copied it.
RETRIEVAL_HEAD = 0.5


# --------------------------------------------------------------------------- marks, codes, colours, words

#: How a tested label is marked after its code (the ``evidence`` section's ``mark``).
MARKS = {"confirmed": "✓", "attention-only": "~"}
#: What each mark means.
MARK_WORDS = {"confirmed": "confirmed: removing the head weakens what its label names",
              "attention-only": "attention-only: it looks that way, but the behaviour does not need it"}

_SHORT = {"induction": "IND", "coreference": "COREF", "sink": "SINK",
          "self": "SELF", "previous": "PREV", "next": "NEXT", "special-token": "SPEC", "local": "LOCL",
          "broad": "BRD", "mixed": "·", "aligned": "ALGN", "source-special": "SSPEC", "cls": "CLS"}
#: three-letter codes of the components, for ``A+B`` codes (``PRV+SNK``)
_PART_CODES = {"previous": "PRV", "self": "SLF", "next": "NXT", "sink": "SNK", "cls": "CLS", "eos": "EOS",
               "sep": "SEP", "punctuation": "PNC", "broad": "BRD"}

#: background colour of each label (syntactic labels share one)
LABEL_COLOURS = {
    "induction": "#f4a582", "coreference": "#b2abd2", "self": "#fddbc7", "previous": "#92c5de",
    "next": "#d1e5f0", "special-token": "#e0e0e0", "sink": "#cccccc", "broad": "#fff7bc", "local": "#c7e9c0",
    "mixed": "#ffffff", "syntactic": "#a6dba0",
}

#: What each label says a head does, in words (the legends of the page and the static report).
LABEL_WORDS = {"induction": "attends to the token after an earlier copy of the current one (induction probe)",
               "self": "attends to its own position", "previous": "attends to the previous token",
               "next": "attends to the next token", "special-token": "attends to [CLS]/[SEP] (a decoder: EOS)",
               "broad": "spreads its attention widely (normalised entropy)", "local": "attends within ±2 tokens"}


def colour_of(label: str) -> str:
    """The label's background (``A+B``: its first component's label colour)."""
    first = label.split(":")[0].split("+")[0]
    return LABEL_COLOURS.get({"cls": "special-token", "sep": "special-token", "eos": "special-token",
                              "punctuation": "mixed"}.get(first, first), "#ffffff")


def label_codes(labels: Iterable[str], width: int = 7) -> dict[str, str]:
    """A short, unique code per label for maps: IND, PREV, ... for the pattern labels; the relation
    for ``syntactic:REL`` (its direction mark ``>`` always kept, long names cut and numbered where
    two would collide). The legend maps each code back to its label."""
    codes: dict[str, str] = {}
    used: set[str] = set()
    for label in sorted(set(labels)):
        if label.startswith("syntactic:"):
            rel = label.removeprefix("syntactic:").lower()
            arrow = ">" if rel.endswith(">") else ""
            rel = rel.removesuffix(">")
            code = rel[:width - len(arrow)] + arrow
            n = 1
            while code in used:  # two relations cut to the same prefix
                n += 1
                code = rel[:width - len(arrow) - len(str(n))] + str(n) + arrow
        elif "+" in label and all(p in _PART_CODES for p in label.split("+")):
            code = "+".join(_PART_CODES[p] for p in label.split("+"))
        else:
            code = _SHORT.get(label, label[:width].upper())
        used.add(code)
        codes[label] = code
    return codes


def legend() -> dict[str, dict[str, str]]:
    """Each label's and flag's rule in words, from the rules themselves, and the labels' colours."""
    words = {label: f"{LABEL_WORDS.get(label, label)}: {key} ≥ {threshold}" for label, key, threshold in LABEL_RULES}
    n, acc, margin = SYNTAX_RULE
    words["syntactic:REL"] = (f"the dependent attends to its governor for relation REL (REL>: the governor to "
                              f"its dependents): seen ≥ {n} times, accuracy ≥ {acc} and ≥ the best fixed offset "
                              f"+ {margin}")
    words["coreference"] = (f"a pronoun attends to its antecedent: accuracy ≥ {COREFERENCE_RULE[0]} and ≥ the "
                            f"nearest-mention baseline + {COREFERENCE_RULE[1]}")
    words["sink"] = (f"a causal head parks its attention on the first token (an attention sink, whatever that "
                     f"token is): cls ≥ {SINK_RULE}")
    together, least = COMBINED
    words["A+B"] = (f"its two largest components (previous, self, next, sink/cls, eos/sep, punctuation), largest "
                    f"first, holding ≥ {together} of its attention together, the second ≥ {least}; A+broad: the "
                    f"largest ≥ {WITH_BROAD[0]} and the rest spread (entropy_norm ≥ {WITH_BROAD[1]})")
    words["mixed"] = "none of the rules above holds"
    flags = {flag: f"{key} ≥ {threshold}" for flag, key, threshold in FLAG_RULES}
    flags["degenerate"] = (f"a flag holds and removing the head changes nothing (its zero-ablation interval holds 0, "
                           f"or the effect is under {NEGLIGIBLE:.0%} of the largest head's)")
    flags["sink (trait)"] = (f"a head with another label that also puts ≥ {SINK_HEAD} of its attention on the first "
                             f"token")
    return {"legend": words, "flag_legend": flags, "colours": dict(LABEL_COLOURS), "marks": dict(MARKS),
            "mark_words": dict(MARK_WORDS)}
