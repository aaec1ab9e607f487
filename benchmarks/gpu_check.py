"""`make gpu-check`: the CUDA checks and a short GPU benchmark, in under 8 minutes, with the GPU
machine's own PyTorch (no .venv, nothing downloaded, no weights carried: random-weight models of
real shapes are built on the spot).

1. the tests marked ``cuda`` (when pytest and hypothesis are there);
2. our kernels forward and backward against SDPA and FlexAttention compiled for CUDA (bfloat16,
   causal window 256 at 8k and 32k tokens);
3. a Qwen2-1.5B-shaped decoder (random, bfloat16) on 8k and 32k tokens: the plain forward against
   the streamed analysis (head metrics, typical texts, long-context statistics), time and peak
   memory above the weights, and the memory plan against the allocator's peak.

    PYTHONPATH=src python3 benchmarks/gpu_check.py
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def timed(fn, repeat: int = 3) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def kernels() -> None:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from _common import table

    flex = torch.compile(flex_attention)
    rows = [row for T in (8192, 32768) for row in _kernels_at(T, flex)]
    print("Kernels, bfloat16, B1 H16 D128, causal window 256 (SDPA: dense causal)")
    print(table(["tokens", "kernel", "forward ms", "forward+backward ms"], rows))


def _kernels_at(T: int, flex) -> list[list]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    import multihead as mh
    from multihead import masks

    q, k, v = (torch.randn(1, 16, T, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    ours_mask = masks.causal() & masks.window(256, 0)
    block = create_block_mask(lambda b, h, i, j: (j <= i) & (i - j <= 256), None, None, T, T, device="cuda")
    runs = {
        "ours (local)": lambda: mh.attention(q, k, v, ours_mask, backend="local")[0],
        "FlexAttention (compiled)": lambda: flex(q, k, v, block_mask=block),
        "SDPA (dense causal)": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    rows = []
    for name, run in runs.items():
        forward = timed(run)
        backward = timed(lambda run=run: run().sum().backward())
        rows.append([T, name, f"{forward * 1e3:.2f}", f"{backward * 1e3:.2f}"])
    return rows


def analysis() -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    import multihead as mh

    vocab = {f"w{i}": i for i in range(49152)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", pad_token="w0", eos_token="w1")
    config = Qwen2Config(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=65536)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to("cuda").eval()
    hf = mh.hf.wrap(model, tokenizer, name="qwen2-1.5b-shaped")
    from _common import table

    rows = [_analysis_at(hf, tokenizer, T) for T in (8192, 32768)]
    print("Qwen2-1.5B-shaped (random, bfloat16) on CUDA: plain forward vs streamed analysis")
    print(table(["tokens", "plain s", "analysis s", "ratio", "plain peak MiB", "analysis peak MiB",
                 "plan MiB (vs peak)"], rows))


def _analysis_at(hf, tokenizer, T: int) -> list:
    import torch

    import multihead as mh
    from multihead.analysis.pipelines.analyze import collect_statistics

    g = torch.Generator().manual_seed(0)
    text = " ".join(f"w{int(i)}" for i in torch.randint(2, 49152, (T,), generator=g))
    ids = torch.tensor([tokenizer(text)["input_ids"]], device="cuda")
    found = mh.analysis.plan(hf, ids.shape[1], probes=False, redundancy=False, views=0)
    base = torch.cuda.memory_allocated()
    with torch.inference_mode():
        torch.cuda.reset_peak_memory_stats()
        plain = timed(lambda: hf.body(input_ids=ids, use_cache=False), repeat=1)
        plain_peak = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    collect_statistics(hf, [text], redundancy=False, progress=False)
    torch.cuda.synchronize()
    ours = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - base
    return [ids.shape[1], f"{plain:.2f}", f"{ours:.2f}", f"{ours / plain:.2f}x", f"{plain_peak / 2**20:.0f}",
            f"{peak / 2**20:.0f}", f"{found.working / 2**20:.0f} ({found.working / peak - 1:+.0%})"]


def main() -> int:
    try:
        import torch
    except ImportError:
        print(f"gpu-check: no PyTorch in {sys.executable}; run it on the GPU machine with its own Python")
        return 0
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine; nothing to check")
        return 0
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__}")
    status = 0
    if importlib.util.find_spec("pytest") and importlib.util.find_spec("hypothesis"):
        status = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests/test_cuda.py",
                                 "-p", "no:cacheprovider"]).returncode
    else:
        print("gpu-check: pytest/hypothesis missing here: the cuda tests are skipped, the benchmark runs")
    kernels()
    analysis()
    return status


if __name__ == "__main__":
    sys.exit(main())
