"""The AMX tiles' attention (attn/softmax.c's ``attend_rows``, through ``fused.attend`` and the math
kernel): held to the path it replaces — oneDNN's bfloat16 products around the compiled softmax,
``MULTIHEAD_TILES=0`` — and through that to the eager steps (test_kernels.py holds the two together).
Runs only on a CPU with AMX; elsewhere the products' path is the only one and these skip."""

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from conftest import amx_tiles, masking_case
from multihead import masks
from multihead.attn import kernels
from multihead.attn.cpu_trace import traced_as_cpu
from multihead.attn.workspace import Workspace


def _both(monkeypatch, call):
    """``call()`` through oneDNN's products and the compiled softmax, then through the tiles (checked taken)."""
    fused = amx_tiles()
    monkeypatch.setenv(fused.TILES_ENV, "0")
    products = call()
    monkeypatch.setenv(fused.TILES_ENV, "1")
    calls = []
    real = fused.attend
    monkeypatch.setattr(fused, "attend", lambda *a, **kw: (calls.append(a[0].shape), real(*a, **kw))[1])
    tiles = call()
    assert calls, "the tiles' path was not taken"
    return products, tiles


def _operands(B, H, Hkv, T, S, Dk, Dv, seed):
    """Random bfloat16 q (B, H, T, Dk), k and v (B, Hkv, S, D·) — q a (B, T, H, Dk) block transposed, as
    a model's projection hands it over (strided: a G = 1 model's reshape of it stays a view)."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, T, H, Dk, generator=g) * 2).bfloat16().transpose(1, 2)
    k = torch.randn(B, Hkv, S, Dk, generator=g).bfloat16()
    v = torch.randn(B, Hkv, S, Dv, generator=g).bfloat16()
    return q, k, v


@pytest.mark.parametrize("shape", [(1, 9, 3, 170, 170, 64, 64), (2, 12, 2, 100, 300, 128, 128),
                                   (1, 4, 4, 7, 5, 32, 64), (2, 8, 2, 33, 1000, 96, 192), (1, 2, 1, 16, 16, 256, 256),
                                   (1, 7, 7, 40, 40, 64, 64), (2, 4, 4, 20, 50, 256, 64)])
@pytest.mark.parametrize("masking", ["none", "causal", "padded"])
def test_the_tiles_give_the_products_paths_weights_and_output(shape, masking, monkeypatch):
    """Weights bit for bit where the scores round alike (the products' float32 sums in the same order
    on these shapes), the output within a unit of bfloat16 in its last place — over head dims of
    32-256 (scales 1/√96, 1/√128 not powers of two: the scores rounded, scaled and rounded again;
    1/√64 and 1/√256 exact: q scaled first — with one query head a key head, a strided one),
    tiles of 16 rows cut short (7, 33, 170 rows), keys off the blocks of 16 and 32 (5, 300, 1,000),
    grouped query heads, T ≠ S, and rows that see no key (a causal mask with T > S, padded keys)."""
    B, H, Hkv, T, S, Dk, Dv = shape
    q, k, v = _operands(B, H, Hkv, T, S, Dk, Dv, seed=S + T)
    mask = masking_case(masking, B, S)

    def run():
        with torch.inference_mode():
            return mh.attention(q, k, v, mask, backend="math", need_weights=True, weights_dtype=torch.float32)

    (out, w), (tiles_out, tiles_w) = _both(monkeypatch, run)
    assert tiles_w.dtype == torch.float32 and tiles_out.dtype == torch.bfloat16 and tiles_out.shape == out.shape
    assert torch.equal(tiles_w == 0, w == 0)
    torch.testing.assert_close(tiles_w, w, atol=1e-6, rtol=1e-5)
    ulp = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(tiles_out.float(), out.float(), atol=ulp * float(out.abs().max()), rtol=ulp)
    assert float((tiles_out != out).float().mean()) < 0.01
    if masking != "none":  # rows that see no key: zeros, in the weights and the output
        blind = ~w.bool().any(-1)
        assert bool(blind.any()) == (T > S)
        assert not tiles_out[blind].any() and not tiles_w[blind].any()


def test_the_tiles_keep_nan_rows_nan_and_huge_scores_finite(monkeypatch):
    """A row with a NaN score gives NaN (as eager's softmax), a row of scores in the thousands its
    largest key's weight, equal scores uniform weights — in the weights and through P·V."""
    q, k, v = _operands(1, 2, 2, 40, 40, 64, 64, seed=3)
    q[0, 0, :10] = 0  # equal scores: uniform rows
    q[0, 1, 10:20] *= 3000.0
    k[0, 0, 5, 0] = float("nan")  # every row of head 0 that sees key 5 scores NaN there (head 1 has its own keys)

    def run():
        with torch.inference_mode():
            return mh.attention(q, k, v, masks.causal(), backend="math", need_weights=True,
                                weights_dtype=torch.float32)

    (out, w), (tiles_out, tiles_w) = _both(monkeypatch, run)
    nan_rows = torch.zeros(1, 2, 40, dtype=torch.bool)
    nan_rows[0, 0, 5:] = True
    assert torch.equal(tiles_w.isnan().any(-1), nan_rows) and torch.equal(w.isnan().any(-1), nan_rows)
    assert torch.equal(tiles_out.isnan().any(-1), nan_rows)
    assert torch.equal(tiles_w[~nan_rows], w[~nan_rows]) and torch.isfinite(tiles_out[~nan_rows]).all()
    torch.testing.assert_close(tiles_w[0, 0, 3, :4], torch.full((4,), 0.25))  # equal scores: 1/4 each
    huge = tiles_w[0, 1, 10:20]  # scores in the thousands: one key takes (nearly) all of each row
    assert torch.isfinite(huge).all() and float(huge.max(-1).values.min()) > 0.99
    assert torch.equal(tiles_out[0, 1, 10:20], out[0, 1, 10:20]) and torch.isfinite(tiles_out[0, 1]).all()


def test_the_tiles_form_each_rows_entropy(monkeypatch):
    """A workspace that asks for the rows' entropies gets them from the tiles' softmax: −Σ p ln p of
    the weights it returns, 0 for a row that sees nothing."""
    q, k, v = _operands(1, 6, 2, 50, 40, 64, 64, seed=5)

    def run():
        ws = Workspace(entropy=True)
        with torch.inference_mode():
            out, w = kernels.attention(q, k, v, masks.causal(), backend="math", need_weights=True,
                                       weights_dtype=torch.float32, workspace=ws)
            return out.clone(), w.clone(), ws.entropy.clone()

    (_, _, entropy), (_, tiles_w, tiles_entropy) = _both(monkeypatch, run)
    p = tiles_w.double()
    want = -(p * p.clamp_min(1e-300).log()).sum(-1)  # (B, H, T)
    torch.testing.assert_close(tiles_entropy.double(), want, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(tiles_entropy, entropy, atol=1e-6, rtol=0)
    assert float(tiles_entropy[..., :10].abs().max()) == 0.0  # T > S: the first 10 rows see nothing


def test_the_tiles_are_not_taken_where_their_path_does_not_hold(monkeypatch):
    """A gradient, a bias in the mask, float16, head dims that do not fill a tile (Dk 48, Dv 32),
    ``MULTIHEAD_TILES=0``: the products' path (fused.attend never called), the same results as ever."""
    fused = amx_tiles()
    calls = []
    monkeypatch.setattr(fused, "attend", lambda *a, **kw: calls.append(1))
    q, k, v = _operands(1, 4, 2, 20, 20, 64, 64, seed=7)
    bias = masks.from_tensor(torch.randn(20, 20))
    with torch.inference_mode():
        mh.attention(q, k, v, bias, backend="math", need_weights=True)
        mh.attention(q.half(), k.half(), v.half(), masks.causal(), backend="math", need_weights=True)
        q48, k48, v48 = _operands(1, 4, 2, 20, 20, 48, 64, seed=8)
        mh.attention(q48, k48, v48, masks.causal(), backend="math", need_weights=True)
        q32, k32, v32 = _operands(1, 4, 2, 20, 20, 64, 32, seed=9)
        mh.attention(q32, k32, v32, masks.causal(), backend="math", need_weights=True)
        monkeypatch.setenv(fused.TILES_ENV, "0")
        mh.attention(q, k, v, masks.causal(), backend="math", need_weights=True)
    monkeypatch.setenv(fused.TILES_ENV, "1")
    qg = q.clone().requires_grad_()
    out, _ = mh.attention(qg, k, v, masks.causal(), backend="math", need_weights=True)
    out.float().sum().backward()
    assert qg.grad is not None and not calls


def test_attend_refuses_operands_it_cannot_read():
    """Shapes and dtypes that do not fit the C side's layout: a ValueError, nothing written."""
    fused = amx_tiles()
    q, k, v = (t[0] for t in _operands(1, 2, 2, 16, 16, 64, 64, seed=1))
    S, D = 16, 64
    good = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), scale=1.0, keys=S,
                weights=torch.empty(1, 2, 16, S), out=torch.empty(2, 16, D, dtype=torch.bfloat16),
                packed_keys=torch.empty(2 * 16 * D, dtype=torch.bfloat16),
                packed_values=torch.empty(2 * 32 * D, dtype=torch.bfloat16),
                scratch=torch.empty(2 * fused.tile_buffers(S, D), dtype=torch.bfloat16))
    fused.attend(**good)
    before = good["out"].clone()
    strided = torch.empty(2, 64, 16, dtype=torch.bfloat16).transpose(1, 2)  # (2, 16, 64), not contiguous
    for name, bad in (("q", q.float()), ("k", k[:, :8]), ("weights", torch.empty(1, 2, 16, S + 1)),
                      ("out", torch.empty(2, 16, D)), ("packed_keys", torch.empty(8, dtype=torch.bfloat16)),
                      ("scratch", torch.empty(8, dtype=torch.bfloat16)), ("v", v.transpose(0, 1)),
                      ("q", strided.copy_(q)), ("entropy", torch.empty(1, 2, 17))):
        with pytest.raises(ValueError, match="do not fit"):
            fused.attend(**{**good, name: bad})
    assert torch.equal(good["out"], before)  # nothing written by a refused call


def test_a_memory_plan_traces_the_tiles_buffers_on_meta():
    """On ``meta`` under ``traced_as_cpu`` the math kernel takes the tiles' path — its weights,
    packed operands and tile buffers, no scores or half weights of the chunk — and outside it the
    products' (a plan for another device)."""
    amx_tiles()
    from multihead.attn.memory import LiveBytes

    q = torch.empty(1, 9, 512, 64, dtype=torch.bfloat16, device="meta")
    k = v = torch.empty(1, 3, 2048, 64, dtype=torch.bfloat16, device="meta")
    peaks = {}
    for tiles in (True, False):
        with traced_as_cpu(tiles), torch.inference_mode(), LiveBytes("meta") as live:
            out, w = mh.attention(q, k, v, masks.causal(), backend="math", need_weights=True,
                                  weights_dtype=torch.float32)
        assert out.shape == (1, 9, 512, 64) and w.shape == (1, 9, 512, 2048)
        peaks[tiles] = live.peak
    weights = 9 * 512 * 2048 * 4
    assert weights < peaks[True] < weights * 1.2  # the map, and a few MB beside it
    assert peaks[False] >= weights * 1.5  # the scores and the half weights too


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_an_analysis_on_the_tiles_is_the_products_analysis(kv_heads, smollm2, monkeypatch):
    """A bfloat16 Llama with heads of 64 (random weights, SmolLM2's tokenizer) analysed whole and as
    one document streamed in chunks of 8 rows: every head's metrics and label the same with the
    attention on the tiles as through oneDNN's products — with grouped query heads, and with one
    query head a key head (a document's q then reaches the tiles as a strided view)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from multihead.hf.model import HFModel

    amx_tiles()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm2.tokenizer), hidden_size=256, intermediate_size=384,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                         max_position_embeddings=512)
    model = HFModel(LlamaForCausalLM(config).eval().to(torch.bfloat16), smollm2.tokenizer, "llama-64",
                    Path("."), True, 2, 4, kv_heads, 512)
    texts = ["The cat sat on the mat because it was warm.", "Paris is the capital of France, and Rome of Italy."]

    def run():
        return [mh.analyze(model, texts, coreference=False, progress=False),
                mh.analyze(model, [" ".join(texts * 4)], coreference=False, progress=False, chunk=8)]

    products, tiles = _both(monkeypatch, run)
    for want, got in zip(products, tiles, strict=True):
        assert [h.label for h in got.heads] == [h.label for h in want.heads]
        for metric in want.heads[0].metrics:
            assert [h.metrics[metric] for h in got.heads] == pytest.approx(
                [h.metrics[metric] for h in want.heads], abs=1e-6, nan_ok=True), metric


def test_a_streamed_layer_is_packed_once_and_its_chunks_are_as_packed_each(monkeypatch):
    """A layer streamed in chunks of 8 rows, each over its first keys (causal), by readers that keep
    nothing (their workspace names the layer's whole key and value): its operands are packed once a
    layer, not once a chunk — and every chunk's weights and output, and the model's logits, are the
    same to the bit as with each chunk packing its own keys."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fused = amx_tiles()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=256, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval().to(torch.bfloat16)
    ids = torch.randint(0, 100, (1, 75))

    def run():
        seen, packs = [], []
        real = fused.pack
        monkeypatch.setattr(fused, "pack", lambda *a: (packs.append(a[0].shape), real(*a))[1])
        with torch.inference_mode(), mh.hf.AttentionCapture(
                model, lambda c: seen.append((c.layer, c.start, c.weights.clone(), c.outputs.clone())), chunk=8,
                transient=True):
            logits = model(ids).logits
        return seen, packs, logits

    seen, packs, logits = run()
    assert packs == [(2, 75, 64)] * 2  # once a layer: its two key heads' 75 keys of 64
    monkeypatch.setattr(kernels, "_whole_layer", lambda *a: None)  # each chunk packs its own keys
    own, none, own_logits = run()
    assert not none and len(seen) == len(own) == 2 * 10
    assert torch.equal(logits, own_logits)
    for (layer, start, w, out), (layer2, start2, w2, out2) in zip(seen, own, strict=True):
        assert (layer, start) == (layer2, start2)
        assert torch.equal(w, w2) and torch.equal(out, out2)


@settings(max_examples=30, deadline=None)
@given(N=st.integers(0, 70), X=st.integers(0, 4200), seed=st.integers(0, 2**31))
def test_the_tiles_gram_is_the_product_of_the_rows_with_themselves(N, X, seed):
    """The cosine's Gram of bfloat16 rows on the tiles (``gram_rows``): rows @ rowsᵀ of every shape — rows
    that do not fill a tile of 16, columns that do not fill a block of 32 or a share of 2,048 — each
    product exact and the sums float32 (to float32's rounding of a sum of X terms), symmetric to the bit."""
    fused = amx_tiles()
    rows = torch.randn(N, X, generator=torch.Generator().manual_seed(seed)).bfloat16()
    gram = fused.gram(rows)
    assert gram.shape == (N, N) and gram.dtype == torch.float32
    assert torch.equal(gram, gram.T)
    want = rows.double() @ rows.double().T
    torch.testing.assert_close(gram.double(), want, rtol=1e-5, atol=1e-5 * max(1.0, X ** 0.5))


def test_a_bfloat16_cosine_gram_takes_the_tiles_and_refuses_what_they_cannot_read(monkeypatch):
    """redundancy's Gram of a bfloat16 block goes to the tiles (float32 sums, none rounded to bfloat16);
    the tiles' Gram refuses other dtypes and layouts in one line."""
    from multihead.analysis.stats import redundancy

    fused = amx_tiles()
    calls = []
    real = fused.gram
    monkeypatch.setattr(fused, "gram", lambda rows: (calls.append(tuple(rows.shape)), real(rows))[1])
    unit = torch.randn(270, 576 * 3, generator=torch.Generator().manual_seed(1)).bfloat16()
    gram = redundancy._gram(unit)
    assert calls == [(270, 1728)] and gram.dtype == torch.float32
    torch.testing.assert_close(gram.double(), unit.double() @ unit.double().T, rtol=1e-5, atol=1e-3)
    for bad in (unit.float(), unit.T, unit[None]):
        with pytest.raises(ValueError, match="bfloat16 rows"):
            real(bad)
