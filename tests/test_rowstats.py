"""The flash-style row statistics (attn/rowstats.py) against the map formed in float64 and read
row by row: outputs, log-sum-exp, entropy, largest weight, distance, key-set masses, the induction
pattern's mass, distance bins, column sums and weights at pairs — causal or not, padded, grouped
queries, head sizes that are no power of two, half precision. On CUDA where there is a GPU, else
on the CPU in Triton's interpreter."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import triton_kernels

SRC = Path(__file__).resolve().parents[1] / "src"


def targets_of(tokens):
    """(previous, token): the induction targets of texts with no padding (the token before each key)."""
    return torch.cat([torch.full((tokens.shape[0], 1), -1), tokens[:, :-1]], 1), tokens


def reference(q, k, v, *, causal, valid, sets=None, tokens=None, bins=0):
    """Every statistic from the map itself, in float64 (q, k, v as the kernel reads them)."""
    B, H, T, D = q.shape
    group = H // k.shape[1]
    kk, vv = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = q.double() @ kk.transpose(-1, -2) / math.sqrt(D)  # (B, H, T, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = valid[:, None, None, :] & ((j <= i) if causal else torch.ones(T, T, dtype=torch.bool))
    s = s.masked_fill(~seen, -math.inf)
    some = seen.any(-1)  # (B, 1, T) rows that see a key
    p = torch.softmax(s, -1).where(some[..., None], torch.zeros(()))  # (B, H, T, T): zero rows see nothing
    d = (i - j).abs().double()
    out = {"out": p @ vv, "lse": torch.logsumexp(s, -1), "entropy": -(p * p.clamp_min(1e-300).log()).sum(-1),
           "max_weight": p.amax(-1), "distance": (p * d).sum(-1), "p": p}
    if sets is not None:
        out["key_sets"] = torch.stack([(p * f[:, None, None, :]).sum(-1) for f in sets], -1)
    if tokens is not None:
        before = torch.cat([torch.full((B, 1), -1), tokens[:, :-1]], 1)
        target = (before[:, None, :] == tokens[:, :, None]) & (j <= i)  # (B, T, T)
        out["repeat"] = (p * target[:, None]).sum(-1)
    if bins:
        which = torch.where(d == 0, 0, torch.floor(torch.log2(d.clamp_min(1))) + 1).long().clamp_max(bins - 1)
        out["bins"] = torch.stack([(p * (which == b)).sum(-1) for b in range(bins)], -1)
    return out


@st.composite
def cases(draw):
    B = draw(st.integers(1, 2))
    Hkv = draw(st.sampled_from([1, 2]))
    H = Hkv * draw(st.sampled_from([1, 2, 3]))
    T = draw(st.integers(1, 40))
    D = draw(st.sampled_from([8, 16, 24]))
    Dv = draw(st.sampled_from([D, 16]))
    causal = draw(st.booleans())
    padded = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return B, H, Hkv, T, D, Dv, causal, padded, seed


@settings(max_examples=25)  # each a few programs of numpy work in the interpreter
@given(cases())
def test_every_row_statistic_equals_the_map_read_row_by_row(case):
    rowstats, device = triton_kernels()
    B, H, Hkv, T, D, Dv, causal, padded, seed = case
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, T, D, generator=g) * 2, torch.randn(B, Hkv, T, D, generator=g)
    v = torch.randn(B, Hkv, T, Dv, generator=g)
    valid = torch.ones(B, T, dtype=torch.bool)
    if padded:  # right padding: the last text's tokens after its length are no keys
        valid[-1, torch.randint(0, T + 1, (), generator=g):] = False
    sets = torch.rand(3, B, T, generator=g) < 0.3
    tokens = torch.randint(0, 4, (B, T), generator=g)
    want = reference(q, k, v, causal=causal, valid=valid, sets=sets, tokens=tokens, bins=5)
    out, got = rowstats.attention_with_statistics(q.to(device), k.to(device), v.to(device), causal=causal,
                                                  key_valid=valid, key_sets=sets, targets=targets_of(tokens), bins=5)
    assert out.dtype == v.dtype and out.shape == (B, H, T, Dv)
    torch.testing.assert_close(out.cpu().double(), want["out"], atol=1e-5, rtol=1e-5)
    some = want["lse"] > -math.inf
    assert torch.equal(got.lse.cpu() > -math.inf, some)
    torch.testing.assert_close(got.lse.cpu().double()[some], want["lse"][some], atol=1e-5, rtol=1e-5)
    for name in ("entropy", "max_weight", "distance", "key_sets", "repeat", "bins"):
        torch.testing.assert_close(getattr(got, name).cpu().double(), want[name], atol=3e-5, rtol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")
    rows = valid & torch.rand(B, T, generator=g).lt(0.7)  # the rows that count
    columns = rowstats.column_sums(q.to(device), k.to(device), got.lse, causal=causal, key_valid=valid, rows=rows)
    torch.testing.assert_close(columns.cpu().double(), (want["p"] * rows[:, None, :, None]).sum(2),
                               atol=3e-5, rtol=1e-5)
    i = torch.randint(0, T, (12,), generator=g)
    j = torch.randint(-2, T + 2, (12,), generator=g)  # keys outside 0..T-1 weigh 0
    at = rowstats.weights_at(q.to(device), k.to(device), got.lse, i, j, causal=causal, key_valid=valid)
    inside = (j >= 0) & (j < T)
    want_at = want["p"][:, :, i, j.clamp(0, T - 1)] * inside
    torch.testing.assert_close(at.cpu().double(), want_at, atol=1e-6, rtol=1e-5)
    texts = torch.randint(0, B, (5,), generator=g)
    whole = rowstats.rows_at(q.to(device), k.to(device), got.lse, texts, i[:5], causal=causal, key_valid=valid)
    torch.testing.assert_close(whole.cpu().double(), want["p"][texts, :, i[:5]], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_sums_in_float32_what_a_flash_attention_computes(dtype):
    rowstats, device = triton_kernels()
    g = torch.Generator().manual_seed(1)
    B, H, T, D = 1, 4, 33, 32
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(dtype) for _ in range(3))
    # the reference from the same half-precision values: the scores' products are exact in float32
    want = reference(q, k, v, causal=True, valid=torch.ones(B, T, dtype=torch.bool), bins=6)
    out, got = rowstats.attention_with_statistics(q.to(device), k.to(device), v.to(device), causal=True, bins=6)
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu().double(), want["out"], atol=2e-2, rtol=2e-2)  # p rounded to the dtype for P·V
    for name in ("lse", "entropy", "max_weight", "distance", "bins"):
        torch.testing.assert_close(getattr(got, name).cpu().double(), want[name], atol=3e-5, rtol=1e-5)
    assert got.key_sets is None and got.repeat is None


def test_a_row_that_sees_no_key_has_zeros_and_no_nan():
    rowstats, device = triton_kernels()
    B, H, T, D = 2, 2, 20, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1] = False  # the second text has no key at all
    out, got = rowstats.attention_with_statistics(q.to(device), k.to(device), v.to(device), causal=False,
                                                  key_valid=valid, key_sets=valid[None], bins=3)
    assert torch.isinf(got.lse[1]).all() and torch.isfinite(got.lse[0]).all()
    for t in (out, got.entropy, got.max_weight, got.distance, got.key_sets, got.bins):
        assert not t.isnan().any()
        assert (t[1] == 0).all()
    columns = rowstats.column_sums(q.to(device), k.to(device), got.lse, causal=False, key_valid=valid)
    assert not columns.isnan().any() and (columns[1] == 0).all()
    torch.testing.assert_close(columns[0].sum(-1).cpu(), torch.full((H,), float(T)))  # every row's mass is 1


def test_bad_input_is_named():
    rowstats, device = triton_kernels()
    q = torch.randn(1, 3, 8, 16, device=device)
    k = torch.randn(1, 2, 8, 16, device=device)
    with pytest.raises(ValueError, match="cannot share"):
        rowstats.attention_with_statistics(q, k, k, causal=True)
    with pytest.raises(ValueError, match="self-attention"):
        rowstats.attention_with_statistics(q, k[:, :1, :5], k[:, :1, :5], causal=True)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        d = q[:, :1].double()
        rowstats.attention_with_statistics(d, d, d, causal=True)
    with pytest.raises(ValueError, match="key_sets"):
        rowstats.attention_with_statistics(q[:, :2], k, k, causal=True, key_sets=torch.ones(9, 1, 8, dtype=torch.bool))
    if device.type == "cpu":  # the interpreter is on: CUDA tensors are not its to run
        assert not rowstats.available("meta")


@pytest.mark.parametrize("causal", [True, False])
def test_head_metrics_from_the_kernel_equal_the_eager_reader_on_the_map(causal):
    """HeadStatistics' twelve row metrics from the kernel's sums (no map) against the analysis's
    reference reader over the map the capture forms (math kernel, float32)."""
    rowstats, device = triton_kernels()
    from types import SimpleNamespace

    from multihead.analysis.stats.heads import eager_row_values, kernel_key_sets, summary_row_values
    from multihead.attn import attention
    from multihead.inputs import TokenInfo
    from multihead.masks import causal as causal_mask
    from multihead.masks import from_tensor

    g = torch.Generator().manual_seed(3)
    B, H, Hkv, T, D = 3, 4, 2, 37, 16
    q, k, v = torch.randn(B, H, T, D, generator=g) * 2, torch.randn(B, Hkv, T, D, generator=g), \
        torch.randn(B, Hkv, T, D, generator=g)
    lengths = torch.tensor([37, 20, 2])
    valid = torch.arange(T)[None, :] < lengths[:, None]  # (B, T) right padding
    first = torch.zeros(B, T, dtype=torch.bool)
    first[:, 0] = True
    tokens = TokenInfo(valid, first, (torch.rand(B, T, generator=g) < 0.1) & valid,
                       (torch.rand(B, T, generator=g) < 0.2) & valid)
    mask = from_tensor(valid[:, None, None, :])
    if causal:
        mask = causal_mask() & mask
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    _, weights = attention(q, kk, vv, mask, backend="math", need_weights=True)  # (B, H, T, T)
    visible = mask.materialize(T, T)
    want = eager_row_values(SimpleNamespace(weights=weights, visible=visible, start=0), tokens)
    _, found = rowstats.attention_with_statistics(q.to(device), k.to(device), v.to(device), causal=causal,
                                                  key_valid=valid, key_sets=kernel_key_sets(tokens))
    got = summary_row_values(found, q.to(device), k.to(device), tokens.to(device), causal=causal)
    assert got.names == want.names
    torch.testing.assert_close(got.counts.cpu(), want.counts)
    for m, name in enumerate(want.names):  # sums over up to 37 rows of float32 values
        torch.testing.assert_close(got.sums[m].cpu(), want.sums[m], atol=2e-4, rtol=1e-5,
                                   msg=lambda msg, name=name: f"{name}: {msg}")


def test_the_kernels_compile_for_a_hopper_gpu():
    """Triton's compiler builds both kernels for an sm_90 GPU (H100/H200) to machine code, as the
    wrapper launches them with a GPU's tiles (bfloat16 and float32) — here, without a GPU: what the
    interpreter does not check (types across branches, loop-carried shapes, the dot's operand sizes,
    register spills) is caught before a lent GPU's minutes are spent on it. In a process of its own:
    Triton builds its library for the interpreter or for the compiler, once, as it is imported."""
    _, device = triton_kernels()
    if device.type != "cpu":
        pytest.skip("on a GPU the kernels run (the tests above); this compiles them where none is")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9 warns where it is unset (its default changes in 3.10)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("compile_kernels.py"))], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["_rows_kernel", "bfloat16", "_columns_kernel", "bfloat16",
                                   "_rows_kernel", "float32", "_columns_kernel", "float32"]


def test_long_context_metrics_from_the_kernel_equal_the_eager_reader_on_the_map():
    """The long-context reader's row metrics and distance histograms from the kernel's sums against
    its reference over the map, on a text long enough for every window (64, 256, 1,024) and the
    sinks beyond 1,024 tokens: a causal layer of 1,100 tokens and a shorter padded text beside it."""
    rowstats, device = triton_kernels()
    from multihead.analysis.stats.longcontext import BINS, _by_prefix_sums, summary_long_values
    from multihead.inputs import TokenInfo

    g = torch.Generator().manual_seed(5)
    B, H, T, D = 2, 1, 1100, 16
    q, k, v = (torch.randn(B, H, T, D, generator=g) * s for s in (1.0, 0.3, 1.0))  # broad rows: far mass
    q[:, :, :, 0], k[:, :, :4, 0] = 4.0, 3.0  # and sinks: the first four keys stand out
    valid = torch.arange(T)[None, :] < torch.tensor([[T], [700]])  # (B, T) right padding
    none = torch.zeros(B, T, dtype=torch.bool)
    tokens = TokenInfo(valid, none, none, none)
    want = reference(q, k, v, causal=True, valid=valid)["p"].float()  # (B, H, T, T)
    values, hist = _by_prefix_sums(want, valid, tokens.positions[0], 0)
    _, found = rowstats.attention_with_statistics(q.to(device), k.to(device), v.to(device), causal=True,
                                                  key_valid=valid, bins=BINS)
    got_values, got_hist = summary_long_values(found, q.to(device), k.to(device), tokens.to(device), causal=True)
    rows = valid[:, None, :, None]  # the real query rows, as the reducer sums them
    assert (values * rows)[..., 6].abs().sum() > 10 and (values * rows)[..., 7].abs().sum() > 1  # measured, not 0
    torch.testing.assert_close((got_values.cpu() * rows), (values * rows), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close((got_hist.cpu() * rows), (hist * rows), atol=2e-5, rtol=1e-4)


def _tiny_decoder(device):
    """A random two-layer Qwen2 (4 query / 2 key-value heads of 16) with a word-level tokenizer, on
    ``device`` (where the kernels run: the CPU in the interpreter, or CUDA)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    import multihead as mh

    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(200)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", pad_token="w0", eos_token="w1")
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=200, max_position_embeddings=1024)
    return mh.hf.wrap(AutoModelForCausalLM.from_config(config).eval().to(device), tokenizer, name="tiny-qwen2")


def _analysed(monkeypatch, rowstats, model, texts, setting, **options):
    from multihead.analysis.pipelines.analyze import collect_statistics

    calls = []
    kernel = rowstats.attention_with_statistics

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(rowstats, "attention_with_statistics", counted)
    if setting is None:
        monkeypatch.delenv("MULTIHEAD_ROWSTATS", raising=False)
    else:
        monkeypatch.setenv("MULTIHEAD_ROWSTATS", setting)
    found = collect_statistics(model, texts, progress=False, long_context=True, **options)
    monkeypatch.setattr(rowstats, "attention_with_statistics", kernel)
    return found, calls


def _same_head_and_long_metrics(kernels, maps):
    """Every head metric and long-context statistic of the kernels' analysis within 1e-5 of the maps'."""
    for found, reference in ((kernels.heads, maps.heads), (kernels.long, maps.long)):
        for name, value in reference.result().items():
            torch.testing.assert_close(found.result()[name], value, atol=1e-5, rtol=1e-5,
                                       msg=lambda m, name=name: f"{name}: {m}")


def test_an_analysis_through_the_kernels_equals_the_one_through_the_maps(monkeypatch):
    """A document's whole streamed analysis — head metrics, typical texts with the induction
    pattern, long-context statistics, redundancy — with every layer taken as the kernels' row sums
    (MULTIHEAD_ROWSTATS=1) equals the one read from the maps (=0); the default on a CPU keeps to the
    maps (on CUDA, where a GPU runs this, the kernels)."""
    rowstats, device = triton_kernels()
    model = _tiny_decoder(device)
    g = torch.Generator().manual_seed(1)
    text = " ".join(f"w{int(i)}" for i in torch.randint(2, 40, (90,), generator=g))  # words repeat: induction
    kernels, calls = _analysed(monkeypatch, rowstats, model, [text], "1")
    assert len(calls) == 2  # one kernel pass a layer: the whole layer, no map
    maps, none = _analysed(monkeypatch, rowstats, model, [text], "0")
    assert none == []
    _same_head_and_long_metrics(kernels, maps)
    ours, theirs = kernels.typical.metrics, maps.typical.metrics
    assert list(ours) == list(theirs) and "repeat_successor" in list(ours)
    torch.testing.assert_close(ours.value, theirs.value, atol=1e-6, rtol=1e-5)
    assert torch.equal(ours.index, theirs.index)
    torch.testing.assert_close(kernels.redundancy.js_sum, maps.redundancy.js_sum, atol=1e-5, rtol=1e-3)
    torch.testing.assert_close(kernels.redundancy.cos_sum, maps.redundancy.cos_sum, atol=1e-4, rtol=1e-4)
    assert kernels.redundancy.js_count == maps.redundancy.js_count > 0
    _, default = _analysed(monkeypatch, rowstats, model, [text], None)
    assert len(default) == (0 if device.type == "cpu" else 2)  # the maps on a CPU unless asked; on CUDA the kernels


def test_a_padded_batch_goes_through_the_kernels_where_its_mask_is_its_padding(monkeypatch):
    """Texts of different lengths in one batch: transformers gives each layer a mask tensor (the
    causal rule and each text's padding). Where it is exactly that — checked once a forward, one read
    back — the layer goes to the kernels with the padding as its keys: every statistic the same as
    through the maps, a page's view too. A mask that is something else (a sliding window, a bias of
    its own, another batch's padding) keeps to the maps."""
    rowstats, device = triton_kernels()
    from multihead.hf import route

    model = _tiny_decoder(device)
    g = torch.Generator().manual_seed(4)
    texts = [" ".join(f"w{int(i)}" for i in torch.randint(2, 40, (n,), generator=g)) for n in (48, 21, 35)]
    options = {"batch_size": 3, "views": [1]}
    checks = []
    rule_of = route._padding_rule_of
    monkeypatch.setattr(route, "_padding_rule_of", lambda *a: checks.append(1) or rule_of(*a))
    kernels, calls = _analysed(monkeypatch, rowstats, model, texts, "1", **options)
    assert len(calls) == 2 and calls[0][0] == 3  # both layers, the three texts in one pass each
    assert len(checks) == 1  # the mask read once for the forward's two layers
    maps, none = _analysed(monkeypatch, rowstats, model, texts, "0", **options)
    assert none == []
    _same_head_and_long_metrics(kernels, maps)
    torch.testing.assert_close(kernels.typical.metrics.value, maps.typical.metrics.value, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kernels.redundancy.js_sum, maps.redundancy.js_sum, atol=1e-5, rtol=1e-3)
    torch.testing.assert_close(kernels.redundancy.cos_sum, maps.redundancy.cos_sum, atol=1e-4, rtol=1e-4)
    (ours,), (theirs,) = kernels.views.result(), maps.views.result()
    torch.testing.assert_close(ours.maps, theirs.maps, atol=1e-6, rtol=1e-5)

    valid = torch.tensor([[True] * 5 + [False] * 3, [True] * 8])  # (2, 8): the first text right-padded
    earlier = torch.ones(8, 8, dtype=torch.bool).tril()
    causal_mask = valid[:, None, None, :] & earlier  # (2, 1, 8, 8)
    rule = route._padding_rule_of
    assert rule(causal_mask, valid) is True
    assert rule(valid[:, None, None, :].expand(2, 1, 8, 8), valid) is False  # no causal rule: every real key
    additive = torch.zeros(2, 1, 8, 8).masked_fill_(~causal_mask, torch.finfo(torch.float32).min)
    assert rule(additive, valid) is True
    assert rule(additive.masked_fill(~causal_mask, float("-inf")), valid) is True
    assert rule(additive - 1.0, valid) is None  # a bias of its own
    assert rule(causal_mask & ~earlier.tril(-3), valid) is None  # a sliding window
    assert rule(causal_mask, valid.flip(0)) is None  # another batch's padding


def test_the_readers_of_maps_get_them_formed_from_the_sums_and_a_kernel_that_cannot_build_falls_back(monkeypatch):
    """Beside the kernels' readers, those that read maps — a page's view of a text, the syntax
    scores — get each layer's map formed from its Q, K and the rows' lse, chunk by chunk: the same
    views and scores as through the maps, every layer still one kernel pass. A kernel Triton cannot
    build for the GPU leaves the layer — and every later one of that shape — to the maps."""
    rowstats, device = triton_kernels()
    from multihead.analysis.pipelines.analyze import collect_statistics
    from multihead.hf import route

    model = _tiny_decoder(device)
    g = torch.Generator().manual_seed(2)
    texts = [" ".join(f"w{int(i)}" for i in torch.randint(2, 40, (n,), generator=g)) for n in (40, 60)]
    # spaCy's parses where spaCy is (the suite installs it; a GPU machine may lack it: views only there)
    spacy = importlib.util.find_spec("spacy") is not None
    options = {"batch_size": 1, "views": [1], "parses": "spacy" if spacy else None}
    kernels, calls = _analysed(monkeypatch, rowstats, model, texts, "1", **options)
    assert len(calls) == 4  # both texts' two layers
    maps, _ = _analysed(monkeypatch, rowstats, model, texts, "0", **options)
    (ours,), (theirs,) = kernels.views.result(), maps.views.result()
    torch.testing.assert_close(ours.maps, theirs.maps, atol=1e-6, rtol=1e-5)
    if spacy:
        ours, theirs = kernels.syntax.result(), maps.syntax.result()
        assert ours.count == theirs.count and ours.count
        for relation, value in theirs.accuracy.items():  # which word each dependent attends most: the same
            torch.testing.assert_close(ours.accuracy[relation], value)
    for name, value in maps.heads.result().items():
        torch.testing.assert_close(kernels.heads.result()[name], value, atol=1e-5, rtol=1e-5)

    def unbuildable(*args, **kwargs):
        raise rowstats.KernelUnavailableError("_rows_kernel: OutOfResources: shared memory")

    monkeypatch.setattr(rowstats, "attention_with_statistics", unbuildable)
    monkeypatch.setenv("MULTIHEAD_ROWSTATS", "1")
    monkeypatch.setattr(route, "_UNBUILT", set())
    fallen = collect_statistics(model, texts, progress=False, long_context=True, batch_size=1)
    assert len(route._UNBUILT) == 1
    plain, _ = _analysed(monkeypatch, rowstats, model, texts, "0", batch_size=1)
    for name, value in plain.heads.result().items():
        torch.testing.assert_close(fallen.heads.result()[name], value, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_a_summary_forms_its_map_chunk_by_chunk_for_readers_of_maps(causal):
    rowstats, device = triton_kernels()
    from multihead.hf.route import AttentionChunk, LayerSummary, map_chunks

    g = torch.Generator().manual_seed(4)
    B, H, Hkv, T, D = 2, 4, 2, 37, 16
    q, k, v = torch.randn(B, H, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g), \
        torch.randn(B, Hkv, T, D, generator=g)
    want = reference(q, k, v, causal=causal, valid=torch.ones(B, T, dtype=torch.bool))["p"]
    q, k, v = q.to(device), k.to(device), v.to(device)
    out, found = rowstats.attention_with_statistics(q, k, v, causal=causal)
    whole = AttentionChunk(None, 3, 0, T, T, None, out, None, {}, summary=LayerSummary(q, k, None, causal, found, None))
    pieces = list(map_chunks(whole, limit=B * H * T * 4 * 10))  # ten rows a chunk
    assert [(c.start, c.stop, c.weights.shape[-1]) for c in pieces] == [
        (s, min(T, s + 10), min(T, s + 10) if causal else T) for s in range(0, T, 10)]
    assert pieces[-1].last and all(c.layer == 3 for c in pieces)
    for c in pieces:
        K = c.weights.shape[-1]
        torch.testing.assert_close(c.weights.cpu().double(), want[:, :, c.start:c.stop, :K], atol=1e-6, rtol=1e-5)
        assert torch.equal(c.outputs, out[:, :, c.start:c.stop])
        assert torch.equal(c.visible[0, 0].cpu(), want[0, 0, c.start:c.stop, :K] > 0)


def test_what_triton_cannot_build_is_said_as_kernel_unavailable_and_other_errors_pass(monkeypatch):
    rowstats, device = triton_kernels()
    from triton.runtime.errors import OutOfResources

    def failing(error):
        class Kernel:
            def __getitem__(self, grid):
                def run(*args, **constants):
                    raise error

                return run

        return lambda name: Kernel()

    q = torch.randn(1, 2, 16, 16, device=device)
    monkeypatch.setattr(rowstats, "_built", failing(OutOfResources(232448, 101376, "shared memory")))
    with pytest.raises(rowstats.KernelUnavailableError, match="_rows_kernel: OutOfResources"):
        rowstats.attention_with_statistics(q, q, q, causal=True)
    monkeypatch.setattr(rowstats, "_built", failing(ValueError("a launch's own error")))
    with pytest.raises(ValueError, match="own error"):
        rowstats.attention_with_statistics(q, q, q, causal=True)
