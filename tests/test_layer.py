import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from torch import nn

import multihead as mh
from conftest import float_tolerance, mask_cases
from multihead import masks


def torch_masks(mask, B, H, T, S, dtype):
    """Our mask as nn.MultiheadAttention's (attn_mask, key_padding_mask), True = ignore there."""
    if mask is None:
        return None, None
    if isinstance(mask, masks.Padding):  # torch's own key_padding_mask path
        return None, ~mask.materialize(1, S)[:, 0, 0, :]
    bias = mask.bias(T, S, dtype=dtype)
    keep = mask.materialize(T, S).expand(B, H, T, S)
    if bias is None:
        return (~keep).reshape(B * H, T, S), None
    full = bias.expand(B, H, T, S).masked_fill(~keep, float("-inf"))
    return full.reshape(B * H, T, S).contiguous(), None


@st.composite
def layer_configs(draw):
    B = draw(st.integers(1, 3))
    H = draw(st.sampled_from([1, 2, 4]))
    E = H * draw(st.sampled_from([1, 2, 4]))
    T = draw(st.integers(1, 7))
    cross = draw(st.booleans())
    S = draw(st.integers(1, 7)) if cross else T
    kdim = draw(st.sampled_from([None, 3, 5])) if cross else None
    vdim = draw(st.sampled_from([None, 6])) if cross else None
    bias = draw(st.booleans())
    batch_first = draw(st.booleans())
    kinds = ("none", "padding", "bool", "float", "bool&float") + (("causal", "causal&padding") if T <= S else ())
    kind, mask = draw(mask_cases(B, H, T, S, kinds=kinds, never_empty=True))
    return B, H, E, T, S, cross, kdim, vdim, bias, batch_first, kind, mask


@settings(max_examples=50)
@given(layer_configs(), st.sampled_from([torch.float32, torch.float64]))
def test_parity_with_torch_multiheadattention(cfg, dtype):
    B, H, E, T, S, cross, kdim, vdim, bias, batch_first, _kind, mask = cfg
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first, dtype=dtype)
    with torch.no_grad():  # non-zero biases so that their gradients are compared too
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = mh.MultiHeadAttention.from_torch(theirs)
    x = torch.randn(B, T, E, dtype=dtype)
    key = torch.randn(B, S, kdim or E, dtype=dtype) if cross else x
    value = torch.randn(B, S, vdim or E, dtype=dtype) if cross else x
    attn_mask, kpm = torch_masks(mask, B, H, T, S, dtype)

    def t(a):
        return a if batch_first else a.transpose(0, 1)

    ref_out, ref_w = theirs(t(x), t(key), t(value), attn_mask=attn_mask, key_padding_mask=kpm,
                            need_weights=True, average_attn_weights=False)
    ref_out = t(ref_out)
    context = None if not cross else (key, value) if (kdim or E) != (vdim or E) or key is not value else key
    out, w = ours(x, context, mask=mask, need_weights=True)
    out_fast = ours(x, context, mask=mask)  # the auto (fused) path
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(out_fast, ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(w, ref_w, atol=tol, rtol=tol)

    grad = torch.randn_like(ref_out)
    ref_out.backward(grad)
    out_fast.backward(grad)
    E_ = E
    if theirs._qkv_same_embed_dim:
        wq, wk, wv = theirs.in_proj_weight.grad.split(E_)
    else:
        wq, wk, wv = theirs.q_proj_weight.grad, theirs.k_proj_weight.grad, theirs.v_proj_weight.grad
    pairs = [(ours.q_proj.weight.grad, wq), (ours.k_proj.weight.grad, wk), (ours.v_proj.weight.grad, wv),
             (ours.out_proj.weight.grad, theirs.out_proj.weight.grad)]
    if bias:
        bq, bk, bv = theirs.in_proj_bias.grad.split(E_)
        pairs += [(ours.q_proj.bias.grad, bq), (ours.k_proj.bias.grad, bk), (ours.v_proj.bias.grad, bv),
                  (ours.out_proj.bias.grad, theirs.out_proj.bias.grad)]
    for a, b in pairs:
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_input_gradients_match_torch():
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    ours = mh.MultiHeadAttention.from_torch(theirs)
    x1 = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    theirs(x1, x1, x1, need_weights=False)[0].sum().backward()
    ours(x2).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize(("kdim", "vdim", "bias"), [(None, None, True), (None, None, False), (3, 5, True)])
def test_to_torch_round_trip(batch_first, kdim, vdim, bias):
    ours = mh.MultiHeadAttention(8, 2, kdim=kdim, vdim=vdim, bias=bias)
    with torch.no_grad():
        ours.head_gates[1] = 0.5
    theirs = ours.to_torch(batch_first=batch_first)
    x = torch.randn(2, 4, 8)
    key = torch.randn(2, 6, kdim or 8)
    value = torch.randn(2, 6, vdim or 8)
    t = (lambda a: a) if batch_first else (lambda a: a.transpose(0, 1))
    ref = t(theirs(t(x), t(key), t(value), need_weights=False)[0])
    torch.testing.assert_close(ours(x, (key, value)), ref, atol=1e-6, rtol=1e-5)
    back = mh.MultiHeadAttention.from_torch(theirs)
    torch.testing.assert_close(back(x, (key, value)), ref, atol=1e-6, rtol=1e-5)


def test_gqa_layer_equals_shared_kv_heads():
    torch.manual_seed(0)
    layer = mh.MultiHeadAttention(12, 6, num_kv_heads=2, backend="math").double()
    assert layer.k_proj.out_features == 2 * 2 and layer.q_proj.out_features == 12
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    out, w = layer(x, mask=masks.causal(), need_weights=True)
    assert w.shape == (2, 6, 5, 5)
    q = layer.q_proj(x).view(2, 5, 6, 2).transpose(1, 2)
    k = layer.k_proj(x).view(2, 5, 2, 2).transpose(1, 2).repeat_interleave(3, 1)
    v = layer.v_proj(x).view(2, 5, 2, 2).transpose(1, 2).repeat_interleave(3, 1)
    scores = (q @ k.transpose(-1, -2) / 2**0.5).masked_fill(~masks.causal().materialize(5, 5), float("-inf"))
    ref = layer.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 12))
    torch.testing.assert_close(out, ref)
    layer.backend = "sdpa"
    torch.testing.assert_close(layer(x, mask=masks.causal()), ref)
    with pytest.raises(ValueError, match="grouped-query"):
        layer.to_torch()


def test_head_gates_silence_heads_and_take_gradients():
    torch.manual_seed(0)
    layer = mh.MultiHeadAttention(8, 4).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        layer.head_gates[2] = 0.0
        _, w = layer(x, need_weights=True)
        heads = (w @ layer.v_proj(x).view(2, 5, 4, 2).transpose(1, 2)).transpose(1, 2)  # (B, T, H, Dv)
        heads[:, :, 2] = 0.0  # removing head 2 by hand
        ref = layer.out_proj(heads.reshape(2, 5, 8))
    torch.testing.assert_close(layer(x), ref)

    gates = torch.rand(4, dtype=torch.float64, requires_grad=True)

    def f(g):
        layer.head_gates = g
        return layer(x)

    assert torch.autograd.gradcheck(f, (gates,))
    layer.head_gates = gates
    layer(x).sum().backward()
    assert gates.grad is not None and gates.grad.abs().sum() > 0


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_gradcheck_layer_parameters_and_inputs(backend):
    torch.manual_seed(0)
    layer = mh.MultiHeadAttention(4, 2, num_kv_heads=1, backend=backend).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    mask = masks.causal() & masks.padding([3, 2])
    params = tuple(layer.parameters())

    def f(inp, *ps):
        return torch.func.functional_call(layer, dict(zip([n for n, _ in layer.named_parameters()], ps,
                                                          strict=True)), (inp,), {"mask": mask})

    assert torch.autograd.gradcheck(f, (x, *params))


def test_average_weights_and_cross_attention_shapes():
    layer = mh.MultiHeadAttention(8, 2, kdim=3)
    x, ctx = torch.randn(2, 4, 8), torch.randn(2, 6, 3)
    with pytest.raises(ValueError, match="value input must have 8"):
        layer(x, ctx)
    layer = mh.MultiHeadAttention(8, 2, kdim=3, vdim=3)
    out, w = layer(x, ctx, need_weights=True, average_weights=True)
    assert out.shape == (2, 4, 8) and w.shape == (2, 4, 6)
    out, w = layer(x, ctx, need_weights=True)
    assert w.shape == (2, 2, 4, 6)


def test_dropout_only_in_training():
    layer = mh.MultiHeadAttention(8, 2, dropout=0.5)
    plain = mh.MultiHeadAttention(8, 2, dropout=0.0)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 4, 8)
    layer.eval()
    torch.testing.assert_close(layer(x), plain(x))  # evaluation: no dropout at all
    layer.train()
    torch.manual_seed(0)
    a = layer(x)
    assert not torch.allclose(a, layer.eval()(x))


def test_safetensors_round_trip(tmp_path):
    torch.manual_seed(0)
    layer = mh.MultiHeadAttention(16, 4, num_kv_heads=2)
    with torch.no_grad():
        layer.head_gates[1] = 0.0
    save_file(layer.state_dict(), tmp_path / "attn.safetensors")
    fresh = mh.MultiHeadAttention(16, 4, num_kv_heads=2)
    fresh.load_state_dict(load_file(tmp_path / "attn.safetensors"))
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(fresh(x), layer(x))
    assert fresh.head_gates[1] == 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["math", "auto", "local"])
def test_works_under_torch_compile_as_lengths_change(backend):
    """The second length a compiled layer meets is traced with symbolic shapes: the kernel's choice
    of backend and its memory check must not format or read them (``{width:.0f}`` of a SymFloat
    ended every compiled layer's second call in an InternalTorchDynamoError)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = mh.MultiHeadAttention(32, 4, backend=backend).eval()
    compiled = torch.compile(layer)
    for n in (9, 11, 14):  # the second length recompiles with dynamic shapes, the third reuses that graph
        x = torch.randn(2, n, 32)
        mask = (masks.window(3) if backend == "local" else masks.causal()) & masks.padding([n, n - 4])
        with torch.no_grad():
            eager = layer(x, mask=mask)
            got = compiled(x, mask=mask)
        torch.testing.assert_close(got, eager, atol=float_tolerance(eager, ops=64), rtol=1e-5)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: mh.MultiHeadAttention(10, 3), ValueError, "divisible by num_heads"),
        (lambda: mh.MultiHeadAttention(12, 6, num_kv_heads=4), ValueError, "divisible by num_kv_heads"),
        (lambda: mh.MultiHeadAttention(0, 1), ValueError, "positive"),
        (lambda: mh.MultiHeadAttention(8, 2, dropout=1.5), ValueError, "dropout"),
        (lambda: mh.MultiHeadAttention(8, 2, backend="flash"), ValueError, "backend"),
        (lambda: mh.MultiHeadAttention(8, 2)(torch.randn(4, 8)), ValueError, "3-D"),
        (lambda: mh.MultiHeadAttention(8, 2)(torch.randn(2, 4, 7)), ValueError, "8 features"),
        (lambda: mh.MultiHeadAttention(8, 2)(torch.randn(2, 4, 8, dtype=torch.bfloat16)), TypeError,
         "layer's weights are torch.float32"),  # torch's own words were "mat1 and mat2 must have the same dtype"
        (lambda: mh.MultiHeadAttention(8, 2)(torch.randn(2, 4, 8), torch.randn(3, 4, 8)), ValueError, "batch"),
        (lambda: mh.MultiHeadAttention(8, 2)(torch.randn(2, 4, 8), mask=torch.ones(4, 5, dtype=torch.bool)),
         ValueError, "broadcast"),
        (lambda: mh.MultiHeadAttention(8, 2)(torch.randn(2, 4, 8), mask=torch.ones(4, 4, dtype=torch.long)),
         TypeError, "bool"),
        (lambda: mh.MultiHeadAttention(8, 2)(torch.randn(2, 4, 8).long()), TypeError, "floating"),
        (lambda: mh.MultiHeadAttention(8, 2, kdim=3)(torch.randn(2, 4, 8)), ValueError, "pass context"),
        (lambda: mh.MultiHeadAttention.from_torch(nn.Linear(2, 2)), TypeError, "nn.MultiheadAttention"),
        (lambda: mh.MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True)), ValueError,
         "add_bias_kv"),
    ],
)
def test_bad_layer_inputs(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)
