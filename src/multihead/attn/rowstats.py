"""Attention with every row's statistics, the map never written: flash-style kernels (Triton).

The analysis reads a layer's map to sum, for every query row ``i`` and head, quantities of its
weights ``p_ij = softmax_j(s_ij)``, ``s_ij = scale · q_i · k_j`` over the keys row ``i`` may see.
Formed in memory a chunk at a time (the math kernel, then the readers), each weight costs ~100
bytes of memory traffic: on a GPU, an order of magnitude more time than the model's own fused
attention (docs/scale.md, "CUDA"). Here the scores of a block of rows and keys are formed on the
chip from Q and K, as a flash attention forms them, and turned into the layer's outputs and every
row sum at once, with the running maximum's rescaling (Milakov & Gimelshein; Dao et al.):

| output | for one row ``i`` (B, H, T) float32 each |
|---|---|
| ``lse`` | ``log Σ_j exp(s_ij)`` (-inf where the row sees no key) |
| ``entropy`` | ``−Σ_j p_ij ln p_ij`` = ``ln l − Σ_j e_ij (s_ij − m)/l``, ``e = exp(s − m)``, ``l = Σ e`` |
| ``max_weight`` | ``max_j p_ij`` = ``1 / l`` (the largest ``e`` is ``exp(0)``) |
| ``distance`` | ``Σ_j p_ij |i − j|`` |
| ``key_sets`` | (B, H, T, F): ``Σ_{j ∈ set f} p_ij`` for up to 8 sets of keys, given as bits per key |
| ``repeat`` | ``Σ_{j ≤ i, previous(j) = token(i)} p_ij``: the induction pattern's targets (the keys right |
|  | after an earlier occurrence of the row's token) |
| ``bins`` | (B, H, T, NB): mass at ``|i − j| = 0``, then in ``[2^(k−1), 2^k − 1]`` for k = 1 .. NB − 1 (the |
|  | last bin also takes every farther key) |

and, in a second kernel from the first's ``lse``, each key's column sum over the rows that count
(:func:`column_sums`), and at any (row, key) pairs their weights (:func:`weights_at`, O(pairs·D)
in PyTorch). A weight at one position is ``exp(s_ij − lse_i)``: every reader's other quantity —
a diagonal, the mass on the first token, a window's exact edge — is such a pair.

Masks: self-attention (T = S) over the keys ``key_valid`` marks (padding), causal or not — what a
language model or an encoder analysed with padding computes. Anything else (a model's own additive
bias, soft-capping, sink logits, sliding windows) is the chunked path's. Scores are accumulated in
float32 from the model's dtype (as a flash attention does: not rounded to the model's dtype first,
as an eager half-precision model rounds them), float32 inputs in IEEE float32 (no TF32); the
outputs ``p · V`` are formed from ``p`` in the values' dtype, as a flash attention forms them.

Runs on CUDA with Triton, and — for the tests — on CPU tensors in Triton's interpreter, where the
process started with ``TRITON_INTERPRET=1`` (read as Triton is imported: its own library's functions
are built then; tests/conftest.py sets it on a machine without CUDA).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: Triton and its language, imported at the first kernel call (:func:`_load`): optional — CUDA builds of
#: PyTorch bring it, the CPU suite installs it for the interpreter — and ~0.16 s an analysis on a CPU
#: never needs. The kernels' source names ``tl``; Triton resolves it in this module's globals when it builds them.
triton: Any = None
tl: Any = None

__all__ = ["KERNEL_DTYPES", "MAX_KEY_SETS", "KernelUnavailableError", "RowStatistics", "attention_with_statistics",
           "available", "column_sums", "rows_at", "rows_between", "supported", "weights_at"]

#: The dtypes the kernels take (float64 and others: the chunked path).
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The most bytes of float32 query and key rows :func:`weights_at` forms at once.
PAIR_BYTES = 64 << 20
#: Key sets one call sums (bits of an int32 per key; more would only widen the row's registers).
MAX_KEY_SETS = 8


@functools.cache
def _installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _load() -> None:
    global triton, tl
    if tl is None:
        import triton as found
        import triton.language as language

        triton, tl = found, language


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``): on CPU tensors."""
    return _installed() and os.environ.get("TRITON_INTERPRET", "0") == "1"


def available(device: torch.device | str) -> bool:
    """Whether the kernels can run on ``device``: CUDA with Triton, or the CPU in Triton's interpreter."""
    if not _installed():
        return False
    device = torch.device(device)
    if interpreting():
        return device.type == "cpu"
    return device.type == "cuda" and torch.cuda.is_available()


@dataclass
class RowStatistics:
    """Every query row's sums over its weights (see the module's table): (B, H, T) float32 each,
    ``key_sets`` (B, H, T, F) and ``bins`` (B, H, T, NB) or None where not asked for."""

    lse: Tensor
    entropy: Tensor
    max_weight: Tensor
    distance: Tensor
    key_sets: Tensor | None
    repeat: Tensor | None
    bins: Tensor | None


# --------------------------------------------------------------------------- the kernels (Triton source)


def _rows_kernel(Q, K, V, OUT, STATS, SETS, BINS, VALID, FLAGS, TOKENS, PREVIOUS,
                 sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, sob, soh, sot,
                 H, GROUP, T, S, scale,
                 D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, NF: tl.constexpr, NFP: tl.constexpr,
                 REPEAT: tl.constexpr, NB: tl.constexpr, NBP: tl.constexpr, PRECISION: tl.constexpr,
                 WIDEN: tl.constexpr):
    """One program: BM query rows of one (text, head) over every key they may see, in blocks of BN."""
    row_block = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # int64: a text's or head's offset passes 2^31 elements on long texts
    h = (bh % H).to(tl.int64)
    kv = h // GROUP
    i = row_block * BM + tl.arange(0, BM)  # (BM,) the rows
    dk = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + dk[None, :],
                mask=(i[:, None] < T) & (dk[None, :] < D), other=0.0)  # (BM, BD)
    if WIDEN:
        q = q.to(tl.float32)
    m = tl.full((BM,), float("-inf"), tl.float32)  # the running maximum score
    total = tl.zeros((BM,), tl.float32)  # l = Σ e, e = exp(s - m)
    acc = tl.zeros((BM, BDV), tl.float32)  # Σ e v
    shifted = tl.zeros((BM,), tl.float32)  # Σ e (s - m): the entropy's
    distance = tl.zeros((BM,), tl.float32)  # Σ e |i - j|
    repeat = tl.zeros((BM,), tl.float32)
    sets = tl.zeros((BM, NFP), tl.float32)
    bins = tl.zeros((BM, NBP), tl.float32)
    set_index = tl.arange(0, NFP)
    bin_index = tl.arange(0, NBP)
    if REPEAT:
        token = tl.load(TOKENS + b * T + i, mask=i < T, other=-2)  # (BM,) each row's token
    end = S
    if CAUSAL:  # keys past the block's last row are never seen
        end = tl.minimum(S, (row_block + 1) * BM)
    for start in range(0, end, BN):
        j = start + tl.arange(0, BN)  # (BN,) the keys
        k = tl.load(K + b * skb + kv * skh + j[:, None] * sks + dk[None, :],
                    mask=(j[:, None] < S) & (dk[None, :] < D), other=0.0)  # (BN, BD)
        if WIDEN:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BM, BN) float32
        valid = tl.load(VALID + b * S + j, mask=j < S, other=0)  # (BN,)
        seen = (j[None, :] < S) & (valid[None, :] != 0)  # (1, BN)
        if CAUSAL:
            seen = seen & (j[None, :] <= i[:, None])  # (BM, BN)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # (BM,)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet: any finite shift
        alpha = tl.exp(m - shift)  # the old sums' rescaling (0 where nothing was summed)
        e = tl.exp(s - shift[:, None])  # (BM, BN), 0 where unseen
        centred = tl.where(seen, s - shift[:, None], 0.0)
        # Σ e_old (s - m_new) = α (Σ e_old (s - m_old) + (m_old - m_new) Σ e_old)
        shifted = alpha * (shifted + (tl.where(total > 0, m, shift) - shift) * total) + tl.sum(e * centred, 1)
        total = total * alpha + tl.sum(e, 1)
        v = tl.load(V + b * svb + kv * svh + j[:, None] * svs + dv[None, :],
                    mask=(j[:, None] < S) & (dv[None, :] < DV), other=0.0)  # (BN, BDV)
        p = e.to(v.dtype)  # the weights rounded to the values' dtype for P·V, as a flash attention's
        if WIDEN:
            p, v = p.to(tl.float32), v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        gap = tl.abs(i[:, None] - j[None, :])  # (BM, BN) |i - j|
        distance = distance * alpha + tl.sum(e * gap.to(tl.float32), 1)
        if NF > 0:
            flags = tl.load(FLAGS + b * S + j, mask=j < S, other=0)  # (BN,) a bit per key set
            sets = sets * alpha[:, None]
            for f in tl.static_range(NF):
                inside = ((flags >> f) & 1) != 0
                mass = tl.sum(tl.where(inside[None, :], e, 0.0), 1)  # (BM,)
                sets = tl.where(set_index[None, :] == f, sets + mass[:, None], sets)
        if REPEAT:
            before = tl.load(PREVIOUS + b * S + j, mask=j < S, other=-1)  # (BN,) each key's previous token
            target = (before[None, :] == token[:, None]) & (j[None, :] <= i[:, None])
            repeat = repeat * alpha + tl.sum(tl.where(target, e, 0.0), 1)
        if NB > 0:
            bins = bins * alpha[:, None]
            # bin of d: 0 for d = 0, else floor(log2 d) + 1 — the exponent of d as a float32, exact below 2^24
            exponent = (gap.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 126
            which = tl.minimum(tl.where(gap == 0, 0, exponent), NB - 1)  # (BM, BN): the last bin takes the farther keys
            # a block's distances span few bins (one or two off the diagonal): only those are summed
            for at in range(tl.min(which), tl.minimum(tl.max(which) + 1, NB)):
                mass = tl.sum(tl.where(which == at, e, 0.0), 1)
                bins = tl.where(bin_index[None, :] == at, bins + mass[:, None], bins)
        m = m_new
    # (BM,) 1 / l; rows that see no key: zeros, as the math kernel gives them
    inverse = tl.where(total > 0, 1.0 / tl.where(total > 0, total, 1.0), 0.0)
    rows = i < T
    out = (acc * inverse[:, None]).to(OUT.dtype.element_ty)  # (BM, BDV)
    tl.store(OUT + b * sob + h * soh + i[:, None] * sot + dv[None, :], out, mask=rows[:, None] & (dv[None, :] < DV))
    base = STATS + ((b * H + h) * T + i) * 5
    log_total = tl.log(tl.where(total > 0, total, 1.0))
    tl.store(base, tl.where(total > 0, m + log_total, float("-inf")), mask=rows)
    tl.store(base + 1, tl.where(total > 0, log_total - shifted * inverse, 0.0), mask=rows)
    tl.store(base + 2, inverse, mask=rows)
    tl.store(base + 3, distance * inverse, mask=rows)
    tl.store(base + 4, repeat * inverse, mask=rows)
    if NF > 0:
        tl.store(SETS + ((b * H + h) * T + i[:, None]) * NF + set_index[None, :], sets * inverse[:, None],
                 mask=rows[:, None] & (set_index[None, :] < NF))
    if NB > 0:
        tl.store(BINS + ((b * H + h) * T + i[:, None]) * NB + bin_index[None, :], bins * inverse[:, None],
                 mask=rows[:, None] & (bin_index[None, :] < NB))


def _columns_kernel(Q, K, LSE, COUNTED, VALID, C,
                    sqb, sqh, sqt, skb, skh, sks,
                    H, GROUP, T, S, scale,
                    D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
                    PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """One program: BN keys of one (text, head), summed over every counted row that may see them."""
    key_block = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    kv = h // GROUP
    j = key_block * BN + tl.arange(0, BN)  # (BN,)
    dk = tl.arange(0, BD)
    k = tl.load(K + b * skb + kv * skh + j[:, None] * sks + dk[None, :],
                mask=(j[:, None] < S) & (dk[None, :] < D), other=0.0)  # (BN, BD)
    if WIDEN:
        k = k.to(tl.float32)
    valid = tl.load(VALID + b * S + j, mask=j < S, other=0)
    column = tl.zeros((BN,), tl.float32)
    first = 0
    if CAUSAL:  # rows before the block's first key never see it
        first = (key_block * BN // BM) * BM
    for start in range(first, T, BM):
        i = start + tl.arange(0, BM)
        q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + dk[None, :],
                    mask=(i[:, None] < T) & (dk[None, :] < D), other=0.0)  # (BM, BD)
        if WIDEN:
            q = q.to(tl.float32)
        lse = tl.load(LSE + (b * H + h) * T + i, mask=i < T, other=float("-inf"))  # (BM,)
        counted = tl.load(COUNTED + b * T + i, mask=i < T, other=0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BM, BN)
        seen = ((counted != 0) & (lse > float("-inf")))[:, None] & (valid != 0)[None, :] & (j < S)[None, :]
        if CAUSAL:
            seen = seen & (j[None, :] <= i[:, None])
        finite = tl.where(lse > float("-inf"), lse, 0.0)
        column += tl.sum(tl.where(seen, tl.exp(s - finite[:, None]), 0.0), 0)
    tl.store(C + (b * H + h) * S + j, column, mask=j < S)


class KernelUnavailableError(RuntimeError):
    """Triton could not build a kernel for these shapes on this GPU (its compiler's error, or too
    little shared memory or registers): raised before anything ran, so a caller can take another path."""


def supported(query: Tensor, key: Tensor, value: Tensor) -> bool:
    """Whether the kernels take these tensors where they can run at all (:func:`available`): one
    dtype of :data:`KERNEL_DTYPES` for all three, head sizes up to 128 (a program's blocks of larger
    heads may not fit a GPU's shared memory), at most 65,535 (text, head) pairs (CUDA's grid), and
    on CUDA a GPU with bfloat16 products (compute capability 8.0 on) for bfloat16."""
    if query.dtype not in KERNEL_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    if max(query.shape[-1], value.shape[-1]) > 128 or query.shape[0] * query.shape[1] > 65535:
        return False
    if query.device.type == "cuda" and query.dtype == torch.bfloat16:
        return torch.cuda.get_device_capability(query.device)[0] >= 8
    return True


def _launch(name: str, grid: tuple[int, int], device: torch.device, *args: Any, **constants: Any) -> None:
    """Run a kernel on ``device``'s GPU (Triton launches on the current CUDA device: a model spread over
    GPUs runs layers on others) — :class:`KernelUnavailableError` where Triton cannot build it."""
    kernel = _built(name)
    place = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with place:
        try:
            kernel[grid](*args, **constants)
        except _build_errors() as err:  # raised before the launch: nothing ran (a launch's own errors pass)
            raise KernelUnavailableError(f"{name}: {type(err).__name__}: {' '.join(str(err).split())[:300]}") from err


@functools.cache
def _build_errors() -> tuple[type[BaseException], ...]:
    """What Triton raises where it cannot build a kernel — its compiler's errors (and their
    subclasses), too little shared memory or registers, ptxas failing — as its own autotuner
    catches them; those a Triton version lacks are left out."""
    _load()
    found = []
    for module, name in (("triton.compiler.errors", "CompilationError"), ("triton.runtime.errors", "OutOfResources"),
                         ("triton.runtime.errors", "PTXASError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


@functools.cache
def _built(name: str) -> Any:
    """A kernel of this module as Triton builds it: compiled, or run by its interpreter."""
    _load()
    return triton.jit(globals()[name])


# --------------------------------------------------------------------------- the calls


def _blocks(head_dim: int, tokens: int) -> tuple[int, int, int]:
    """(rows, keys, warps) of a program: :func:`gpu_blocks`, or in the interpreter (each block is
    numpy work, its cost mostly per block) 16 for a short text — many blocks of it — else 64."""
    if interpreting():
        return (16, 16, 1) if tokens <= 256 else (64, 64, 1)
    return gpu_blocks(head_dim)


def gpu_blocks(head_dim: int) -> tuple[int, int, int]:
    """(rows, keys, warps) of a program on a GPU: flash attention's forward tiles for the head size
    (the registers a row's sums take beside them: 64 rows and 64 keys, or 32 keys for heads over 64)."""
    return (64, 64, 4) if head_dim <= 64 else (64, 32, 4)


def _scale(scale: float | None, head_dim: int) -> float:
    """The scores' scale: the given one, else 1/√D."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _marks(flags: Tensor | None, B: int, T: int, device: torch.device) -> Tensor:
    """(B, T) bool flags (None: all) as the kernels read them: int8, contiguous, on ``device``."""
    if flags is None:
        return torch.ones(B, T, dtype=torch.int8, device=device)
    return flags.to(device, torch.int8).contiguous()


def _from_lse(score: Tensor, row_lse: Tensor, seen: Tensor) -> Tensor:
    """Weights ``exp(score − lse)`` from float32 scaled scores and their rows' ``lse`` (broadcast),
    0 where not ``seen`` or where the row sees no key (lse −inf)."""
    seen = seen & (row_lse > float("-inf"))
    return torch.where(seen, (score - row_lse.where(seen, torch.zeros((), device=score.device))).exp(),
                       torch.zeros((), device=score.device))


def rows_between(query: Tensor, key: Tensor, lse: Tensor, start: int, stop: int, keys: int, *,
                 scale: float | None = None) -> Tensor:
    """The map's rows ``start .. stop`` over its first ``keys`` keys, ``exp(s − lse)`` in float32,
    made in place in one block (B, H, c, keys) — before any mask: the caller zeroes what its rows may
    not see (a row that sees no key, lse −inf, comes out inf). query (B, H, T, D), key (B, Hkv, T, D)."""
    B, H, _, D = query.shape
    Hkv = key.shape[1]
    c = stop - start
    block = query[:, :, start:stop].float().view(B, Hkv, H // Hkv, c, D)  # (B, Hkv, G, c, D): K not repeated
    weights = torch.einsum("bkgcd,bkjd->bkgcj", block, key[:, :, :keys].float()).reshape(B, H, c, keys)
    del block
    row_lse = lse[:, :, start:stop, None]  # (B, H, c, 1)
    return weights.mul_(_scale(scale, D)).sub_(row_lse.clamp_min(torch.finfo(torch.float32).min)).exp_()


def _pow2(n: int) -> int:
    """The smallest power of two >= n (a block's side: Triton's ranges are powers of two)."""
    return 1 << max(0, int(n) - 1).bit_length()


def _runnable(device: torch.device) -> None:
    if not available(device):
        where = "CUDA" if not interpreting() else "CPU tensors (Triton's interpreter is on)"
        raise RuntimeError(f"row statistics run on {where}; got tensors on {device}"
                           + ("" if _installed() else " and no Triton installed"))


def _checked(query: Tensor, key: Tensor, value: Tensor) -> None:
    B, H, T, D = query.shape
    if key.dim() != 4 or (key.shape[0], key.shape[2], key.shape[3]) != (B, T, D) or value.shape[:3] != key.shape[:3]:
        raise ValueError(f"row statistics need self-attention: query (B, H, T, D), key/value (B, Hkv, T, ·); got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if H % key.shape[1]:
        raise ValueError(f"{H} query heads cannot share {key.shape[1]} key-value heads")
    if query.dtype not in KERNEL_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(f"row statistics take float16, bfloat16 or float32 queries, keys and values; got "
                         f"{query.dtype}, {key.dtype}, {value.dtype}")


def _key_bits(key_sets: Tensor | None, B: int, S: int, device: torch.device) -> tuple[Tensor, int]:
    """(F, B, S) bool key sets as one int32 of bits per key (B, S), and F."""
    if key_sets is None:
        return torch.zeros(B, S, dtype=torch.int32, device=device), 0
    F = key_sets.shape[0]
    if key_sets.dim() != 3 or key_sets.shape[1:] != (B, S) or F > MAX_KEY_SETS:
        raise ValueError(f"key_sets must be (F, B, S) = (≤ {MAX_KEY_SETS}, {B}, {S}) bool; got {tuple(key_sets.shape)}")
    weights = (1 << torch.arange(F, device=device, dtype=torch.int32)).view(F, 1, 1)
    return (key_sets.to(device, torch.int32) * weights).sum(0, dtype=torch.int32), F


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # the latter is ignored for half-precision inputs


def _widen(dtype: torch.dtype) -> bool:
    """Whether the kernels widen bfloat16 blocks to float32 before their products: in Triton's
    interpreter, whose products of bfloat16 are wrong (numpy has no bfloat16; triton 3.9) — exact,
    as a GPU's products of bfloat16 are, summed in float32 as there."""
    return interpreting() and dtype == torch.bfloat16


def attention_with_statistics(query: Tensor, key: Tensor, value: Tensor, *, scale: float | None = None,
                              causal: bool, key_valid: Tensor | None = None, key_sets: Tensor | None = None,
                              targets: tuple[Tensor, Tensor] | None = None, bins: int = 0
                              ) -> tuple[Tensor, RowStatistics]:
    """Self-attention and its rows' statistics in one pass over the scores (the module's table).

    query (B, H, T, Dk), key/value (B, Hkv, T, D·) with H a multiple of Hkv (grouped queries);
    ``causal``: row i sees keys j <= i; ``key_valid`` (B, T) bool: the keys that may be seen at
    all (padding False; default all); ``key_sets`` (F, B, T) bool: keys of each set whose mass
    each row gets; ``targets`` ``(previous, token)``, (B, T) int each: row i's induction targets are
    the keys j <= i with ``previous[j] == token[i]`` (``repeat``; None: not summed — e.g. the token
    before each key, and each row's own, with distinct negative values where padding should match
    nothing); ``bins``: distance bins to sum (0: none). Returns the head outputs (B, H, T, Dv) in
    the values' dtype and the :class:`RowStatistics`.
    """
    _checked(query, key, value)
    _runnable(query.device)
    B, H, T, D = query.shape
    Hkv, Dv = key.shape[1], value.shape[-1]
    device = query.device
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    scale = _scale(scale, D)
    valid = _marks(key_valid, B, T, device)
    flags, F = _key_bits(key_sets, B, T, device)
    repeat = targets is not None
    if repeat:
        previous, tokens = (t.to(device, torch.int32).contiguous() for t in targets)  # (B, T) each
    else:
        previous = tokens = torch.zeros(B, T, dtype=torch.int32, device=device)
    out = value.new_empty(B, H, T, Dv)  # (B, H, T, Dv)
    stats = torch.empty(B, H, T, 5, dtype=torch.float32, device=device)
    sets = torch.empty(B, H, T, max(F, 1), dtype=torch.float32, device=device)
    histogram = torch.empty(B, H, T, max(bins, 1), dtype=torch.float32, device=device)
    BM, BN, warps = _blocks(D, T)
    grid = (-(-T // BM), B * H)
    _launch("_rows_kernel", grid, device,
        query, key, value, out, stats, sets, histogram, valid, flags, tokens, previous,
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], *out.stride()[:3],
        H, H // Hkv, T, T, scale,
        D=D, DV=Dv, BD=max(16, _pow2(D)), BDV=max(16, _pow2(Dv)), BM=BM, BN=BN,
        CAUSAL=bool(causal), NF=F, NFP=max(2, _pow2(max(F, 1))), REPEAT=repeat, NB=bins,
        NBP=max(2, _pow2(max(bins, 1))), PRECISION=_precision(query.dtype), WIDEN=_widen(query.dtype),
        num_warps=warps)
    found = RowStatistics(lse=stats[..., 0], entropy=stats[..., 1], max_weight=stats[..., 2], distance=stats[..., 3],
                          key_sets=sets if F else None, repeat=stats[..., 4] if repeat else None,
                          bins=histogram if bins else None)
    return out, found


def column_sums(query: Tensor, key: Tensor, lse: Tensor, *, scale: float | None = None, causal: bool,
                key_valid: Tensor | None = None, rows: Tensor | None = None) -> Tensor:
    """Each key's column sum ``Σ_i p_ij`` over the rows ``rows`` (B, T) bool marks (default all),
    from the rows' ``lse`` (B, H, T) of :func:`attention_with_statistics`: (B, H, T) float32."""
    B, H, T, D = query.shape
    if key.shape[0] != B or key.shape[2] != T or lse.shape != (B, H, T):
        raise ValueError(f"column sums need query (B, H, T, D), key (B, Hkv, T, D), lse (B, H, T); got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(lse.shape)}")
    _runnable(query.device)
    device = query.device
    query, key = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key))
    scale = _scale(scale, D)
    valid, counted = _marks(key_valid, B, T, device), _marks(rows, B, T, device)
    out = torch.empty(B, H, T, dtype=torch.float32, device=device)
    BM, BN, warps = _blocks(D, T)
    _launch("_columns_kernel", (-(-T // BN), B * H), device,
        query, key, lse.to(torch.float32).contiguous(), counted, valid, out,
        *query.stride()[:3], *key.stride()[:3], H, H // key.shape[1], T, T, scale,
        D=D, BD=max(16, _pow2(D)), BM=BM, BN=BN, CAUSAL=bool(causal),
        PRECISION=_precision(query.dtype), WIDEN=_widen(query.dtype),
        num_warps=warps)
    return out


def weights_at(query: Tensor, key: Tensor, lse: Tensor, rows: Tensor, keys: Tensor, *, causal: bool,
               key_valid: Tensor | None = None, scale: float | None = None) -> Tensor:
    """The weights ``p_ij = exp(s_ij − lse_i)`` at given (row, key) pairs, from the rows' ``lse``
    (:func:`attention_with_statistics`): ``rows``, ``keys`` (P,) int, the same pairs for every text
    and head; a pair the row may not see (a key outside 0..T-1, after the row where ``causal``, not
    in ``key_valid`` (B, T)) weighs 0. query (B, H, T, D), key (B, Hkv, T, D), lse (B, H, T) ->
    (B, H, P) float32. O(P·D) work: a diagonal, the first tokens, a window's exact edge — in slices
    of pairs whose float32 rows take at most :data:`PAIR_BYTES`."""
    B, H, T, D = query.shape
    Hkv = key.shape[1]
    scale = _scale(scale, D)
    rows, keys = rows.to(query.device), keys.to(query.device)
    at = keys.clamp(0, T - 1)
    seen = ((keys >= 0) & (keys < T))[None, :]  # (1, P)
    if causal:
        seen = seen & (keys <= rows)[None, :]
    if key_valid is not None:
        seen = seen & key_valid.to(query.device)[:, at]  # (B, P)
    P = rows.shape[0]
    score = torch.empty(B, H, P, dtype=torch.float32, device=query.device)
    step = max(1, PAIR_BYTES // max(1, B * H * D * 4))
    for s in range(0, P, step):  # the grouped heads as (B, Hkv, G, ·): no copy of K per query head
        q = query[:, :, rows[s:s + step]].float().view(B, Hkv, H // Hkv, -1, D)  # (B, Hkv, G, p, D)
        k = key[:, :, at[s:s + step]].float()  # (B, Hkv, p, D)
        score[:, :, s:s + step] = torch.einsum("bkgpd,bkpd->bkgp", q, k).reshape(B, H, -1) * scale
    return _from_lse(score, lse[:, :, rows], seen[:, None, :])  # (B, H, P)


def rows_at(query: Tensor, key: Tensor, lse: Tensor, texts: Tensor, rows: Tensor, *, causal: bool,
            key_valid: Tensor | None = None, scale: float | None = None) -> Tensor:
    """Whole rows of the map, ``p_i· = exp(s_i· − lse_i)`` over every key, at chosen (text, row)
    pairs: ``texts``, ``rows`` (R,) int -> (R, H, T) float32 (0 where the row may not see a key).
    O(R·H·T·D): a sample of rows (redundancy's), not a layer; a text's keys are read once for all
    its rows (one product a text of the batch)."""
    B, H, T, D = query.shape
    Hkv = key.shape[1]
    scale = _scale(scale, D)
    texts, rows = texts.to(query.device), rows.to(query.device)
    R = texts.shape[0]
    score = torch.empty(R, H, T, dtype=torch.float32, device=query.device)
    for b in range(B):  # a batch's texts (at most its size): no host read of which texts the rows are in
        mine = texts == b  # (R,)
        q = query[b][:, rows].float().view(Hkv, H // Hkv, R, D)  # (Hkv, G, R, D) every row, as text b's
        scores = torch.einsum("kgrd,ktd->kgrt", q, key[b].float()).reshape(H, R, T)  # (H, R, T)
        score = torch.where(mine[:, None, None], scores.transpose(0, 1) * scale, score)
    seen = torch.ones(R, 1, T, dtype=torch.bool, device=query.device)  # (R, 1, T)
    if causal:
        seen = seen & (torch.arange(T, device=query.device)[None, :] <= rows[:, None])[:, None, :]
    if key_valid is not None:
        seen = seen & key_valid.to(query.device)[texts][:, None, :]
    return _from_lse(score, lse[texts, :, rows][..., None], seen)  # (R, H, T)
