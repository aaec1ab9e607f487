"""Streaming capture: each layer's maps in chunks of query rows give the same per-head statistics
as whole maps, for any chunk size and padding on either side, and the model's outputs do not change."""

import re

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import multihead as mh
from architectures import build, inputs
from multihead.analysis.pipelines.analyze import collect_statistics
from multihead.analysis.stats.heads import HeadStatistics
from multihead.analysis.stats.longcontext import LongContextStatistics
from multihead.inputs import TokenInfo
from reducing import chunk as make_chunk
from reducing import feed

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


def _tokens(valid):
    B, T = valid.shape
    first = torch.zeros_like(valid)
    first[torch.arange(B), valid.long().argmax(-1)] = True
    g = torch.Generator().manual_seed(3)
    separator = (torch.rand(B, T, generator=g) < 0.2) & valid & ~first
    punctuation = (torch.rand(B, T, generator=g) < 0.2) & valid
    return TokenInfo(valid=valid, first=first, separator=separator, punctuation=punctuation)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("chunk", [1, 3, 7, 12])
def test_chunks_of_rows_give_the_whole_maps_statistics(side, chunk):
    B, H, T = 3, 4, 12
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([12, 9, 5])
    ar = torch.arange(T)
    valid = ar[None] < lengths[:, None] if side == "right" else ar[None] >= (T - lengths)[:, None]  # (B, T)
    visible = (valid[:, None, None, :] & (ar[None, :] <= ar[:, None])[None, None])  # causal over real keys
    scores = torch.randn(B, H, T, T, generator=g) * 3
    maps = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1).nan_to_num(0.0)
    tokens = _tokens(valid)
    whole, parts = HeadStatistics(2, H), HeadStatistics(2, H)
    long_whole, long_parts = LongContextStatistics(2, H), LongContextStatistics(2, H)
    for reducer in (whole, long_whole):
        feed(reducer, tokens, [maps, maps], visible=visible)
    # as the streamed capture hands them over: a causal chunk's keys end at its last row
    for reducer in (parts, long_parts):
        feed(reducer, tokens, [maps, maps], visible=visible, rows_per_chunk=chunk, causal_keys=True)
    for got, want in ((parts, whole), (long_parts, long_whole)):
        for name, value in want.result().items():
            torch.testing.assert_close(got.result()[name], value, atol=1e-6, rtol=1e-6, equal_nan=True, msg=name)
    assert parts._columns == {}  # nothing held once a layer's last rows are in


def test_row_sums_at_any_points_equal_the_whole_prefix_sum():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from multihead.analysis.stats.longcontext import prefix_sums_at

    @settings(max_examples=60, deadline=None)
    @given(st.integers(1, 70), st.integers(1, 5), st.integers(1, 9), st.integers(0, 2**31 - 1))
    def check(K, C, P, seed):
        g = torch.Generator().manual_seed(seed)
        p = torch.rand(2, 3, C, K, generator=g)
        points = torch.randint(0, K, (C, P), generator=g)
        want = p.cumsum(-1).gather(-1, points.expand(2, 3, C, P))
        torch.testing.assert_close(prefix_sums_at(p, points), want, atol=1e-5, rtol=1e-5)

    check()


def test_long_context_prefix_sums_equal_key_by_key_offsets():
    from multihead.analysis.stats.longcontext import _by_offsets, _by_prefix_sums

    T, g = 2100, torch.Generator().manual_seed(1)
    maps = torch.softmax(torch.randn(1, 3, 50, T, generator=g) * 4, -1)  # rows 1,000..1,049 over every key
    valid = torch.ones(1, T, dtype=torch.bool)
    pos = valid.long().cumsum(-1) - 1
    for got, want in zip(_by_prefix_sums(maps, valid, pos, 1000), _by_offsets(maps, valid, pos, 1000), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_rows_past_the_end_are_refused():
    stats = HeadStatistics(1, 1)
    valid = torch.ones(1, 4, dtype=torch.bool)
    rows = torch.full((1, 1, 3, 4), 0.25)
    stats.begin_batch(mh.inputs.Batch(_tokens(valid), [0]))
    with pytest.raises(ValueError, match=r"rows 3\.\.6 of a \(T, T\) map with T = 4"):
        stats.update(make_chunk(rows, start=3, rows=4))


@pytest.mark.parametrize("name", ["bert", "llama (GQA)", "gemma2 (window 4, softcap 1)",
                                  "gemma3 (window 4, local and global layers)", "deepseek-v3 (latent K/V, Dv 6 < Dk 8)",
                                  "t5"])
def test_a_streamed_capture_equals_the_whole_maps_and_leaves_outputs_alone(name):
    model = build(name)
    batch = inputs(name, model)
    tol = 1e-12 if model.dtype == torch.float64 else 2e-6  # float32 (experts): a chunk's products may round apart
    stack = "encoder" if name == "t5" else None
    dense: dict[int, torch.Tensor] = {}
    with mh.hf.AttentionCapture(model, lambda c: dense.__setitem__(c.layer, c.weights), stack=stack), \
            torch.no_grad():
        want = model(**batch).last_hidden_state
    rows: dict[int, list] = {}
    with mh.hf.AttentionCapture(model, lambda c: rows.setdefault(c.layer, []).append((c.start, c.weights)),
                                stack=stack, chunk=3), torch.no_grad():
        got = model(**batch).last_hidden_state
    out_tol = tol if model.dtype == torch.float64 else tol * float(want.abs().max())  # float32: relative
    torch.testing.assert_close(got, want, atol=out_tol, rtol=0)
    for layer, maps in dense.items():
        starts = [start for start, _ in rows[layer]]
        assert starts == list(range(0, maps.shape[2], 3))  # in order, every row once
        S = maps.shape[-1]
        for start, w in rows[layer]:  # keys past the chunk's last visible one are left out: zero in the whole map
            K = w.shape[-1]
            torch.testing.assert_close(w, maps[:, :, start:start + w.shape[2], :K], atol=tol, rtol=0)
            assert not maps[:, :, start:start + w.shape[2], K:].any()
            if name.startswith("llama"):  # causal: a chunk ending at row r reads keys 0..r only
                assert K == min(S, start + 3)


def test_a_run_streams_every_chunk_however_many_a_plans_trace_would_leave_out():
    """A plan's trace (meta) runs a layer's first and last TRACED_EDGE_CHUNKS chunks only; a run
    on real tensors runs every one (once, for a day, it skipped those after the 48th)."""
    from multihead.hf.route import TRACED_EDGE_CHUNKS

    model = build("llama (GQA)")
    batch = inputs("llama (GQA)", model, T=2 * TRACED_EDGE_CHUNKS + 24)  # that many chunks of one row
    with mh.hf.AttentionCapture(model, lambda c: None), torch.no_grad():  # the layer whole
        want = model(**batch).last_hidden_state
    rows: dict[int, list[int]] = {}
    with mh.hf.AttentionCapture(model, lambda c: rows.setdefault(c.layer, []).append(c.start), chunk=1), \
            torch.no_grad():
        got = model(**batch).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)  # float64
    assert rows and all(starts == list(range(2 * TRACED_EDGE_CHUNKS + 24)) for starts in rows.values())


@pytest.mark.parametrize("padded", [False, True])
def test_a_causal_layers_chunks_take_as_many_rows_as_their_own_keys_fit(padded, monkeypatch):
    model = build("llama (GQA)")
    ids = inputs("llama (GQA)", model)["input_ids"][:1].repeat(1, 4)
    # one text of 40 tokens: the causal mask, known by its structure; or two, the second right-padded: the
    # model's mask a tensor, each row's last key read from it
    batch = {"input_ids": ids}
    if padded:
        valid = torch.ones(2, ids.shape[1], dtype=torch.long)
        valid[1, -5:] = 0
        batch = {"input_ids": ids.repeat(2, 1), "attention_mask": valid}
    dense: dict[int, torch.Tensor] = {}
    with mh.hf.AttentionCapture(model, lambda c: dense.__setitem__(c.layer, c.weights)), torch.no_grad():
        want = model(**batch).last_hidden_state
    B, H, T, S = dense[0].shape
    row_bytes = B * H * S * 4  # a row of every key, float32
    # a CPU's bytes for three such rows: fewer than a chunk holds at least, so twice that (and no more)
    assert mh.hf.route.at_least_rows(3 * row_bytes, row_bytes) == 6 * row_bytes
    assert mh.hf.route.at_least_rows(200 * row_bytes, row_bytes) == 200 * row_bytes
    monkeypatch.setattr(mh.hf.route, "CHUNK_BYTES", 3 * row_bytes)
    entries = 6 * S  # a chunk's map: at most B·H·entries float32
    rows: dict[int, list] = {}
    with mh.hf.AttentionCapture(model, lambda c: rows.setdefault(c.layer, []).append((c.start, c.weights)),
                                budget=1), torch.no_grad():
        got = model(**batch).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    for layer, maps in dense.items():
        chunks = rows[layer]
        assert [start for start, _ in chunks] == [0] + [start + w.shape[2] for start, w in chunks[:-1]]
        assert chunks[-1][0] + chunks[-1][1].shape[2] == T  # every row once, in order
        assert chunks[0][1].shape[2] > 6  # the first rows see few keys: more than the six rows of S keys
        assert len(chunks) < -(-T // 6)
        for start, w in chunks:
            c, K = w.shape[2:]
            assert K == start + c and c * K <= entries  # causal: keys 0..its last row, within the budget
            stop = start + c
            assert stop == T or (c + 1) * (stop + 1) > entries  # the widest that fits: one more row would not
            torch.testing.assert_close(w, maps[:, :, start:stop, :K], atol=1e-12, rtol=0)
    # a reader that does not let them grow (the memory plan's trace) and gives its own bytes (which stand):
    # rows of every key, three a chunk
    fixed: list = []
    capture = mh.hf.AttentionCapture(model, lambda c: fixed.append((c.layer, c.start, c.weights.shape[2])), budget=1,
                                     chunk_bytes=3 * row_bytes)
    capture.grow = False
    with capture, torch.no_grad():
        model(**batch)
    assert [(start, c) for layer, start, c in fixed if layer == 0] == [(s, min(3, T - s)) for s in range(0, T, 3)]


@pytest.mark.parametrize("name", ["gemma3 (window 4, local and global layers)", "gpt-oss (sinks)",
                                  "deepseek-v3 (latent K/V, Dv 6 < Dk 8)", "t5"])
def test_grown_chunks_equal_the_whole_maps_on_windows_sinks_latent_keys_and_an_encoder(name, monkeypatch):
    model = build(name)
    batch = inputs(name, model, T=24)  # two texts, one padded: the model's mask a tensor
    stack = "encoder" if name == "t5" else None
    dense: dict[int, torch.Tensor] = {}
    with mh.hf.AttentionCapture(model, lambda c: dense.__setitem__(c.layer, c.weights), stack=stack), \
            torch.no_grad():
        want = model(**batch).last_hidden_state
    B, H, T, S = dense[0].shape
    monkeypatch.setattr(mh.hf.route, "CHUNK_BYTES", 2 * B * H * S * 4)  # two rows of every key (four, the floor)
    rows: dict[int, list] = {}
    with mh.hf.AttentionCapture(model, lambda c: rows.setdefault(c.layer, []).append((c.start, c.weights.clone())),
                                stack=stack, budget=1, transient=True), torch.no_grad():
        got = model(**batch).last_hidden_state
    tol = 1e-12 if model.dtype == torch.float64 else 2e-6  # float32 (experts): a chunk's products may round apart
    out_tol = tol if model.dtype == torch.float64 else tol * float(want.abs().max())
    torch.testing.assert_close(got, want, atol=out_tol, rtol=0)
    for layer, maps in dense.items():
        sizes = [w.shape[2] for _, w in rows[layer]]
        assert sum(sizes) == T
        if name != "t5":  # causal: the first rows see few keys, their chunk more than four rows
            assert sizes[0] > 4
        for start, w in rows[layer]:
            K = w.shape[-1]
            torch.testing.assert_close(w, maps[:, :, start:start + w.shape[2], :K], atol=tol, rtol=0)
            assert not maps[:, :, start:start + w.shape[2], K:].any()


def test_the_widest_chunk_fits_its_keys_on_their_grid():
    from multihead.hf.route import _widest

    def widest(lasts, stop, limit, S=100):
        return _widest(0, stop, len(lasts), S, 1, limit, lambda end: max(lasts[:end]), lambda k: -(-k // 8) * 8)

    causal = list(range(40))  # row i sees keys 0..i
    assert widest(causal, 2, 10_000) == 40  # everything fits: to the end
    end = widest(causal, 2, 100)  # rows x their keys on a grid of 8
    assert end * (-(-end // 8) * 8) <= 100 < (end + 1) * (-(-(end + 1) // 8) * 8)
    assert widest(causal, 12, 100) == 12  # what is asked for does not fit: as asked
    assert widest([-1] * 40, 2, 250) == 2  # rows that see no key: S keys each, no growth
    assert widest(causal, 2, 100) != widest([c + 8 for c in causal], 2, 100)  # the keys, not the rows, decide


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.integers(1, 40), st.integers(1, 30), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_each_rows_last_key_read_once_a_layer_answers_as_the_chunks_rows_evaluated(B, T, S, density, seed):
    from multihead.hf import route
    from multihead.masks import Rows, from_tensor

    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(B, 1, T, S, generator=g) < density  # rows that see nothing among them
    mask = from_tensor(keep)
    lasts = route._row_last_keys(mask, T, S, torch.device("cpu"))
    for start in range(T):
        last_key = route._running_last(lasts, start, S)
        for end in range(start + 1, T + 1):
            assert last_key(end) == route._last_key(Rows(mask, start, T, S), end, torch.device("cpu"))


def test_each_rows_last_key_is_read_in_blocks_of_rows_when_rows_are_long():
    from multihead.hf import route
    from multihead.masks import from_tensor

    T, S = 70, 100_000  # blocks of 20 rows
    keep = torch.zeros(1, 1, T, S, dtype=torch.bool)
    for i in range(T):
        keep[0, 0, i, :1000 * i + 5] = True
    keep[0, 0, 33] = False  # a row that sees nothing
    want = torch.tensor([1000 * i + 4 for i in range(T)])
    want[33] = -1
    assert torch.equal(route._row_last_keys(from_tensor(keep), T, S, torch.device("cpu")), want)


def test_a_transient_capture_lends_one_set_of_buffers_to_every_streamed_layer_until_released():
    model = build("llama (GQA)")
    batch = inputs("llama (GQA)", model)
    dense: dict[int, torch.Tensor] = {}
    with mh.hf.AttentionCapture(model, lambda c: dense.__setitem__(c.layer, c.weights)), torch.no_grad():
        want = model(**batch).last_hidden_state
    copies: dict[int, list] = {}
    storage: set[int] = set()

    def keep(c):  # a transient reader copies what it keeps
        copies.setdefault(c.layer, []).append((c.start, c.weights.clone()))
        storage.add(c.weights.untyped_storage().data_ptr())

    capture = mh.hf.AttentionCapture(model, keep, chunk=3, transient=True)
    with capture, torch.no_grad():
        got = model(**batch).last_hidden_state
        assert len(dense) > 1 and capture.workspace is not None  # held after the forward, for the next one
        lent = capture.workspace
        model(**batch)
        assert capture.workspace is lent
        capture.release()
        assert capture.workspace is None
        model(**batch)
        assert capture.workspace is not None and capture.workspace is not lent  # made again
    assert capture.workspace is None  # let go with the capture
    assert len(storage) == 2  # every chunk of every layer in one buffer — and one more after the release
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    for layer, maps in dense.items():
        for start, w in copies[layer][:len(copies[layer]) // 3]:
            torch.testing.assert_close(w, maps[:, :, start:start + w.shape[2], :w.shape[-1]], atol=1e-12, rtol=0)


def test_a_transient_cpu_capture_gives_the_heaps_free_pages_back_after_each_streamed_layer_paced(monkeypatch):
    from multihead.attn import heap
    from multihead.hf import route

    given: list[int] = []
    monkeypatch.setattr(heap, "give_back_freed", lambda: given.append(1))
    ticks = iter(range(10**6))  # a clock a second later at every look: every layer's give-back is due
    monkeypatch.setattr(route, "PacedGiveBack", lambda: heap.PacedGiveBack(clock=lambda: float(next(ticks))))
    model = build("llama (GQA)")
    batch = inputs("llama (GQA)", model)
    layers = model.config.num_hidden_layers
    with mh.hf.AttentionCapture(model, lambda c: None, chunk=3, transient=True) as capture, torch.no_grad():
        model(**batch)
        assert len(given) == layers  # after each layer's chunks, before the rest of its block
        assert capture.give_back is not None and capture.give_back.given == layers

    monkeypatch.setattr(route, "PacedGiveBack", lambda: heap.PacedGiveBack(clock=lambda: 0.0))  # time stands still
    with mh.hf.AttentionCapture(model, lambda c: None, chunk=3, transient=True), torch.no_grad():
        model(**batch)
    assert len(given) == layers  # paced: none within its interval
    # a reader that keeps its chunks gets no lent buffers, so no give-backs: fresh blocks every chunk
    with mh.hf.AttentionCapture(model, lambda c: None, chunk=3), torch.no_grad():
        model(**batch)
    assert len(given) == layers


def test_buffers_lent_under_inference_mode_are_remade_for_a_forward_outside_it():
    model = build("llama (GQA)")
    batch = inputs("llama (GQA)", model)
    maps: list[torch.Tensor] = []
    capture = mh.hf.AttentionCapture(model, lambda c: maps.append(c.weights.clone()), chunk=3, transient=True)
    with capture:
        with torch.inference_mode():  # the buffers are inference tensors
            want = model(**batch).last_hidden_state.clone()
        first = len(maps)
        with torch.no_grad():  # writing them here would raise; they are made again
            got = model(**batch).last_hidden_state
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert len(maps) == 2 * first and all(torch.equal(a, b) for a, b in zip(maps[:first], maps[first:], strict=True))


@pytest.mark.slow
def test_streamed_analysis_of_minilm_equals_the_dense_one(minilm):
    texts = ["The animal didn't cross the street because it was too tired.", "Heads look.",
             "A longer sentence about how every head of a model looks at the words around it."]
    from multihead.analysis.probes.syntax import parse_with_spacy, spacy_available

    parses = parse_with_spacy(texts) if spacy_available() else None
    dense = collect_statistics(minilm, texts, batch_size=2, parses=parses)
    for chunk in (1, 5, 64):  # every reducer streams: the same numbers from chunks of rows
        streamed = collect_statistics(minilm, texts, batch_size=2, parses=parses, chunk=chunk)
        for name, value in dense.heads.result().items():
            torch.testing.assert_close(streamed.heads.result()[name], value, atol=1e-5, rtol=1e-5, equal_nan=True,
                                       msg=name)
        red, want = streamed.redundancy.result(), dense.redundancy.result()
        torch.testing.assert_close(red.js(), want.js(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(red.cosine(), want.cosine(), atol=1e-6, rtol=1e-5)
        if parses is not None:
            got, ref = streamed.syntax.result(), dense.syntax.result()
            assert got.count == ref.count and got.baseline == ref.baseline
            for rel, acc in ref.accuracy.items():
                torch.testing.assert_close(got.accuracy[rel], acc, atol=0, rtol=0, msg=rel)


@pytest.mark.slow
def test_cli_document_streams_one_long_text(tmp_path, capsys):
    from conftest import run_cli

    doc = tmp_path / "doc.txt"
    doc.write_text("The first paragraph says one thing.\n\nThe second says another, at some length.\n" * 40)
    code, out, err = run_cli(["analyze", "--file", str(doc), "--document", "--truncate", "--syntax", "off",
                              "--no-coreference", "--ablation", "0", "--out", str(tmp_path / "r")], capsys)
    assert code == 0 and "layer |" in out, err
    assert re.search(r"1 text cut to the model's 512 positions \(text 1: [\d,]+ tokens, [\d,]+ dropped\)", err), err
    assert "Long context (512 tokens, streamed where a layer's map passes 24 MiB):" in out and "attention sinks" in out
    import json

    report = json.loads((tmp_path / "r" / "report.json").read_text())
    sections = report["sections"]
    assert report["sentences"] == 1 and report["tokens"] == 512 and "redundancy" in sections  # streamed too
    assert sections["long_context"] == {"longest_tokens": 512, "budget_bytes": 24 << 20}
    head = report["heads"][0]["metrics"]
    assert 0 <= head["sink_first"] <= head["sink_first4"] <= 1 and head["window_1024"] == pytest.approx(1.0)
    assert head["long_1024"] == 0 and head["distance_median"] <= head["distance_p90"] <= 512
    page = (tmp_path / "r" / "report.html").read_text()
    assert 'class="mh-page"' in page and "The first paragraph says one thing" in page  # the document's own page
    for args, words in ((["--document", "x"], "--document reads one --file"),):
        code, _, err = run_cli(["analyze", *args, "--out", str(tmp_path / "bad")], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def _long_maps(T: int) -> torch.Tensor:
    """(1, 3, T, T): a sink-only head, a head at a fixed offset of 300 (itself before that), a local ±1 head."""
    maps = torch.zeros(1, 3, T, T)
    rows = torch.arange(T)
    maps[0, 0, :, 0] = 1.0
    maps[0, 1, rows, torch.where(rows >= 300, rows - 300, rows)] = 1.0
    maps[0, 2] = (((rows[:, None] - rows[None, :]).abs() <= 1) & (rows[None, :] <= rows[:, None])).float()
    return maps / maps.sum(-1, keepdim=True)


@pytest.mark.parametrize("chunk", [100, 1200])
def test_long_context_metrics_on_heads_with_known_answers(chunk):
    T = 1200
    maps = _long_maps(T)
    tokens = _tokens(torch.ones(1, T, dtype=torch.bool))
    stats = feed(LongContextStatistics(1, 3), tokens, [maps], rows_per_chunk=chunk)
    m = {k: v[0].tolist() for k, v in stats.result().items()}
    far = (T - 300) / T  # rows that reach back 300 tokens
    # rows 0 and 300 of the offset head land on token 0; the local head's row 0 wholly, row 1 half
    assert m["sink_first"] == pytest.approx([1.0, 2 / T, 1.5 / T], abs=1e-9)
    assert m["sink_first4"][0] == pytest.approx(1.0)
    assert m["long_256"] == pytest.approx([(T - 257) / T, far, 0.0], abs=1e-6)  # the sink head: rows past 256
    assert m["long_1024"] == pytest.approx([(T - 1025) / T, 0.0, 0.0], abs=1e-6)
    assert m["long_1024_past_sinks"] == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)  # the far mass is the sink's
    assert m["window_256"] == pytest.approx([257 / T, 1 - far, 1.0], abs=1e-6)
    assert m["window_1024"] == pytest.approx([1025 / T, 1.0, 1.0], abs=1e-6)
    assert m["distance_median"][1] == 512 and m["distance_p90"][1] == 512  # 300 lies in [256, 512)
    # the local head: 600.5 of 1,200 rows' mass on the token itself (d = 0), the rest at d = 1
    assert m["distance_median"][2] == 0 and m["distance_p90"][2] == 2
    assert m["distance_median"][0] == 1024 and m["distance_p90"][0] == 2048  # the sink: d = i, up to 1,199


# --- what a window would do: replace_attention and what-if ---------------------------------------


def _tiny_lm(name="llama (GQA)"):
    from transformers import AutoModelForCausalLM

    model = build(name)
    lm = AutoModelForCausalLM.from_config(model.config).to(torch.float64).eval()
    lm.base_model.load_state_dict(model.state_dict())
    return lm


@pytest.mark.parametrize("name", ["llama (GQA)", "gemma2 (window 4, softcap 1)"])
def test_a_window_wider_than_the_text_changes_nothing_and_a_narrow_one_is_obeyed(name):
    lm = _tiny_lm(name)
    batch = inputs(name, lm)
    with torch.no_grad():
        eager = lm(**batch).logits
        with mh.hf.HeadGates(lm):  # the same route through our attention, with nothing changed
            want = lm(**batch).logits
        with mh.hf.replace_attention(lm, mh.masks.window(64) | mh.masks.global_tokens([0])):
            wide = lm(**batch).logits
        seen = {}
        with mh.hf.replace_attention(lm, mh.masks.window(1, 0), layers=[1]), \
                mh.hf.AttentionCapture(lm, lambda c: seen.__setitem__(c.layer, c.weights)):
            narrow = lm(**batch).logits
    torch.testing.assert_close(wide, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(wide, eager, atol=1e-5 * float(eager.abs().max()), rtol=0)  # eager soft-maxes in fp32
    assert not torch.allclose(narrow, want)
    T = want.shape[1]
    far = torch.ones(T, T, dtype=torch.bool).tril(-2)  # keys more than one token back
    assert seen[1][..., far].abs().max() == 0 and seen[0][..., far].abs().max() > 0  # only layer 1 replaced
    assert lm.config._attn_implementation == "eager"


def test_what_if_reports_the_loss_change_overall_and_per_layer(tmp_path):
    from architectures import ARCHITECTURES  # noqa: F401 - the same tiny models
    from test_architectures import _word_tokenizer

    lm = _tiny_lm()
    tok = _word_tokenizer(lm.config.vocab_size)
    hf = mh.hf.HFModel(lm, tok, "tiny-llama", tmp_path, True, 2, 4, 2, 128)
    text = " ".join(f"w{3 + (i * 7) % 100}" for i in range(40))
    same = mh.analysis.what_if(hf, [text], "window=64,sinks=4")
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0, :-1]
    want = float(torch.nn.functional.cross_entropy(logits, ids[0, 1:]))
    assert same.loss == pytest.approx(want, rel=1e-9) and same.tokens == ids.shape[1] - 1
    # the eager intact run soft-maxes in float32, the replaced runs are float64 throughout
    assert same.replaced == pytest.approx(same.loss, rel=1e-6) and all(x == pytest.approx(same.loss, rel=1e-6)
                                                                        for x in same.per_layer)
    narrow = mh.analysis.what_if(hf, [text], "window=2")
    assert narrow.replaced != pytest.approx(narrow.loss) and len(narrow.per_layer) == 2
    section = narrow.section()
    assert "every layer" in mh.render.what_if_text(section)
    # a window that changes nothing prints +0.0000, not the -0.0000 of a rounding's sign
    from multihead.analysis.sections import WhatIf

    unchanged = mh.render.what_if_text(WhatIf("window=64", 39, 4.5, 4.5 - 2e-7, -2e-7, [-3e-6, 1e-7]))
    assert "-0.0000" not in unchanged and unchanged.count("+0.0000") == 3, unchanged
    assert section.delta_all_layers == narrow.replaced - narrow.loss
    for bad in ("window=abc", "sinks=4", "window=256,frobs=2"):
        with pytest.raises(ValueError, match="window"):
            mh.analysis.what_if(hf, [text], bad)


def test_what_if_on_single_token_texts_is_refused_before_any_pass(smollm2, tmp_path, capsys, monkeypatch):
    """One-token texts give a causal LM no token to predict: the what-if's losses were 0.0000 over 0
    tokens, shown as measured. It is refused in one line, asked of the tokenizer before the pass
    (exit 2, nothing written); texts of which one has two tokens are measured on that one."""
    import importlib

    from conftest import run_cli

    pipeline = importlib.import_module("multihead.analysis.pipelines.analyze")  # the module, not the function
    with pytest.raises(ValueError, match="every text is a single token; give texts of two tokens or more"):
        mh.analysis.what_if(smollm2, ["hello", "world"], "window=4", per_layer=False)
    with pytest.raises(ValueError, match="got none"):
        mh.analysis.what_if(smollm2, [], "window=4", per_layer=False)
    found = mh.analysis.what_if(smollm2, ["hello there", "world"], "window=4", per_layer=False)
    assert found.tokens == 1 and found.loss > 0
    # its forwards said as they go (a long text's 32 of them ran minutes without a line)
    from multihead import progress

    with monkeypatch.context() as patched:
        patched.setattr(progress, "HOLD", 0.0)
        progress.set_enabled(True, terminal=False)
        capsys.readouterr()
        try:
            again = mh.analysis.what_if(smollm2, ["hello there"], "window=4", per_layer=False, progress=True)
        finally:
            progress.set_enabled(False)
    assert (again.loss, again.replaced) == (found.loss, found.replaced)
    said = capsys.readouterr().err.splitlines()
    assert said[0] == "multihead: what if: the loss: 2 forwards …" and said[-1].startswith("multihead: what if: the "
                                                                                         "loss: done in"), said
    passes = []
    monkeypatch.setattr(pipeline, "collect_statistics", lambda *a, **k: passes.append(1))
    with pytest.raises(ValueError, match="single token"):
        mh.analyze(smollm2, ["hello", "world"], what_if="window=4", progress=False)
    assert not passes
    code, _, err = run_cli(["analyze", "--model", "smollm2", "hello", "world", "--what-if", "window=4", "--out",
                            str(tmp_path / "o")], capsys)
    assert code == 2 and "two tokens or more" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_cli_what_if_is_checked_before_anything_runs(tmp_path, capsys):
    from conftest import run_cli

    code, _, err = run_cli(["analyze", "hi", "--what-if", "window=big", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "--what-if" in err and "window=256,sinks=4" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_retrieval_counts_only_copy_steps_that_point_at_the_source():
    from multihead.analysis.probes.retrieval import retrieval_from_argmax

    source = torch.tensor([10, 11, 12, 13])
    copied = torch.tensor([True, True, False, True])
    top = torch.tensor([[[10, 11, 12, 13],  # a perfect retrieval head: 3 of the 3 copy steps
                         [10, 0, 12, 0]],  # right twice, once on a step the model did not copy
                        [[9, 10, 11, 12],  # one token off (an induction-style head): never the source
                         [10, 11, 12, 99]]])  # (L=2, H=2, N=4)
    assert retrieval_from_argmax(top, source, copied).tolist() == [[3, 1], [0, 2]]


def test_a_model_that_never_copies_the_needle_has_its_retrieval_called_unmeasured_not_none():
    """A random-weight decoder never copies the needle: every head's score is 0 of 0 copy steps (NaN),
    which the summary once printed as "retrieval heads: none"."""
    from types import SimpleNamespace

    from multihead.analysis.sections import LongContext, Retrieval
    from multihead.render.text import _long_context

    heads = [SimpleNamespace(layer=0, head=h, metrics={"sink_first": 0.1, "retrieval": float("nan")})
             for h in range(2)]
    for copied, want in ((0, "not measured, the model copied the needle on none of the probe's 60 steps"),
                         (51, "retrieval heads (copy a needle from far back): none")):
        report = SimpleNamespace(heads=heads, sections=SimpleNamespace(
            long_context=LongContext(1334, 24 << 20), retrieval=Retrieval(4, 600, 0.1, 0, copied, 60)))
        assert want in _long_context(report)


@pytest.mark.slow
def test_smollm2_has_retrieval_heads(smollm2):
    from multihead.analysis.probes.retrieval import retrieval_scores

    found = retrieval_scores(smollm2, trials=2, haystack=300)
    assert found.steps == 2 * 15 and found.copy_steps >= 10  # SmolLM2 copies a random needle
    assert found.score.shape == (30, 9) and float(found.score.max()) > 0.5
    assert float(found.score[:8].max()) < 0.5  # the early layers do not fetch from far back


# --- the page of a long text: block-pooled maps and each row's largest weights, streamed -----------


def test_pooled_maps_of_chunks_equal_block_pooling_of_the_whole_map():
    from multihead.analysis.stats.maps import pooled_maps

    g = torch.Generator().manual_seed(4)
    H, T, block = 3, 50, 8
    cells = -(-T // block)
    maps = torch.softmax(torch.randn(H, T, T, generator=g) * 3, -1).tril()  # causal-looking, rows need not sum to 1
    mass, big, rows = torch.zeros(H, cells, cells), torch.zeros(H, cells, cells), torch.zeros(cells)
    for start in range(0, T, 7):
        stop = min(T, start + 7)
        m, b, r = pooled_maps(maps[:, start:stop, :stop], start, block, cells)  # keys cut as the capture cuts them
        mass, big, rows = mass + m, torch.maximum(big, b), rows + r
    padded = torch.zeros(H, cells * block, cells * block)
    padded[:, :T, :T] = maps
    blocks = padded.view(H, cells, block, cells, block)
    torch.testing.assert_close(mass, blocks.sum(dim=(2, 4)))
    torch.testing.assert_close(big, blocks.amax(dim=(2, 4)))
    assert rows.tolist() == [8.0] * 6 + [2.0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 90), st.integers(1, 20), st.integers(1, 12),
       st.sampled_from(["random", "sparse", "ties"]), st.integers(0, 2**31 - 1))
def test_top_weights_from_key_blocks_are_the_rows_k_largest(H, c, K, block, k, kind, seed):
    from multihead.analysis.stats.maps import key_blocks, top_weights

    g = torch.Generator().manual_seed(seed)
    w = torch.rand(H, c, K, generator=g)
    if kind == "sparse":  # a causal chunk's rows: most keys exactly 0
        w = w * (torch.rand(H, c, K, generator=g) < 0.1)
    elif kind == "ties":  # bytes' worth of distinct values: many equal weights
        w = (w * 4).round() / 4
    k = min(k, K)
    sums, maxima = key_blocks(w, block)
    padded = torch.zeros(H, c, -(-K // block) * block)
    padded[..., :K] = w
    torch.testing.assert_close(sums, padded.unflatten(-1, (-1, block)).sum(-1))
    torch.testing.assert_close(maxima, padded.unflatten(-1, (-1, block)).amax(-1))
    top, where = top_weights(w, k, maxima, block)
    torch.testing.assert_close(top, w.topk(k, dim=-1).values)  # the same values, largest first
    assert bool((where < K).all()) and torch.equal(w.gather(-1, where), top)  # each at a key that holds it
    assert all(len(set(row)) == k for row in where.reshape(-1, k).tolist())  # k different keys


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 300), st.integers(1, 70), st.integers(0, 2**31 - 1))
def test_pooled_blocks_from_fine_blocks_equal_the_blocks_read_directly(H, c, K, block, seed):
    from multihead.analysis.stats.maps import FINE_BLOCK, _coarser, _fine_block, key_blocks

    w = torch.rand(H, c, K, generator=torch.Generator().manual_seed(seed))
    fine = _fine_block(block)
    assert block % fine == 0 and (fine == block or FINE_BLOCK // 2 <= fine <= FINE_BLOCK)
    sums, maxima = _coarser(*key_blocks(w, fine), block // fine)
    want_sums, want_maxima = key_blocks(w, block)
    torch.testing.assert_close(sums, want_sums)
    assert torch.equal(maxima, want_maxima)


@pytest.mark.slow
def test_a_long_texts_page_entry_holds_its_real_top_weights_and_block_masses(smollm2):
    import base64
    import gzip

    import numpy as np

    from multihead.analysis.pipelines.views import text_views
    from multihead.analysis.stats.maps import LONG_TEXT
    from multihead.render.page import page_data

    text = " ".join(f"Sentence {n} says that the heads of a model look at different words." for n in range(60))
    entry = page_data(text_views(smollm2, [text], chunk=100))["sentences"][0]
    tokens, maps = mh.viz.attention_maps(smollm2, text)  # (L, H, T, T), the dense reference
    L, H, T = maps.shape[:3]
    assert T > LONG_TEXT and entry["tokens"] == tokens

    def unpack(field, dtype):
        return np.frombuffer(gzip.decompress(base64.b64decode(field)), dtype=dtype)

    k = entry["k"]
    index = torch.from_numpy(unpack(entry["index"], "<u2").astype(np.int64)).view(L, H, T, k)
    values = torch.from_numpy(unpack(entry["values"], np.uint8).copy()).view(L, H, T, k).float() / 255
    top = maps.topk(k, dim=-1).values  # (L, H, T, k)
    stored = maps.gather(-1, index)  # the true weights of the stored keys
    torch.testing.assert_close(values, stored, atol=0.5 / 255 + 1e-5, rtol=0)  # a byte (of a chunked map)
    torch.testing.assert_close(stored.sort(-1).values, top.sort(-1).values, atol=1e-6, rtol=0)  # the k largest
    pool = entry["pooled"]
    block, cells = pool["block"], pool["cells"]
    padded = torch.zeros(L, H, cells * block, cells * block)
    padded[..., :T, :T] = maps
    blocks = padded.view(L, H, cells, block, cells, block)
    rows = torch.full((cells,), float(block))
    rows[-1] = T - block * (cells - 1)
    want_mass = blocks.sum(dim=(3, 5)) / rows.view(cells, 1)  # each block's mean row mass
    scale = torch.tensor(pool["mass_scale"]).view(L, H, 1, 1)
    mass = (torch.from_numpy(unpack(pool["mass"], np.uint8).copy()).view(L, H, cells, cells).float() / 255) ** 2
    torch.testing.assert_close(mass * scale, want_mass, atol=float(scale.max()) / 255 + 1e-6, rtol=0)
    largest = (torch.from_numpy(unpack(pool["max"], np.uint8).copy()).view(L, H, cells, cells).float() / 255) ** 2
    torch.testing.assert_close(largest, blocks.amax(dim=(3, 5)), atol=1 / 255 + 1e-6, rtol=0)


def test_a_pass_keeps_the_objects_alive_before_it_out_of_its_garbage_collections(minilm):
    """The model's modules and the imports wait in the permanent generation while a pass runs (a
    full collection over them cost 0.24 s), and come back to the collector when it ends; inside a
    command's own frozen body, a pass freezes what is alive at its start too, let go with the body;
    a process that froze objects itself keeps them as it had them."""
    import gc

    from multihead.analysis.pipelines.common import encode_corpus, run_pass, text_batches
    from multihead.analysis.stats.base import ReducerBase
    from multihead.collector import old_objects_frozen

    class Watch(ReducerBase):
        def __init__(self):
            self.frozen: list[int] = []

        def update(self, chunk):
            self.frozen.append(gc.get_freeze_count())

    texts = ["The cat sat on the mat.", "Heads look at different words."]
    batches = lambda: text_batches(minilm, encode_corpus(minilm, texts), range(2), 2)  # noqa: E731
    assert gc.get_freeze_count() == 0
    watch = Watch()
    run_pass(minilm, batches(), [watch], progress=False)
    assert len(watch.frozen) == 6 and min(watch.frozen) > 100_000  # every layer's chunk: the model and imports
    assert gc.get_freeze_count() == 0  # given back
    with old_objects_frozen():
        before = gc.get_freeze_count()
        made = [[n] for n in range(10_000)]  # alive when the pass starts: frozen with it
        watch = Watch()
        run_pass(minilm, batches(), [watch], progress=False)
        assert min(watch.frozen) >= before + len(made) and gc.get_freeze_count() > before + len(made) - 1000
    assert gc.get_freeze_count() == 0  # the outermost body let everything go
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        watch = Watch()
        run_pass(minilm, batches(), [watch], progress=False)
        # nothing more frozen (objects freed leave the permanent generation), nothing let go
        assert max(watch.frozen) <= mine and mine - 1000 < gc.get_freeze_count() <= mine
    finally:
        gc.unfreeze()


def test_a_pass_gives_its_free_heap_back_before_the_reducers_end_of_batch_work(minilm, monkeypatch):
    """The free holes a batch's pass leaves in the C heap go back before the reducers' end-of-batch
    work, whose blocks would otherwise be mapped beside them (SmolLM2 float32 at 1k tokens: 24-60 MiB,
    a peak 25 % above its tensors), and again after it, for the next batch; a reducer's chunks come
    before either."""
    from multihead.analysis.pipelines import common
    from multihead.analysis.stats.base import ReducerBase

    calls: list[str] = []
    monkeypatch.setattr(common, "return_freed_memory", lambda: calls.append("given back"))

    class Watch(ReducerBase):
        def begin_batch(self, batch):
            calls.append("begin")

        def update(self, chunk):
            if calls[-1] != "chunk":
                calls.append("chunk")

        def end_batch(self):
            calls.append("end")

    texts = ["The cat sat on the mat.", "Heads look at different words.", "A third text."]
    batches = common.text_batches(minilm, common.encode_corpus(minilm, texts), range(3), 2)
    common.run_pass(minilm, batches, [Watch()], progress=False)
    assert calls == ["begin", "chunk", "given back", "end", "given back"] * 2


def test_an_ablation_its_texts_are_too_long_for_is_said_before_the_pass(minilm, monkeypatch, capsys):
    """`--ablation 2` on a 3,848-token document: accepted, then skipped; the user learned it from the
    report after a 10-minute run. Said in a line before the pass now (the report says it too)."""
    import importlib

    from multihead import progress

    pipeline = importlib.import_module("multihead.analysis.pipelines.analyze")
    monkeypatch.setattr(pipeline, "LONG_TEXT", 8)  # the texts below pass it
    monkeypatch.setattr(progress, "HOLD", 0.0)
    progress.set_enabled(True, terminal=False)
    try:
        report = mh.analyze(minilm, ["the cat sat on the mat and looked at the dog"], ablation=1, coreference=False,
                            views=(), progress=True)
    finally:
        progress.set_enabled(False)
    said = capsys.readouterr().err.splitlines()
    note = next(i for i, line in enumerate(said) if "ablation: skipped — the ablated texts reach" in line)
    assert note < next(i for i, line in enumerate(said) if "analyze: 1 batch" in line), said
    assert report.sections.ablation.skipped.startswith("the ablated texts reach")
