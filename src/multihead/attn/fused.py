"""The math kernel's softmax compiled for the CPU (``softmax.c``): one pass a row.

After the scores' product the eager steps are a mask's checks and fill, a softmax, and for a half
model the scores copied to float32 first and the weights rounded back to the half dtype for P·V —
passes over every chunk of a streamed layer, most of what an analysis adds to the model's own
forward after the readers. ``softmax.c`` does them in one pass a row, on the OpenMP threads PyTorch
already runs, built for AVX-512 or for AVX2 (with FMA and F16C): float32 weights for the readers (in
place of float32 scores), half weights (zeros for the keys a half product was padded with) where
P·V takes them, and each row's entropy where a streaming reader asks for it. The scores are
bfloat16 or float16 where the CPU has units for them (:func:`~multihead.attn.precision.half_units`),
float32 otherwise — a float32 model's, or a half model's product formed in float32 and rounded. Its
exp is not PyTorch's (a few units in float32's last place apart; a half weight that lies on a
rounding boundary can round the other way); the tests hold it to the eager steps, which remain
everywhere else: on a CPU with neither instruction set or without a C compiler with OpenMP, with
``MULTIHEAD_NATIVE=0``, under autograd.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from .. import compiled
from .precision import HALF

__all__ = ["available", "softmax"]

SOURCE = Path(__file__).with_name("softmax.c")
#: No -ffast-math: masked scores are -inf, and the compiler may not assume them away.
FLAGS = ("-O3", "-march=native", "-fPIC", "-fopenmp", "-c")
LINK = ("-shared", "-fopenmp")
#: Map entries below which a chunk is soft-maxed by the calling thread alone (threads cost ~50 µs a call).
THREADED = 1 << 16


@functools.cache
def _library() -> ctypes.CDLL | None:
    """softmax.c built for this CPU and loaded, or None: no compiler with OpenMP, neither AVX-512 nor
    AVX2 with FMA and F16C, or ``MULTIHEAD_NATIVE=0``."""
    if not compiled.enabled():
        return None
    lib = compiled.build(SOURCE, "softmax", FLAGS, LINK)
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.fused_available.argtypes = []
    lib.fused_available.restype = i64
    lib.softmax_rows.argtypes = [ptr, i64, i64, ptr, ptr, i64, i64, i64, i64, i64, ptr, i64, i64, i64, i64, i64, i64,
                                 ptr]
    lib.softmax_rows.restype = None
    return lib if lib.fused_available() else None


def available() -> bool:
    """Whether the compiled softmax is in use on this machine."""
    return _library() is not None


#: the C side's codes of the dtypes it reads and writes (the half ones: precision.HALF)
KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def softmax(scores: Tensor, keys: int, weights: Tensor, half: Tensor | None = None, keep: Tensor | None = None,
            entropy: Tensor | None = None) -> None:
    """Each row's softmax over its first ``keys`` scores (and its entropy, where asked).

    Args:
        scores: (N, R, P) float32, bfloat16 or float16 scores, contiguous, P >= keys (the columns
            after ``keys`` are not read).
        keys: K, the keys each row is soft-maxed over.
        weights: (B, H, T, K) float32, contiguous, B·H·T = N·R: the weights, row after row — the
            float32 ``scores`` themselves (the same memory, P = K): soft-maxed in place.
        half: (N, R, P') bfloat16 or float16 (half scores' own dtype), contiguous, P' >= K, or None:
            the weights rounded to its dtype, zeros at keys K..P'-1.
        keep: bool, broadcastable to (B, H, T, K): True where a row may see a key. A key it may not
            see weighs 0; a row that may see none gives zeros (never NaN). None: every key. A row with
            a NaN or +inf score at a key it may see, or -inf at all of them, gives NaN (as eager's).
        entropy: (B, H, T) float32, contiguous, or None: each row's entropy −Σ_j p_j ln p_j in nats,
            formed from the scores on the softmax's way (ln Z − Σ e_j (s_j − m) / Z: no log a weight);
            0 for a row that sees no key, NaN for a NaN row.
    """
    lib = _library()
    if lib is None:
        raise RuntimeError("the compiled softmax is not available here (see multihead.attn.fused.available)")
    N, R, P = scores.shape
    rows = N * R
    tensors = (scores, weights) if half is None else (scores, weights, half)
    laid_out = all(t.is_contiguous() and t.device.type == "cpu" for t in tensors)
    # in place: the weights over the float32 scores exactly; any other sharing of memory is refused (a row
    # would be written before it is read, and by another thread)
    in_place = weights.numel() > 0 and weights.data_ptr() == scores.data_ptr()
    pairs = [(weights, half), (weights, entropy), (scores, half), (scores, entropy), (half, entropy)]
    overlapping = (any(_shares_memory(a, b) for a, b in pairs)
                   or (not in_place and _shares_memory(scores, weights)))
    if not (laid_out and scores.dtype in KINDS and weights.dtype == torch.float32 and weights.dim() == 4
            and weights.shape[-1] == keys and weights.numel() == rows * keys and keys <= P
            and (not in_place or (scores.dtype == torch.float32 and P == keys)) and not overlapping
            and (half is None or (half.dtype in HALF and scores.dtype in (torch.float32, half.dtype)
                                  and half.shape[:2] == scores.shape[:2] and half.shape[2] >= keys))
            and (entropy is None or (entropy.dtype == torch.float32 and entropy.is_contiguous()
                                     and entropy.device.type == "cpu" and entropy.shape == weights.shape[:3]))):
        raise ValueError(f"softmax: scores {tuple(scores.shape)} {scores.dtype}, weights "
                         f"{tuple(weights.shape)} {weights.dtype}"
                         + ("" if half is None else f", half {tuple(half.shape)} {half.dtype}")
                         + ("" if entropy is None else f", entropy {tuple(entropy.shape)} {entropy.dtype}")
                         + " do not fit (see its docstring)")
    B, H, T, _ = weights.shape
    strides = (0, 0, 0)
    if keep is not None:
        if keep.dtype != torch.bool or keep.device.type != "cpu":
            raise ValueError(f"softmax: keep must be a bool CPU tensor; got {keep.dtype} on {keep.device}")
        if keep.stride(-1) != 1 or keep.shape[-1] != keys:  # keys consecutive (a mask broadcast over them: made whole)
            keep = keep.expand(*keep.shape[:-1], keys).contiguous()
        keep = keep.expand(B, H, T, keys)  # (B, H, T, K), a view: stride 0 where it broadcasts
        strides = keep.stride()[:3]
    parts = 1 if rows * keys < THREADED else max(1, min(torch.get_num_threads(), rows))
    lib.softmax_rows(scores.data_ptr(), P, KINDS[scores.dtype], weights.data_ptr(),
                     None if half is None else half.data_ptr(), 0 if half is None else half.shape[2],
                     0 if half is None else half.shape[2], 0 if half is None else KINDS[half.dtype], rows, keys,
                     None if keep is None else keep.data_ptr(), H, T, *strides, parts,
                     None if entropy is None else entropy.data_ptr())


def _shares_memory(a: Tensor | None, b: Tensor | None) -> bool:
    """Whether two tensors (None: none) are views of one storage — any overlap the C code could meet."""
    return (a is not None and b is not None and a.numel() > 0 and b.numel() > 0
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
