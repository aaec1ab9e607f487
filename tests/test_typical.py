"""Each head's most typical texts of the corpus (multihead.analysis.stats.typical), kept during analyze."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from multihead.analysis.pipelines.analyze import collect_statistics
from multihead.analysis.probes.syntax import Parse
from multihead.analysis.stats.typical import FALLBACK, MEASURES, MIN_TOKENS, TypicalTexts, measure_of

TEXTS = [
    "The cat sat on the mat because it was tired after the long day.",
    "Heads specialise.",  # shorter than MIN_TOKENS: ranked after every longer text
    "Researchers measured every head of the model on a corpus of ordinary sentences.",
    "She gave him the book that her grandmother had written in Paris.",
    "Attention weights are not explanations, but they are evidence of where a head looks.",
    "A dog barked, a door slammed, and the whole street woke up at once.",
    "Numbers like 3.14 and 2.71 appear in many technical papers about constants.",
]


def _top(report, layer, head, measure):
    mine = next(e for e in report.sections.typical.to_dict()["heads"] if (e["layer"], e["head"]) == (layer, head))
    assert mine["measure"] == measure
    return mine["texts"]


@pytest.fixture(scope="module")
def corpus_report(minilm):
    return mh.analyze(minilm, TEXTS, batch_size=3, coreference=False, redundancy=False)


def test_the_corpus_ranking_equals_each_text_analysed_alone(minilm, corpus_report):
    """A text's own means are what analysing it alone reports: the kept top texts are the best of those."""
    alone = [mh.analyze(minilm, [t], coreference=False, redundancy=False) for t in TEXTS]
    tokens = [a.tokens for a in alone]
    for rec in corpus_report.heads:
        measure = measure_of(rec.label)
        kept = _top(corpus_report, rec.layer, rec.head, measure)
        def value(a, rec=rec, measure=measure):
            return sum(a.heads[rec.layer * 12 + rec.head].metrics[m] for m in measure.split("+"))

        want = sorted(range(len(TEXTS)), key=lambda i: (tokens[i] >= MIN_TOKENS, value(alone[i])), reverse=True)[:3]
        assert [i for i, _, _ in kept] == want, (rec.layer, rec.head, measure)
        for i, v, n in kept:
            assert v == pytest.approx(value(alone[i]), abs=1e-4)
            assert n == tokens[i]
    # the short text never beats a long one (six long texts here)
    assert all(1 not in [i for i, _, _ in e["texts"]] for e in corpus_report.sections.typical.to_dict()["heads"])


def test_batching_and_chunking_keep_the_same_texts(minilm, corpus_report):
    labels = {(r.layer, r.head): r.label for r in corpus_report.heads}
    want = corpus_report.sections.typical.to_dict()
    for kwargs in ({"batch_size": 1}, {"batch_size": 7, "redundancy": False, "chunk": 5}):
        kwargs.setdefault("redundancy", False)
        found = collect_statistics(minilm, TEXTS, **kwargs).typical.section(labels, TEXTS).to_dict()
        for a, b in zip(found["heads"], want["heads"], strict=True):
            assert [i for i, _, _ in a["texts"]] == [i for i, _, _ in b["texts"]], (kwargs, a, b)
            assert [v for _, v, _ in a["texts"]] == pytest.approx([v for _, v, _ in b["texts"]], abs=1e-4)


def test_shards_merged_equal_the_whole(minilm, corpus_report):
    """What torch.distributed's ranks do: each keeps its own top texts; merged, they are the corpus's."""
    labels = {(r.layer, r.head): r.label for r in corpus_report.heads}
    whole = collect_statistics(minilm, TEXTS, redundancy=False).typical
    # a shard's texts under their corpus indices: feed the halves through one accumulator each
    halves = []
    for part in (TEXTS[:4], TEXTS[4:]):
        halves.append(collect_statistics(minilm, part, redundancy=False).typical)
    for top in halves[1].metrics.values():  # the second half's texts are 4.. in the corpus
        top.index[top.index >= 0] += 4
    halves[0].merge(halves[1])
    assert halves[0].section(labels, TEXTS) == whole.section(labels, TEXTS)


def test_the_section_names_its_texts_and_survives_json(tmp_path, corpus_report):
    section = corpus_report.sections.typical.to_dict()
    named = {str(i) for e in section["heads"] for i, _, _ in e["texts"]}
    assert set(section["texts"]) == named and all(section["texts"][k] == TEXTS[int(k)] for k in named)
    assert section["measures"]["previous"] == MEASURES["previous"] and section["measures"]["*"] == FALLBACK
    path = tmp_path / "report.json"
    corpus_report.to_json(path)
    assert mh.Report.from_json(path).sections.typical.to_dict() == section


def test_syntax_heads_rank_texts_by_their_relation():
    """Hits on a relation: the text with more dependents found first, a larger share breaking ties."""
    typical = TypicalTexts(1, 2)
    hits = torch.tensor([[1.0, 0.0], [2.0, 1.0], [1.0, 1.0], [0.0, 0.0]])  # (B, H) per text
    count = torch.tensor([2.0, 4.0, 1.0, 0.0])  # text 3 has no such relation: never named
    typical._add_syntax(0, "nsubj", hits, count, [10, 11, 12, 13])
    section = typical.section({(0, 0): "syntactic:nsubj", (0, 1): "syntactic:nsubj"},
                              [f"t{i}" for i in range(14)]).to_dict()
    first, second = section["heads"]
    assert [i for i, _, _ in first["texts"]] == [11, 12, 10]  # 2 hits; then 1 hit of 1 before 1 of 2
    assert first["texts"][0][1:] == [0.5, 4]
    assert [i for i, _, _ in second["texts"][:2]] == [12, 11]  # 1 of 1 before 1 of 4; 0 hits last
    assert 13 not in [i for i, _, _ in second["texts"]]


def _tables(typical):
    return {(group, name): (top.key, top.value, top.count, top.index)
            for group, tops in (("metrics", typical.metrics), ("syntax", typical.syntax)) for name, top in tops.items()}


@pytest.mark.parametrize("at_once", [1, 40, 100, 1 << 18])
def test_a_batchs_layers_offered_at_once_keep_what_a_layer_at_a_time_keeps(at_once, monkeypatch):
    """A batch's per-layer means and syntax hits are offered at its end, runs of consecutive layers
    in one step each (as many as ``OFFER_ELEMENTS`` candidates hold): the tables are those a
    layer-by-layer offer leaves (NaN means, short texts and texts without a dependent among them),
    for every layer, one, or two apart — and a section read before the batch ends names them too."""
    from multihead.analysis.stats import typical as module
    from multihead.analysis.stats.typical import _RANKED

    monkeypatch.setattr(module, "OFFER_ELEMENTS", at_once)

    g = torch.Generator().manual_seed(3)
    L, H, B = 3, 2, 5
    parts = sorted({part for name in _RANKED for part in name.split("+")})
    tokens, texts = torch.tensor([12, 3, 9, 20, 8]), [4, 7, 1, 0, 9]  # text 7 is short
    means = {layer: {p: torch.rand(B, H, generator=g, dtype=torch.float64) for p in parts} for layer in range(L)}
    means[1]["self"][2, 1] = torch.nan  # not counted
    relations = ["amod", "nsubj"]
    count = torch.tensor([[2.0, 0.0, 1.0, 3.0, 0.0], [1.0, 1.0, 0.0, 2.0, 4.0]])  # (R, B): 0, no dependent
    hits = {layer: torch.randint(0, 3, (2, B, H), generator=g).to(torch.float64) for layer in range(L)}

    def fed(layers):
        typical = TypicalTexts(L, H)
        typical._texts_of_batch = (tokens, texts)
        typical._layer_means = {layer: means[layer] for layer in layers}
        typical._layer_hits = {layer: (relations, hits[layer], count) for layer in layers}
        return _tables(typical.result())

    def read_early(layers):  # the section of a batch not ended: its candidates offered first
        typical = TypicalTexts(L, H)
        typical._texts_of_batch = (tokens, texts)
        typical._layer_means = {layer: means[layer] for layer in layers}
        typical._layer_hits = {layer: (relations, hits[layer], count) for layer in layers}
        return typical.section({(layer, 0): "previous" for layer in layers}, [str(i) for i in range(10)]).to_dict()

    def one_at_a_time(layers):
        typical = TypicalTexts(L, H)
        for layer in layers:
            typical._add_metrics(layer, means[layer], tokens, texts)
            typical._add_syntax(layer, relations, hits[layer], count, texts)
        return _tables(typical)

    for layers in (range(L), [1], [0, 2]):
        found, want = fed(layers), one_at_a_time(layers)
        assert found.keys() == want.keys()
        for name in want:
            for a, b in zip(found[name], want[name], strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        early = read_early(layers)
        assert [e["texts"] for e in early["heads"]] and all(e["texts"] for e in early["heads"])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 6))
def test_stacked_tables_keep_what_one_table_per_name_keeps(seed, k, rounds):
    """Every name's top-k of the stacked tables — several names offered at once, in any order, a
    name new in any round, shards merged — is each name's best k candidates by key (never one keyed -inf)."""
    from multihead.analysis.stats.typical import _Tops

    g = torch.Generator().manual_seed(seed)
    L, H, names = 2, 3, ["a", "b", "c", "d"]
    shards = [_Tops(L, H, k), _Tops(L, H, k)]
    seen: dict = {}  # (name, layer, head) -> every candidate (key, value, count, index)
    text = 0
    for r in range(rounds):
        chosen = [n for n in names if torch.rand(1, generator=g) < 0.6] or ["a"]
        layer, N = int(torch.randint(L, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
        key = torch.rand(len(chosen), H, N, generator=g, dtype=torch.float64)
        key[torch.rand(key.shape, generator=g) < 0.2] = -torch.inf  # not present in that text
        value, count = torch.rand(key.shape, generator=g, dtype=torch.float64), torch.randint(1, 9, key.shape)
        index = torch.arange(text, text + N).expand(len(chosen), H, N)
        text += N
        shards[r % 2].offer(chosen, layer, key, value, count, index)
        for i, name in enumerate(chosen):
            for h in range(H):
                seen.setdefault((name, layer, h), []).extend(
                    (float(key[i, h, n]), float(value[i, h, n]), int(count[i, h, n]), int(index[i, h, n]))
                    for n in range(N) if key[i, h, n] > -torch.inf)
    whole = shards[0]
    whole.merge(shards[1])
    assert sorted(whole) == sorted({name for name, _, _ in seen} | set(shards[0]))
    for name in whole:
        top = whole[name]
        for layer in range(L):
            for h in range(H):
                want = sorted(seen.get((name, layer, h), []), reverse=True)[:k]
                kept = [(float(top.key[layer, h, j]), float(top.value[layer, h, j]), int(top.count[layer, h, j]),
                         int(top.index[layer, h, j])) for j in range(k) if top.key[layer, h, j] > -torch.inf]
                assert kept == want


def test_syntax_texts_come_from_the_parses(minilm):
    """With parses, a syntactic head's texts are those where its relation's dependents find their governor."""
    text = "The old man saw the small dog near the river."
    words = ["The", "old", "man", "saw", "the", "small", "dog", "near", "the", "river", "."]
    heads = [2, 2, 3, 3, 6, 6, 3, 3, 9, 7, 3]
    rels = ["det", "amod", "nsubj", "ROOT", "det", "amod", "dobj", "prep", "det", "pobj", "punct"]
    spans, at = [], 0
    for w in words:
        at = text.index(w, at)
        spans.append((at, at + len(w)))
        at += len(w)
    parse = Parse(text, tuple(spans), tuple(heads), tuple(rels))
    corpus = collect_statistics(minilm, [text], parses=[parse], redundancy=False)
    top = corpus.typical.syntax["det"]
    assert set(top.index[top.key > -torch.inf].tolist()) == {0}
    assert set(top.count[top.key > -torch.inf].tolist()) == {3.0}
    # the share kept is the accuracy of that head on the relation (one parsed text: the corpus's)
    acc = corpus.syntax.result().accuracy["det"]
    assert torch.allclose(top.value[..., 0], acc, atol=1e-9)


def test_an_induction_heads_texts_are_those_it_copies_in():
    """The texts' own induction pattern: a repeated token's mass on the token after its earlier occurrence."""
    from multihead.analysis.stats.typical import RepeatKeys, _repeats_followed

    ids = torch.tensor([[5, 6, 7, 5, 6, 0]])  # a b c a b, then padding
    valid = torch.tensor([[True] * 5 + [False]])
    keys = RepeatKeys.of(ids, valid)
    p = torch.zeros(1, 2, 6, 6)
    p[:, :, :, 0] = 1.0  # every row on the first token ...
    p[0, 0, 3] = torch.tensor([0.3, 0.7, 0, 0, 0, 0])  # ... but head 0: the second 'a' on 'b' (after the first 'a')
    p[0, 0, 4] = torch.tensor([0.1, 0.1, 0.8, 0, 0, 0])  # the second 'b' on 'c' (after the first 'b')
    total, rows = _repeats_followed(p, keys, 0)
    assert rows.tolist() == [[2, 2]]  # rows 3 and 4 repeat an earlier token
    assert total[0].tolist() == pytest.approx([0.7 + 0.8, 0.0])
    # the same rows handed over in two chunks, as the streamed capture does
    first, n1 = _repeats_followed(p[:, :, :4, :4], keys, 0)
    second, n2 = _repeats_followed(p[:, :, 4:, :5], keys, 4)
    assert (first + second)[0].tolist() == pytest.approx(total[0].tolist()) and (n1 + n2).tolist() == rows.tolist()
    # two texts: each its own
    keys2 = RepeatKeys.of(torch.cat([ids, ids]), torch.cat([valid, valid]))
    both, rows2 = _repeats_followed(torch.cat([p, p]), keys2, 0)
    torch.testing.assert_close(both, torch.cat([total, total]))
    assert rows2.tolist() == [[2, 2]] * 2
    past = p[..., :2].contiguous()  # keys 0..1: row 4's target (key 2) is past the chunk's last
    assert _repeats_followed(past, keys, 0)[0][0].tolist() == pytest.approx([0.7, 0])


def _brute_targets(ids, valid, start, stop):
    """The definition, over a (B, C, T) mask: key j follows an earlier real occurrence of row i's token."""
    B, T = ids.shape
    i = torch.arange(start, stop)[:, None]
    j = torch.arange(T)[None, :]
    before = torch.cat([ids.new_full((B, 1), -1), ids[:, :-1]], 1)  # (B, T) the token before each key
    real_before = torch.cat([valid.new_zeros(B, 1), valid[:, :-1]], 1) & valid  # (B, T)
    target = (ids[:, start:stop, None] == before[:, None, :]) & real_before[:, None, :] & (j <= i)  # (B, C, T)
    target &= valid[:, start:stop, None]
    return target, target.any(-1)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_the_induction_pattern_is_the_definitions_chunk_by_chunk(data):
    """Each chunk's rows' mass on their targets, from the batch's O(B·T) keys, equals the sum of the
    definition's (text, row, key) targets; its counted rows too (right-padded texts or any mask,
    tokens repeated often, any chunk, keys up to the chunk's last row or all)."""
    from multihead.analysis.stats.typical import RepeatKeys, _repeats_followed

    B, T = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 40))
    vocabulary = data.draw(st.integers(1, 6))
    ids = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, vocabulary - 1), min_size=T, max_size=T),
                                          min_size=B, max_size=B)))
    if data.draw(st.booleans()):  # right-padded, as batches are
        lengths = [T] + [data.draw(st.integers(0, T)) for _ in range(B - 1)]
        valid = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    else:  # any mask: the definition holds for holes too
        valid = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B,
                                                max_size=B)))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, T - 1), max_size=4)))) if T > 1 else []
    causal = data.draw(st.booleans())
    keys = RepeatKeys.of(ids, valid)
    p = torch.rand(B, 2, T, T, generator=torch.Generator().manual_seed(T * B + vocabulary))
    for start, stop in itertools.pairwise([0, *cuts, T]):  # a layer's chunks
        K = stop if causal else T
        chunk = p[:, :, start:stop, :K]
        mass, counted = _repeats_followed(chunk, keys, start)
        target, want_counted = _brute_targets(ids, valid, start, stop)
        want = (chunk * target[:, None, :, :K]).sum((2, 3))  # (B, H)
        torch.testing.assert_close(mass, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(counted, want_counted.sum(-1)[:, None].expand_as(counted))


def test_a_long_documents_induction_pattern_holds_no_targets():
    """20,000 tokens of two kinds: the document has ~10^8 targets (2.4 GB as triples); its keys are
    three (T,) rows, and a chunk's mass is the definition's."""
    from multihead.analysis.stats.typical import RepeatKeys, _repeats_followed

    T = 20_000
    ids = (torch.arange(T) % 7 == 0).long()[None]  # (1, T)
    valid = torch.ones(1, T, dtype=torch.bool)
    keys = RepeatKeys.of(ids, valid)
    assert sum(t.numel() for t in (keys.prev, keys.token, keys.counted)) == 3 * T
    start, stop = 15_000, 15_004
    p = torch.rand(1, 3, stop - start, stop, generator=torch.Generator().manual_seed(0))
    target, counted = _brute_targets(ids, valid, start, stop)
    assert counted.all() and int(target.sum()) > 30_000  # four rows of 2,000-13,000 targets each
    mass, rows = _repeats_followed(p, keys, start)
    torch.testing.assert_close(mass, (p * target[:, None, :, :stop]).sum((2, 3)), rtol=1e-5, atol=1e-3)
    assert rows.tolist() == [[4, 4, 4]]
    empty = RepeatKeys.of(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.bool))
    assert empty.counted.shape == (2, 0)
    padded = RepeatKeys.of(torch.tensor([[3, 4, 3, -100]]), torch.tensor([[True, True, True, False]]))
    assert padded.prev.tolist() == [[-1, 3, 4, -1]] and padded.token.tolist() == [[3, 4, 3, -2]]
    assert padded.counted.tolist() == [[False, False, True, False]]


def test_smollm2_induction_heads_name_texts_with_repeats(smollm2):
    texts = ["The cat sat on the mat and then the cat sat on the mat again, as cats do.",
             "A completely different sentence with no word said twice in it at all.",
             "Paris is the capital of France and Rome is the capital of Italy, said Paris."]
    report = mh.analyze(smollm2, texts, coreference=False, redundancy=False)
    heads = [e for e in report.sections.typical.to_dict()["heads"] if e["measure"] == "repeat_successor"]
    assert heads, "SmolLM2 has induction heads (the probe labels them)"
    for e in heads:  # only texts with a repeated token are named
        assert e["texts"] and {i for i, _, _ in e["texts"]} <= {0, 2}, e
    # and the strongest copies for real: most of a repeated token's attention on what followed it before
    assert max(e["texts"][0][1] for e in heads) > 0.3, heads


def test_a_heads_own_map_is_not_run_on_a_text_too_long_to_keep(minilm, monkeypatch):
    """head_views keeps a head's map on texts of at most HEAD_VIEW_TOKENS tokens: a longer typical
    text (a document) gets no pass of its own — it had cost a 81,590-token run a quarter of its time."""
    from multihead.analysis.pipelines import views
    from multihead.analysis.stats.maps import HEAD_VIEW_TOKENS

    passes = []
    run = views.run_pass
    monkeypatch.setattr(views, "run_pass", lambda *args, **kwargs: (passes.append(1), run(*args, **kwargs))[1])
    long = " ".join(["word"] * (HEAD_VIEW_TOKENS + 20))
    assert views.head_views(minilm, [long], {0: {(0, 1)}}) == {} and passes == []
    found = views.head_views(minilm, [long, "A short one."], {0: {(0, 1)}, 1: {(2, 3)}})
    assert list(found) == [(1, 2, 3)] and passes == [1]
    assert found[(1, 2, 3)].tokens[1] == "a" and found[(1, 2, 3)].index.shape[0] == len(found[(1, 2, 3)].tokens)
