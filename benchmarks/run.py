"""`make bench`: run every benchmark and print its tables. `python benchmarks/run.py [NAME ...] [--quick]`."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

BENCHMARKS = ["bench_layer", "bench_long", "bench_band_ceiling", "bench_analyze", "bench_long_analysis", "bench_prune",
              "bench_train", "bench_evidence", "bench_scale", "bench_js_rows", "bench_command"]


def main() -> None:
    args = sys.argv[1:]
    names = [a for a in args if not a.startswith("-")] or BENCHMARKS
    flags = [a for a in args if a.startswith("-")]
    for name in names:
        module = importlib.import_module(name if name.startswith("bench_") else f"bench_{name}")
        module.main(flags)
        print()


if __name__ == "__main__":
    main()
