"""A half-precision model's linear layers on a CPU without half units: products formed in float32
and rounded once (attn.precision.raised_linear, hf.halflinear) — what a float32-accumulating half
GEMM gives, without PyTorch's scalar half loop (issue 27: any dtype, any device)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import multihead as mh
from multihead.attn import precision
from multihead.hf import halflinear
from multihead.hf.halflinear import RaisedHalfLinear, raise_half_linears

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few rows, so every loop of the raised product and its backward runs many times
    and ends on a partial block."""
    monkeypatch.setattr(precision, "RAISED_BYTES", 5 * 4 * 24)  # 5 rows of K = 24, but at least RAISED_ROWS
    monkeypatch.setattr(precision, "RAISED_ROWS", 7)
    monkeypatch.setattr(precision, "RAISED_WEIGHT_BYTES", 3 * 4 * 24)  # 3 weight rows of K = 24


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_the_raised_product_is_the_float32_product_rounded_once(dtype, bias, small_blocks):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 45, 24, generator=g).to(dtype)  # (B, T, K): 90 rows, blocks of 7 and a partial one
    w = (torch.randn(17, 24, generator=g) / 5).to(dtype)  # (N, K): blocks of 3 rows and a partial one
    b = torch.randn(17, generator=g).to(dtype) if bias else None
    got = precision.raised_linear(x, w, b)  # (2, 45, 17)
    assert got.dtype == dtype and got.shape == (2, 45, 17)
    wide = F.linear(x.float(), w.float(), None if b is None else b.float())
    # one rounding of the float32 sum: a block's summation order may flip a rounding by one unit
    torch.testing.assert_close(got, wide.to(dtype), atol=1e-6, rtol=torch.finfo(dtype).eps)
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    ulp = torch.finfo(dtype).eps * float(exact.abs().max())
    own = F.linear(x, w, b)  # PyTorch's own half product, as the model computes without us
    assert float((got.double() - own.double()).abs().max()) <= ulp
    assert float((got.double() - exact).abs().max()) <= float((own.double() - exact).abs().max()) + ulp / 2


@pytest.mark.parametrize("needs", [(True, True, True), (True, False, False), (False, True, True)])
def test_the_raised_products_backward_passes_gradcheck_in_float64(needs, small_blocks):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 30, 24, dtype=torch.float64, generator=g).requires_grad_(needs[0])  # (B, T, K)
    w = torch.randn(11, 24, dtype=torch.float64, generator=g).requires_grad_(needs[1])  # (N, K)
    b = torch.randn(11, dtype=torch.float64, generator=g).requires_grad_(needs[2])  # (N,)
    assert torch.autograd.gradcheck(precision.raised_linear, (x, w, b))
    torch.testing.assert_close(precision.raised_linear(x, w, b), F.linear(x, w, b), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_raised_backward_in_half_precision_is_float32s_rounded(dtype, small_blocks):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(90, 24, generator=g).to(dtype)
    w = (torch.randn(17, 24, generator=g) / 5).to(dtype)
    b = torch.randn(17, generator=g).to(dtype)
    up = torch.randn(90, 17, generator=g).to(dtype)  # the gradient arriving from above
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    precision.raised_linear(*leaves).backward(up)
    wide = [t.float().requires_grad_() for t in (x, w, b)]
    F.linear(*wide).backward(up.float())
    for ours, theirs in zip(leaves, wide, strict=True):
        assert ours.grad.dtype == dtype
        ulp = torch.finfo(dtype).eps * float(theirs.grad.abs().max())
        assert float((ours.grad.float() - theirs.grad).abs().max()) <= ulp  # the float32 sum, rounded


def _tiny_llama(dtype):
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, vocab_size=300)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()


def test_a_half_model_on_a_cpu_without_units_gets_raised_linears_that_give_its_outputs(monkeypatch):
    monkeypatch.setattr(precision, "half_units", lambda dtype: False)  # an AVX2 CPU, whatever runs this
    monkeypatch.setattr(halflinear, "half_units", lambda dtype: False)
    model = _tiny_llama(torch.bfloat16)
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = model(input_ids=ids).logits  # (B, T, V): PyTorch's half products
    keys = list(model.state_dict())
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    assert raise_half_linears(model) == len(linears) == 2 * 7 + 1  # q k v o gate up down per layer, the LM head
    assert all(type(m) is RaisedHalfLinear for m in linears) and list(model.state_dict()) == keys
    assert raise_half_linears(model) == 0  # once
    calls = []
    raised_linear = precision.raised_linear
    monkeypatch.setattr(precision, "raised_linear", lambda *a: calls.append(1) or raised_linear(*a))
    with torch.no_grad():
        raised = model(input_ids=ids).logits
    assert len(calls) == len(linears)
    ulps = 4 * torch.finfo(torch.bfloat16).eps * float(own.abs().max())  # summation order, through two layers
    assert float((raised.float() - own.float()).abs().max()) <= ulps
    # float32, or a CPU with the units: nothing changes
    assert raise_half_linears(_tiny_llama(torch.float32)) == 0
    monkeypatch.setattr(halflinear, "half_units", lambda dtype: True)
    assert raise_half_linears(_tiny_llama(torch.bfloat16)) == 0


def test_load_raises_a_half_models_linears_only_where_the_cpu_lacks_the_units(tmp_path):
    loaded = mh.hf.load("smollm2", dtype="bfloat16")
    raised = [m for m in loaded.model.modules() if type(m) is RaisedHalfLinear]
    plain = [m for m in loaded.model.modules() if type(m) is nn.Linear]
    if precision.half_units(torch.bfloat16):
        assert not raised and plain
    else:
        assert len(raised) == 30 * 7 + 1 and not plain  # SmolLM2's LM head is tied: one module
    full = mh.hf.load("smollm2")
    assert not any(type(m) is RaisedHalfLinear for m in full.model.modules())


def test_pruning_a_raised_model_keeps_its_linears_raised(monkeypatch):
    from multihead.heads import prune_heads

    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    monkeypatch.setattr(halflinear, "half_units", lambda dtype: False)
    model = _tiny_llama(torch.bfloat16)
    raise_half_linears(model)
    prune_heads(model, {0: [1, 3]})
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.out_features == 2 * 16
    assert all(type(m) is RaisedHalfLinear for m in (attention.q_proj, attention.k_proj, attention.v_proj,
                                                     attention.o_proj))


def test_an_offloaded_half_model_runs_its_raised_linears_through_accelerates_hooks(tmp_path, monkeypatch):
    """accelerate's hook calls the forward it saved at dispatch (``_old_forward``): that one is raised
    too, and the offloaded model gives the in-memory model's logits exactly."""
    pytest.importorskip("accelerate")
    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    monkeypatch.setattr(halflinear, "half_units", lambda dtype: False)
    calls = []
    raised_linear = precision.raised_linear
    monkeypatch.setattr(precision, "raised_linear", lambda *a: calls.append(1) or raised_linear(*a))
    offloaded = mh.hf.load("smollm2", dtype="bfloat16", device_map="auto", max_memory="cpu=200MiB",
                           offload_folder=tmp_path)
    in_memory = mh.hf.load("smollm2", dtype="bfloat16")
    assert "disk" in set(offloaded.model.hf_device_map.values())
    ids = in_memory.tokenizer("The capital of France is Paris, and the capital of Italy is",
                              return_tensors="pt")["input_ids"]
    with torch.no_grad():
        got = offloaded.model(input_ids=ids).logits
        assert len(calls) == 30 * 7 + 1
        want = in_memory.model(input_ids=ids).logits
    assert len(calls) == 2 * (30 * 7 + 1) and torch.equal(got, want)


def test_raised_layers_with_nothing_to_multiply_and_in_place_use_behave_as_nn_linear(monkeypatch):
    """A layer with every head pruned has no inputs (W^O) or no outputs (W^Q); an empty batch has no
    rows; the output may be changed in place under autograd (not a view of the Function's); a
    forward-mode tangent takes nn.Linear's own product."""
    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    for in_features, out_features, rows in ((0, 6, 5), (6, 0, 5), (6, 4, 0)):
        layer = nn.Linear(in_features, out_features).to(torch.bfloat16)
        layer.__class__ = RaisedHalfLinear
        x = torch.randn(2, rows, in_features).to(torch.bfloat16).requires_grad_()
        out = layer(x)
        assert out.shape == (2, rows, out_features) and out.dtype == torch.bfloat16
        out.float().sum().backward()
        assert x.grad.shape == x.shape
    layer = nn.Linear(24, 8).to(torch.bfloat16)
    layer.__class__ = RaisedHalfLinear
    x = torch.randn(3, 24, 5).to(torch.bfloat16).transpose(1, 2).requires_grad_()  # (3, 5, 24), not contiguous
    out = layer(x)
    out.mul_(2)  # as a model may do to an nn.Linear's output
    out.float().sum().backward()
    torch.testing.assert_close(x.grad.float(), (2 * layer.weight.float().sum(0)).expand(3, 5, 24),
                               atol=0.05, rtol=0.01)
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        dual = fwAD.make_dual(x.detach(), torch.ones_like(x))
        tangent = fwAD.unpack_dual(layer(dual)).tangent  # refused by a Function without a jvp
    torch.testing.assert_close(tangent.float(), layer.weight.float().sum(1).expand(3, 5, 8), atol=0.05, rtol=0.01)


def _tiny_gpt2(dtype):
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=300)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).to(dtype).eval()


def test_gpt2s_conv1d_layers_are_raised_too_and_give_its_outputs_and_gradients(monkeypatch):
    """GPT-2 keeps its projections in transformers' Conv1D, x @ W + b with W stored (in, out): in
    bfloat16 that addmm is PyTorch's scalar loop on an AVX2 CPU (a GPT-2-small shape's 1,024-token
    forward 129 s against float32's 2.7 s). Raised, it is F.linear with Wᵀ, a view."""
    from transformers.pytorch_utils import Conv1D

    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    monkeypatch.setattr(halflinear, "half_units", lambda dtype: False)
    model = _tiny_gpt2(torch.bfloat16)
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    own = model(input_ids=ids, labels=ids)
    own.loss.backward()
    own_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    convs = [m for m in model.modules() if type(m) is Conv1D]
    keys = list(model.state_dict())
    assert raise_half_linears(model) == len(convs) + 1 == 2 * 4 + 1  # c_attn c_proj c_fc c_proj per layer, LM head
    assert all(isinstance(m, Conv1D) and mh.hf.model.is_conv1d(m) and type(m) is halflinear.raised_conv1d(Conv1D)
               for m in convs) and list(model.state_dict()) == keys
    assert raise_half_linears(model) == 0  # once
    calls = []
    raised_linear = precision.raised_linear
    monkeypatch.setattr(precision, "raised_linear", lambda *a: calls.append(1) or raised_linear(*a))
    raised = model(input_ids=ids, labels=ids)
    raised.loss.backward()
    assert len(calls) == len(convs) + 1
    ulps = 4 * torch.finfo(torch.bfloat16).eps * float(own.logits.detach().abs().max())
    assert float((raised.logits.float() - own.logits.float()).abs().max()) <= ulps
    for name, param in model.named_parameters():  # the weight's gradient comes back through Wᵀ, as (in, out)
        assert param.grad.shape == param.shape, name
        scale = float(own_grads[name].abs().max()) + 1e-30
        assert float((param.grad.float() - own_grads[name].float()).abs().max()) <= 0.05 * scale, name
    # the sites still see W^O, and gates, capture and the DLA's output weights read it as (D, H·Dv)
    site = mh.hf.sites.find_sites(model)[0]
    torch.testing.assert_close(site.output_weight(), model.transformer.h[0].attn.c_proj.weight.T)


def test_the_raised_product_through_a_transposed_weight_passes_gradcheck_in_float64(small_blocks):
    """Conv1D's raised product takes Wᵀ, a view with strides (1, nf), whose row blocks are the
    weight's column blocks."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 20, 24, dtype=torch.float64, generator=g).requires_grad_()  # (B, T, nx)
    w = torch.randn(24, 13, dtype=torch.float64, generator=g).requires_grad_()  # (nx, nf), as Conv1D keeps it
    b = torch.randn(13, dtype=torch.float64, generator=g).requires_grad_()  # (nf,)
    assert torch.autograd.gradcheck(lambda x, w, b: precision.raised_linear(x, w.T, b), (x, w, b))
    torch.testing.assert_close(precision.raised_linear(x, w.T, b), torch.addmm(b, x.reshape(-1, 24), w).view(2, 20, 13))


def test_under_autocast_to_a_slow_half_dtype_our_layers_products_are_raised(monkeypatch):
    """Mixed-precision training (autocast to bfloat16) on a CPU without units for it: autocast's
    half GEMM was PyTorch's scalar loop, a step of a 2-layer, 512-wide DecoderLM 23.5 s against
    float32's 0.4 s (0.5 s raised). Raised, the product is autocast's own — operands cast to
    bfloat16, a float32 sum rounded once — and the gradients reach the float32 weights through the
    casts; with the units (or autocast off) it is F.linear's."""
    from multihead.models import DecoderLM, ModelConfig

    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    calls = []
    raised_linear = precision.raised_linear
    monkeypatch.setattr(precision, "raised_linear", lambda *a: calls.append(1) or raised_linear(*a))
    config = ModelConfig("decoder", 2, 4, 64, 128, vocab=50, max_len=32, norm_first=True, dropout=0.0, eps=1e-5)
    torch.manual_seed(0)
    model = DecoderLM(config)
    ids = torch.randint(0, 50, (3, 33), generator=torch.Generator().manual_seed(0))

    autocast = precision.autocast_half

    def step(raise_products: bool):
        monkeypatch.setattr(precision, "autocast_half", autocast if raise_products else lambda t: None)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids[:, :-1])  # (B, T, V)
        loss = F.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:])
        loss.backward()
        return logits, loss, {n: p.grad.clone() for n, p in model.named_parameters()}

    own_logits, own_loss, own_grads = step(False)
    assert not calls
    logits, loss, grads = step(True)
    assert len(calls) == 2 * 4 + 1  # per layer: Q/K/V in one, W^O, the feed-forward's two; the LM head
    assert logits.dtype == own_logits.dtype == torch.bfloat16
    ulps = 4 * torch.finfo(torch.bfloat16).eps * float(own_logits.detach().abs().max())
    assert float((logits.detach().float() - own_logits.detach().float()).abs().max()) <= ulps
    assert abs(loss.item() - own_loss.item()) < 1e-2
    for name, grad in grads.items():  # float32 gradients, as autocast's casts give them
        assert grad.dtype == torch.float32, name
        if name.endswith("k_proj.bias"):  # 0 in exact arithmetic (softmax ignores a shift): rounding noise
            continue
        scale = float(own_grads[name].abs().max()) + 1e-12
        assert float((grad - own_grads[name]).abs().max()) <= 0.05 * scale, name
    # the raised product ignores an enclosing autocast: its float32 sums stay float32
    x, w = torch.randn(5, 8).to(torch.bfloat16), torch.randn(3, 8).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = raised_linear(x, w)
    assert torch.equal(inside, raised_linear(x, w))
    # a CPU with the units, or no autocast: F.linear's own
    monkeypatch.setattr(precision, "half_units", lambda dtype: True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert precision.autocast_half(torch.ones(2)) is None
    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    assert precision.autocast_half(torch.ones(2)) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert precision.autocast_half(torch.ones(2)) == torch.bfloat16
        assert precision.autocast_half(torch.ones(2, dtype=torch.float64)) is None


def test_a_tangent_on_the_weight_alone_takes_f_linear_and_our_feed_forward_calls_its_modules(monkeypatch):
    """A forward-mode tangent or torch.func on the weight (not on x) — as a jvp over head gates gives
    W^O·ξ — reaches F.linear, not the raised Function (which has no jvp); the feed-forward's
    layers are precision.Linear modules, called as modules, so hooks on them fire; a model with
    raised Conv1D layers pickles."""
    import pickle

    import torch.autograd.forward_ad as fwAD

    from multihead.models.blocks import FeedForward

    monkeypatch.setattr(precision, "half_units", lambda dtype: False)
    x = torch.randn(4, 8).to(torch.bfloat16)
    w = torch.randn(3, 8).to(torch.bfloat16)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(precision.linear(x, fwAD.make_dual(w, torch.ones_like(w)))).tangent
    torch.testing.assert_close(tangent.float(), x.float().sum(1, keepdim=True).expand(4, 3), atol=0.1, rtol=0.02)
    grad = torch.func.grad(lambda w: precision.linear(x.float(), w).sum())(w.float())  # float32: F.linear anyway
    torch.testing.assert_close(grad, x.float().sum(0).expand(3, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        grad = torch.func.grad(lambda w: precision.linear(x.float(), w).float().sum())(w.float())
    torch.testing.assert_close(grad, x.float().sum(0).expand(3, 8), atol=0.1, rtol=0.02)
    ffn = FeedForward(8, 16)
    seen = []
    ffn.up.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    ffn(torch.randn(2, 5, 8))
    assert seen == [(2, 5, 16)] and isinstance(ffn.up, nn.Linear)
    model = _tiny_gpt2(torch.bfloat16)
    monkeypatch.setattr(halflinear, "half_units", lambda dtype: False)
    assert raise_half_linears(model) == 9
    copy = pickle.loads(pickle.dumps(model))
    assert type(copy.transformer.h[0].attn.c_attn) is type(model.transformer.h[0].attn.c_attn)
