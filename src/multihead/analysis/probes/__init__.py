"""Probes: inputs built to show one behaviour — repeated random tokens (induction), pronouns
(coreference), a needle far back (retrieval) — and the dependency parses syntax is scored against."""

from typing import TYPE_CHECKING

from ...lazy import lazy_names

__all__ = ["CoreferenceExample", "Parse", "coreference_scores", "induction_scores", "load_examples",
           "parse_with_spacy", "read_conllu", "repeated_sequences", "retrieval_scores", "spacy_available"]

if TYPE_CHECKING:  # at run time the names come from __getattr__, each module imported on first use
    from .coreference import CoreferenceExample, coreference_scores, load_examples
    from .induction import induction_scores, repeated_sequences
    from .retrieval import retrieval_scores
    from .syntax import Parse, parse_with_spacy, read_conllu, spacy_available

#: Public name -> its module (imported on first use: a light module of the package loads no torch)
_NAMES = {
    **dict.fromkeys(("CoreferenceExample", "coreference_scores", "load_examples"), ".coreference"),
    **dict.fromkeys(("induction_scores", "repeated_sequences"), ".induction"),
    **dict.fromkeys(("retrieval_scores",), ".retrieval"),
    **dict.fromkeys(("Parse", "parse_with_spacy", "read_conllu", "spacy_available"), ".syntax"),
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
