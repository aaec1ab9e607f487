"""The chunked kernels (local band, block-sparse, top-k) against the dense math reference."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from multihead import masks
from multihead.attn.plans import plan_chunks
from multihead.masks import split_topk
from test_kernels import naive_attention, rand_qkv


def run(backend, q, k, v, mask, grad, **kwargs):
    for t in (q, k, v):
        t.grad = None
    out, _ = mh.attention(q, k, v, mask, backend=backend, **kwargs)
    out.backward(grad)
    return out.detach(), *(t.grad.clone() for t in (q, k, v))


@st.composite
def long_cases(draw):
    B = draw(st.integers(1, 2))
    Hkv = draw(st.integers(1, 2))
    H = Hkv * draw(st.integers(1, 2))
    T = draw(st.integers(1, 40))
    w = draw(st.integers(0, 45))  # includes window 0 and windows longer than the sequence
    right = draw(st.one_of(st.none(), st.integers(0, 45)))
    kind = draw(st.sampled_from(["window", "causal-window", "window|global", "bigbird", "segments", "blocks",
                                 "window&padding", "topk", "topk&causal", "global-only"]))
    glob = draw(st.lists(st.sampled_from(sorted({0, -1, min(1, T - 1), T // 2})), min_size=1, max_size=3))
    bs = draw(st.sampled_from([1, 3, 4, 8]))
    seed = draw(st.integers(0, 100))
    lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    win = masks.window(w, right)
    mask = {
        "window": win,
        "causal-window": masks.window(w) & masks.causal(),
        "window|global": win | masks.global_tokens(glob),
        "bigbird": masks.window(w, right) | masks.global_tokens(glob) | masks.random_blocks(2, bs, seed=seed),
        "segments": masks.segments(_split(T, seed)),
        "blocks": masks.blocks(bs, torch.rand(T // bs + 1, T // bs + 1, generator=torch.Generator().manual_seed(seed))
                               > 0.6),
        "window&padding": win & masks.padding(lengths),
        "topk": masks.topk(draw(st.integers(1, 8))),
        "topk&causal": masks.topk(draw(st.integers(1, 8))) & masks.causal() & masks.padding(lengths),
        "global-only": masks.global_tokens(glob),
    }[kind]
    return B, H, Hkv, T, kind, mask, seed


def _split(T, seed):
    g = torch.Generator().manual_seed(seed)
    out, left = [], T
    while left:
        n = int(torch.randint(1, left + 1, (1,), generator=g))
        out.append(n)
        left -= n
    return out


@settings(max_examples=80)
@given(long_cases(), st.sampled_from(["float64", "float32"]))
def test_chunked_kernels_match_the_math_reference(case, dtype_name):
    B, H, Hkv, T, kind, mask, seed = case
    dtype = getattr(torch, dtype_name)
    q, k, v = rand_qkv(B, H, Hkv, T, T, 8, 4, dtype, seed=seed, requires_grad=True)
    grad = torch.randn(B, H, T, 4, dtype=dtype)
    want = run("math", q, k, v, mask, grad)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    backends = ["topk"] if kind.startswith("topk") else ["local", "sparse"]
    for backend in backends:
        got = run(backend, q, k, v, mask, grad)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_math_reference_for_topk_keeps_exactly_k():
    q, k, v = rand_qkv(1, 2, 2, 6, 9, 4, 4, torch.float64)
    _, w = mh.attention(q, k, v, masks.topk(3), need_weights=True)
    assert ((w > 0).sum(-1) == 3).all()
    scores = q @ k.transpose(-1, -2) / 2
    keep = masks.topk(3).materialize(6, 9, scores=scores)
    ref, _ = naive_attention(q, k, v, masks.from_tensor(keep))
    torch.testing.assert_close(mh.attention(q, k, v, masks.topk(3))[0], ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("mask", "backend"), [
    (masks.window(5) | masks.global_tokens([0, -1]), "local"),
    (masks.window(3) | masks.random_blocks(1, 8, seed=0), "sparse"),
    (masks.topk(4) & masks.causal(), "topk"),
])
def test_half_precision_with_float32_accumulation(dtype, mask, backend):
    q64, k64, v64 = rand_qkv(2, 4, 2, 50, 50, 16, 16, torch.float64, seed=5)
    grad = torch.randn(2, 4, 50, 16, dtype=torch.float64)
    want = run("math", *(t.clone().requires_grad_(True) for t in (q64, k64, v64)), mask, grad)
    half = [t.to(dtype).requires_grad_(True) for t in (q64, k64, v64)]
    got = run(backend, *half, mask, grad.to(dtype))
    tol = 2e-2 if dtype == torch.float16 else 8e-2
    if backend == "topk":
        # Rounding to 16 bits may swap near-tied keys at the k-th place, so the reference is
        # the math path in the same dtype, which rounds the scores the same way.
        want = [t.double() for t in run("math", *half, mask, grad.to(dtype))]
        got = run(backend, *half, mask, grad.to(dtype))
    for a, b in zip(got, want, strict=True):
        assert a.dtype == dtype and torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("mask", "backend"), [
    (masks.window(20), "local"),
    (masks.window(8) | masks.random_blocks(1, 64, seed=0), "sparse"),
])
def test_half_gradients_where_logits_share_an_offset_are_as_good_as_sdpas(dtype, mask, backend):
    """A head whose queries and keys share a direction has logits offset by ~50 (the softmax does
    not see it; bfloat16's step there is 0.25). The forward's chunks go through fused SDPA, which
    holds its scores in float32; the backward recomputed them rounded to the half dtype — another
    softmax than the forward's: dk 1.5 against torch's 0.08 (bfloat16), 0.11 against 0.012 (float16)."""
    torch.manual_seed(0)
    T, D = 1100, 64
    q, k, v = (torch.randn(1, 2, T, D, dtype=torch.float64) * 0.5 for _ in range(3))
    q[..., 0] += 20
    k[..., 0] += 20
    q, k, v = (t.to(dtype).double() for t in (q, k, v))  # the half inputs, exactly
    grad = torch.randn(1, 2, T, D, dtype=torch.float64)
    truth = run("math", *(t.clone().requires_grad_(True) for t in (q, k, v)), mask, grad)
    keep = mask.materialize(T, T)
    errors = {}
    for name in (backend, "torch"):  # torch's own SDPA in the half dtype: the peer
        half = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
        if name == "torch":
            out = F.scaled_dot_product_attention(*half, attn_mask=keep)
            out.backward(grad.to(dtype))
            got = [out.detach(), *(t.grad for t in half)]
        else:
            got = run(name, *half, mask, grad.to(dtype))
        errors[name] = [float((a.double() - b).abs().max()) for a, b in zip(got, truth, strict=True)]
    for ours, torchs, what in zip(errors[backend], errors["torch"], ("out", "dq", "dk", "dv"), strict=True):
        # within 3x: the chunks' products are half GEMMs (ds rounded to the dtype; dk 1.8-2x torch's here),
        # torch's CPU kernel sums in float32 throughout
        assert ours <= 3 * torchs, (what, errors)


def test_a_learned_bias_gets_its_gradient_from_auto_and_a_chunked_kernel_refuses_it():
    """ALiBi-like slopes learned through a float mask: auto took the chunked kernel for the band
    (S >= 1024) and the slope's gradient was silently None (the kernels' backward differentiates
    q, k, v only); auto now takes a dense kernel, a chunked one named is one line."""
    T = 1100
    q, k, v = rand_qkv(1, 2, 2, T, T, 8, 8, torch.float64, seed=2, requires_grad=True)
    i = torch.arange(T)
    slope = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)

    def learned(extra):
        return masks.from_tensor(-(i[:, None] - i[None, :]).abs().double() * slope) & extra

    grads = {}
    for backend, extra in (("math", masks.window(64)), ("auto", masks.window(64)), ("auto", masks.topk(8)),
                           ("math", masks.topk(8))):
        slope.grad = None
        mh.attention(q, k, v, learned(extra), backend=backend)[0].sum().backward()
        grads[backend, repr(extra)] = slope.grad
    assert grads["auto", repr(masks.window(64))] == pytest.approx(float(grads["math", repr(masks.window(64))]))
    assert grads["auto", repr(masks.topk(8))] == pytest.approx(float(grads["math", repr(masks.topk(8))]))
    for backend in ("local", "sparse"):
        with pytest.raises(ValueError, match="bias takes a gradient"):
            mh.attention(q, k, v, learned(masks.window(64)), backend=backend)
    with torch.no_grad():  # nothing to differentiate: the band's chunked kernel, as before
        assert mh.explain_backend(q, k, v, learned(masks.window(64))).backend == "local"
    fixed = masks.from_tensor(-(i[:, None] - i[None, :]).abs().double() * 0.1) & masks.window(64)
    assert mh.explain_backend(q, k, v, fixed).backend == "local"


@pytest.mark.parametrize("backend", ["local", "sparse", "topk"])
def test_gradcheck_chunked_float64(backend):
    mask = {"local": masks.window(2, 1) | masks.global_tokens([0, -1]),
            "sparse": masks.window(1) | masks.random_blocks(1, 2, seed=3),
            "topk": masks.topk(3) & masks.causal()}[backend]
    q, k, v = rand_qkv(2, 2, 1, 9, 9, 3, 2, torch.float64, seed=1, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: mh.attention(a, b, c, mask, backend=backend)[0], (q, k, v))


def test_fully_masked_rows_in_chunked_kernels_are_zero():
    mask = masks.window(1) & masks.padding([0, 5])  # example 0 has no key at all
    q, k, v = rand_qkv(2, 2, 2, 12, 12, 4, 4, torch.float32, requires_grad=True)
    for backend in ("local", "topk"):
        m = mask if backend == "local" else mask & masks.topk(2)
        out, _ = mh.attention(q, k, v, m, backend=backend)
        assert torch.isfinite(out).all() and (out[0] == 0).all()
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_fused_and_unfused_chunks_together_match_the_math_reference(monkeypatch):
    # Many chunks; in example 1 the rows past its length + window see no key, so those chunks
    # take the unfused path while the rest go through the fused forward.
    from multihead.attn import chunked

    calls = []
    fused = chunked.F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape[2])
        return fused(*args, **kwargs)

    monkeypatch.setattr(chunked.F, "scaled_dot_product_attention", counting)
    mask = masks.window(20, 5) & masks.padding([300, 150])
    q, k, v = rand_qkv(2, 4, 2, 300, 300, 8, 6, torch.float64, seed=3, requires_grad=True)
    grad = torch.randn(2, 4, 300, 6, dtype=torch.float64)
    want = run("math", q, k, v, mask, grad)
    calls.clear()
    got = run("local", q, k, v, mask, grad)
    n_chunks = len(plan_chunks(mask.cover(300, 300), 300, 300, B=2, H=4))
    assert 0 < len(calls) < n_chunks  # both paths were taken
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.slow
def test_dropout_in_chunked_kernel_is_consistent_between_forward_and_backward():
    q, k, v = rand_qkv(1, 2, 2, 30, 30, 4, 4, torch.float64, requires_grad=True)
    mask = masks.window(4)
    torch.manual_seed(0)
    out, _ = mh.attention(q, k, v, mask, backend="local", dropout_p=0.3)
    assert torch.isfinite(out).all()

    def f(a, b, c):
        torch.manual_seed(0)  # the same dropout pattern in every evaluation
        return mh.attention(a, b, c, mask, backend="local", dropout_p=0.3)[0]

    torch.testing.assert_close(f(q, k, v), out)
    assert torch.autograd.gradcheck(f, (q, k, v))


def test_autocast_runs_chunked_and_dense_paths():
    layer = mh.MultiHeadAttention(32, 4)
    x = torch.randn(2, 300, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for mask in (masks.window(8), masks.causal(), masks.topk(4) & masks.causal()):
            y = layer(x, mask=mask)
            assert torch.isfinite(y).all()
            y.float().sum().backward()
    ref = layer(x, mask=masks.window(8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(layer(x, mask=masks.window(8)).float(), ref, atol=0.1, rtol=0.1)


def test_auto_picks_sparse_kernels_from_the_mask_structure():
    q, k, v = (torch.empty(1, 8, 4096, 64, device="meta") for _ in range(3))
    cases = {
        "local": masks.window(256) | masks.global_tokens([0]),
        "sparse": masks.window(64) | masks.global_tokens([0]) | masks.random_blocks(3, 64, seed=0),
        "topk": masks.topk(32) & masks.causal(),
        "sdpa": masks.causal(),
    }
    for want, mask in cases.items():
        choice = mh.explain_backend(q, k, v, mask)
        assert choice.backend == want, str(choice)
        assert choice.reason and choice.rejected
    assert mh.explain_backend(q, k, v, masks.window(256) & masks.causal()).backend == "local"
    assert mh.explain_backend(q, k, v, masks.window(256), need_weights=True).backend == "math"
    assert mh.explain_backend(q[:, :, :64], k[:, :, :64], v[:, :, :64], masks.window(60)).backend == "sdpa"


def test_local_plan_is_linear_in_n():
    cover = masks.window(256).cover(16384, 16384)
    chunks = plan_chunks(cover, 16384, 16384)
    rows = sum(c.rows.stop - c.rows.start for c in chunks)
    assert rows == 16384
    assert max(c.n_keys for c in chunks) <= 256 * 2 + 256  # chunk rows + band, never S


def test_memory_estimate_fails_fast_and_suggests_a_window():
    B, H, T, D = 1, 8, 65536, 16
    q, k, v = (torch.zeros(B, H, T, D) for _ in range(3))
    dense = mh.estimate_memory(q, k, v, need_weights=True)
    assert dense.backend == "math" and dense.bytes > 100 * 2**30
    with pytest.raises(mh.AttentionMemoryError) as info:
        mh.attention(q, k, v, need_weights=True)
    assert "window" in str(info.value) and "GiB" in str(info.value)
    local = mh.estimate_memory(q, k, v, masks.window(256))
    assert local.backend == "local" and local.bytes < 2**30
    meta = [t.to("meta") for t in (q, k, v)]
    assert mh.estimate_memory(*meta, masks.window(256)).bytes == local.bytes


def test_layer_checkpoint_recomputes_attention_with_same_gradients():
    torch.manual_seed(0)
    plain = mh.MultiHeadAttention(16, 4, dropout=0.1)
    ckpt = mh.MultiHeadAttention(16, 4, dropout=0.1, checkpoint=True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 20, 16)
    outs = []
    for layer in (plain, ckpt):
        torch.manual_seed(1)
        y, w = layer(x, mask=masks.causal(), need_weights=True)
        (y.sum() + w.sum()).backward()
        outs.append([y, *(p.grad for p in layer.parameters())])
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b)


def test_topk_refuses_or_and_not():
    with pytest.raises(ValueError, match="combines only with '&'"):
        masks.topk(2) | masks.causal()
    with pytest.raises(ValueError, match="combines only with '&'"):
        ~(masks.topk(2) & masks.causal())
    assert split_topk(masks.topk(4) & masks.causal() & masks.topk(2))[0] == 2
    with pytest.raises(ValueError, match="top-k"):
        mh.attention(*rand_qkv(1, 1, 1, 3, 3, 2, 2, torch.float32), masks.topk(1), backend="sdpa")


@pytest.mark.parametrize(("make", "words"), [
    (lambda: masks.window(-1), "non-negative"),
    (lambda: masks.global_tokens([[0]]), "1-D"),
    (lambda: masks.global_tokens([5]).materialize(4, 4), "out of range"),
    (lambda: masks.segments([3, 0]), "> 0"),
    (lambda: masks.segments([3, 3]).materialize(4, 4), "add up to 6"),
    (lambda: masks.segments([2]).materialize(2, 3), "as many queries as keys"),
    (lambda: masks.blocks(4, torch.ones(1, 1, dtype=torch.bool)).materialize(8, 8), "does not cover"),
    (lambda: masks.blocks(0, torch.ones(1, 1, dtype=torch.bool)), "positive"),
    (lambda: masks.random_blocks(-1, 4), "non-negative"),
    (lambda: masks.topk(0), "positive"),
    (lambda: masks.topk(2).materialize(3, 3), "scores"),
])
def test_bad_long_masks(make, words):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert words in str(info.value)


def test_random_blocks_are_deterministic_for_a_seed():
    a = masks.random_blocks(2, 4, seed=7).materialize(32, 32)
    b = masks.random_blocks(2, 4, seed=7).materialize(32, 32)
    c = masks.random_blocks(2, 4, seed=8).materialize(32, 32)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a.view(8, 4, 8, 4)[:, 0, :, 0].sum(-1) == 2).all()  # two key blocks per query block
