import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from conftest import compiled_softmax, mask_cases, masking_case
from multihead import masks
from multihead.attn.cpu_trace import traced_as_cpu
from multihead.attn.memory import LiveBytes

HALF = (torch.float16, torch.bfloat16)


def naive_attention(q, k, v, mask, scale=None):
    """Attention written from the formula in float64, independent of the library's kernels."""
    _B, H, T, Dk = q.shape
    S = k.shape[2]
    scale = 1 / math.sqrt(Dk) if scale is None else scale
    group = H // k.shape[1]
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    scores = q.double() @ k.transpose(-1, -2) * scale
    if mask is not None:
        bias = mask.bias(T, S, dtype=torch.float64)
        if bias is not None:
            scores = scores + bias
        scores = scores.masked_fill(~mask.materialize(T, S), float("-inf"))
    weights = torch.nan_to_num(scores.softmax(-1), nan=0.0)
    return weights @ v, weights


def rand_qkv(B, H, Hkv, T, S, Dk, Dv, dtype, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dk, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, Hkv, S, Dk, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, Hkv, S, Dv, generator=g, dtype=torch.float64).to(dtype)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


@st.composite
def configs(draw):
    B = draw(st.integers(1, 3))
    Hkv = draw(st.integers(1, 3))
    H = Hkv * draw(st.integers(1, 3))
    T = draw(st.integers(1, 9))
    S = draw(st.integers(1, 9))
    Dk = draw(st.sampled_from([1, 4, 8]))
    Dv = draw(st.sampled_from([Dk, 3]))
    kind, mask = draw(mask_cases(B, H, T, S))
    return B, H, Hkv, T, S, Dk, Dv, kind, mask


@settings(max_examples=60)
@given(configs(), st.sampled_from([torch.float32, torch.float64]))
def test_math_matches_the_formula(cfg, dtype):
    B, H, Hkv, T, S, Dk, Dv, _, mask = cfg
    q, k, v = rand_qkv(B, H, Hkv, T, S, Dk, Dv, dtype)
    out, w = mh.attention(q, k, v, mask, backend="math", need_weights=True)
    ref_out, ref_w = naive_attention(q, k, v, mask)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out.double(), ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(w.double(), ref_w, atol=tol, rtol=tol)
    assert out.shape == (B, H, T, Dv) and w.shape == (B, H, T, S)


@settings(max_examples=60)
@given(configs(), st.sampled_from([torch.float32, torch.float64]))
def test_sdpa_matches_math_forward_and_backward(cfg, dtype):
    B, H, Hkv, T, S, Dk, Dv, _, mask = cfg
    tol = 2e-5 if dtype == torch.float32 else 1e-10
    results = []
    for backend in ("math", "sdpa"):
        q, k, v = rand_qkv(B, H, Hkv, T, S, Dk, Dv, dtype, requires_grad=True)
        out, _ = mh.attention(q, k, v, mask, backend=backend)
        out.backward(torch.ones_like(out).cos())
        results.append((out, q.grad, k.grad, v.grad))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("Hkv", [1, 2, 4])
def test_gqa_matches_torch_enable_gqa(Hkv):
    q, k, v = rand_qkv(2, 4, Hkv, 7, 9, 8, 8, torch.float32)
    keep = masks.padding([9, 4]).materialize(7, 9)
    if "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or ""):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    else:  # torch < 2.5: the same heads, each key/value head repeated for its group of query heads
        k_all, v_all = (t.repeat_interleave(4 // Hkv, dim=1) for t in (k, v))  # (B, H, S, D)
        want = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=keep)
    for backend in ("math", "sdpa", "auto"):
        got, _ = mh.attention(q, k, v, masks.padding([9, 4]), backend=backend)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_causal_fast_path_matches_explicit_mask():
    q, k, v = rand_qkv(1, 2, 2, 6, 6, 4, 4, torch.float64)
    fast, _ = mh.attention(q, k, v, masks.causal(), backend="sdpa")
    dense, _ = mh.attention(q, k, v, masks.from_tensor(torch.ones(6, 6, dtype=torch.bool).tril()), backend="math")
    torch.testing.assert_close(fast, dense)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_fully_masked_rows_are_zero_not_nan(dtype, backend):
    q, k, v = rand_qkv(2, 2, 2, 5, 4, 8, 8, dtype, requires_grad=True)
    keep = torch.ones(2, 1, 5, 4, dtype=torch.bool)
    keep[0, :, 1] = False  # query 1 of example 0 sees nothing
    keep[1, :, :, :] = False  # example 1 sees nothing at all
    out, w = mh.attention(q, k, v, keep, backend=backend, need_weights=backend == "math")
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    assert (out[0, :, 1] == 0).all() and (out[1] == 0).all()
    assert out[0, :, 0].abs().sum() > 0
    if w is not None:
        assert torch.isfinite(w).all() and (w[0, :, 1] == 0).all() and (w[1] == 0).all()
        torch.testing.assert_close(w[0, :, 0].float().sum(-1), torch.ones(2), atol=1e-2, rtol=0)
    out.float().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (k.grad[1] == 0).all() and (q.grad[1] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
def test_huge_negative_float_mask_does_not_overflow_half(dtype, backend):
    q, k, v = rand_qkv(1, 2, 2, 4, 4, 8, 8, dtype)
    bias = torch.zeros(4, 4)
    bias[:, 2:] = -1e9  # a classic additive mask: -1e9 overflows float16
    out, _ = mh.attention(q, k, v, bias, backend=backend)
    ref, _ = naive_attention(q, k, v, masks.from_tensor(bias.double()))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_half_scores_are_rounded_as_the_eager_path_rounds_them(dtype, head_dim):
    """transformers' eager attention: (q @ kᵀ) * scale in the half dtype — the product rounded, then
    its scaling (a second rounding when the scale is no power of two: head dims 80, 128) — and the
    softmax in float32. The math kernel (on a CPU with half units a half product, as eager's; without
    them a float32 product of the half operands, rounded) gives the same weights; rounding once only
    moved a quarter of the scores by a step."""
    g = torch.Generator().manual_seed(head_dim)
    q, k, v = (torch.randn(2, 4, 64, head_dim, generator=g).to(dtype) for _ in range(3))
    eager = torch.softmax((q @ k.transpose(-1, -2)) * head_dim ** -0.5, -1, dtype=torch.float32).to(dtype)
    _, w = mh.attention(q, k, v, None, backend="math", need_weights=True)
    moved = (w.float() - eager.float()).abs()
    assert float((moved > 0).float().mean()) < 0.01 and float(moved.max()) <= 2 * torch.finfo(dtype).eps


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("units", [True, False])
def test_half_products_padded_to_the_key_grid_change_nothing(dtype, units, monkeypatch):
    """On a CPU with half units the half products run over keys padded to a multiple of KEY_GRID
    (a few oneDNN shapes for every chunk): zero keys whose scores are dropped and zero weights. The
    weights are the unpadded ones bit for bit; the outputs and gradients (P·V summed over more zero
    terms) within a unit in the last place of the dtype. Without half units nothing is padded. (The
    eager steps after the product, with and without a graph: the compiled softmax, which a pass
    without a graph takes where it is built, is held to them below.)"""
    from multihead.attn import fused, precision

    monkeypatch.setattr(precision, "half_units", lambda dt: units)
    monkeypatch.setattr(fused, "available", lambda: False)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 6, 300, 80, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, 300, 80, generator=g).to(dtype) for _ in range(2))
    grids = (precision.KEY_GRID, 1)  # padded to 512 keys; not padded
    found = {}
    for grid in grids:
        monkeypatch.setattr(precision, "KEY_GRID", grid)
        assert precision.key_grid(q, 300) == (512 if units and grid > 1 else 300)
        a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
        out, w = mh.attention(a, b, c, masks.causal(), backend="math", need_weights=True)
        (out.float().square().sum() + w.float().mul(torch.arange(300.0)).sum()).backward()
        with torch.inference_mode():  # the in-place path, no graph
            still, weights = mh.attention(q, k, v, masks.causal(), backend="math", need_weights=True)
        assert torch.equal(weights, w) and torch.equal(still, out)
        found[grid] = out.detach(), w.detach(), a.grad, b.grad, c.grad
    (out, w, *grads), (plain_out, plain_w, *plain_grads) = found[grids[0]], found[grids[1]]
    assert torch.equal(w, plain_w)
    ulp = torch.finfo(dtype).eps
    for padded, plain in zip([out, *grads], [plain_out, *plain_grads], strict=True):
        torch.testing.assert_close(padded, plain, atol=ulp * plain.abs().max().item(), rtol=ulp)


@pytest.mark.parametrize("dtype", HALF)
def test_half_products_without_half_units_are_float32_sums_rounded_once(dtype, monkeypatch):
    """On a CPU without half units PyTorch's half GEMM is a scalar loop (20x a float32 one on an AVX2
    EPYC), so P·V and the long kernels' half products are float32 products of the raised operands
    (exact) summed in float32 and rounded once — a float32-accumulating half GEMM's result: torch's
    own half product within its summation order (a unit in the last place at most), as close to
    float64's as it. Without a gradient a's rows are raised a block at a time, which changes no bit;
    batch dims broadcast; gradients flow; a CPU with the units (or full precision) is ``a @ b``."""
    from multihead.attn import precision

    g = torch.Generator().manual_seed(3)
    a = torch.softmax(torch.randn(2, 3, 301, 257, generator=g), -1).to(dtype)  # (2, 3, 301, 257)
    b = torch.randn(1, 3, 257, 40, generator=g).to(dtype)  # (1, 3, 257, 40): broadcast over the batch
    monkeypatch.setattr(precision, "half_units", lambda dt: False)
    whole = precision.half_matmul(a, b)
    assert whole.dtype == dtype and whole.shape == (2, 3, 301, 40)
    assert torch.equal(whole, (a.float() @ b.float()).to(dtype))
    monkeypatch.setattr(precision, "RAISED_BYTES", 1024)
    monkeypatch.setattr(precision, "RAISED_ROWS", 7)  # 44 blocks of 7 rows and one of 0..6
    assert torch.equal(precision.half_matmul(a, b), whole)
    exact = a.double() @ b.double()
    ulp = torch.finfo(dtype).eps * exact.abs().max().item()
    torch_half = a @ b  # torch's own half GEMM
    assert (whole.double() - torch_half.double()).abs().max().item() <= ulp
    assert (whole.double() - exact).abs().max().item() <= (torch_half.double() - exact).abs().max().item() + ulp / 2
    a2, b2 = a.clone().requires_grad_(), b.clone().requires_grad_()
    precision.half_matmul(a2, b2).float().square().sum().backward()
    a3, b3 = a.double().requires_grad_(), b.double().requires_grad_()
    (a3 @ b3).square().sum().backward()
    for got, want in ((a2.grad, a3.grad), (b2.grad, b3.grad)):
        torch.testing.assert_close(got.double(), want, atol=4 * torch.finfo(dtype).eps * want.abs().max().item(),
                                   rtol=0)
    monkeypatch.setattr(precision, "half_units", lambda dt: True)
    assert torch.equal(precision.half_matmul(a, b), torch_half)
    assert torch.equal(precision.half_matmul(a.float(), b.float()), a.float() @ b.float())


def _eager_and_compiled(monkeypatch, call):
    """``call()`` once through the eager steps after the half product, once through the compiled softmax."""
    from multihead.attn import fused

    real = fused.available
    monkeypatch.setattr(fused, "available", lambda: False)
    eager = call()
    monkeypatch.setattr(fused, "available", real)
    return eager, call()


#: (dtype, half units): half scores formed in their dtype (a CPU with units for it); half scores formed
#: in float32 and rounded, soft-maxed from float32 (an AVX2 CPU); a float32 model's, soft-maxed in place
SCORES = [(torch.bfloat16, True), (torch.float16, True), (torch.bfloat16, False), (torch.float16, False),
          (torch.float32, False)]


@pytest.mark.parametrize(("dtype", "units"), SCORES)
@pytest.mark.parametrize("shape", [(1, 9, 3, 170, 2210, 64), (2, 12, 2, 100, 300, 128), (1, 4, 4, 7, 5, 96),
                                   (2, 8, 2, 33, 1000, 80)])
@pytest.mark.parametrize("masking", ["none", "causal", "padded"])
def test_the_compiled_softmax_is_the_eager_steps_within_float32s_rounding(dtype, units, shape, masking, monkeypatch):
    """The compiled pass (softmax.c, which reads the mask itself) against the eager steps (float32
    copy, masked fill, softmax, half copy) — float32 weights within 1e-6 relative, masked keys exactly
    0, rows summing to 1 or, seeing no key, all 0, half outputs within a unit in their last place (a
    weight on a rounding boundary may round the other way), float32 ones within the weights' error;
    head dims 80 and 128 scale the product (in the half dtype where it is formed in it), key counts
    off the key grid (2,210, 300, 1,000) pad it; a causal mask with T > S and a per-text padding mask
    (B, 1, 1, S) leave rows that see nothing; key counts not a multiple of 8 or 16 end in part blocks."""
    from multihead.attn import precision

    compiled_softmax()
    monkeypatch.setattr(precision, "half_units", lambda dt: units)
    B, H, Hkv, T, S, D = shape
    g = torch.Generator().manual_seed(S)
    q = (torch.randn(B, H, T, D, generator=g) * 2).to(dtype)
    k, v = (torch.randn(B, Hkv, S, D, generator=g).to(dtype) for _ in range(2))
    mask = masking_case(masking, B, S)

    def run():
        with torch.inference_mode():
            return mh.attention(q, k, v, mask, backend="math", need_weights=True, weights_dtype=torch.float32)

    (out, w), (fast_out, fast_w) = _eager_and_compiled(monkeypatch, run)
    assert fast_w.dtype == torch.float32 and fast_out.dtype == dtype
    assert torch.equal(fast_w == 0, w == 0)  # the masked keys, and only they (no weight here underflows)
    assert float(((fast_w - w).abs() / w.clamp_min(1e-30))[w > 0].max()) < 1e-6
    assert float((fast_w.sum(-1) - w.sum(-1)).abs().max()) < 1e-5  # 1, or 0 for a row that sees no key (T > S)
    if dtype == torch.float32:  # P·V of weights 1e-6 apart: every output moves by a few units in its last place
        torch.testing.assert_close(fast_out, out, atol=2e-6 * float(out.abs().max()), rtol=0)
        return
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(fast_out.float(), out.float(), atol=ulp * float(out.abs().max()), rtol=ulp)
    assert float((fast_out != out).float().mean()) < 0.01


@pytest.mark.parametrize(("dtype", "units"), SCORES)
def test_the_compiled_softmax_keeps_rows_that_see_nothing_and_huge_scores_finite(dtype, units, monkeypatch):
    """A row that may see no key gives zeros (the compiled pass finds no key to see); scores in the
    thousands, far beyond exp's range beside a row's largest, give no NaN, a row of equal scores its
    uniform weights."""
    from multihead.attn import precision

    compiled_softmax()
    monkeypatch.setattr(precision, "half_units", lambda dt: units)
    g = torch.Generator().manual_seed(3)
    big = 100.0 if dtype == torch.float16 else 3000.0  # scores up to ~1e4-1e5: finite in the dtype
    q = torch.randn(1, 2, 40, 64, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, 40, 64, generator=g).to(dtype) for _ in range(2))
    q[0, 0, :10] = 0  # equal scores: uniform rows
    q[0, 1, 10:20] *= big
    keep = torch.ones(40, 40, dtype=torch.bool)
    keep[30:] = False  # rows 30.. see nothing
    with torch.inference_mode():
        out, w = mh.attention(q, k, v, masks.from_tensor(keep), backend="math", need_weights=True,
                              weights_dtype=torch.float32)
        unmasked_out, unmasked_w = mh.attention(q, k, v, None, backend="math", need_weights=True,
                                                weights_dtype=torch.float32)
    assert torch.equal(w[..., 30:, :], torch.zeros_like(w[..., 30:, :])) and not out[..., 30:, :].any()
    for weights in (w, unmasked_w):
        assert not weights.isnan().any() and not out.isnan().any() and not unmasked_out.isnan().any()
        torch.testing.assert_close(weights[0, 0, :10], torch.full((10, 40), 1 / 40), atol=1e-7, rtol=0)
        assert float((weights[0, 1, 10:20].sum(-1) - 1).abs().max()) < 1e-5


@pytest.mark.parametrize(("dtype", "units"), SCORES)
def test_the_compiled_softmax_reads_a_mask_per_head_under_grouped_query_attention(dtype, units, monkeypatch):
    """Random keep masks that differ by head, text and row — (B, H, T, S), (1, H, T, S), (B, 1, T, 1)
    and one whose keys are not consecutive in memory — over grouped-query heads (H = 6, Hkv = 2),
    rows that may see no key among them: the eager steps' weights and outputs (and their zeros)."""
    from multihead.attn import precision

    compiled_softmax()
    monkeypatch.setattr(precision, "half_units", lambda dt: units)
    g = torch.Generator().manual_seed(11)
    B, H, Hkv, T, S = 2, 6, 2, 37, 300
    q = (torch.randn(B, H, T, 64, generator=g) * 2).to(dtype)
    k, v = (torch.randn(B, Hkv, S, 64, generator=g).to(dtype) for _ in range(2))
    per_head = torch.rand(B, H, T, S, generator=g) < 0.3
    per_head[0, 3, 5] = False  # a row that sees nothing
    shapes = {"per text and head": per_head, "per head": per_head[:1], "per row": per_head[..., :1, :, :1],
              "keys not consecutive": per_head.transpose(-1, -2).contiguous().transpose(-1, -2)}
    for name, keep in shapes.items():
        def run(keep=keep):
            with torch.inference_mode():
                return mh.attention(q, k, v, masks.from_tensor(keep), backend="math", need_weights=True,
                                    weights_dtype=torch.float32)

        (out, w), (fast_out, fast_w) = _eager_and_compiled(monkeypatch, run)
        assert torch.equal(fast_w == 0, w == 0), name
        torch.testing.assert_close(fast_w, w, atol=1e-7, rtol=1e-6, msg=name)
        ulp = torch.finfo(dtype).eps * (16 if dtype == torch.float32 else 1)  # float32: the weights' 1e-6
        torch.testing.assert_close(fast_out.float(), out.float(), atol=ulp * float(out.abs().max()), rtol=ulp,
                                   msg=name)


@pytest.mark.parametrize(("dtype", "written"), [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                              (torch.float32, None), (torch.float32, torch.bfloat16)])
def test_the_compiled_softmax_keeps_nan_and_infinite_scores_as_the_eager_steps_do(dtype, written):
    """Nothing broken turns finite: a NaN score, +inf scores (alone or beside finite ones) and a row
    whose visible scores are all -inf give NaN rows, as the eager softmax gives them; a row the mask
    hides entirely still gives zeros; scores 90-100 below a row's largest give eager's subnormal
    weights, not zeros (AVX2 forms 2^n as two powers of two: the same exps). Half scores, and
    float32 ones soft-maxed in place (a float32 model's) or written in bfloat16 as well (a half
    model's on an AVX2 CPU); 43 keys end in a part block of every width."""
    fused = compiled_softmax()
    T, S = 8, 43
    product = torch.randn(1, T, S).to(dtype)
    product[0, 0, 3] = float("nan")
    product[0, 1] = float("inf")
    product[0, 2, 7] = float("inf")
    product[0, 3] = float("-inf")
    product[0, 5, :20] = -95.0  # e^-95 ≈ 5e-42: subnormal in float32
    product[0, 5, 20:] = 0.0
    product[0, 7, 41] = -90.0  # subnormal in a part block
    keep = torch.ones(T, S, dtype=torch.bool)
    keep[4] = False  # row 4 sees nothing
    keep[6, 3] = False  # row 6 hides a NaN
    product[0, 6, 3] = float("nan")
    eager = torch.softmax(product.float().masked_fill(~keep, float("-inf")), -1)  # (1, T, S)
    eager[:, 4] = 0.0  # the kernels' definition for a row that sees nothing
    in_place = written is None
    weights = product.view(1, 1, T, S) if in_place else torch.empty(1, 1, T, S)
    half = None if in_place else torch.empty(1, T, 64, dtype=written)
    fused.softmax(product, S, weights, half, keep)
    assert torch.equal(weights[0, 0].isnan(), eager[0].isnan())
    assert weights[0, 0, :4].isnan().all() and not weights[0, 0, 4:].isnan().any()
    assert torch.equal(weights[0, 0, 4], torch.zeros(S))
    assert float(weights[0, 0, 5, 0]) > 0 and torch.equal(weights[0, 0, 5] == 0, eager[0, 5] == 0)
    assert torch.equal(weights[0, 0, 5, :20], eager[0, 5, :20])  # subnormal: exact
    assert float(weights[0, 0, 7, 41]) > 0 and torch.equal(weights[0, 0, 7] == 0, eager[0, 7] == 0)
    fine = ~eager[0].isnan()
    torch.testing.assert_close(weights[0, 0][fine], eager[0][fine], atol=1e-7, rtol=1e-6)
    if half is not None:
        assert torch.equal(half[0, 4], torch.zeros(64, dtype=written))
        assert torch.equal(half[0, :4, :S].isnan(), eager[0, :4].isnan()) and not half[0, :, S:].any()
        assert torch.equal(half[0, 4:, :S], weights[0, 0, 4:].to(written))  # rounded as PyTorch rounds


def test_the_compiled_softmax_reads_any_shape_of_mask_and_scores_near_exps_normal_floor():
    """Each row's mask read once for its open prefix (every key seen, no mask read) and its end (no
    key seen after): rows whose seen keys start late, stop early, have gaps, or are one key, each
    against the eager steps; and scores straddling -86 below a row's largest in one vector (on AVX2
    the exps of a vector whose lanes are all normal floats take a shorter path, a vector with one
    lane below goes the long way), down to subnormal weights: exactly eager's there, within 1e-6
    elsewhere; entropies within float32's rounding of −Σ p ln p."""
    fused = compiled_softmax()
    T, S = 12, 301
    g = torch.Generator().manual_seed(5)
    product = torch.randn(1, T, S, generator=g) * 3
    product[0, 0, ::2] -= 86.0  # every other key just below the floor of the short path
    product[0, 1] = torch.linspace(-80.0, -92.0, S)  # across it and into subnormal weights
    product[0, 1, 150] = 0.0
    keep = torch.ones(T, S, dtype=torch.bool)
    keep[2, :200] = False  # seen keys start late
    keep[3, 17:] = False  # stop early, inside a vector
    keep[4, 40:90] = False  # a gap
    keep[5] = False
    keep[5, 123] = True  # one key
    keep[6, ::3] = False  # every third key hidden
    keep[7, :8] = False  # a hidden first vector, then every key
    keep[8, 296:] = False  # the row's part block hidden
    keep[9, 7] = False  # a hidden key in the last lane of a vector (8 wide, and 16)
    keep[10, 15] = False
    eager = torch.softmax(product.masked_fill(~keep, float("-inf")), -1)  # (1, T, S)
    entropy = torch.empty(1, 1, T)
    scores = product.clone()
    fused.softmax(scores, S, scores.view(1, 1, T, S), None, keep, entropy)
    weights = scores[0]
    assert torch.equal(weights == 0, eager[0] == 0)
    assert torch.equal(weights[1, 200:], eager[0, 1, 200:])  # subnormal (and the smallest normal) weights: exact
    assert float(((weights - eager[0]).abs() / eager[0].clamp_min(1e-30))[eager[0] > 1e-37].max()) < 1e-6
    plogp = torch.where(eager[0] > 0, eager[0].double() * eager[0].double().log(), 0.0)
    torch.testing.assert_close(entropy[0, 0].double(), -plogp.sum(-1), atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [*HALF, torch.float32])
def test_the_compiled_softmax_forms_each_rows_entropy_from_its_scores(dtype):
    """Each row's −Σ p ln p formed on the softmax's way (ln Z − Σ e (s − m) / Z, no log a weight):
    the definition in float64 on the same scores (half or float32) — flat, middling and sharp heads, a causal
    band and a padded text, rows that see one key (0) or none (0), a row with a NaN score (NaN) —
    within float32's rounding, and as close as −Σ p ln p of the float32 weights it writes."""
    fused = compiled_softmax()
    g = torch.Generator().manual_seed(5)
    B, H, T, S = 2, 3, 50, 700
    spread = torch.tensor([0.05, 3.0, 40.0]).view(1, H, 1, 1)  # near uniform .. nearly one key
    product = (torch.randn(B, H, T, S, generator=g) * spread).to(dtype)  # (B, H, T, S)
    keep = (torch.arange(S)[None] <= torch.arange(T)[:, None] * 14 + 3).expand(B, H, T, S).clone()
    keep[1, ..., 600:] = False  # the second text's last keys are padding
    keep[0, 1, 7] = False  # sees nothing
    keep[0, 2, 8] = False
    keep[0, 2, 8, 3] = True  # sees one key
    product[0, 0, 9, 5] = float("nan")  # a NaN score it may see
    weights, entropy = torch.empty(B, H, T, S), torch.full((B, H, T), -7.0)
    half = torch.empty(B * H, T, S, dtype=dtype)
    fused.softmax(product.view(B * H, T, S), S, weights, half if dtype in HALF else None, keep, entropy)
    exact = torch.softmax(product.double().masked_fill(~keep, float("-inf")), -1)  # (B, H, T, S)
    want = -torch.xlogy(exact, exact).sum(-1)  # (B, H, T)
    want[0, 1, 7] = 0.0  # no key to see: zeros, entropy 0 (the kernels' definition)
    assert entropy[0, 0, 9].isnan() and torch.equal(entropy.isnan(), want.isnan())
    assert float(entropy[0, 1, 7]) == 0.0 and float(entropy[0, 2, 8]) == 0.0
    fine = ~want.isnan()
    error = (entropy.double() - want).abs()[fine]
    rounded = -torch.xlogy(weights.double(), weights.double()).sum(-1)  # from the float32 weights
    assert float(error.max()) < 2e-6 * math.log(S)
    assert float(error.max()) <= 2 * float((rounded - want).abs()[fine].max()) + 1e-7
    sharp = want[:, 2][fine[:, 2]]
    assert float(sharp.min()) < 0.05 and float(want[:, 0][fine[:, 0]].max()) > 5.5  # the heads span the range
    with pytest.raises(ValueError, match="entropy"):
        fused.softmax(product.view(B * H, T, S), S, weights, None, keep, torch.empty(B, H, T + 1))


def test_a_forward_mode_derivative_goes_through_the_eager_steps():
    """A dual tensor (torch.autograd.forward_ad) requires no grad, yet carries a tangent that a ctypes
    call — and an in-place ``out=`` softmax — would drop: the math kernel takes the eager steps for it,
    and float32's tangents of the outputs and weights are float64's."""
    from torch.autograd import forward_ad

    compiled_softmax()
    g = torch.Generator().manual_seed(4)
    q, k, v, along = (torch.randn(1, 4, 50, 32, generator=g, dtype=torch.float64) for _ in range(4))

    def tangents(dtype):
        with torch.no_grad(), forward_ad.dual_level():
            dual = forward_ad.make_dual(q.to(dtype), along.to(dtype))
            out, w = mh.attention(dual, k.to(dtype), v.to(dtype), masks.causal(), backend="math", need_weights=True)
            return forward_ad.unpack_dual(out).tangent, forward_ad.unpack_dual(w).tangent

    (out32, w32), (out64, w64) = tangents(torch.float32), tangents(torch.float64)
    assert out32 is not None and float(out64.abs().max()) > 0.1
    torch.testing.assert_close(out32.double(), out64, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w32.double(), w64, atol=1e-5, rtol=1e-4)


def test_a_traced_half_attention_records_the_eager_steps(monkeypatch):
    """torch.jit.trace cannot see a ctypes call: while tracing, the math kernel takes the eager steps,
    so the traced graph replays on new inputs what the kernel computes."""
    from multihead.attn import precision

    compiled_softmax()
    monkeypatch.setattr(precision, "half_units", lambda dt: True)
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(1, 4, 30, 64, generator=g).bfloat16() for _ in range(3)]
    fresh = [torch.randn(1, 4, 30, 64, generator=g).bfloat16() for _ in range(3)]

    def attend(q, k, v):
        return mh.attention(q, k, v, None, backend="math")[0]

    with torch.no_grad():
        traced = torch.jit.trace(attend, inputs, check_trace=False)
        replayed, direct = traced(*fresh), attend(*fresh)
    assert not replayed.isnan().any()
    torch.testing.assert_close(replayed.float(), direct.float(), atol=torch.finfo(torch.bfloat16).eps * 4, rtol=0.01)


@pytest.mark.parametrize(("dtype", "units"), SCORES)
@pytest.mark.parametrize("masking", ["none", "causal", "padded"])
def test_a_memory_plans_trace_holds_what_the_compiled_softmaxs_run_holds(dtype, units, masking, monkeypatch):
    """A memory plan traces a CPU run on ``meta`` (``traced_as_cpu``): there the math kernel takes the
    compiled softmax's path too, and holds what the run on this CPU holds, byte for byte — not the eager
    steps' masked copies of the map (a trace that took them planned SmolLM2 bfloat16 at 1k tokens 38 %
    above the measured peak on an AVX-512 CPU without AMX)."""
    from multihead.attn import fused, precision

    compiled_softmax()
    monkeypatch.setenv(fused.TILES_ENV, "0")  # on a CPU with AMX, bfloat16's other path: test_tiles.py's
    monkeypatch.setattr(precision, "half_units", lambda dt: units)
    B, H, Hkv, T, S, D = 2, 8, 2, 96, 640, 64
    mask = masking_case(masking, B, S)
    peaks = {}
    for device, traced in (("cpu", False), ("meta", True), ("meta", False)):
        q = torch.randn(B, H, T, D).to(dtype).to(device)
        k, v = (torch.randn(B, Hkv, S, D).to(dtype).to(device) for _ in range(2))
        with traced_as_cpu(traced), torch.inference_mode(), LiveBytes(device) as live:
            out, w = mh.attention(q, k, v, mask, backend="math", need_weights=True, weights_dtype=torch.float32)
        assert out.shape == (B, H, T, D) and w.shape == (B, H, T, S) and w.dtype == torch.float32
        peaks[device, traced] = live.peak
    assert peaks["meta", True] == peaks["cpu", False]
    if masking != "none":  # outside the trace: the eager steps' masked copies beside the map
        assert peaks["meta", False] > peaks["cpu", False]


def test_the_compiled_softmax_refuses_tensors_it_cannot_read():
    fused = compiled_softmax()
    product, half = torch.zeros(2, 3, 16, dtype=torch.bfloat16), torch.empty(2, 3, 16, dtype=torch.bfloat16)
    weights = torch.empty(1, 2, 3, 16)  # (B, H, T, K): B·H·T = 2·3 rows
    fused.softmax(product, 16, weights, half)  # fits: uniform rows
    assert torch.equal(weights, torch.full_like(weights, 1 / 16))
    scores = torch.zeros(2, 3, 16)
    fused.softmax(scores, 16, scores.view(1, 2, 3, 16))  # float32 in place: fits
    assert torch.equal(scores, torch.full_like(scores, 1 / 16))
    wide = torch.zeros(2, 3, 20)
    shared = torch.zeros(112)  # float32 scores and weights one row apart in one block
    fused.softmax(torch.empty(0, 3, 16, dtype=torch.bfloat16), 16, torch.empty(1, 0, 3, 16),
                  torch.empty(0, 3, 16, dtype=torch.bfloat16))  # no rows: nothing to do, not "in place"
    for bad in ({"weights": torch.empty(1, 2, 3, 8)}, {"half": half.half()}, {"product": product.transpose(0, 1)},
                {"keep": torch.ones(3, 16)}, {"half": torch.empty(2, 3, 16)}, {"product": product.double()},
                {"product": wide, "weights": wide.view(-1)[:96].view(1, 2, 3, 16)},  # in place, but 20 keys a row
                {"product": shared[16:].view(2, 3, 16), "weights": shared[:96].view(1, 2, 3, 16), "half": None},
                {"half": weights.view(torch.bfloat16)[..., :16].reshape(2, 3, 16)}):  # overlaps: refused
        args = {"product": product, "weights": weights, "half": half, "keep": None} | bad
        with pytest.raises(ValueError, match=r"do not fit|bool"):
            fused.softmax(args["product"], 16, args["weights"], args["half"], args["keep"])


@pytest.mark.parametrize("dtype", [*HALF, torch.float32])
@pytest.mark.parametrize("units", [True, False])
def test_a_workspace_changes_nothing_but_where_the_maps_are_made(dtype, units, monkeypatch):
    """Chunks of rows through the math kernel with a Workspace (as a capture streams a layer):
    outputs and weights bit-equal to fresh tensors', chunk after chunk, with the key grid and
    without, a padding mask, a scale that is no power of two; the map-shaped buffers are made once
    for the largest chunk; under autograd the workspace is not used."""
    from multihead.attn import precision
    from multihead.attn.workspace import Workspace

    monkeypatch.setattr(precision, "half_units", lambda dt: units)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, 260, 96, generator=g).to(dtype)
    k, v = (torch.randn(2, 3, 260, 96, generator=g).to(dtype) for _ in range(2))
    keep = torch.ones(2, 1, 1, 260, dtype=torch.bool)
    keep[1, ..., 200:] = False  # the second text is 200 tokens long
    mask = masks.causal() & masks.from_tensor(keep)
    workspace = Workspace(map_entries=2 * 6 * 40 * 512)  # the largest chunk's map, over the key grid
    held = set()
    with torch.inference_mode():
        for start in range(0, 260, 40):
            stop = min(260, start + 40)
            rows = masks.Rows(mask, start, 260, 260)
            K = stop  # causal: the chunk's last row sees keys 0..stop-1
            chunk_mask = masks.from_tensor(rows.materialize(stop - start, K))
            args = (q[:, :, start:stop], k[:, :, :K], v[:, :, :K], chunk_mask)
            fresh = mh.attention(*args, backend="math", need_weights=True, weights_dtype=torch.float32)
            made = mh.attention(*args, backend="math", need_weights=True, weights_dtype=torch.float32,
                                workspace=workspace)
            assert torch.equal(made[0], fresh[0]) and torch.equal(made[1], fresh[1])
            held.add(made[1].data_ptr())
    assert len(held) == 1  # the weights of every chunk in one buffer, made for the largest at the first
    grads = []
    for lent in (Workspace(), None):  # under autograd the workspace is left alone: the same gradients
        a = q.clone().requires_grad_()
        out, w = mh.attention(a, k, v, masks.causal(), backend="math", need_weights=True, workspace=lent)
        (out.float().sum() + w.float().square().sum()).backward()
        grads.append(a.grad)
    assert torch.equal(*grads) and torch.isfinite(grads[0]).all()


@pytest.mark.parametrize("dtype", HALF)
def test_half_inputs_softmax_in_float32(dtype):
    q, k, v = rand_qkv(2, 2, 1, 16, 16, 32, 32, dtype, seed=3)
    out, w = mh.attention(q, k, v, masks.causal(), backend="math", need_weights=True)
    ref_out, ref_w = naive_attention(q, k, v, masks.causal())
    assert out.dtype == w.dtype == dtype
    tol = 1e-2 if dtype == torch.float16 else 4e-2
    torch.testing.assert_close(out.double(), ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(w.double(), ref_w, atol=tol, rtol=tol)


@pytest.mark.parametrize("kind", ["causal&padding", "float", "bool&float", "none"])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_gradcheck_float64(kind, backend):
    B, H, Hkv, T, S = 2, 2, 1, 4, 5
    g = torch.Generator().manual_seed(1)
    bias = torch.randn(1, H, T, S, generator=g, dtype=torch.float64)
    mask = {
        "causal&padding": masks.causal() & masks.padding([5, 3]),
        "float": masks.from_tensor(bias),
        "bool&float": masks.from_tensor(torch.rand(B, 1, T, S, generator=g) > 0.3) & masks.from_tensor(bias),
        "none": None,
    }[kind]
    q, k, v = rand_qkv(B, H, Hkv, T, S, 3, 2, torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: mh.attention(a, b, c, mask, backend=backend)[0], (q, k, v))
    if backend == "math":
        assert torch.autograd.gradcheck(
            lambda a, b, c: mh.attention(a, b, c, mask, backend="math", need_weights=True)[1], (q, k, v)
        )


def test_gradcheck_with_fully_masked_rows():
    keep = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    keep[..., 1, :] = False
    q, k, v = rand_qkv(1, 2, 2, 3, 4, 3, 3, torch.float64, requires_grad=True)
    for backend in ("math", "sdpa"):
        def f(a, b, c, be=backend):
            return mh.attention(a, b, c, keep, backend=be)[0]

        assert torch.autograd.gradcheck(f, (q, k, v))


def test_custom_scale_and_dropout():
    q, k, v = rand_qkv(1, 2, 2, 4, 4, 8, 8, torch.float64)
    out, _ = mh.attention(q, k, v, scale=0.5, backend="sdpa")
    ref, _ = naive_attention(q, k, v, None, scale=0.5)
    torch.testing.assert_close(out, ref)
    torch.manual_seed(0)
    dropped, w = mh.attention(q, k, v, dropout_p=0.5, backend="math", need_weights=True)
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, mh.attention(q, k, v)[0])
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 4, dtype=torch.float64))  # weights before dropout


def test_explain_backend_says_why():
    q, k, v = rand_qkv(1, 2, 2, 4, 4, 8, 8, torch.float32)
    choice = mh.explain_backend(q, k, v, masks.causal())
    assert choice.backend == "sdpa" and "math" in choice.rejected
    with_weights = mh.explain_backend(q, k, v, need_weights=True)
    assert with_weights.backend == "math" and "weights" in with_weights.rejected["sdpa"]
    half = [t.half() for t in (q, k, v)]
    assert mh.explain_backend(*half, torch.zeros(4, 4)).backend == "math"
    assert "backend: sdpa" in str(choice)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda q, k, v: mh.attention(q[0], k, v), ValueError, "4-D"),
        (lambda q, k, v: mh.attention(q, k[:, :3].repeat(1, 1, 1, 1), v[:, :3]), ValueError, "multiple"),
        (lambda q, k, v: mh.attention(q, k[..., :3], v), ValueError, "head_dim"),
        (lambda q, k, v: mh.attention(q, k, v[:, :, :2]), ValueError, "length S"),
        (lambda q, k, v: mh.attention(q, k[:1], v[:1]), ValueError, "batch"),
        (lambda q, k, v: mh.attention(q, k.double(), v), TypeError, "dtype"),
        (lambda q, k, v: mh.attention(q.long(), k.long(), v.long()), TypeError, "floating"),
        (lambda q, k, v: mh.attention(q, k, v, torch.ones(3, 3, dtype=torch.bool)), ValueError, "broadcast"),
        (lambda q, k, v: mh.attention(q, k, v, torch.ones(5, 1, 4, 5, dtype=torch.bool)), ValueError, "broadcast"),
        (lambda q, k, v: mh.attention(q, k, v, torch.ones(4, 5, dtype=torch.int32)), TypeError, "bool"),
        (lambda q, k, v: mh.attention(q, k, v, "causal"), TypeError, "Mask"),
        (lambda q, k, v: mh.attention(q, k, v, backend="flash"), ValueError, "backend"),
        (lambda q, k, v: mh.attention(q, k, v, backend="sdpa", need_weights=True), ValueError, "weights"),
        (lambda q, k, v: mh.attention(q, k, v, dropout_p=1.0), ValueError, "dropout_p"),
        (lambda q, k, v: mh.attention(q, k, v, scale=-1.0), ValueError, "scale"),
        (lambda q, k, v: mh.attention(q, k, v, scale=float("inf")), ValueError, "finite"),  # was all NaN
    ],
)
def test_bad_inputs_name_the_expected_form(call, error, words):
    q, k, v = rand_qkv(2, 4, 4, 4, 5, 8, 8, torch.float32)
    with pytest.raises(error) as info:
        call(q, k, v)
    assert words in str(info.value)


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "local"])
@pytest.mark.parametrize(("B", "H", "T", "S"), [(0, 2, 5, 5), (2, 0, 5, 5), (2, 2, 0, 5), (2, 2, 5, 0),
                                                (0, 2, 1100, 1100)])
def test_nothing_to_attend_is_an_empty_or_zero_output_with_zero_gradients(backend, B, H, T, S):
    """An empty batch (the last of a dataset split unevenly), no queries or no keys: what SDPA and
    nn.MultiheadAttention answer — empty outputs, and zeros for rows with no key (as a fully
    masked row) — not "cannot reshape tensor of 0 elements"."""
    q = torch.randn(B, H, T, 8, requires_grad=True)
    k, v = (torch.randn(B, max(H, 1) if H else 0, S, 8, requires_grad=True) for _ in range(2))
    if H == 0:
        k, v = (torch.randn(B, 1, S, 8, requires_grad=True) for _ in range(2))
    mask = masks.window(4) if backend == "local" else None
    for need_weights in (False, True) if backend in ("auto", "math") else (False,):
        out, weights = mh.attention(q, k, v, mask, need_weights=need_weights, backend=backend)
        assert out.shape == (B, H, T, 8) and not out.any()
        assert weights is None if not need_weights else (weights.shape == (B, H, T, S) and not weights.any())
        out.sum().backward()
        assert all(t.grad is not None and not t.grad.any() for t in (q, k, v))
    for bad in (dict(backend="topk"), dict(backend="sdpa", need_weights=True),
                dict(mask=torch.ones(3, 4, dtype=torch.bool))):  # refused as for any batch, not only a real one
        with pytest.raises(ValueError):
            mh.attention(q, k, v, **bad)
    layer = mh.MultiHeadAttention(16, 2)
    x = torch.randn(B, T, 16)
    out, weights = layer(x, need_weights=True)
    assert out.shape == (B, T, 16) and weights.shape == (B, 2, T, T)


@pytest.mark.parametrize("mask", [None, "causal", "window"])
def test_sdpa_with_a_gradient_in_half_precision_on_a_cpu_without_units_runs_in_float32(monkeypatch, mask):
    """PyTorch's CPU flash backward in bfloat16 without the units was 5-6x float32's (SmolLM2's gated
    backward over 1,024 tokens 13.7 s against 5.9 s): with a gradient to take, the sdpa backend runs
    on the operands raised to float32 (exact there) and rounds the output once; its gradients are as
    close to float64's as the half kernel's. Without a gradient it is the half kernel, unchanged."""
    from multihead.attn import precision

    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 40, 16, generator=g).to(torch.bfloat16) for _ in range(3))  # (B, H, T, Dk)
    m = {None: None, "causal": masks.causal(), "window": masks.window(5)}[mask]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = mh.attention(*leaves, m, backend="sdpa")[0]  # (B, H, T, Dv)
    wide = [t.float().requires_grad_() for t in (q, k, v)]
    want = mh.attention(*wide, m, backend="sdpa")[0]
    assert out.dtype == torch.bfloat16 and torch.equal(out, want.detach().to(torch.bfloat16))
    up = torch.randn(out.shape, generator=g)
    out.float().backward(up)
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    mh.attention(*exact, m, backend="math")[0].backward(up.double())
    halves = [t.clone().requires_grad_() for t in (q, k, v)]
    monkeypatch.setattr(precision, "half_units", lambda dtype: True)  # PyTorch's own half kernel, for comparison
    mh.attention(*halves, m, backend="sdpa")[0].float().backward(up)
    for ours, theirs, truth in zip(leaves, halves, exact, strict=True):
        assert ours.grad.dtype == torch.bfloat16
        ulp = torch.finfo(torch.bfloat16).eps * float(truth.grad.abs().max())
        assert float((ours.grad.double() - truth.grad).abs().max()) <= float(
            (theirs.grad.double() - truth.grad).abs().max()) + ulp
    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    if mask != "window":
        with torch.no_grad():  # no gradient: the half kernel itself
            assert torch.equal(mh.attention(q, k, v, m, backend="sdpa")[0],
                               F.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal"))


def test_sdpa_raised_under_autocast_and_with_a_bias_rounds_as_the_half_kernel(monkeypatch):
    """Under autocast to bfloat16 (training) SDPA would cast raised operands straight back: the raised
    call runs with autocast off. A mask's float bias is rounded to the half dtype as the half kernel
    rounds it, so a gradient does not change the map (near -100 bfloat16's step is 0.5)."""
    from multihead.attn import precision

    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=g) for _ in range(3))  # float32, as a layer under autocast gives
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mh.attention(*leaves, masks.causal(), backend="sdpa")[0]
    assert out.dtype == torch.bfloat16
    halves = [t.to(torch.bfloat16).float() for t in (q, k, v)]  # autocast's casts, then float32's kernel
    want = F.scaled_dot_product_attention(*halves, is_causal=True).to(torch.bfloat16)
    assert torch.equal(out, want)  # autocast's own bfloat16 kernel differs from this in 35 % of the elements
    bias = torch.randn(24, 24, generator=g) * 40 - 100  # (T, S) additive, where bfloat16 rounds by 0.25..0.5
    mask = masks.from_tensor(bias)
    qh, kh, vh = (t.to(torch.bfloat16) for t in (q, k, v))
    with torch.no_grad():
        plain = mh.attention(qh, kh, vh, mask, backend="sdpa")[0]  # the half kernel, bias in bfloat16
    graded = mh.attention(*(t.clone().requires_grad_() for t in (qh, kh, vh)), mask, backend="sdpa")[0]
    ulp = torch.finfo(torch.bfloat16).eps * float(plain.float().abs().max())
    assert float((graded.detach().float() - plain.float()).abs().max()) <= 2 * ulp


def test_the_memory_estimate_counts_the_raised_sdpa_operands(monkeypatch):
    """With a gradient in half precision on a CPU without units, the sdpa backend keeps float32
    copies of q, k, v and its float32 output: the estimate adds them; with the units it does not."""
    from multihead.attn import precision

    q, k, v = (torch.zeros(2, 4, 64, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    monkeypatch.setattr(precision, "half_units", lambda dtype: True)
    own = mh.estimate_memory(q, k, v, masks.causal(), backend="sdpa")
    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    raised = mh.estimate_memory(q, k, v, masks.causal(), backend="sdpa")
    assert raised.bytes - own.bytes == 4 * 2 * 4 * 64 * 16 * 4 and "float32 operands" in raised.detail
    with torch.no_grad():  # no gradient: the half kernel, nothing raised
        assert mh.estimate_memory(q, k, v, masks.causal(), backend="sdpa").bytes < own.bytes


def test_a_workspace_keeps_a_causal_chunks_mask_for_the_next_layers_within_its_bytes(monkeypatch):
    """A streamed causal layer's chunk masks are evaluated once for every layer that streams the same
    chunks (the same tensor handed to the kernel), another length's chunks take their place, a mask
    that is not the plain causal one is evaluated each time, and no more than MASK_BYTES are kept."""
    from multihead.attn.workspace import Workspace
    from multihead.hf import route

    calls = []
    evaluated = route._evaluated
    monkeypatch.setattr(route, "_evaluated", lambda *a: calls.append(a[1:3]) or evaluated(*a))
    workspace = Workspace()
    query = torch.zeros(1, 2, 8, 4)

    def masks_of(mask, T, chunks):
        return [route._evaluated_once(masks.Rows(mask, start, T, T), c, K, query, workspace)
                for start, c, K in chunks]

    chunks = [(0, 30, 30), (30, 20, 50)]
    first = masks_of(masks.causal(), 50, chunks)
    again = masks_of(masks.causal(), 50, chunks)  # the next layer: a new Causal object, the same chunks
    assert calls == [(30, 30), (20, 50)]
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert [m.materialize(c, K).tolist() for m, (_, c, K) in zip(first, chunks, strict=True)] == [
        masks.Rows(masks.causal(), s, 50, 50).materialize(c, K).tolist() for s, c, K in chunks]
    masks_of(masks.causal(), 60, [(0, 60, 60)])  # another length: evaluated anew, the last length's let go
    masks_of(masks.causal(), 50, chunks[:1])
    assert calls[2:] == [(60, 60), (30, 30)]
    calls.clear()
    window = masks.causal() & masks.window(4)
    masks_of(window, 50, chunks)
    masks_of(window, 50, chunks)
    assert calls == [(30, 30), (20, 50)] * 2  # not the plain causal mask: each time
    calls.clear()
    monkeypatch.setattr(Workspace, "MASK_BYTES", 30 * 30 + 10)
    masks_of(masks.causal(), 40, [*chunks[:1], (30, 10, 40)])
    masks_of(masks.causal(), 40, [*chunks[:1], (30, 10, 40)])
    assert calls == [(30, 30), (10, 40), (10, 40)]  # the first kept, the second past the bytes: evaluated again
