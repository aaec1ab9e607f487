"""The same claims on a CUDA GPU (issue 27): kernels, capture, gates, streamed analysis, memory plan,
low precision. Every test here is marked ``cuda``: skipped without a GPU, never required by
``make test``; ``make gpu-check`` runs them on the GPU machine with its own PyTorch."""

from __future__ import annotations

import pytest
import torch

import multihead as mh
from architectures import build, inputs
from multihead import masks

pytestmark = pytest.mark.cuda
CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("backend", "mask"), [
    ("math", masks.causal()), ("sdpa", masks.causal()), ("local", masks.causal() & masks.window(64, 0)),
    ("sparse", masks.window(32) | masks.global_tokens([0])), ("topk", masks.topk(8)),
])
def test_kernels_on_cuda_equal_the_float64_oracle_forward_and_backward(backend, mask, dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 32, generator=g, dtype=torch.float64) for _ in range(3))
    want, _ = mh.attention(q, k, v, mask, backend="math")
    leaves = [t.to(CUDA, dtype).requires_grad_(True) for t in (q, k, v)]
    got, _ = mh.attention(*leaves, mask, backend=backend)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=tol)
    got.float().square().sum().backward()
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    mh.attention(*ref, mask, backend="math")[0].square().sum().backward()
    for a, b in zip(leaves, ref, strict=True):
        torch.testing.assert_close(a.grad.double().cpu(), b.grad, atol=20 * tol, rtol=20 * tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_capture_and_gates_on_cuda_equal_the_cpu(dtype):
    model = build("llama (GQA)").to(torch.float32)
    batch = inputs("llama (GQA)", model)
    seen_cpu, seen_gpu = {}, {}
    gates = torch.ones(model.config.num_hidden_layers, model.config.num_attention_heads)
    gates[0, 1] = 0
    with torch.no_grad(), mh.hf.HeadGates(model, values=gates), \
            mh.hf.AttentionCapture(model, lambda c: seen_cpu.__setitem__(c.layer, c.weights)):
        want = model(**batch).last_hidden_state
    gpu = model.to(CUDA, dtype)
    with torch.no_grad(), mh.hf.HeadGates(gpu, values=gates), \
            mh.hf.AttentionCapture(gpu, lambda c: seen_gpu.__setitem__(c.layer, c.weights), chunk=3):
        got = gpu(**{k: v.to(CUDA) for k, v in batch.items()}).last_hidden_state
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    rows = batch["attention_mask"].bool()
    torch.testing.assert_close(got.float().cpu()[rows], want[rows], atol=tol * float(want.abs().max()), rtol=0)
    assert all(w.device.type == "cuda" and w.dtype == torch.float32 for w in seen_gpu.values())


def test_a_streamed_pass_on_cuda_reads_nothing_back_per_chunk():
    """The routed attention and its chunking make no host synchronisation (set_sync_debug_mode)."""
    model = build("llama (GQA)").to(CUDA, torch.float32)
    batch = {k: v.to(CUDA) for k, v in inputs("llama (GQA)", model, B=2, T=64).items()}
    batch.pop("attention_mask")  # a padding mask is read on the host by transformers itself, once per pass
    with torch.no_grad(), mh.hf.AttentionCapture(model, lambda c: None, chunk=8):
        model(**batch)  # warm-up: kernels, caches
        torch.cuda.set_sync_debug_mode("error")
        try:
            model(**batch)
        finally:
            torch.cuda.set_sync_debug_mode(0)


def _random_decoder(device: str):
    """A Qwen2-shaped random decoder (4 layers, 12/2 heads) with a word-level tokenizer: no weights
    to carry to the GPU machine."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", pad_token="w0", eos_token="w1")
    config = Qwen2Config(hidden_size=384, num_hidden_layers=4, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=1024, vocab_size=1000, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_proj.weight" in name or "k_proj.weight" in name:
                p.normal_(0, 0.2)  # heads that differ
    return mh.hf.wrap(model.to(device), tokenizer, name="random qwen2")


TEXT = " ".join(f"w{(7 * i) % 997 + 2}" for i in range(1500))


def test_the_streamed_analysis_on_cuda_equals_the_cpu():
    """On CUDA the document's layers go to the row-statistics kernels (the default there); on the CPU
    through the maps: the head metrics agree."""
    cpu = mh.analysis.collect_statistics(_random_decoder("cpu"), [TEXT], redundancy=False, progress=False)
    gpu = mh.analysis.collect_statistics(_random_decoder("cuda"), [TEXT], redundancy=False, progress=False)
    want, got = dict(cpu.heads.result()), dict(gpu.heads.result())
    for name, value in want.items():
        torch.testing.assert_close(got[name].cpu(), value, atol=1e-4, rtol=1e-4, equal_nan=True)


def test_the_memory_plan_on_cuda_is_within_20_percent_of_the_allocator(monkeypatch):
    # the plan traces the maps' path; the row-statistics kernels' (the default on CUDA) hold far less
    monkeypatch.setenv("MULTIHEAD_ROWSTATS", "0")
    model = _random_decoder("cuda")
    n = len(model.tokenizer(TEXT)["input_ids"])
    found = mh.analysis.plan(model, n, probes=False, views=0)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    mh.analysis.collect_statistics(model, [TEXT], views=(), progress=False)
    peak = torch.cuda.max_memory_allocated() - base
    assert abs(found.working / peak - 1) <= 0.2, (found, peak)


def test_the_streamed_analysis_on_cuda_waits_for_the_gpu_once_a_layer_not_once_a_chunk():
    """Every streaming reducer on a document in 64-row chunks: the syncs PyTorch counts
    (set_sync_debug_mode "warn") stay far below one per chunk — its statistics live on the GPU."""
    import warnings

    model = _random_decoder("cuda")
    n = len(model.tokenizer(TEXT)["input_ids"])
    chunks = model.num_layers * -(-n // 64)
    mh.analysis.collect_statistics(model, [TEXT], chunk=64, progress=False)  # warm-up
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            stats = mh.analysis.collect_statistics(model, [TEXT], chunk=64, progress=False, views=[0])
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in seen if "synchroniz" in str(w.message)]
    assert stats.heads.result()["entropy"].isfinite().all()
    assert len(syncs) < chunks / 2, (len(syncs), chunks)


#: texts and a patching example in the random decoder's words (its word-level tokenizer: one token a
#: word; none starting w0 or w1, its special tokens, which would split them)
WORD_TEXTS = ["w5 w6 w7 w8 w9 w22 w23 w24", "w20 w21 w22 w23 w24", "w30 w31 w32 w33 w34 w35 w36 w37 w38 w39"]
WORD_EXAMPLE = ("w5 w6 w7 w8 w9", "w5 w6 w40 w8 w9", " w25", " w26")


@pytest.mark.slow
def test_every_feature_on_cuda_equals_the_cpu():
    """Capture, a streamed document, zero / mean ablation, the gradient estimate, patching, direct
    logit attribution, what-if and gradient importance of a random decoder on the GPU equal the
    CPU's (on the CPU this is rehearsed on stand-in devices: tests/test_placement.py)."""
    from test_placement import assert_same_features, every_feature

    heads = ((0, 0), (2, 1), (3, 11))
    # (no coreference: its examples are English, the decoder's words are not)
    want = every_feature(_random_decoder("cpu"), WORD_TEXTS, WORD_EXAMPLE, heads, coreference=False)
    got = every_feature(_random_decoder("cuda"), WORD_TEXTS, WORD_EXAMPLE, heads, coreference=False)
    assert_same_features(got, want, tol=1e-4)
