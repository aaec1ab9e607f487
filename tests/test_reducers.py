"""The one reducer protocol: every statistic implements it, streams (chunks of rows give the whole
maps' numbers), never keeps a chunk, and merges shards (what torchrun's ranks do) into the whole."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multihead.analysis.probes.syntax import Parse
from multihead.analysis.stats import REDUCERS, Reducer
from multihead.analysis.stats.cross import CrossStatistics
from multihead.analysis.stats.heads import HeadStatistics
from multihead.analysis.stats.longcontext import LongContextStatistics
from multihead.analysis.stats.maps import HeadMaps, TextViews, WholeMaps
from multihead.analysis.stats.patches import PatchStatistics
from multihead.analysis.stats.redundancy import RedundancyStatistics, _gram
from multihead.analysis.stats.syntax import SyntaxStatistics
from multihead.analysis.stats.typical import TypicalTexts
from multihead.inputs import Batch, TokenInfo
from reducing import chunk as make_chunk
from reducing import feed

L, H, B, T = 2, 3, 3, 10
LENGTHS = [10, 7, 4]
#: "The cat sat on the mat ." — word spans and a parse
TEXT = "The cat sat on the mat ."
WORDS = ((0, 3), (4, 7), (8, 11), (12, 14), (15, 18), (19, 22), (23, 24))
PARSE = Parse(TEXT, WORDS, (1, 2, -1, 2, 5, 3, 2), ("det", "nsubj", "ROOT", "prep", "det", "pobj", "punct"))


class WordTokenizer:
    """Just enough of a tokenizer for the views: each id is a word."""

    is_fast = False
    all_special_ids = (0,)

    def convert_ids_to_tokens(self, ids):
        return [f"w{i}" for i in ids]

    def convert_tokens_to_string(self, tokens):
        return " ".join(tokens)


def _tokens(lengths=LENGTHS, T=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    valid = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    first = torch.zeros_like(valid)
    first[:, 0] = True
    sep = (torch.rand(len(lengths), T, generator=g) < 0.2) & valid & ~first
    punct = (torch.rand(len(lengths), T, generator=g) < 0.2) & valid
    ids = torch.randint(1, 6, (len(lengths), T), generator=g) * valid  # few ids: texts repeat tokens
    return TokenInfo(valid, first, sep, punct, ids)


def _maps(tokens, *, causal=True, layers=L, heads=H, S=None, seed=1):
    """Soft-maxed maps over each text's real keys (causal or not), zero on padding."""
    g = torch.Generator().manual_seed(seed)
    B, T = tokens.valid.shape
    S = T if S is None else S
    visible = tokens.valid[:, None, None, :S] if S == T else torch.ones(B, 1, 1, S, dtype=torch.bool)
    if causal:
        visible = visible & torch.ones(T, S, dtype=torch.bool).tril()[None, None]
    out = []
    for _ in range(layers):
        scores = torch.randn(B, heads, T, S, generator=g) * 3
        out.append(torch.softmax(scores.masked_fill(~visible, float("-inf")), -1).nan_to_num(0.0))
    return out, visible.expand(B, 1, T, S)


def _batch(tokens, texts=None, **extra):
    return Batch(tokens, list(range(tokens.valid.shape[0])) if texts is None else texts, **extra)


def _outputs(seed=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, 4, generator=g) for _ in range(L)]


W_O = torch.randn(5, H * 4, generator=torch.Generator().manual_seed(3))


def _syntax_batch(texts=None):
    """Three copies of the parsed sentence, one word per token, right-padded."""
    tokens = _tokens([7, 7, 7], T=7)
    offsets = [list(WORDS)] * 3
    return _batch(tokens, texts, parses=[PARSE] * 3, offsets=offsets)


def _close(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, equal_nan=True)
    else:
        assert a == b


# each: (make the reducer, make its batch, its maps and feed options, what its result is compared by)
CASES = {
    "HeadStatistics": (lambda: HeadStatistics(L, H), _tokens, {}, lambda r: r.result()),
    "LongContextStatistics": (lambda: LongContextStatistics(L, H), _tokens, {}, lambda r: r.result()),
    "RedundancyStatistics": (lambda: RedundancyStatistics(L, H), _tokens, {"outputs": True},
                             lambda r: {"js": r.result().js(), "cosine": r.cosine()}),
    "SyntaxStatistics": (lambda: SyntaxStatistics(L, H), None, {}, lambda r: r.result().accuracy),
    "TypicalTexts": (lambda: TypicalTexts(L, H), _tokens, {},
                     lambda r: r.result().section({(la, h): "previous" for la in range(L) for h in range(H)},
                                                  [f"t{i}" for i in range(6)]).to_dict()),
    "CrossStatistics": (lambda: CrossStatistics(L, H), "cross", {"causal": False}, lambda r: r.result()),
    "PatchStatistics": (lambda: PatchStatistics(L, H), "patches", {"causal": False}, lambda r: r.result()),
    "TextViews": (lambda: TextViews(L, H, {0: "a", 2: "b c"}, WordTokenizer(), long=6), _tokens, {},
                  lambda r: {f"{v.text}-{k}": getattr(v, k) if k != "pooled" else v.pooled.mass
                             for v in r.result() for k in ("maps", "pooled", "tokens") if getattr(v, k) is not None}),
    "WholeMaps": (lambda: WholeMaps(L, H, [0, 1]), _tokens, {}, lambda r: r.result()),
    "HeadMaps": (lambda: HeadMaps({0: {(0, 1), (1, 0)}, 2: {(1, 1)}}, {0: "a", 2: "b c"}, WordTokenizer(), k=3),
                 _tokens, {}, lambda r: {f"{i}-{la}-{h}-{k}": getattr(v, k) for (i, la, h), v in r.result().items()
                                         for k in ("index", "values")}),
}


def _run(name, rows_per_chunk=None, texts=None, seed=1, reducer=None):
    """One batch of the case's maps (from ``seed``) through ``reducer`` (default: a new one)."""
    make, tokens_of, options, _ = CASES[name]
    reducer = make() if reducer is None else reducer
    causal = options.get("causal", True)
    if tokens_of is None:  # syntax: parsed texts
        batch = _syntax_batch(texts)
        maps, visible = _maps(batch.tokens, seed=seed)
    elif tokens_of == "cross":  # decoder queries (T) over encoder keys (S = 6)
        queries, keys = _tokens(), _tokens([6, 5, 3], T=6, seed=4)
        batch = _batch(queries, texts, keys=keys)
        maps, visible = _maps(queries, causal=False, S=6, seed=seed)
        visible = keys.valid[:, None, None, :].expand(B, 1, T, 6)
    elif tokens_of == "patches":  # [CLS] and a 3 x 3 grid of patches
        tokens = _tokens([10, 10, 10])
        batch = _batch(tokens, texts)
        maps, visible = _maps(tokens, causal=False, seed=seed)
    else:
        batch = _batch(tokens_of(), texts)
        maps, visible = _maps(batch.tokens, causal=causal, seed=seed)
    outputs = _outputs(seed) if options.get("outputs") else None
    return feed(reducer, batch, maps, visible=visible, outputs=outputs, w_o=W_O if outputs else None,
                rows_per_chunk=rows_per_chunk, causal_keys=causal and rows_per_chunk is not None)


def test_every_reducer_implements_the_protocol():
    assert {cls.__name__ for cls in REDUCERS} == set(CASES)
    for cls in REDUCERS:
        assert all(callable(getattr(cls, step, None)) for step in ("begin_batch", "update", "end_batch", "merge",
                                                                  "result")), cls
        assert isinstance(CASES[cls.__name__][0](), Reducer)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("rows", [1, 3, 7])
def test_chunks_of_rows_give_the_whole_maps_result(name, rows):
    whole, streamed = _run(name), _run(name, rows_per_chunk=rows)
    compare = CASES[name][3]
    _close(compare(streamed), compare(whole))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_reducer_keeps_no_chunk(name):
    reducer = _run(name, rows_per_chunk=3)
    kept = [v for v in vars(reducer).values() if isinstance(v, torch.Tensor) and v.dim() == 4
            and v.shape[-2:] == (3, T)]  # a (B, H, c, K) chunk would look like this
    assert kept == []
    for attr in ("_columns", "_per_text", "_maps", "_outputs", "_kept"):  # cross-chunk state is released
        assert not getattr(reducer, attr, None), attr


@pytest.mark.parametrize("name", ["HeadStatistics", "LongContextStatistics", "RedundancyStatistics",
                                  "SyntaxStatistics", "CrossStatistics", "PatchStatistics", "WholeMaps"])
def test_shards_merged_equal_one_pass_over_both(name):
    """Two batches through one reducer, or each through its own and merged (as torchrun's ranks)."""
    compare = CASES[name][3]
    first, second = _run(name, seed=1), _run(name, texts=[3, 4, 5], seed=5)
    first.merge(second)
    both = _run(name, texts=[3, 4, 5], seed=5, reducer=_run(name, seed=1))
    _close(compare(first), compare(both))


def test_the_syntax_tables_per_text_group_add_up_to_the_whole_and_sit_at_each_texts_group():
    """Each batch's hits and offset counts go to its texts' groups (text i in group i % 256) — the
    batches' own, in any order, a group met twice across batches added to — and summed over the
    groups they are the totals the accuracy and the baseline read."""
    from multihead.analysis.stats.bootstrap import GROUPS

    reducer = _run("SyntaxStatistics", texts=[5, GROUPS + 2, 9], seed=1)
    reducer = _run("SyntaxStatistics", texts=[2, 7, 3], seed=5, reducer=reducer, rows_per_chunk=3)
    reducer.result()
    met = {2, 3, 5, 7, 9}
    for key, n in reducer.count.items():
        torch.testing.assert_close(reducer.group_correct[key].sum(0), reducer.correct[key], rtol=0, atol=1e-12)
        torch.testing.assert_close(reducer.group_offset[key].sum(0), reducer.offset_hits[key], rtol=0, atol=1e-12)
        assert float(reducer.group_count[key].sum()) == n
        assert set(reducer.group_count[key].nonzero().flatten().tolist()) == met
        assert set((reducer.group_correct[key].abs().sum((1, 2)) > 0).nonzero().flatten().tolist()) <= met
        # every text holds the same parse: its group counts a third of the first batch's arcs, or two for group 2
        per_text = n / 6
        for g in met:
            assert float(reducer.group_count[key][g]) == per_text * (2 if g == 2 else 1)
    # each text's hits at its own group: texts 5, 6, 9 apart, then 5 and 261 (group 5) together
    apart = _run("SyntaxStatistics", texts=[5, 6, 9], seed=3)
    together = _run("SyntaxStatistics", texts=[5, GROUPS + 5, 9], seed=3)
    apart.result(), together.result()
    assert any(bool(apart.group_correct[key][[5, 6]].any()) for key in apart.count)  # hits to tell apart
    for key in apart.count:
        a, t = apart.group_correct[key], together.group_correct[key]
        torch.testing.assert_close(t[5], a[5] + a[6], rtol=0, atol=0)
        torch.testing.assert_close(t[9], a[9], rtol=0, atol=0)
        assert not t[6].any()


def test_a_syntax_shard_pickles_to_its_tables_bytes():
    """What torchrun's ranks send for the merge (pickled): each relation's tables, not a block shared by all."""
    import pickle

    reducer = _run("SyntaxStatistics", seed=1)
    reducer.result()
    tables = sum(t.numel() * t.element_size() for tables in (reducer.correct, reducer.group_correct,
                                                           reducer.offset_hits, reducer.group_offset,
                                                           reducer.group_count) for t in tables.values())
    assert len(reducer.count) >= 3
    assert len(pickle.dumps(reducer)) < 1.5 * tables


@pytest.mark.parametrize("name", ["HeadStatistics", "LongContextStatistics", "RedundancyStatistics",
                                  "SyntaxStatistics", "TypicalTexts", "TextViews"])
def test_a_layers_chunks_read_nothing_back_from_the_device_they_are_on(name):
    """What a long document's analysis does per chunk stays where the chunk is: on the ``meta``
    device (no values at all) any host read — .item(), bool(), .cpu(), .tolist(), nonzero(), a
    boolean mask's index — raises, as does a statistic kept on another device than its chunks'.
    Every chunk but each layer's last is fed there; a layer's last may bring the layer's results
    home (once per layer), and the batch's end once per batch."""
    make = CASES[name][0]
    reducer = make()
    tokens = _tokens([7, 7, 7], T=7)  # real to the last row: a text's end is its layer's end
    batch = _batch(tokens, parses=[PARSE] * 3, offsets=[list(WORDS)] * 3).to("meta")
    assert batch.host_tokens is tokens  # what is counted once per batch, counted where the tokens were
    maps, visible = _maps(tokens, seed=1)
    outputs = _outputs()
    reducer.begin_batch(batch)
    for layer, weights in enumerate(maps):
        memo: dict = {}
        for start in range(0, 6, 2):  # rows 0..5 of 7: never the layer's last chunk
            stop = start + 2
            reducer.update(make_chunk(weights[:, :, start:stop, :stop].to("meta"), layer=layer, start=start, rows=7,
                                      keys=7, visible=visible[..., start:stop, :stop].to("meta"),
                                      outputs=outputs[layer][:, :, start:stop, :7].to("meta"), w_o=W_O,
                                      call_memo=memo))
    held = [t for t in _tensors(reducer.__dict__) if t.dim() > 0 and t.numel() > 0 and t.device.type == "meta"]
    if name != "SyntaxStatistics":  # (syntax's per-layer state lives in the chunks' call memo)
        assert held, "the reducer keeps its running sums where its chunks are"


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        yield from _tensors(vars(value))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 64), st.integers(1, 5))
def test_the_cosine_gram_from_bands_is_the_full_product(n, x, parts):
    """The cosine's Gram multiplies the blocks on and above the diagonal only, all of one shape (the
    last block overlapping where the parts do not divide n): the full product's numbers (to float32
    rounding), exactly symmetric."""
    from torch.utils._python_dispatch import TorchDispatchMode

    shapes = set()

    class Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.mm.default:
                shapes.add((tuple(args[0].shape), tuple(args[1].shape)))
            return func(*args, **(kwargs or {}))

    unit = torch.randn(n, x, generator=torch.Generator().manual_seed(n * x + parts))
    with Products():
        gram = _gram(unit, parts)
    assert len(shapes) == 1  # one kernel for a GEMM library to build
    assert torch.equal(gram, gram.T)
    torch.testing.assert_close(gram, unit @ unit.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("dtype", "units"), [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True),
                                             (torch.float16, True), (torch.float64, False)])
def test_the_cosine_in_many_steps_is_the_cosine_in_one(dtype, units, monkeypatch):
    """The cosine's block of contributions is filled step by step (a few rows at a time, the last
    step partial, the block and a half model's staging buffer reused): the same sums as one step,
    and as the definition — the mean over rows of the cosine of every two heads' W^O contributions.
    A half model on a CPU with units for its dtype (forced either way here) forms its unit vectors
    and their Gram in that dtype: each step's sums rounded once, so the steps agree to its rounding."""
    import multihead.analysis.stats.redundancy as redundancy

    monkeypatch.setattr(redundancy, "half_units", lambda _: units)
    assert redundancy.gram_dtype(dtype, "cpu") == (dtype if units else torch.float32)
    g = torch.Generator().manual_seed(3)
    B, T, D, Dv = 2, 7, 5, 3
    maps = [torch.softmax(torch.randn(B, H, T, T, generator=g), -1) for _ in range(L)]
    outs = [torch.randn(B, H, T, Dv, generator=g).to(dtype) for _ in range(L)]
    w_o = torch.randn(D, H * Dv, generator=g).to(dtype)
    valid = torch.ones(B, T, dtype=torch.bool)
    none = torch.zeros_like(valid)
    found = {}
    for chunk_elements in (redundancy.COSINE_CHUNK, L * H * D * 4):  # every row in one step; 4 rows a step
        monkeypatch.setattr(redundancy, "COSINE_CHUNK", chunk_elements)
        red = feed(RedundancyStatistics(L, H), TokenInfo(valid, none, none, none), maps, outputs=outs, w_o=w_o,
                   rows_per_chunk=3)
        assert red.cos_count == B * T  # 14 rows: 4 steps of 4, 4, 4, 2
        found[chunk_elements] = red.cosine()
    contributions = torch.stack([torch.einsum("btv,dv->btd", outs[layer][:, h].double(),
                                              w_o.view(D, H, Dv)[:, h].double())
                                 for layer in range(L) for h in range(H)]).flatten(1, 2)  # (N, rows, D)
    unit = contributions / contributions.norm(dim=-1, keepdim=True)
    want = torch.einsum("ard,brd->ab", unit, unit) / (B * T)
    tolerance = 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5
    steps = 2.0 ** -7 if units else 1e-5  # a half Gram's step sums are rounded to the half dtype
    one, many = found.values()
    torch.testing.assert_close(many, one, atol=steps, rtol=steps)
    torch.testing.assert_close(many, want, atol=tolerance, rtol=tolerance)
    assert torch.equal(many, many.T)


@given(N=st.integers(1, 2048), D=st.integers(1, 8192), rows=st.integers(0, 5000))
def test_a_cosine_step_is_whole_vectors_of_rows_within_its_chunk(N, D, rows):
    """The cosine's rows a step: within COSINE_CHUNK elements of contributions (or one row), a
    multiple of 16 where more than 16 fit, never more than the batch's rows — SmolLM2's 270 heads
    of 576 take 96 rows a step, not 107."""
    import multihead.analysis.stats.redundancy as redundancy

    step = redundancy._cosine_step(N, D, rows)
    fit = redundancy.COSINE_CHUNK // (N * D)
    assert step <= rows and (step * N * D <= redundancy.COSINE_CHUNK or step <= 1)
    if rows > fit > 16:
        assert step % 16 == 0 and step > fit - 16
    assert redundancy._cosine_step(270, 576, 1024) == 96


def test_a_half_gram_keeps_the_cosine_within_its_rounding():
    """A bfloat16 model's cosine from a bfloat16 Gram against the float32 Gram of the same
    contributions, on 96 heads of 64 over 300 rows of correlated outputs (some heads near copies of
    others): every mean cosine within 3e-3."""
    import multihead.analysis.stats.redundancy as redundancy

    g = torch.Generator().manual_seed(5)
    L_, H_, T, D, Dv = 8, 12, 150, 64, 16
    shared_part = torch.randn(2, 1, T, Dv, generator=g)
    outs = [(shared_part + 0.5 * torch.randn(2, H_, T, Dv, generator=g)).bfloat16() for _ in range(L_)]
    w_o = (torch.randn(D, H_ * Dv, generator=g) / 8).bfloat16()
    maps = [torch.softmax(torch.randn(2, H_, T, T, generator=g), -1) for _ in range(L_)]
    valid = torch.ones(2, T, dtype=torch.bool)
    none = torch.zeros_like(valid)
    found = []
    for units in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(redundancy, "half_units", lambda _, units=units: units)
            red = feed(RedundancyStatistics(L_, H_), TokenInfo(valid, none, none, none), maps, outputs=outs,
                       w_o=w_o, rows_per_chunk=64)
            found.append(red.cosine())
    wide, half = found
    pairs = ~torch.eye(L_ * H_, dtype=torch.bool)
    assert wide[pairs].abs().max() > 0.3  # correlated heads: cosines of two heads well away from 0
    assert (half - wide).abs().max() < 3e-3


def test_the_cosine_beyond_its_budget_is_the_mean_over_an_even_stride_of_rows(monkeypatch):
    """Where every pair of heads on every row would pass COSINE_BUDGET, the cosine averages over an
    even stride of the batch's real rows (each in the middle of its stride, never the first rows
    alone), as many as the plan counts: exactly the definition's mean over those rows, and the
    report says how many (``rows_cosine``)."""
    import multihead.analysis.stats.redundancy as redundancy
    from multihead.analysis.pipelines.analyze import redundancy_section
    from multihead.analysis.sections import Redundancy

    g = torch.Generator().manual_seed(5)
    B, T, D, Dv = 2, 9, 4, 3
    N = L * H
    monkeypatch.setattr(redundancy, "MIN_COSINE_ROWS", 1)
    monkeypatch.setattr(redundancy, "COSINE_BUDGET", N * N * D * 5)  # 5 of the 18 rows' work
    maps = [torch.softmax(torch.randn(B, H, T, T, generator=g), -1) for _ in range(L)]
    outs = [torch.randn(B, H, T, Dv, generator=g) for _ in range(L)]
    w_o = torch.randn(D, H * Dv, generator=g)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, 6:] = False  # 15 real rows: a stride of 3 keeps the 2nd, 5th, ... (5 rows)
    none = torch.zeros_like(valid)
    red = feed(RedundancyStatistics(L, H), TokenInfo(valid, none, none, none), maps, outputs=outs, w_o=w_o,
               rows_per_chunk=4)
    real = [(b, t) for b in range(B) for t in range(T) if valid[b, t]]
    kept = real[1::3]
    assert red.cos_count == len(kept) == 5
    held, _ = RedundancyStatistics.planned_bytes(L, H, len(real), T, D, Dv)
    assert held == L * H * red.js_count * T * 4 + L * H * len(kept) * Dv * 4  # the plan's rows are the run's
    contributions = torch.stack([torch.stack([outs[layer][b, h, t].double() @ w_o.view(D, H, Dv)[:, h].double().T
                                              for b, t in kept]) for layer in range(L) for h in range(H)])  # (N, r, D)
    unit = contributions / contributions.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(red.cosine(), torch.einsum("ard,brd->ab", unit, unit) / len(kept), atol=1e-5,
                               rtol=1e-5)
    section = redundancy_section(red, H)
    assert (section.rows_js, section.rows_cosine) == (15, 5)
    assert Redundancy.from_dict(section.to_dict()).rows_cosine == 5


def test_the_js_sample_is_as_large_as_the_pass_that_reads_it_affords(monkeypatch):
    """The compiled all-pairs JS (a CPU with the library built) takes 8x the eager blocks' work
    per batch, so 8x the rows where the budget binds — the rows the memory plan counts — and the
    eager budget where the maps are on CUDA or nothing is compiled."""
    import multihead.analysis.stats.redundancy as redundancy
    from multihead.analysis.stats import native

    assert redundancy.js_budget("cuda") == redundancy.JS_BUDGET
    assert redundancy.COMPILED_JS_BUDGET == 8 * redundancy.JS_BUDGET
    L_, H_, B, T = 6, 12, 32, 40  # MiniLM's heads, a batch of 32 sentences of 40 tokens
    g = torch.Generator().manual_seed(0)
    maps = [torch.softmax(torch.randn(B, H_, T, T, generator=g), -1) for _ in range(L_)]
    valid = torch.ones(B, T, dtype=torch.bool)
    none = torch.zeros_like(valid)
    rows = {}
    for compiled in (False, True):
        monkeypatch.setattr(native, "available", lambda compiled=compiled: compiled)
        budget = redundancy.js_budget("cpu")
        assert budget == (redundancy.COMPILED_JS_BUDGET if compiled else redundancy.JS_BUDGET)
        red = feed(RedundancyStatistics(L_, H_), TokenInfo(valid, none, none, none), maps)
        held, _ = RedundancyStatistics.planned_bytes(L_, H_, B * T, T, 384, 32, budget=budget)
        rows[compiled] = red.js_count
        assert held == L_ * H_ * red.js_count * T * 4 + L_ * H_ * B * T * 32 * 4  # the plan's rows are the run's
    # 2,628 pairs x 40 keys a row: the eager budget affords 79 rows of the 1,280, an even stride of 17
    # takes 75; the compiled one affords 638, a stride of 3 takes 427
    assert (rows[False], rows[True]) == (75, 427)


@pytest.mark.parametrize(("n", "rows"), [(23, None), (23, 4), (300, None), (300, 7), (300, 64)])
def test_a_pooled_texts_tables_are_its_maps_top_weights_and_cell_means(n, rows):
    """A chosen text above ``long`` tokens is kept pooled — each row's k largest weights (as bytes)
    and their keys, and per cell of block x block tokens the mean over its query rows of their
    weight in it and the largest single weight — the same whether its chunks come whole or in rows
    (the host's tables written in place, layer by layer), against the whole maps read directly."""
    k, layers = 4, 3
    tokens = _tokens([n, 9], T=n, seed=5)
    views = TextViews(layers, H, {0: "a"}, WordTokenizer(), long=6, top_k=k)
    maps, _ = _maps(tokens, layers=layers, seed=7)  # causal: each chunk's keys may end after its last row
    feed(views, tokens, maps, rows_per_chunk=rows, causal_keys=rows is not None)
    pooled = views.result()[0].pooled
    block, cells = pooled.block, pooled.cells
    assert pooled.k == k and cells * block >= n > (cells - 1) * block and block == (1 if n == 23 else 3)
    for layer in range(layers):
        _assert_pooled_layer(pooled, layer, maps[layer][0, :, :n, :n], k)


def _assert_pooled_layer(pooled, layer, w, k):
    """A pooled view's tables at ``layer`` against the text's whole map there, w (H, n, n)."""
    H, n, block, cells = w.shape[0], w.shape[1], pooled.block, pooled.cells
    per_block = torch.tensor([min(block, n - c * block) for c in range(cells)], dtype=torch.float32)
    top = w.topk(k, dim=-1).values
    assert torch.equal(pooled.values[layer], (top * 255).round().to(torch.uint8))
    assert torch.equal(w.gather(-1, pooled.index[layer].long()), top)  # each kept key holds its weight
    padded = torch.zeros(H, cells * block, cells * block)
    padded[:, :n, :n] = w
    blocks = padded.view(H, cells, block, cells, block)
    torch.testing.assert_close(pooled.mass[layer], blocks.sum(dim=(2, 4)) / per_block.view(1, -1, 1))
    assert torch.equal(pooled.largest[layer], blocks.amax(dim=(2, 4)))


def test_a_pooled_texts_rows_are_counted_once_on_the_first_layer_that_comes():
    """The rows a row block holds (the cells' means divide by them) are counted on the first layer a
    capture hands over — layer 0 or not — and once: a layer streamed again does not count them twice."""
    n, k = 300, 4
    tokens = _tokens([n, 9], T=n, seed=5)
    maps, _ = _maps(tokens, layers=3, seed=7)
    views = TextViews(3, H, {0: "a"}, WordTokenizer(), long=6, top_k=k)
    views.begin_batch(_batch(tokens))
    for layer in (1, 2, 1):  # no layer 0; layer 1 again, in other chunks
        step = 64 if layer == 2 else 45
        for start in range(0, n, step):
            stop = min(n, start + step)
            views.update(make_chunk(maps[layer][:, :, start:stop, :stop], layer=layer, start=start, rows=n, keys=n))
    views.end_batch()
    pooled = views.result()[0].pooled
    for layer in (1, 2):
        _assert_pooled_layer(pooled, layer, maps[layer][0, :, :n, :n], k)
    assert pooled.mass[0].abs().sum() == 0 and pooled.largest[0].abs().sum() == 0  # never streamed


def test_a_long_documents_js_rests_on_js_rows_rows_where_their_memory_allows():
    """A long document is one batch, whose budget affords fewer rows than the JS needs to rank pairs
    (4 of SmolLM2 at 1k-8k tokens): it takes JS_ROWS wherever every head's float32 rows fit
    JS_ROWS_MEMORY, fewer where they do not — never below MIN_JS_ROWS — and a batch of sentences the
    budget's rows as before; the plan holds exactly the rows the run keeps."""
    from multihead.analysis.stats import redundancy
    from multihead.analysis.stats.redundancy import JS_ROWS, JS_ROWS_MEMORY, MIN_JS_ROWS, _row_sample

    budget = redundancy.COMPILED_JS_BUDGET

    def rows(N, R, S):
        return len(range(R)[_row_sample(N, R, S, budget)])

    assert rows(270, 1024, 1024) == rows(270, 4096, 4096) == JS_ROWS  # SmolLM2: 4 by the budget alone
    assert budget // (270 * 271 // 2 * 1024) < MIN_JS_ROWS
    assert rows(270, 8192, 8192) == JS_ROWS_MEMORY // (270 * 8192 * 4) == 30  # the memory's rows
    assert rows(1024, 32768, 32768) == MIN_JS_ROWS  # an 8B model at 32k: 128 MiB a row
    assert rows(270, 20, 20) == 20 and rows(72, 1280, 40) == 427  # short texts: every row, or the budget's
    for N, S in ((270, 8192), (1024, 8192), (336, 4096)):
        kept = rows(N, S, S)
        held, _ = RedundancyStatistics.planned_bytes(1, N, S, S, 64, 64, budget=budget)
        cosine = len(range(S)[redundancy._cosine_sample(N, 64, S)])
        assert held == N * kept * S * 4 + N * cosine * 64 * 4
        assert N * kept * S * 4 <= max(JS_ROWS_MEMORY, N * MIN_JS_ROWS * S * 4)
        # a float64 model's maps are kept in float64 (RedundancyStatistics.update): the plan counts 8 bytes
        held, _ = RedundancyStatistics.planned_bytes(1, N, S, S, 64, 64, element_size=8, budget=budget)
        assert held == N * kept * S * 8 + N * cosine * 64 * 8


@pytest.mark.parametrize("rows", [None, 3, 4])
def test_a_documents_sampled_rows_kept_as_strided_views_equal_the_rows_gathered(rows, monkeypatch):
    """One text's sampled rows at an even stride (a document's JS and cosine samples) are read from
    each chunk as strided views: the same sums as gathering the rows by index, whole or in chunks."""
    from multihead.analysis.stats import redundancy

    monkeypatch.setattr(redundancy, "COSINE_BUDGET", 1)  # an even sample of the rows, not all of them
    monkeypatch.setattr(redundancy, "MIN_COSINE_ROWS", 3)
    monkeypatch.setattr(redundancy, "JS_BUDGET", 1)
    monkeypatch.setattr(redundancy, "COMPILED_JS_BUDGET", 1)
    monkeypatch.setattr(redundancy, "MIN_JS_ROWS", 4)
    monkeypatch.setattr(redundancy, "JS_ROWS", 4)
    tokens = _tokens([T], T=T, seed=3)
    maps, visible = _maps(tokens, seed=4)
    outputs = [o[:1] for o in _outputs(5)]

    def run():
        return feed(RedundancyStatistics(L, H), _batch(tokens), maps, visible=visible, outputs=outputs, w_o=W_O,
                    rows_per_chunk=rows, causal_keys=rows is not None)

    strided = run()
    monkeypatch.setattr(redundancy, "_even_stride", lambda b, i, place: None)
    gathered = run()
    assert 1 < strided.js_count == gathered.js_count < T and 1 < strided.cos_count == gathered.cos_count < T
    assert torch.equal(strided.js(), gathered.js()) and torch.equal(strided.cosine(), gathered.cosine())
    assert torch.isfinite(strided.cosine()).all()
