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

On a CPU with AMX (an Intel Xeon of the Sapphire Rapids generation or later) a bfloat16 attention
runs whole in ``softmax.c`` (:func:`attend`): 16 query rows at a time, QKᵀ on the tiles, the same
row pass on the scores while they are in the thread's cache, P·V on the tiles — the products'
path (oneDNN's GEMMs around :func:`softmax`) to the bit on the tests' shapes, without the chunk's
scores and half weights in memory and without a oneDNN primitive per chunk shape (their cache held
~230 MiB at 8k tokens of a 28-layer model, which no memory plan could see). ``MULTIHEAD_TILES=0``
keeps the products' path. The same tiles form the Gram of bfloat16 rows (:func:`gram`: the redundancy
cosine's, 1.4-1.6x oneDNN's product of its short, wide shape).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch
from torch import Tensor

from .. import compiled
from .precision import HALF

__all__ = ["GRAM_THREADED", "TILES_ENV", "attend", "available", "gram", "pack", "packed_sizes",
           "softmax", "tiles_available", "tiles_fit"]

SOURCE = Path(__file__).with_name("softmax.c")
#: No -ffast-math: masked scores are -inf, and the compiler may not assume them away.
FLAGS = ("-O3", "-march=native", "-fPIC", "-fopenmp", "-c")
LINK = ("-shared", "-fopenmp")
#: ``MULTIHEAD_TILES=0`` keeps the AMX tiles' path (:func:`attend`) off: the products through oneDNN.
TILES_ENV = "MULTIHEAD_TILES"
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
    lib.tiles_available.argtypes = []
    lib.tiles_available.restype = i64
    lib.attend_rows.argtypes = [ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_float, ptr, ptr, ptr, i64, i64, i64,
                                i64, i64, ptr, ptr, ptr, ptr, i64, i64]
    lib.attend_rows.restype = None
    lib.pack_operands.argtypes = [ptr, ptr, i64, i64, i64, i64, ptr, ptr, i64]
    lib.pack_operands.restype = None
    lib.gram_rows.argtypes = [ptr, i64, i64, ptr, i64]
    lib.gram_rows.restype = None
    return lib if lib.fused_available() else None


def tiles_available() -> bool:
    """Whether :func:`attend` runs here: the compiled softmax built with AMX (an Intel Xeon of the
    Sapphire Rapids generation or later, and a compiler that knows the tiles), Linux granting the
    process the tiles' state, and ``MULTIHEAD_TILES`` not ``0``."""
    return os.environ.get(TILES_ENV, "1") != "0" and available() and _tiles_granted()


@functools.cache
def _tiles_granted() -> bool:
    """The tiles' build, and Linux's grant of their state to this process — asked only here, the first
    time a caller may use them: the grant is for the process's life (and asks a larger signal stack
    of it), so a run with ``MULTIHEAD_TILES=0`` or without a bfloat16 attention never asks."""
    lib = _library()
    if lib is None or not lib.tiles_available():
        return False
    lib.tile_scratch.argtypes = [ctypes.c_int64, ctypes.c_int64]  # only the build with the tiles has it
    lib.tile_scratch.restype = ctypes.c_int64
    return True


def tiles_fit(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether :func:`attend` takes operands of these dtypes and head dimensions — bfloat16, dimensions
    that fill the tiles (Dk a multiple of 32, Dv of 64) — on this machine, the tiles available (the
    caller checks their device: the CPU, or ``meta`` under :func:`~.cpu_trace.traced_as_cpu`)."""
    return (q.dtype == k.dtype == v.dtype == torch.bfloat16 and q.shape[-1] % 32 == 0 and v.shape[-1] % 64 == 0
            and q.shape[-1] == k.shape[-1] and tiles_available())


def tile_buffers(keys: int, dim: int) -> int:
    """bfloat16 entries :func:`attend` needs in ``scratch`` per thread for S = ``keys`` and Dk = ``dim``:
    a tile's scores and half weights (16 rows of S rounded up to 32), q for a short tile, and a row's
    float32 exponentials (S rounded up to 16)."""
    if not _tiles_granted():
        raise RuntimeError("the AMX tiles are not available here (see multihead.attn.fused.tiles_available)")
    return int(_library().tile_scratch(keys, dim))


def attend_parts(rows: int, keys: int, groups: int) -> int:
    """On how many threads :func:`attend` runs ``groups`` groups of ``rows`` query rows over ``keys`` keys."""
    return 1 if groups * rows * keys < THREADED else max(1, min(torch.get_num_threads(), groups * -(-rows // 16)))


def packed_sizes(groups: int, keys: int, dim_k: int, dim_v: int) -> tuple[int, int]:
    """bfloat16 entries of the packed keys and values (:func:`pack`) of ``groups`` groups of ``keys`` keys."""
    return groups * -(-keys // 16) * 16 * dim_k, groups * -(-keys // 32) * 32 * dim_v


def pack(k: Tensor, v: Tensor, packed_keys: Tensor, packed_values: Tensor) -> None:
    """k (N, S, Dk) and v (N, S, Dv) bfloat16, contiguous, in the tiles' layout into ``packed_keys``
    and ``packed_values`` (at least :func:`packed_sizes` entries each), for :func:`attend` calls
    over the first S' <= S keys of the same operands (``packed=S``): a streamed layer's chunks."""
    N, S, Dk = k.shape
    Dv = v.shape[-1]
    sizes = packed_sizes(N, S, Dk, Dv)
    if not (all(t.is_contiguous() and t.device.type == "cpu" and t.dtype == torch.bfloat16
                for t in (k, v, packed_keys, packed_values))
            and v.shape[:2] == (N, S) and Dk % 32 == 0 and Dv % 64 == 0 and S > 0
            and packed_keys.numel() >= sizes[0] and packed_values.numel() >= sizes[1]):
        raise ValueError(f"pack: k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype} into "
                         f"{packed_keys.numel()} and {packed_values.numel()} entries do not fit (see its docstring)")
    _library().pack_operands(k.data_ptr(), v.data_ptr(), N, S, Dk, Dv, packed_keys.data_ptr(),
                             packed_values.data_ptr(), max(1, min(torch.get_num_threads(), N)))


def attend(q: Tensor, k: Tensor, v: Tensor, scale: float, keys: int, weights: Tensor, out: Tensor, packed_keys: Tensor,
           packed_values: Tensor, scratch: Tensor, keep: Tensor | None = None, entropy: Tensor | None = None,
           packed: int = 0) -> None:
    """The whole attention of bfloat16 operands on the AMX tiles, 16 query rows at a time: QKᵀ, the
    softmax of :func:`softmax` (the same mask semantics, the same float32 weights from the same
    scores) and P·V, the scores and the half weights kept in cache (``softmax.c``, ``attend_rows``).

    Args:
        q: (N, R, Dk) bfloat16, contiguous — N groups of R rows (a key/value head's G query heads
            stacked, R = G·T); already scaled where the scale is a power of two.
        k: (N, S, Dk) and v: (N, S, Dv) bfloat16, contiguous, S = ``keys``.
        scale: multiplies the scores rounded to bfloat16 (then rounded again, as eager's
            ``(q @ kᵀ) * scale`` does); 1.0 where q carries it.
        weights: (B, H, T, S) float32, contiguous, B·H·T = N·R: the weights (zeros past a row's last
            block of 16 keys it may see).
        out: (N, R, Dv) bfloat16, contiguous: P·V with the weights rounded to bfloat16 — over the
            keys up to the last one a row of its block of 16 may see (a NaN value at a key hidden
            from the whole block does not reach it, where a product over every key makes 0·NaN).
        packed_keys: at least N·up(S, 16)·Dk bfloat16; packed_values: N·up(S, 32)·Dv bfloat16 —
            scratch for the operands in the tiles' layout; scratch: the threads' tile buffers,
            ``tile_buffers(S, Dk)`` bfloat16 each — it runs on at most as many threads as it holds
            buffers for (``attend_parts(R, S, N)`` for all of them).
        keep, entropy: as :func:`softmax` takes them.
        packed: 0 — k and v are packed first, into ``packed_keys`` and ``packed_values``; else those
            already hold the first ``packed`` >= S keys of every group (:func:`pack`), and k and v
            are not read (only v's last dimension, Dv).
    """
    lib = _library()
    if lib is None or not tiles_available():
        raise RuntimeError("the AMX tiles are not available here (see multihead.attn.fused.tiles_available)")
    N, R, Dk = q.shape
    S, Dv = keys, v.shape[-1]
    B, H, T, _ = weights.shape
    sizes = packed_sizes(N, max(S, packed), Dk, Dv)
    ok = (all(t.is_contiguous() and t.device.type == "cpu"
              for t in (q, weights, out, packed_keys, packed_values, scratch) + (() if packed else (k, v)))
          and (packed == 0 or packed >= S)
          and q.dtype == k.dtype == v.dtype == out.dtype == packed_keys.dtype == packed_values.dtype == torch.bfloat16
          and (packed > 0 or (k.shape == (N, S, Dk) and v.shape[:2] == (N, S))) and out.shape == (N, R, Dv)
          and weights.dtype == torch.float32 and weights.shape[-1] == S and B * H * T == N * R
          and Dk % 32 == 0 and Dv % 64 == 0 and packed_keys.numel() >= sizes[0]
          and packed_values.numel() >= sizes[1] and S > 0 and R > 0
          and scratch.dtype == torch.bfloat16 and scratch.numel() >= tile_buffers(S, Dk)
          and (entropy is None or (entropy.dtype == torch.float32 and entropy.is_contiguous()
                                   and entropy.device.type == "cpu" and entropy.shape == weights.shape[:3])))
    if not ok:
        raise ValueError(f"attend: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, v {tuple(v.shape)}, weights "
                         f"{tuple(weights.shape)} {weights.dtype}, out {tuple(out.shape)} do not fit "
                         "(see its docstring)")
    strides = (0, 0, 0)
    if keep is not None:
        keep, strides = _mask_rows(keep, (B, H, T, S))
    parts = min(attend_parts(R, S, N), scratch.numel() // tile_buffers(S, Dk))  # threads it holds buffers for
    lib.attend_rows(q.data_ptr(), k.data_ptr(), v.data_ptr(), N, R, S, Dk, Dv, float(scale), weights.data_ptr(),
                    out.data_ptr(), None if keep is None else keep.data_ptr(), H, T, *strides,
                    None if entropy is None else entropy.data_ptr(), packed_keys.data_ptr(), packed_values.data_ptr(),
                    scratch.data_ptr(), parts, packed)


#: Multiply-adds of a Gram below which :func:`gram` runs on the calling thread alone.
GRAM_THREADED = 1 << 22


def gram(rows: Tensor) -> Tensor:
    """``rows @ rows.T`` of bfloat16 rows (N, X), contiguous, in CPU memory, on the AMX tiles
    (``softmax.c``, ``gram_rows``): (N, N) float32, each product exact and the sums float32 (in
    another order than a BLAS's: they differ in float32's last places), symmetric exactly. Where the
    tiles are not available (:func:`tiles_available`) it raises; the caller multiplies instead."""
    if not tiles_available():
        raise RuntimeError("the AMX tiles are not available here (see multihead.attn.fused.tiles_available)")
    if not (rows.dim() == 2 and rows.dtype == torch.bfloat16 and rows.device.type == "cpu" and rows.is_contiguous()):
        raise ValueError(f"gram: bfloat16 rows (N, X), contiguous, in CPU memory; got {tuple(rows.shape)} {rows.dtype} "
                         f"on {rows.device}")
    N, X = rows.shape
    out = torch.empty(N, N, dtype=torch.float32)
    if N == 0:
        return out
    if X == 0:
        return out.zero_()
    parts = 1 if N * N * X < GRAM_THREADED else max(1, torch.get_num_threads())
    _library().gram_rows(rows.data_ptr(), N, X, out.data_ptr(), parts)
    return out


def _mask_rows(keep: Tensor, shape: tuple[int, int, int, int]) -> tuple[Tensor, tuple[int, int, int]]:
    """``keep`` as the C side reads it — a bool CPU tensor viewed as (B, H, T, K) with each row's keys
    consecutive (stride 0 where it broadcasts) — and its strides over (B, H, T)."""
    if keep.dtype != torch.bool or keep.device.type != "cpu":
        raise ValueError(f"softmax: keep must be a bool CPU tensor; got {keep.dtype} on {keep.device}")
    keys = shape[-1]
    if keep.stride(-1) != 1 or keep.shape[-1] != keys:  # keys consecutive (a mask broadcast over them: made whole)
        keep = keep.expand(*keep.shape[:-1], keys).contiguous()
    keep = keep.expand(*shape)  # (B, H, T, K), a view: stride 0 where it broadcasts
    return keep, keep.stride()[:3]


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
        keep, strides = _mask_rows(keep, (B, H, T, keys))
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
