"""The row readers compiled for the CPU: every per-row statistic of a chunk in one pass (native.c).

The eager readers (:mod:`.heads`, :mod:`.longcontext`, :mod:`.maps`) make a dozen passes over each
chunk, each a few PyTorch operations, and on a CPU those passes — not the model — were most of an
analysis's time (SmolLM2, 4,096 tokens: 8.5 of 25.6 s). ``native.c`` reads each row in one
vectorised pass for every head metric (mass, Σ p·|i − j|, largest weight, and p log p unless the
chunk brings its rows' entropies, which the compiled softmax forms from the scores), the
key-set masses at the sets' keys (:func:`key_sets`),
and a second over its distance bins for the long-context ones, the columns' sums for vertical
concentration, and each row's mass on its induction-pattern targets (one comparison a key); for
a page's pooled text, each row's key-block sums and maxima added into the page's cells and its k
largest weights; for the syntax scores, each source word's most attended word; and redundancy's
Jensen–Shannon distance of every two heads (:func:`pairwise_js`) and the unit vectors of its
cosine (:func:`unit_columns`).

It is compiled at first use with the machine's C compiler (``$CC``, else ``gcc``; ``-O3
-march=native -ffast-math``: vectorised — its log inline, 16 wide, under GCC on AVX-512, else glibc's
vector ``logf``; linked without ``-ffast-math``, so that loading it leaves the process's floating
point as it was; with ``-fopenmp`` where the compiler has it) into the user's cache
(``$XDG_CACHE_HOME/multihead``, keyed by the source, the flags and the CPU's features), and called
through ctypes — which lets go of the GIL. A chunk's rows are read in as many ranges as torch uses
threads: on the OpenMP threads PyTorch's own runtime keeps (one call; its workers, spinning after
PyTorch's last operation, had competed with threads of ours for the cores), else — built without
OpenMP — one call per range, each on a thread of a pool of ours. The
eager code stays the reference (the tests hold the two together) and the path everywhere else:
CUDA, float64, maps that are not right-padded, a machine without a compiler, or
``MULTIHEAD_NATIVE=0``.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ... import compiled
from ...hf.route import AttentionChunk
from ...inputs import Batch, TokenInfo
from .base import shared

__all__ = ["COLUMNS", "ENV", "LONG", "REPEAT", "ROW_SUMS", "PooledJob", "RowSums", "StatsInputs", "WordJob",
           "WordRuns", "available", "batch_reads", "chunk_parts", "compiled_rows", "key_sets", "openmp",
           "pairwise_js", "pooled_job", "pooled_parts", "pooled_pass", "read_chunk", "row_extents", "row_pooled",
           "row_sums", "stats_inputs", "unit_columns", "usable", "visible_counts", "word_job", "word_pass",
           "word_predictions", "word_runs"]

SOURCE = Path(__file__).with_name("native.c")
#: Compiled with -ffast-math (vectorised reductions and log) but linked without it: a
#: shared library linked with it carries crtfastmath, which sets the CPU to flush subnormal floats to
#: zero for the whole process the moment it is loaded — every other computation's numerics changed.
COMPILE = ("-O3", "-march=native", "-ffast-math", "-fPIC", "-c")
LINK = ("-shared",)
#: Added to both where the compiler has OpenMP: the readers' ranges then run on the threads of the
#: OpenMP runtime PyTorch already runs (native.c, ``IN_PARTS``), not on a thread pool of ours.
OPENMP = ("-fopenmp",)
#: ``MULTIHEAD_NATIVE=0`` keeps every reader eager (the reference).
ENV = compiled.ENV
#: Map entries below which a chunk is read by the calling thread alone (threads cost ~50 µs a call).
THREADED = 1 << 18
BINS = 18
#: The most weights a row's top-k of :func:`row_pooled` keeps (its k best blocks live on the stack).
TOP_K = 64
HEAD_VALUES = 12
#: Floats of rows (every head's, up to the rows' lengths) :func:`pairwise_js` reads as one block of
#: rows — 4 MiB, within the last cache: rows beyond it came from memory once for every head before a
#: pair's, 3 G pair-elements a second against 5.5-7 G in blocks (AMD EPYC Zen 4, 270 heads; 2 to 8 MiB
#: the same there, 16 MiB at memory's speed again).
JS_BLOCK = 1 << 20
#: Columns :func:`unit_columns` reads as one piece of work (native.c's UNIT_TILE).
UNIT_TILE = 256
LONG_VALUES = 8


@functools.cache
def _library() -> ctypes.CDLL | None:
    """native.c built for this CPU and loaded — with OpenMP where the compiler has it, else without
    — or None (no compiler, a failed build, ``ENV=0``)."""
    if not compiled.enabled():
        return None
    lib = compiled.build(SOURCE, "rows", COMPILE + OPENMP, LINK + OPENMP)
    lib = lib or compiled.build(SOURCE, "rows", COMPILE, LINK)  # a compiler without OpenMP
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.openmp_parts.argtypes = []
    lib.openmp_parts.restype = i64
    lib.row_extents.argtypes = [ptr, i64, i64, ptr]
    lib.row_extents.restype = None
    lib.visible_counts.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, i64, ptr]
    lib.visible_counts.restype = None
    lib.row_statistics.argtypes = [ptr, ptr, i64, i64, i64, i64]
    lib.row_statistics.restype = None
    lib.row_pooled.argtypes = [ptr, i64, i64, i64, i64]
    lib.row_pooled.restype = None
    lib.word_predictions.argtypes = [ptr, i64, i64, i64]
    lib.word_predictions.restype = None
    lib.read_chunk.argtypes = [i64, i64, i64, i64, ptr, ptr, ptr, i64, ptr, i64]
    lib.read_chunk.restype = None
    lib.pairwise_js.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, ptr]
    lib.pairwise_js.restype = None
    lib.unit_columns.argtypes = [ptr, i64, i64, i64, i64, i64]
    lib.unit_columns.restype = None
    return lib


def _struct(name: str, fields: str) -> type[ctypes.Structure]:
    """A ctypes mirror of a native.c struct: ``fields`` its members in order, ``*name`` a pointer."""
    return type(name, (ctypes.Structure,), {"_fields_": [
        (f.strip("* "), ctypes.c_void_p if f.strip().startswith("*") else ctypes.c_int64) for f in fields.split(",")]})


_StatsPass = _struct("stats_pass", "*w, B, H, C, K, start, *set_keys, *set_bounds, *valid, *log_n, *row_entropy, "
                                   "*heads, *long_sums, *hist, *repeat, *columns, *prev, *token, *extent")
_PooledPass = _struct("pooled_pass", "*w, text, C, K, hstride, kstride, block, k, *sums, *maxima, *top, *where, "
                                     "start, pool, cells, rb0, nrb, *mass, *largest, *extent, H")
_WordPass = _struct("word_pass", "*w, C, K, hstride, kstride, *row_word, *key_word, *lone, *multi, *blocks, "
                                 "*longest, *acc, astride, carried, acc_keys, last, *best, H, *block_max, text")


def available() -> bool:
    """Whether the compiled readers are in use on this machine."""
    return _library() is not None


def openmp() -> bool:
    """Whether the compiled readers are in use and run their parts on OpenMP's threads (one call a chunk)."""
    return available() and bool(_library().openmp_parts())


def usable(weights: Tensor) -> bool:
    """Whether a chunk's map can be read by the compiled readers: float32 in CPU memory, each row's
    keys consecutive, and the library built."""
    return (weights.device.type == "cpu" and weights.dtype == torch.float32 and weights.stride(-1) == 1
            and available())


_POOL: dict[int, ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()
if hasattr(os, "register_at_fork"):  # a forked child has none of its parent's threads: new pools there
    os.register_at_fork(after_in_child=_POOL.clear)


def _parts(items: int, entries: int) -> int:
    """In how many ranges a chunk's ``items`` (rows, or heads) are read: as many as torch uses
    threads, one when the chunk is small."""
    return 1 if entries < THREADED else max(1, min(torch.get_num_threads(), items))


def _bounds(items: int, parts: int) -> list[int]:
    """Where ``parts`` consecutive ranges of items 0..items begin, and the last ends (native.c's
    ``part_bound``)."""
    return [items * n // parts for n in range(parts + 1)]


def _in_parts(items: int, parts: int, call) -> None:
    """``call(lo, hi, parts, n)`` over items 0..items in ``parts`` ranges: one call on the OpenMP
    threads where the library has them, else a call per range (``n`` its index, ``parts`` 1) each
    on a thread of a pool of ours (ctypes releases the GIL), the first on this one."""
    lib = _library()
    if parts == 1 or lib.openmp_parts():
        call(0, items, parts, 0)
        return
    calls = [functools.partial(call, a, b, 1, n) for n, (a, b) in enumerate(itertools.pairwise(_bounds(items, parts)))]
    with _POOL_LOCK:
        pool = _POOL.get(parts)
        if pool is None:
            pool = _POOL[parts] = ThreadPoolExecutor(parts, thread_name_prefix="multihead-rows")
    others = [pool.submit(c) for c in calls[1:]]
    calls[0]()
    for done in others:
        done.result()


@dataclass
class RowSums:
    """One chunk's row statistics summed over its counted rows (real queries), per text and head:
    ``heads`` (B, H, 12) in :data:`~.heads.ROW_METRICS` order (``entropy_norm`` and ``kl_uniform``
    over the rows that see more than one key: ``informative`` (B, H) of them, ``rows`` (B, 1) in
    all); with ``long``, ``long`` (B, H, 8) in the long-context row metrics' order and ``hist``
    (B, H, BINS) the mass per distance bin; float64. With ``columns``, ``columns`` (B, H, K) the
    weight each key receives from the counted rows, float32. With the batch's repeat keys
    (``batch.memo[REPEAT]``), ``repeat`` (B, H) float64: each text's rows' mass on the keys right
    after earlier occurrences of their token (:class:`~.typical.RepeatKeys`)."""

    heads: Tensor
    rows: Tensor
    informative: Tensor
    long: Tensor | None
    hist: Tensor | None
    columns: Tensor | None = None
    repeat: Tensor | None = None


#: ``batch.memo`` key: a reducer of the pass reads the long-context sums (they cost a second pass a row).
LONG = "native-long"
#: ``batch.memo`` key: a reducer of the pass reads the column sums (vertical concentration).
COLUMNS = "native-columns"
#: ``batch.memo`` key: the batch's (prev, token) (B, T) int32 of :class:`~.typical.RepeatKeys`: the
#: rows' mass on their induction-pattern targets is summed in the same pass.
REPEAT = "native-repeat"


def row_extents(chunk: AttentionChunk) -> Tensor:
    """Each row's extent (B, H, c) int32, once a chunk: its last visible key + 1 — the keys from
    there on weigh exactly 0 in its row (it may not see them: a causal row's later keys, a third of
    a causal chunk's map at 1k keys) and the compiled readers do not read them; K for a row that
    sees no key (whatever its weights are, they are read). Needs the library (:func:`available`)."""
    def extents() -> Tensor:
        B, H, C, K = chunk.weights.shape
        visible = chunk.visible.contiguous()  # (B|1, 1|H, C, K) bool, one byte a key
        found = torch.empty(visible.shape[:-1], dtype=torch.int32)
        _library().row_extents(visible.data_ptr(), visible[..., 0].numel(), K, found.data_ptr())
        return found.expand(B, H, C).contiguous()

    return shared(chunk.memo, "native-extents", extents)


def visible_counts(visible: Tensor, valid: Tensor) -> Tensor:
    """How many real keys each row may see: ``visible`` (B|1, Hv, c, K) bool and ``valid`` (B, K)
    bool, both in CPU memory -> (B, Hv, c) int64, as ``(visible & valid[:, None, None]).sum(-1)``
    counts (in one compiled pass, without the (B, Hv, c, K) temporary). Needs the library."""
    B, K = valid.shape
    if (visible.dim() != 4 or visible.shape[0] not in (1, B) or visible.shape[-1] != K or visible.dtype != torch.bool
            or valid.dtype != torch.bool or visible.device.type != "cpu" or valid.device.type != "cpu"):
        raise ValueError(f"visible_counts: visible (B|1, H, c, K) and valid (B, K) bool in CPU memory; got "
                         f"{tuple(visible.shape)} {visible.dtype} and {tuple(valid.shape)} {valid.dtype}")
    visible = visible.contiguous()
    valid = valid if valid.stride(-1) == 1 else valid.contiguous()
    Bv, Hv, c = visible.shape[:3]
    counts = torch.empty(B, Hv, c, dtype=torch.int32)
    _library().visible_counts(visible.data_ptr(), Bv, B, Hv, c, K, valid.data_ptr(), valid.stride(0),
                              counts.data_ptr())
    return counts.long()


def compiled_rows(chunk: AttentionChunk, batch: Batch) -> RowSums | None:
    """The chunk's compiled row sums (:func:`row_sums`, once a chunk) where they read it — a
    right-padded float32 map in CPU memory (:func:`usable`) — else None (the eager readers' chunk)."""
    if chunk.weights is not None and usable(chunk.weights) and batch.tokens.positions[1]:
        return row_sums(chunk, batch)
    return None


def row_sums(chunk: AttentionChunk, batch: Batch) -> RowSums:
    """The compiled row statistics of a chunk of a right-padded self-attention (see
    :func:`usable`), computed once per chunk for every reader that asks; the long-context sums
    too when a reducer of the pass set ``batch.memo[LONG]`` at its ``begin_batch``, the columns
    when one set ``batch.memo[COLUMNS]``, the induction pattern's mass with ``batch.memo[REPEAT]``."""
    return shared(chunk.memo, ROW_SUMS, lambda: _row_sums(chunk, batch.tokens, *batch_reads(batch)))


#: ``chunk.memo`` key: the chunk's :class:`RowSums` (:func:`row_sums`, or the one read of
#: :mod:`.onepass`, which leaves them there).
ROW_SUMS = "native-rows"


def batch_reads(batch: Batch) -> tuple[bool, bool, tuple[Tensor, Tensor] | None, tuple[Tensor, Tensor]]:
    """What the row statistics of ``batch``'s chunks sum besides the head metrics, as its reducers
    asked at ``begin_batch`` — (long-context sums, columns, the induction pattern's (prev, token) or
    None) — and the batch's key sets (:func:`key_sets`, once a batch): :func:`stats_inputs`' arguments."""
    memo = batch.memo
    sets = shared(memo, "native-key-sets", lambda: key_sets(batch.tokens))
    return bool(memo.get(LONG)), bool(memo.get(COLUMNS)), memo.get(REPEAT), sets


def key_sets(tokens: TokenInfo) -> tuple[Tensor, Tensor]:
    """Each text's key sets as :func:`row_sums` reads them: its first real token, its separators and
    its punctuation, the keys of set s of text b ``keys[bounds[3b + s]:bounds[3b + s + 1]]``
    ascending — keys (n,) int32, bounds (3B + 1,) int64."""
    marks = torch.stack([tokens.first, tokens.separator, tokens.punctuation], 1).cpu()  # (B, 3, T)
    flat = marks.reshape(-1, marks.shape[-1])  # (3B, T)
    keys = flat.nonzero()[:, 1].to(torch.int32).contiguous()  # by set, then key: ascending within each
    counts = flat.sum(-1)  # (3B,)
    return keys, torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int64).contiguous()


@dataclass
class StatsInputs:
    """What the row statistics of a chunk read besides its map (:func:`stats_inputs`)."""

    p: Tensor  # (B, H, C, K) float32, contiguous
    start: int
    set_keys: Tensor
    set_bounds: Tensor
    counted: Tensor  # (B, C) uint8: the rows that count (real queries)
    log_n: Tensor  # (B, H, C) float32
    entropy: Tensor | None  # (B, H, C) float32: each row's entropy as the softmax formed it
    extents: Tensor  # (B, H, C) int32
    prev_keys: Tensor | None  # (B, K) int32: each key's previous token (the induction pattern's)
    row_tokens: Tensor | None  # (B, C) int32: each row's own token
    queries: Tensor  # (B, C) bool
    informative: Tensor  # (B, H) float64
    long: bool
    columns: bool

    def sums(self, parts: int) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """(parts, B, H, ·) float64 zeros for each part's own heads, long, hist and repeat sums."""
        B, H = self.p.shape[:2]
        return (torch.zeros(parts, B, H, HEAD_VALUES, dtype=torch.float64),
                torch.zeros(parts, B, H, LONG_VALUES, dtype=torch.float64) if self.long else None,
                torch.zeros(parts, B, H, BINS, dtype=torch.float64) if self.long else None,
                torch.zeros(parts, B, H, dtype=torch.float64) if self.prev_keys is not None else None)

    def struct(self, sums: tuple[Tensor | None, ...], columns: Tensor | None) -> ctypes.Structure:
        """The inputs as native.c's ``stats_pass``, adding into the parts' ``sums`` (:meth:`sums`) and the
        parts' ``columns`` (:func:`_column_parts`) or None."""
        p = self.p
        B, H, C, K = p.shape
        return _StatsPass(p.data_ptr(), B, H, C, K, self.start, self.set_keys.data_ptr(), self.set_bounds.data_ptr(),
                          self.counted.data_ptr(), self.log_n.data_ptr(), _address(self.entropy),
                          *(_address(t) for t in sums), _address(columns), _address(self.prev_keys),
                          _address(self.row_tokens), self.extents.data_ptr())

    def result(self, sums: tuple[Tensor | None, ...], columns: Tensor | None) -> RowSums:
        """The chunk's :class:`RowSums` from the parts' ``sums`` and the column sums (B, H, K) or None."""
        heads_sums, long_sums, hist, repeat_sums = (None if t is None else t.sum(0) for t in sums)
        return RowSums(heads_sums, self.queries.sum(-1, keepdim=True, dtype=torch.float64), self.informative,
                       long_sums, hist, columns, repeat_sums)


def stats_inputs(chunk: AttentionChunk, tokens: TokenInfo, long: bool, columns: bool = False,
                  repeat: tuple[Tensor, Tensor] | None = None,
                  sets: tuple[Tensor, Tensor] | None = None) -> StatsInputs:
    p = chunk.weights.detach()  # (B, H, C, K) float32
    if p.dtype != torch.float32 or p.device.type != "cpu":
        raise TypeError(f"the compiled readers read float32 maps in CPU memory; got {p.dtype} on {p.device}")
    if not p.is_contiguous():
        p = p.contiguous()
    B, H, C, K = p.shape
    start = chunk.start
    valid = tokens.valid.to(p.device)  # (B, T)
    if start < 0 or start + C > valid.shape[1] or K > valid.shape[1] or valid.shape[0] != B:
        raise ValueError(f"rows {start}..{start + C} over {K} keys of a batch of {B} x {valid.shape[1]} tokens: "
                         "the compiled readers read a self-attention's rows")
    set_keys, set_bounds = sets if sets is not None else key_sets(tokens)
    queries = valid[:, start:start + C]  # (B, C)
    # each row's entropy as the softmax formed it from the scores, where it did (no log a weight here)
    entropy = chunk.entropy
    if entropy is not None and (entropy.shape != (B, H, C) or entropy.dtype != torch.float32
                                or not entropy.is_contiguous() or entropy.device.type != "cpu"):
        raise ValueError(f"a chunk's row entropies are (B, H, c) = {(B, H, C)} float32, contiguous, in CPU memory; "
                         f"got {tuple(entropy.shape)} {entropy.dtype}")
    seen = visible_counts(chunk.visible, valid[:, :K]).expand(B, H, C)  # (B, H, C) keys each row may see
    log_n = seen.float().clamp_min(1).log().contiguous()  # (B, H, C)
    informative = (queries[:, None, :] & (seen > 1)).sum(-1, dtype=torch.float64)  # (B, H)
    prev_keys = row_tokens = None
    if repeat is not None:  # each key's token before it (B, K), each row's own token (B, C)
        prev_keys = repeat[0][:, :K].to(torch.int32).contiguous()
        row_tokens = repeat[1][:, start:start + C].to(torch.int32).contiguous()
    return StatsInputs(p, start, set_keys, set_bounds, queries.to(torch.uint8).contiguous(), log_n, entropy,
                        row_extents(chunk), prev_keys, row_tokens, queries, informative, long, columns)


def _row_sums(chunk: AttentionChunk, tokens: TokenInfo, long: bool, columns: bool = False,
              repeat: tuple[Tensor, Tensor] | None = None, sets: tuple[Tensor, Tensor] | None = None) -> RowSums:
    x = stats_inputs(chunk, tokens, long, columns, repeat, sets)
    B, H, C, K = x.p.shape
    parts = chunk_parts(x.p)
    sums = x.sums(parts)  # (parts, B, H, ·): a range's own sums
    column_parts, pairs, offsets = _column_parts(B, H, C, K, parts) if columns else (None, [], [0])
    column_at = torch.tensor(offsets[:-1] or [0], dtype=torch.int64)  # each part's first row of column_parts
    lib, inputs = _library(), x.struct(sums, column_parts)
    _in_parts(B * H * C, parts, lambda a, b, n_parts, n: lib.row_statistics(ctypes.byref(inputs), column_at.data_ptr(),
                                                                            a, b, n_parts, n))
    return x.result(sums, None if column_parts is None else _columns_summed(column_parts, pairs, offsets, B, H))


def chunk_parts(weights: Tensor) -> int:
    """In how many ranges of rows a chunk's map (B, H, C, K) is read (:func:`row_sums`, :func:`read_chunk`)."""
    return _parts(weights[..., 0].numel(), weights.numel())


def _column_parts(B: int, H: int, C: int, K: int, parts: int) -> tuple[Tensor, list[tuple[int, int]], list[int]]:
    """The column sums as the parts add them: each range of rows its own (text, head) pairs only, range
    after range (native.c, row_statistics) — (Σ pairs, K) zeros, each range's (first pair, pairs) and
    its first row there."""
    pairs = [(a // C, (b - 1) // C - a // C + 1 if b > a else 0)
             for a, b in itertools.pairwise(_bounds(B * H * C, parts))]
    offsets = list(itertools.accumulate((n for _, n in pairs), initial=0))
    return torch.zeros(offsets[-1], K, dtype=torch.float32), pairs, offsets


def _columns_summed(column_parts: Tensor, pairs: list[tuple[int, int]], offsets: list[int], B: int, H: int) -> Tensor:
    """The parts' column sums (:func:`_column_parts`) added per (text, head): (B, H, K)."""
    column_sums = torch.zeros(B * H, column_parts.shape[1], dtype=torch.float32)
    for (first, n), offset in zip(pairs, offsets, strict=False):
        column_sums[first:first + n] += column_parts[offset:offset + n]
    return column_sums.view(B, H, -1)


def _address(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def row_pooled(weights: Tensor, start: int, block: int, pool: int, cells: int, k: int,
               extents: Tensor | None = None) -> tuple[int, Tensor, Tensor, Tensor, Tensor]:
    """One text's rows ``start .. start + c`` of a chunk, ``weights`` (H, c, K) float32 (any strides
    with consecutive keys; see :func:`usable`), as a page pools them (:func:`~.maps.pooled_maps`):
    their weight summed and their largest weight over cells of ``pool`` · ``block`` query rows by as
    many keys — this chunk's part, to add and max into a layer's (H, cells, cells): returns the first
    row block its rows fall in, r, and the sums and maxima of its row blocks r .. r + n - 1, (H, n,
    cells) each — and each row's k largest weights and their keys (H, c, k), largest first, found
    from its blocks of ``block`` keys. ``extents`` (H, c) int32, or None: each row's keys from its
    extent on weigh exactly 0 (:func:`row_extents`) and are not read."""
    return pooled_pass(pooled_job(weights, start, block, pool, cells, k, extents, pooled_parts(weights)))


def pooled_parts(weights: Tensor) -> int:
    """In how many parts :func:`row_pooled` reads a text's rows ``weights`` (H, c, K)."""
    return _parts(weights.shape[0] * weights.shape[1], weights.numel())


def pooled_pass(job: PooledJob) -> tuple[int, Tensor, Tensor, Tensor, Tensor]:
    """:func:`row_pooled` of a job (:func:`pooled_job`): its rows in its ``parts`` ranges."""
    lib, x = _library(), job.struct()
    H, c = job.w.shape[:2]
    _in_parts(H * c, job.parts, lambda a, b, n_parts, n: lib.row_pooled(ctypes.byref(x), a, b, n_parts, n))
    return job.result()


@dataclass
class PooledJob:
    """A text's chunk rows as :func:`row_pooled` reads them, in ``parts`` parts: its scratch and outputs."""

    w: Tensor  # (H, c, K) float32, consecutive keys
    start: int
    block: int
    pool: int
    cells: int
    k: int
    first: int  # the first row block the rows fall in
    n_blocks: int
    parts: int
    scratch: Tensor  # (2, parts, nb): a part's block sums and maxima of the row at hand
    mass: Tensor  # (parts, H, n_blocks, cells): a part's own cells
    largest: Tensor
    top: Tensor  # (H, c, k)
    where: Tensor
    extents: Tensor | None  # (H, c) int32

    def result(self) -> tuple[int, Tensor, Tensor, Tensor, Tensor]:
        return self.first, self.mass.sum(0), self.largest.amax(0), self.top, self.where

    def struct(self, text: int = 0) -> ctypes.Structure:
        """The job as native.c's ``pooled_pass`` (``text``: the text's row of its chunk, for :func:`read_chunk`)."""
        w = self.w
        return _PooledPass(w.data_ptr(), text, w.shape[1], w.shape[2], w.stride(0), w.stride(1), self.block, self.k,
                           self.scratch[0].data_ptr(), self.scratch[1].data_ptr(), self.top.data_ptr(),
                           self.where.data_ptr(), self.start, self.pool, self.cells, self.first, self.n_blocks,
                           self.mass.data_ptr(), self.largest.data_ptr(), _address(self.extents), w.shape[0])


def pooled_job(weights: Tensor, start: int, block: int, pool: int, cells: int, k: int, extents: Tensor | None,
                parts: int) -> PooledJob:
    H, c, K = weights.shape
    nb = -(-K // block)
    first, last = start // (block * pool), (start + c - 1) // (block * pool)  # the chunk's row blocks
    if (weights.dtype != torch.float32 or not 1 <= k <= min(K, TOP_K) or block < 1 or pool < 1 or last >= cells
            or -(-nb // pool) > cells or weights.stride(-1) != 1):
        raise ValueError(f"row_pooled reads float32 rows for 1..{min(K, TOP_K)} largest weights into {cells} cells; "
                         f"got {weights.dtype}, k={k}, block={block}, pool={pool}, rows {start}..{start + c}")
    n_blocks = last - first + 1
    mass, largest = torch.zeros(2, parts, H, n_blocks, cells, dtype=torch.float32)  # a part's own cells
    if extents is not None:
        if extents.shape != (H, c):
            raise ValueError(f"row_pooled reads an extent a row, (H, c) = {(H, c)}; got {tuple(extents.shape)}")
        extents = extents.to(torch.int32).contiguous()
    return PooledJob(weights.detach(), start, block, pool, cells, k, first, n_blocks, parts,
                      torch.empty(2, parts, nb, dtype=torch.float32), mass, largest,
                      torch.empty(H, c, k, dtype=torch.float32), torch.empty(H, c, k, dtype=torch.long), extents)


@dataclass
class WordRuns:
    """A text's words as runs of consecutive keys, for :func:`word_predictions`: ``key_word`` (T,)
    int32 each key's word (-1: none), ``lone`` (T,) uint8 1 where a key is a whole word, ``multi``
    (M, 2) int32 the (first key, keys) of the longer words in key order, ``blocks`` (ceil(T / 64) + 1,)
    int32 where the longer words starting in each 64-key block begin in ``multi`` and ``longest``
    (ceil(T / 64),) int32 the most keys one of them has; ``acc`` (H, T) float32 the row sums of a
    word still open at a chunk's end."""

    key_word: Tensor
    lone: Tensor
    multi: Tensor
    acc: Tensor
    blocks: Tensor
    longest: Tensor


def word_runs(owner: Tensor, num_heads: int) -> WordRuns | None:
    """A text's :class:`WordRuns` from ``owner`` (T,) each token's word (-1: none), or None when a
    word's tokens are not consecutive (the eager readers take that text)."""
    owner = owner.cpu()
    T = len(owner)
    keys = (owner >= 0).nonzero().squeeze(1)
    words, counts = torch.unique_consecutive(owner[keys], return_counts=True)
    if len(words) != len(owner[keys].unique()):  # a word in two places
        return None
    first = keys[counts.cumsum(0) - counts]  # (n,) each word's first key
    if bool(((keys[counts.cumsum(0) - 1] - first + 1) != counts).any()):  # a gap inside a word
        return None
    lone = torch.zeros(T, dtype=torch.uint8)
    lone[first[counts == 1]] = 1
    multi = torch.stack([first[counts > 1], counts[counts > 1]], 1).to(torch.int32).contiguous()
    n_blocks = -(-T // 64)
    blocks = torch.searchsorted(multi[:, 0].contiguous(), torch.arange(n_blocks + 1, dtype=torch.int32) * 64)
    longest = torch.zeros(n_blocks, dtype=torch.int32).scatter_reduce_(0, (multi[:, 0] // 64).long(), multi[:, 1],
                                                                       reduce="amax")
    return WordRuns(owner.to(torch.int32).contiguous(), lone, multi, torch.zeros(num_heads, T, dtype=torch.float32),
                    blocks.to(torch.int32).contiguous(), longest)


def word_predictions(weights: Tensor, rows: Tensor, runs: WordRuns, carried: tuple[int, int] | None, last: bool,
                     best: Tensor) -> tuple[int, int] | None:
    """One parsed text's rows of a chunk, ``weights`` (H, c, K) float32 (consecutive keys) with
    ``rows`` (c,) each row's word (-1: none): each source word's rows summed, and for each word whose
    rows end in this chunk the word it attends most written into ``best`` (W, H) int64 — as
    :func:`~.syntax._add_chunk` does (ties: the earliest word). ``carried``: the word still open
    from the layer's last chunk and its keys then, as this returns it for the next chunk (None
    when no word is open, and after the layer's last chunk)."""
    return word_pass(word_job(weights, rows, runs, carried, last, best))


def word_pass(job: WordJob) -> tuple[int, int] | None:
    """:func:`word_predictions` of a job (:func:`word_job`): its heads in as many ranges as torch uses threads."""
    lib, x = _library(), job.struct()
    H = job.w.shape[0]
    _in_parts(H, _parts(H, job.w.numel()),
              lambda h0, h1, parts, _: lib.word_predictions(ctypes.byref(x), h0, h1, parts))
    return job.result()


@dataclass
class WordJob:
    """A parsed text's chunk rows as :func:`word_predictions` reads them."""

    w: Tensor  # (H, c, K) float32, consecutive keys
    row_word: Tensor  # (c,) int32
    runs: WordRuns
    open_word: int  # carried in (-1: none)
    acc_keys: int
    last: bool
    best: Tensor  # (W, H) int64
    scratch: Tensor  # (H, 2 ceil(K / 64)): each head's block maxima

    def result(self) -> tuple[int, int] | None:
        """The word still open for the next chunk, and its keys (None: none, or the layer's last chunk)."""
        if self.last:
            return None
        in_words = self.row_word[self.row_word >= 0]
        open_word = int(in_words[-1]) if len(in_words) else self.open_word
        return (open_word, self.w.shape[2]) if open_word >= 0 else None

    def struct(self, text: int = 0) -> ctypes.Structure:
        """The job as native.c's ``word_pass`` (``text``: the text's row of its chunk, for :func:`read_chunk`)."""
        w, runs = self.w, self.runs
        return _WordPass(w.data_ptr(), w.shape[1], w.shape[2], w.stride(0), w.stride(1), self.row_word.data_ptr(),
                         runs.key_word.data_ptr(), runs.lone.data_ptr(), runs.multi.data_ptr(), runs.blocks.data_ptr(),
                         runs.longest.data_ptr(), runs.acc.data_ptr(), runs.acc.stride(0), self.open_word,
                         self.acc_keys, int(self.last), self.best.data_ptr(), self.best.shape[1],
                         self.scratch.data_ptr(), text)


def word_job(weights: Tensor, rows: Tensor, runs: WordRuns, carried: tuple[int, int] | None, last: bool,
              best: Tensor) -> WordJob:
    H, c, K = weights.shape
    T = runs.key_word.shape[0]
    if (weights.dtype != torch.float32 or runs.acc.shape != (H, T) or K > T or rows.shape != (c,)
            or best.dtype != torch.long or best.shape[1] != H or not best.is_contiguous() or weights.stride(-1) != 1):
        raise ValueError("word_predictions: float32 rows (H, c, K <= T), their words (c,), a text's runs of H heads "
                         "and best (W, H) int64")
    open_word, acc_keys = carried if carried is not None else (-1, 0)
    return WordJob(weights.detach(), rows.to(torch.int32).contiguous(), runs, open_word, acc_keys, last, best,
                    torch.empty(H, 2 * -(-K // 64), dtype=torch.float32))


def pairwise_js(maps: Tensor) -> Tensor:
    """Σ over rows of the Jensen–Shannon distance (base 2) of every two heads: maps (N, R, S)
    float32, contiguous, in CPU memory (see :func:`usable`) -> (N, N) float64, symmetric, 0 on the
    diagonal — :func:`~.redundancy._pairwise_js` times R, in one pass per pair (each row read up
    to its last key any head weighs; the logs vectorised, summed in float32 over blocks of 256 keys
    and in float64 beyond), its pairs in as many ranges as torch uses threads, its rows in blocks of
    :data:`JS_BLOCK` floats (the same sums in the same order, whatever the blocks)."""
    N, R, S = maps.shape
    if not available():
        raise RuntimeError("pairwise_js: the compiled readers are not built here (no C compiler, or "
                           f"{ENV}=0); redundancy._pairwise_js is the eager one")
    if not (usable(maps) and maps.is_contiguous()):
        raise ValueError("pairwise_js: float32 maps (N, R, S), contiguous, in CPU memory")
    if S == 0 or R == 0:
        return torch.zeros(N, N, dtype=torch.float64)
    lengths = torch.empty(R, dtype=torch.int64)
    own = torch.empty(N, R, dtype=torch.float64)
    out = torch.empty(N, N, dtype=torch.float64)
    parts = _parts(N, N * N * R * S // 2)
    lib = _library()
    if parts > 1 and not lib.openmp_parts():  # a build without OpenMP: one range of pairs, on this thread
        parts = 1
    lib.pairwise_js(maps.data_ptr(), N, R, S, parts, JS_BLOCK, lengths.data_ptr(), own.data_ptr(), out.data_ptr())
    upper = out.triu(1)
    return upper + upper.T


def unit_columns(x: Tensor) -> None:
    """Make each column of ``x`` (H, D, n) — bfloat16 or float32, contiguous, in CPU memory — a unit
    vector in place: ``x / max(|x|, 1e-12)`` over D, as ``x.div_(x.float().square().sum(1,
    keepdim=True).sqrt().clamp_min(1e-12))`` does (the norm summed in float32 in another order and the
    quotient formed with its reciprocal: a bfloat16 quotient may round the other way where it falls on
    a tie, a float32 one differ in its last place); a NaN column stays NaN."""
    if not available():
        raise RuntimeError("unit_columns: the compiled readers are not built here (no C compiler, or "
                           f"{ENV}=0)")
    if not (x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float32) and x.dim() == 3
            and x.is_contiguous()):
        raise ValueError("unit_columns: a bfloat16 or float32 (H, D, n) block, contiguous, in CPU memory")
    H, D, n = x.shape
    lib = _library()
    parts = _parts(H * -(-n // UNIT_TILE), x.numel()) if lib.openmp_parts() else 1
    lib.unit_columns(x.data_ptr(), H, D, n, int(x.dtype == torch.bfloat16), parts)


# ------------------------------------------------------------------------- one read of a chunk


def read_chunk(stats: StatsInputs | None, pooled: dict[int, PooledJob], words: dict[int, WordJob], B: int, H: int,
               C: int, parts: int) -> tuple[tuple[Tensor | None, ...], Tensor | None]:
    """A chunk of B texts × H heads × C rows read once for its row statistics (``stats``), the pooled
    view of each text in ``pooled`` and the words of each in ``words`` (keyed by the text's row; each
    job made for ``parts`` = :func:`chunk_parts` parts): its rows in those ranges, each range's a few
    at a time by every reader in turn while they are in cache (native.c, ``read_chunk``) — the same
    sums as :func:`row_sums`', :func:`row_pooled`'s and :func:`word_predictions`' own passes, each of
    which reads the map from memory again. The jobs' outputs are filled in; returns the statistics'
    parts' sums and column sums (B, H, K) or None, for :meth:`StatsInputs.result`. Needs the library
    built with OpenMP."""
    lib = _library()
    sums, columns, stats_pass, column_at = (), None, None, None
    if stats is not None:
        sums = stats.sums(parts)
        if stats.columns:
            columns, pairs, offsets = _column_parts(B, H, C, stats.p.shape[-1], parts)
            column_at = torch.tensor(offsets[:-1], dtype=torch.int64)
        stats_pass = stats.struct(sums, columns)
    pools = (_PooledPass * max(1, len(pooled)))(*(job.struct(text) for text, job in pooled.items()))
    passes = (_WordPass * max(1, len(words)))(*(job.struct(text) for text, job in words.items()))
    lib.read_chunk(B, H, C, parts, None if stats_pass is None else ctypes.addressof(stats_pass),
                   _address(column_at), ctypes.addressof(pools), len(pooled), ctypes.addressof(passes), len(words))
    return sums, None if columns is None else _columns_summed(columns, pairs, offsets, B, H)
