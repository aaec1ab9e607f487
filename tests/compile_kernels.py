"""Compile attn/rowstats.py's kernels for an sm_90 GPU with Triton's compiler, as the wrapper launches
them with a GPU's tiles, on a machine without a GPU (test_rowstats.py runs it, in a process where
Triton's interpreter is off); prints each kernel and dtype built, fails on an error or a spill."""

from __future__ import annotations

import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.runtime.jit import JITFunction

from multihead.attn import rowstats

NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16", torch.int8: "i8",
         torch.int32: "i32", torch.int64: "i64"}


def launches(dtype: torch.dtype) -> list[tuple[str, tuple, dict]]:
    """Each kernel launch the wrapper makes for a Qwen2-shaped layer of ``dtype``: (kernel, arguments, constants)."""
    made = []

    class Launcher:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **constants: made.append((self.name, args, constants))

    rowstats._built = Launcher  # this process only: the launches recorded, not run
    rowstats._blocks = lambda head_dim, tokens: rowstats.gpu_blocks(head_dim)
    rowstats._runnable = lambda device: None
    q = torch.randn(1, 4, 64, 128, dtype=dtype)
    k = torch.randn(1, 2, 64, 128, dtype=dtype)
    rowstats.attention_with_statistics(q, k, k, causal=True, key_sets=torch.ones(3, 1, 64, dtype=torch.bool),
                                       targets=(torch.zeros(1, 64, dtype=torch.int32),) * 2, bins=18)
    rowstats.column_sums(q, k, torch.zeros(1, 4, 64), causal=True)
    return made


def main() -> None:
    rowstats._load()
    for dtype in (torch.bfloat16, torch.float32):
        for name, args, constants in launches(dtype):
            fn = JITFunction(getattr(rowstats, name))
            warps = constants.pop("num_warps")
            positional = [p for p in fn.arg_names if p not in constants]
            assert len(positional) == len(args), (positional, len(args))
            signature = {n: (f"*{NAMES[a.dtype]}" if isinstance(a, torch.Tensor) else "fp32" if isinstance(a, float)
                             else "i32") for n, a in zip(positional, args, strict=True)}
            signature.update(dict.fromkeys(constants, "constexpr"))
            source = ASTSource(fn, signature, constexprs={(fn.arg_names.index(n),): v for n, v in constants.items()})
            built = compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
            assert built.asm["cubin"], f"{name}: no machine code"
            assert ".local" not in built.asm["ptx"], f"{name} ({dtype}): registers spilled to local memory"
            print(name, str(dtype).removeprefix("torch."), flush=True)


if __name__ == "__main__":
    main()
