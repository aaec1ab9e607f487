"""A chunk read once by all its compiled readers (stats/onepass.py, native.c's ``read_chunk``): held
to the readers' own passes, one after another — the same numbers, to the bit, where the one read
splits the chunk's rows as they do."""

import torch

from conftest import missing, needs_spacy
from multihead.analysis.pipelines.analyze import collect_statistics
from multihead.analysis.probes.syntax import parse_with_spacy
from multihead.analysis.stats import native, onepass

SENTENCE = ("The committee said on Tuesday that the new rules, which take effect next year, would cost "
            "the industry about two billion dollars. ")


def _statistics(model, texts, parses, monkeypatch, one_read: bool, views):
    calls = []
    real_read = native.read_chunk
    monkeypatch.setattr(native, "read_chunk", lambda *a: (calls.append(len(a[1]) + len(a[2])), real_read(*a))[1])
    if not one_read:
        monkeypatch.setattr(onepass, "read_once", lambda *a, **kw: None)
    with torch.inference_mode():
        found = collect_statistics(model, texts, parses=parses, views=list(views), chunk=48, progress=False)
    monkeypatch.undo()
    return found, calls


def _alone_and_once(model, texts, monkeypatch, views):
    """The pass's statistics with each compiled reader reading each chunk alone, then with one read for
    all, and how many pooled views and word passes each one read took — a skip where the readers run
    without OpenMP (each then reads each chunk itself) or spaCy is missing (a failure under CI)."""
    if not native.openmp():
        missing("the compiled readers are not built with OpenMP: each reads each chunk itself",
                "analysis/stats/native.c did not build with OpenMP (gcc with -fopenmp)")
    needs_spacy()
    parses = parse_with_spacy(texts)
    alone, none = _statistics(model, texts, parses, monkeypatch, one_read=False, views=views)
    once, calls = _statistics(model, texts, parses, monkeypatch, one_read=True, views=views)
    assert not none
    return alone, once, calls


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


def _assert_same(alone, once, close: str | None = None) -> dict:
    """Every value of ``once`` equal to ``alone``'s — those at paths ending in ``close`` within 1e-6 relative."""
    left, right = dict(_flat(alone)), dict(_flat(once))
    assert left.keys() == right.keys()
    for path, want in left.items():
        got = right[path]
        if isinstance(want, torch.Tensor) and close is not None and path.endswith(close):
            assert torch.allclose(want, got, rtol=1e-6, atol=0), path
        elif isinstance(want, torch.Tensor):
            assert torch.equal(want, got) or torch.allclose(want, got, equal_nan=True, rtol=0, atol=0), path
        else:
            assert want == got or (want != want and got != got), path
    return left


def test_one_read_of_each_chunk_gives_what_each_reader_gives_alone(smollm2, monkeypatch):
    """SmolLM2 on a 600-token text (its page's view pooled, its words parsed) streamed in chunks of 48
    rows: every chunk read once by the row statistics, the pooled view and the syntax words together,
    and every statistic, view and predicted word the same as with each reader reading it alone."""
    alone, once, calls = _alone_and_once(smollm2, [SENTENCE * 24], monkeypatch, views=(0,))
    assert len(calls) >= 30 and all(n == 2 for n in calls)  # every chunk: the view and the words too
    assert len(_assert_same(alone, once)) > 50


def test_in_a_batch_of_two_texts_only_the_pages_cell_sums_group_otherwise(smollm2, monkeypatch):
    """Two texts of 601 and 721 tokens in one batch (the shorter padded: its rows end inside a chunk),
    both pooled on the page, both parsed: every number the same as with each reader alone, the page's
    cell sums (float32 sums of the same rows, grouped by the one read's ranges of the batch's rows,
    not the text's own) within 1e-6 relative."""
    texts = [SENTENCE * 24, "Rome is the capital of Italy, and its river, the Tiber, runs through it. " * 40]
    alone, once, calls = _alone_and_once(smollm2, texts, monkeypatch, views=(0, 1))
    assert calls and max(calls) == 4  # both pages' views and both texts' words with the rows
    _assert_same(alone, once, close=".pooled.mass")
