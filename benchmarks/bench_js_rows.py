"""How many query rows the redundancy's JS distances need: SmolLM2 (bfloat16) on one Penn Treebank
document, its 270 heads' mean JS distance over R sampled rows against the same over many more.

A long document is one batch, and the JS work a batch of sentences affords (`COMPILED_JS_BUDGET`)
gives it 4 rows; `redundancy.JS_ROWS` (32, within `JS_ROWS_MEMORY`) is the floor this measures.
For each R the analysis runs with the row rule's constants set so that the JS rests on R rows
(an even stride, as the run takes them), nothing else changed; the reference is every row (at most
1,024 tokens) or `--reference` rows. Columns: the pairs' largest and mean absolute difference, the
correlation of the (N, N) upper triangles, how many of the reference's 20 most redundant pairs (the
least JS distance) are among R's 20, and the analysis's seconds (the JS's share of them).

    python benchmarks/bench_js_rows.py [--quick] [--tokens 1024,4096] [--rows 4,16,32,64] [--reference 256]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import setup_threads, table
from bench_scale import cpu_name, document, load

TOKENS = (1024, 4096)
ROWS = (4, 16, 32, 64, 128)
#: rows of the reference at lengths beyond every row's (4k tokens: 256 rows, ~6 s on two cores)
REFERENCE = 256
TOP = 20


def js_over(model, text: str, rows: int | None) -> tuple:
    """(N, N) mean JS distances of the analysis of ``text`` over ``rows`` rows (None: the default
    rule), the rows counted, and the seconds the analysis took."""
    import torch

    from multihead.analysis.pipelines.analyze import collect_statistics
    from multihead.analysis.stats import redundancy

    saved = redundancy.JS_ROWS, redundancy.JS_ROWS_MEMORY, redundancy.MIN_JS_ROWS, redundancy.COMPILED_JS_BUDGET
    if rows is not None:  # exactly `rows`: the floor at rows, the budget and the memory out of the way
        redundancy.JS_ROWS = redundancy.MIN_JS_ROWS = rows
        redundancy.JS_ROWS_MEMORY, redundancy.COMPILED_JS_BUDGET = 1 << 40, 1
    try:
        start = time.perf_counter()
        with torch.inference_mode():
            found = collect_statistics(model, [text], parses=None, views=[], progress=False).redundancy
        seconds = time.perf_counter() - start
    finally:
        redundancy.JS_ROWS, redundancy.JS_ROWS_MEMORY, redundancy.MIN_JS_ROWS, redundancy.COMPILED_JS_BUDGET = saved
    return found.js().clone(), int(found.js_count), seconds


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k tokens, every row the reference")
    parser.add_argument("--tokens", type=_numbers, default=TOKENS, help="lengths, e.g. 1024,4096")
    parser.add_argument("--rows", type=_numbers, default=ROWS, help="rows to sample, e.g. 4,16,32,64")
    parser.add_argument("--reference", type=int, default=REFERENCE, help="the reference's rows past 1k tokens")
    args = parser.parse_args(argv)
    import torch

    setup_threads()
    tokens = (1024,) if args.quick else args.tokens
    rows = args.rows
    reference_rows = args.reference
    model = load("smollm2 bfloat16")
    out = []
    for n in tokens:
        text, ids = document(model.tokenizer, n)
        js_over(model, model.tokenizer.decode(ids[:64]), None)  # the process's first run: its one-time costs
        T = len(ids)
        reference, counted, _ = js_over(model, text, T if T <= 1024 else reference_rows)
        N = reference.shape[0]
        upper = torch.triu_indices(N, N, 1)
        want = reference[upper[0], upper[1]]
        best = set(want.argsort()[:TOP].tolist())
        seen = set()
        for r in (None, *rows):
            if r is not None and (r >= counted or r in seen):
                continue
            js, got_rows, seconds = js_over(model, text, r)
            seen.add(got_rows)
            got = js[upper[0], upper[1]]
            diff = (got - want).abs()
            corr = torch.corrcoef(torch.stack([got, want]))[0, 1].item()
            same = len(best & set(got.argsort()[:TOP].tolist()))
            label = f"{got_rows} (the default)" if r is None else str(got_rows)
            out.append([f"{T:,}", label, f"{counted}", f"{diff.max():.3f}", f"{diff.mean():.4f}", f"{corr:.4f}",
                        f"{same} of {TOP}", f"{seconds:.1f}"])
            print(" | ".join(out[-1]), flush=True)
    print(f"The JS's rows: SmolLM2 bfloat16, one Penn Treebank document; {cpu_name()}")
    print(table(["tokens", "rows", "reference rows", "largest difference", "mean difference", "correlation",
                 f"the {TOP} most redundant pairs, the same", "analysis s"], out))


if __name__ == "__main__":
    main(sys.argv[1:])
