"""`make gpu-check`: the CUDA checks and a short GPU benchmark, in under 8 minutes, with the GPU
machine's own PyTorch (no .venv, nothing downloaded, no weights carried: random-weight models of
real shapes are built on the spot).

1. the tests marked ``cuda``, and tests/test_rowstats.py's kernels on the GPU (when pytest and hypothesis
   are there);
2. our kernels forward and backward against SDPA and FlexAttention compiled for CUDA (bfloat16,
   causal window 256 at 8k and 32k tokens);
3. the row-statistics kernels (attn/rowstats.py: a layer's outputs and every row's sums from Q and K,
   the map never written; then the columns' sums and the weights at the diagonals) against SDPA's
   forward on one Qwen2-1.5B-shaped layer (12 query / 2 key-value heads of 128, bfloat16, causal) at
   8k and 32k tokens: what the analysis would add per layer if its readers took these sums;
4. a Qwen2-1.5B-shaped decoder (random, bfloat16) on 8k and 32k tokens: the plain forward against
   the streamed analysis — through the row-statistics kernels, the default on CUDA (every reducer
   that streams without a parser, as bench_scale's: head
   metrics, typical texts, long-context statistics, redundancy; one untimed analysis of 64 tokens
   first), time and peak memory above the weights, and the memory plan against the allocator's
   peak. A length whose time, extrapolated from the one before it (quadratic in the tokens), would
   pass the check's budget is skipped with a line saying so: the GPU machine's time is lent by the
   minute.

    PYTHONPATH=src python3 benchmarks/gpu_check.py
    PYTHONPATH=src python3 benchmarks/gpu_check.py --rehearse   # the same code on the CPU, small

``--rehearse`` runs steps 2 to 4 on the CPU at 32 to 256 tokens with two layers (FlexAttention
uncompiled and forward only: it has no backward on a CPU): every call of the benchmark is made on a
machine without a GPU (the suite runs it), so the GPU's minutes are not the first to meet a broken one.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

#: Seconds the benchmark part may take (the whole check: under 8 minutes, the tests first).
BUDGET_S = 300.0


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeat: int = 3) -> float:
    fn()
    sync(device)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def kernels(device: str, lengths: tuple[int, ...], *, compiled: bool = True) -> None:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from _common import table

    flex = torch.compile(flex_attention) if compiled else flex_attention
    label = "FlexAttention (compiled)" if compiled else "FlexAttention (eager)"
    rows = [row for T in lengths for row in _kernels_at(T, flex, label, device)]
    print(f"Kernels on {device}, bfloat16, B1 H16 D128, causal window 256 (SDPA: dense causal)")
    print(table(["tokens", "kernel", "forward ms", "forward+backward ms"], rows), flush=True)


def _kernels_at(T: int, flex, label: str, device: str) -> list[list]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask

    import multihead as mh
    from multihead import masks

    q, k, v = (torch.randn(1, 16, T, 128, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    ours_mask = masks.causal() & masks.window(256, 0)
    block = create_block_mask(lambda b, h, i, j: (j <= i) & (i - j <= 256), None, None, T, T, device=device)
    # FlexAttention has no backward on a CPU (it refuses inputs that want gradients there): forward only
    flex_grad = torch.device(device).type != "cpu"
    qf, kf, vf = (t if flex_grad else t.detach() for t in (q, k, v))
    runs = {
        "ours (local)": (lambda: mh.attention(q, k, v, ours_mask, backend="local")[0], True),
        label: (lambda: flex(qf, kf, vf, block_mask=block), flex_grad),
        "SDPA (dense causal)": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), True),
    }
    rows = []
    for name, (run, grad) in runs.items():
        forward = timed(run, device)
        backward = f"{timed(lambda run=run: run().sum().backward(), device) * 1e3:.2f}" if grad else "—"
        rows.append([T, name, f"{forward * 1e3:.2f}", backward])
    return rows


def analysis(device: str, lengths: tuple[int, ...], *, layers: int = 28, budget: float = BUDGET_S) -> list[list]:
    """The Qwen2-1.5B shape (``layers`` of its 28) on ``device``: a row per length (or a line saying
    it was skipped), printed as a table; returns the rows."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    import multihead as mh
    from _common import table

    started = time.perf_counter()
    vocab = {f"w{i}": i for i in range(49152)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", pad_token="w0", eos_token="w1")
    config = Qwen2Config(hidden_size=1536, num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=65536)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device).eval()
    hf = mh.hf.wrap(model, tokenizer, name="qwen2-1.5b-shaped")
    # one analysis of 64 tokens first, untimed: the first call's one-time costs (kernels loaded, libraries
    # set up) would count in the first length's time — and in what it projects for the next
    from multihead.analysis.pipelines.analyze import collect_statistics

    collect_statistics(hf, [" ".join(f"w{i}" for i in range(2, 66))], progress=False)
    sync(device)
    rows, last = [], None
    for T in lengths:
        if last is not None:  # (tokens, seconds) of the length before: the attention's work grows as T²
            projected = last[1] * (T / last[0]) ** 2
            if time.perf_counter() - started + projected > budget:
                print(f"{T} tokens skipped: ~{projected:.0f} s projected from {last[0]} tokens, beyond the "
                      f"check's {budget:.0f} s", flush=True)
                continue
        row, seconds = _analysis_at(hf, tokenizer, T, device)
        rows.append(row)
        last = (T, seconds)
        print(f"{T} tokens: analysis {seconds:.2f} s", flush=True)
    print(f"Qwen2-1.5B-shaped ({layers} layers, random, bfloat16) on {device}: plain forward vs streamed analysis")
    print(table(["tokens", "plain s", "analysis s", "ratio", "plain peak MiB", "analysis peak MiB",
                 "plan MiB (vs peak)"], rows), flush=True)
    return rows


def _analysis_at(hf, tokenizer, T: int, device: str) -> tuple[list, float]:
    import torch

    import multihead as mh
    from multihead.analysis.pipelines.analyze import collect_statistics

    cuda = device.startswith("cuda")
    g = torch.Generator().manual_seed(0)
    text = " ".join(f"w{int(i)}" for i in torch.randint(2, 49152, (T,), generator=g))
    ids = torch.tensor([tokenizer(text)["input_ids"]], device=device)
    found = mh.analysis.plan(hf, ids.shape[1], probes=False, views=0)
    base = torch.cuda.memory_allocated() if cuda else 0
    with torch.inference_mode():
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        plain = timed(lambda: hf.body(input_ids=ids, use_cache=False), device, repeat=1)
        plain_peak = torch.cuda.max_memory_allocated() - base if cuda else None
        if cuda:
            torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    collect_statistics(hf, [text], progress=False)
    sync(device)
    ours = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - base if cuda else None

    def mib(n: int | None) -> str:
        return "—" if n is None else f"{n / 2**20:.0f}"

    plan = f"{found.working / 2**20:.0f}" + ("" if peak is None else f" ({found.working / peak - 1:+.0%})")
    return [ids.shape[1], f"{plain:.2f}", f"{ours:.2f}", f"{ours / plain:.2f}x", mib(plain_peak), mib(peak),
            plan], ours


def row_statistics(device: str, lengths: tuple[int, ...], *, heads: int = 12, kv_heads: int = 2, dim: int = 128,
                   ) -> dict[int, float]:
    """One causal layer of ``heads`` query and ``kv_heads`` key-value heads of ``dim`` (bfloat16):
    SDPA's forward against the row-statistics kernels with what the analysis's readers sum (three key
    sets, the induction pattern's tokens, 18 distance bins; the columns; the weights at five
    diagonals); returns {tokens: seconds the kernels take beyond SDPA}."""
    from _common import table
    from multihead.attn import rowstats

    if not rowstats.available(device):
        print(f"row statistics: the kernels cannot run on {device} here (no Triton, or its interpreter is off)")
        return {}
    extra, rows = {}, []
    for T in lengths:
        sdpa, rows_only, everything = _row_statistics_at(T, heads, kv_heads, dim, device)
        extra[T] = everything - sdpa
        rows.append([T, f"{sdpa * 1e3:.2f}", f"{rows_only * 1e3:.2f}", f"{everything * 1e3:.2f}",
                     f"{everything / sdpa:.2f}x"])
    print(f"Row statistics on {device}, one layer: bfloat16, B1 H{heads} (KV {kv_heads}) D{dim}, causal")
    print(table(["tokens", "SDPA ms", "rows kernel ms", "+ columns, diagonals ms", "vs SDPA"], rows), flush=True)
    return extra


def _row_statistics_at(T: int, heads: int, kv_heads: int, dim: int, device: str) -> tuple[float, float, float]:
    """Seconds of SDPA's forward, the rows kernel, and the rows kernel with the columns and diagonals."""
    import torch
    import torch.nn.functional as F

    from multihead.attn import rowstats

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, T, dim, generator=g).to(device, torch.bfloat16)
    k, v = (torch.randn(1, kv_heads, T, dim, generator=g).to(device, torch.bfloat16) for _ in range(2))
    sets = (torch.rand(3, 1, T, generator=g) < 0.1).to(device)
    tokens = torch.randint(0, 1000, (1, T), generator=g).to(device)
    targets = (torch.cat([tokens.new_full((1, 1), -1), tokens[:, :-1]], 1), tokens)  # the induction pattern's
    i = torch.arange(T, device=device)
    kk, vv = (t.repeat_interleave(heads // kv_heads, 1) for t in (k, v))  # SDPA's grouped heads, as the model's

    def rows_kernel():
        return rowstats.attention_with_statistics(q, k, v, causal=True, key_sets=sets, targets=targets, bins=18)

    def everything():
        _, found = rows_kernel()
        rowstats.column_sums(q, k, found.lse, causal=True)
        for offset in range(-2, 3):
            rowstats.weights_at(q, k, found.lse, i, i + offset, causal=True)

    with torch.inference_mode():
        return (timed(lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True), device),
                timed(rows_kernel, device), timed(everything, device))


def projected(extra: dict[int, float], analysed: list[list], layers: int) -> None:
    """The analysis's time if its readers took the kernels' sums: the plain forward plus each layer's
    kernels beyond SDPA (an estimate from the two measurements above, not a run)."""
    from _common import table

    rows = []
    for row in analysed:
        n, plain = int(row[0]), float(row[1])  # the analysed text's tokens (its words tokenise to a few more)
        if not extra:
            break
        T = min(extra, key=lambda t: abs(t - n))  # the kernels' length nearest, scaled to n as attention is: n²
        ours = plain + layers * extra[T] * (n / T) ** 2
        rows.append([n, f"{plain:.2f}", f"{ours:.2f}", f"{ours / plain:.2f}x"])
    if rows:
        print(f"Projected analysis with the row-statistics kernels ({layers} layers; target <= 1.5x):")
        print(table(["tokens", "plain s", "projected s", "ratio"], rows), flush=True)


def rehearse() -> int:
    """Steps 2 to 4 on the CPU, small: the benchmark's every call, no GPU needed."""
    import torch

    torch.manual_seed(0)
    print(f"gpu-check rehearsal on the CPU · torch {torch.__version__}", flush=True)
    with warnings.catch_warnings():  # FlexAttention uncompiled says so once: known, and beside the point here
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        kernels("cpu", (256,), compiled=False)
    extra = row_statistics("cpu", (64,), heads=2, kv_heads=1, dim=16)  # in Triton's interpreter, where it is on
    analysed = analysis("cpu", (32, 96), layers=2)
    projected(extra, analysed, 2)
    return 0


#: The exit status of a check that checked nothing (no PyTorch, no GPU): not a pass — automake's
#: and pytest-style runners' "skipped" code, which no failure uses either.
NOTHING_CHECKED = 77


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rehearse", action="store_true", help="the benchmark's code on the CPU, small")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(f"gpu-check: no PyTorch in {sys.executable}; run it on the GPU machine with its own Python")
        return NOTHING_CHECKED
    if args.rehearse:
        return rehearse()
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine; nothing to check")
        return NOTHING_CHECKED
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__}", flush=True)
    status = 0
    if importlib.util.find_spec("pytest") and importlib.util.find_spec("hypothesis"):
        status = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests/test_cuda.py",
                                 "-p", "no:cacheprovider"]).returncode
    else:
        print("gpu-check: pytest/hypothesis missing here: the cuda tests are skipped, the benchmark runs")
    if importlib.util.find_spec("pytest") and importlib.util.find_spec("hypothesis"):
        status |= subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_rowstats.py",
                                  "-p", "no:cacheprovider"]).returncode
    kernels("cuda", (8192, 32768))
    extra = row_statistics("cuda", (8192, 32768))
    projected(extra, analysis("cuda", (8192, 32768)), 28)
    return status


if __name__ == "__main__":
    sys.exit(main())
