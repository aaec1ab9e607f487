"""attn.gemm: a batch of matrix products the threads would share unevenly, one matrix at a time."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from multihead.attn import gemm


@contextlib.contextmanager
def threads(n: int):
    """torch on ``n`` threads within the block (the suite's workers run on one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def operands(n: int, r: int, k: int, m: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, r, k, generator=g, dtype=dtype), torch.randn(n, k, m, generator=g, dtype=dtype)


@pytest.mark.parametrize(("n", "count", "spreads"), [
    (3, 2, True),   # 4 slots for 3 matrices: a thread idle a third of the time
    (1, 2, False),  # one matrix: MKL splits it itself
    (2, 2, False), (4, 2, False),  # even
    (5, 2, False),  # 6 slots for 5: the smaller products split over threads lose more
    (2, 4, True), (6, 4, True), (3, 1, False),
    (3, 8, False),  # 16.8 M multiply-adds over 8 threads: too little a thread
])
def test_a_batch_is_spread_where_whole_matrices_would_leave_threads_idle(n, count, spreads):
    a, b = operands(n, 512, 64, 512)  # 16.8 M multiply-adds a matrix: 4 M a thread on 4
    with threads(count):
        assert gemm.spread(a, b) is spreads


def test_small_half_or_differentiated_products_stay_batched():
    a, b = operands(3, 90, 64, 512)
    with threads(2):
        assert not gemm.spread(a, b)  # 2.9 M multiply-adds, 1.5 M a thread: faster whole on one
        a, b = operands(3, 256, 64, 512)
        assert gemm.spread(a, b)
        assert not gemm.spread(a.bfloat16(), b.bfloat16())  # oneDNN's: it splits its own work
        assert not gemm.spread(a.requires_grad_(), b)
        assert gemm.spread(a.double().detach(), b.double())
        assert not gemm.spread(a.detach(), b[:2])  # batches that do not match: torch.bmm's own error
        with pytest.raises(RuntimeError):
            gemm.bmm(a.detach(), b[:2])


def test_derivatives_go_through_the_batched_product():
    """A forward-mode tangent (a dual tensor does not require grad), functorch's jvp and vmap: the
    products stay torch.bmm (an ``out=`` product takes no derivative), reverse mode as well."""
    a, b = operands(3, 256, 64, 512, dtype=torch.float64)
    ta, tb = operands(3, 256, 64, 512, dtype=torch.float64, seed=1)
    expected = torch.bmm(ta, b) + torch.bmm(a, tb)  # d(a b) = da b + a db
    with threads(2):
        with torch.autograd.forward_ad.dual_level():
            dual = gemm.bmm(torch.autograd.forward_ad.make_dual(a, ta), torch.autograd.forward_ad.make_dual(b, tb))
            tangent = torch.autograd.forward_ad.unpack_dual(dual).tangent
        torch.testing.assert_close(tangent, expected)
        _, jvp = torch.func.jvp(gemm.bmm, (a, b), (ta, tb))
        torch.testing.assert_close(jvp, expected)
        mapped = torch.func.vmap(gemm.bmm)(a[None].expand(2, -1, -1, -1), b[None].expand(2, -1, -1, -1))
        torch.testing.assert_close(mapped[1], torch.bmm(a, b))
        # the math kernel with a tangent on its queries: three key-value heads, products that would spread
        q, k, v = (torch.randn(1, h, 384, 64, generator=torch.Generator().manual_seed(h)) for h in (9, 3, 3))
        dq = torch.randn_like(q)
        with torch.autograd.forward_ad.dual_level(), torch.no_grad():
            out, _ = mh.attention(torch.autograd.forward_ad.make_dual(q, dq), k, v, mh.masks.causal(), backend="math",
                                  need_weights=True)
            assert torch.autograd.forward_ad.unpack_dual(out).tangent is not None
        leaf = a.clone().requires_grad_()
        gemm.bmm(leaf, b).sum().backward()
        torch.testing.assert_close(leaf.grad, b.sum(-1)[:, None, :].expand_as(a))


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 6), r=st.integers(1, 300), k=st.integers(1, 80), m=st.integers(1, 600),
       transposed=st.booleans(), into=st.booleans(), count=st.sampled_from([2, 3, 4]))
def test_bmm_equals_torch_bmm_for_any_shape_and_strides(n, r, k, m, transposed, into, count):
    a, b = operands(n, r, k, m, dtype=torch.float64, seed=r + k)
    if transposed:  # b as the scores' product takes the keys: a transposed view
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
    out = torch.full((n, r, m), float("nan"), dtype=a.dtype) if into else None
    with threads(count), gemm_floor(1):
        got = gemm.bmm(a, b, out=out)
    assert got.shape == (n, r, m)
    if into:
        assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got, torch.bmm(a, b), rtol=1e-12, atol=1e-12)


@contextlib.contextmanager
def gemm_floor(macs: int):
    """:data:`gemm.SPREAD_MACS` set to ``macs`` within the block (every product size taken)."""
    before = gemm.SPREAD_MACS
    gemm.SPREAD_MACS = macs
    try:
        yield
    finally:
        gemm.SPREAD_MACS = before


def test_a_grouped_query_capture_on_two_threads_equals_the_formula_and_one_thread():
    """Three key-value heads (SmolLM2's grouping) and a chunk large enough to spread: the math
    kernel's weights and outputs against the formula in float64, and a half model's against the
    same kernel on one thread (batched products)."""
    g = torch.Generator().manual_seed(3)
    B, H, Hkv, T, D = 1, 9, 3, 384, 64
    q = torch.randn(B, H, T, D, generator=g)
    k, v = torch.randn(B, Hkv, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g)
    mask = mh.masks.causal()
    scores = q.double() @ k.double().repeat_interleave(3, 1).transpose(-1, -2) / D ** 0.5  # (B, H, T, T)
    formula = scores.masked_fill(~mask.materialize(T, T), float("-inf")).softmax(-1)
    half = [t.bfloat16() for t in (q, k, v)]
    with torch.inference_mode():
        with threads(1):
            one_out, one_w = mh.attention(*half, mask, need_weights=True, backend="math")
        with threads(2):
            assert gemm.spread(q.reshape(Hkv, 3 * T, D), k.reshape(Hkv, T, D).transpose(1, 2))
            out, w = mh.attention(q, k, v, mask, need_weights=True, backend="math")
            half_out, half_w = mh.attention(*half, mask, need_weights=True, backend="math")
    torch.testing.assert_close(w.double(), formula, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.double(), formula @ v.double().repeat_interleave(3, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(half_w, one_w, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(half_out, one_out)  # bfloat16's own tolerance
