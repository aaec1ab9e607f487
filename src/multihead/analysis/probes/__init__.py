"""Probes: inputs built to show one behaviour — repeated random tokens (induction), pronouns
(coreference), a needle far back (retrieval) — and the dependency parses syntax is scored against."""

from .coreference import CoreferenceExample, coreference_scores, load_examples
from .induction import induction_scores, repeated_sequences
from .retrieval import retrieval_scores
from .syntax import Parse, parse_with_spacy, read_conllu, spacy_available

__all__ = ["CoreferenceExample", "Parse", "coreference_scores", "induction_scores", "load_examples",
           "parse_with_spacy", "read_conllu", "repeated_sequences", "retrieval_scores", "spacy_available"]
