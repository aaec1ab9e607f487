"""A chunk read once by all its compiled readers (stats/onepass.py, native.c's ``read_chunk``): held
to the readers' own passes, one after another — the same numbers, to the bit, where the one read
splits the chunk's rows as they do."""

import pytest
import torch

from multihead.analysis.pipelines.analyze import collect_statistics
from multihead.analysis.probes.syntax import parse_with_spacy, spacy_available
from multihead.analysis.stats import native, onepass


def _statistics(model, text, parses, monkeypatch, one_read: bool, views=(0,)):
    calls = []
    real_read = native.read_chunk
    monkeypatch.setattr(native, "read_chunk", lambda *a: (calls.append(len(a[1]) + len(a[2])), real_read(*a))[1])
    if not one_read:
        monkeypatch.setattr(onepass, "read_once", lambda *a, **kw: None)
    with torch.inference_mode():
        texts = text if isinstance(text, list) else [text]
        found = collect_statistics(model, texts, parses=parses, views=list(views), chunk=48, progress=False)
    monkeypatch.undo()
    return found, calls


def _flat(x, path=""):
    """Every tensor and number of a statistics object, by path."""
    if isinstance(x, torch.Tensor):
        yield path, x
    elif isinstance(x, (int, float, str, bool)) or x is None:
        yield path, x
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            yield from _flat(x[k], f"{path}.{k}")
    elif isinstance(x, (list, tuple)):
        for n, v in enumerate(x):
            yield from _flat(v, f"{path}[{n}]")
    elif hasattr(x, "__dict__"):
        for k in sorted(vars(x)):
            if not k.startswith("_") and k not in ("batch", "tokenizer"):
                yield from _flat(getattr(x, k), f"{path}.{k}")


def test_one_read_of_each_chunk_gives_what_each_reader_gives_alone(smollm2, monkeypatch):
    """SmolLM2 on a 600-token text (its page's view pooled, its words parsed) streamed in chunks of 48
    rows: every chunk read once by the row statistics, the pooled view and the syntax words together,
    and every statistic, view and predicted word the same as with each reader reading it alone."""
    if not native.openmp():
        pytest.skip("the compiled readers without OpenMP read each chunk reader by reader")
    if not spacy_available():
        pytest.skip("no spaCy model for the syntax scores")
    sentence = ("The committee said on Tuesday that the new rules, which take effect next year, would cost "
                "the industry about two billion dollars. ")
    text = sentence * 24
    parses = parse_with_spacy([text])
    alone, none = _statistics(smollm2, text, parses, monkeypatch, one_read=False)
    once, calls = _statistics(smollm2, text, parses, monkeypatch, one_read=True)
    assert not none and len(calls) >= 30 and all(n == 2 for n in calls)  # every chunk: the view and the words too
    left, right = dict(_flat(alone)), dict(_flat(once))
    assert left.keys() == right.keys() and len(left) > 50
    for path, want in left.items():
        got = right[path]
        if isinstance(want, torch.Tensor):
            assert torch.equal(want, got) or torch.allclose(want, got, equal_nan=True, rtol=0, atol=0), path
        else:
            assert want == got or (want != want and got != got), path


def test_in_a_batch_of_two_texts_only_the_pages_cell_sums_group_otherwise(smollm2, monkeypatch):
    """Two texts of 601 and 721 tokens in one batch (the shorter padded: its rows end inside a chunk),
    both pooled on the page, both parsed: every number the same as with each reader alone, the page's
    cell sums (float32 sums of the same rows, grouped by the one read's ranges of the batch's rows,
    not the text's own) within 1e-6 relative."""
    if not native.openmp():
        pytest.skip("the compiled readers without OpenMP read each chunk reader by reader")
    if not spacy_available():
        pytest.skip("no spaCy model for the syntax scores")
    sentence = ("The committee said on Tuesday that the new rules, which take effect next year, would cost "
                "the industry about two billion dollars. ")
    texts = [sentence * 24, ("Rome is the capital of Italy, and its river, the Tiber, runs through it. " * 40)]
    parses = parse_with_spacy(texts)
    alone, none = _statistics(smollm2, texts, parses, monkeypatch, one_read=False, views=(0, 1))
    once, calls = _statistics(smollm2, texts, parses, monkeypatch, one_read=True, views=(0, 1))
    assert not none and calls and max(calls) == 4  # both pages' views and both texts' words with the rows
    left, right = dict(_flat(alone)), dict(_flat(once))
    assert left.keys() == right.keys()
    for path, want in left.items():
        got = right[path]
        if isinstance(want, torch.Tensor) and path.endswith(".pooled.mass"):
            assert torch.allclose(want, got, rtol=1e-6, atol=0), path
        elif isinstance(want, torch.Tensor):
            assert torch.equal(want, got) or torch.allclose(want, got, equal_nan=True, rtol=0, atol=0), path
        else:
            assert want == got or (want != want and got != got), path
