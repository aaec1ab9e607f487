"""A chunk's map read once by every compiled reader of the pass, not once by each.

A streamed chunk's float32 map is tens of MB, written by the attention just before the readers
run; the compiled readers — the row statistics (:func:`~.native.row_sums`: head metrics, long
context, typical texts), a page's pooled view (:func:`~.native.row_pooled`) and the syntax scores'
words (:func:`~.native.word_predictions`) — each read it whole, and each such pass was bound by the
memory's bandwidth (SmolLM2 bfloat16, 8,192 tokens: ~36 GB a pass at ~22 GB/s, Intel Xeon). Here,
where two or more of them read a chunk, it is read once: each (text, head)'s rows a few at a time
by every reader in turn (native.c, ``read_chunk``), the results left in the chunk's memo where each
reader looks first — the same numbers its own pass gives.

The readers say what they read at their ``begin_batch``, in the batch's memo: :data:`ROWS` (the row
statistics), :data:`POOLED` ({text row: what its pooled view reads of a chunk}) and :data:`WORDS`
(what the syntax scores read of a chunk); :func:`read_once` is the pass's ``Dispatch.before``.
"""

from __future__ import annotations

from collections.abc import Callable

from ...hf.route import AttentionChunk
from ...inputs import Batch
from . import native

__all__ = ["POOLED", "ROWS", "WORDS", "pooled_result", "read_once", "words_result"]

#: ``batch.memo`` key: a reducer of the pass reads the chunks' row statistics (:func:`~.native.row_sums`).
ROWS = "one-pass-rows"
#: ``batch.memo`` key: {text row: ``job(chunk, parts)`` -> a :class:`~.native.PooledJob` or None} for
#: each text whose pooled view a reducer keeps (:mod:`.maps`).
POOLED = "one-pass-pooled"
#: ``batch.memo`` key: ``jobs(chunk, parts)`` -> {text row: :class:`~.native.WordJob`}, the parsed
#: texts' words (:mod:`.syntax`).
WORDS = "one-pass-words"


def read_once(chunk: AttentionChunk, batch: Batch) -> None:
    """Read ``chunk`` once for every compiled reader the batch's reducers said they run, where two or
    more do and the chunk is a right-padded float32 map in CPU memory, and leave each one's result in
    ``chunk.memo`` (:func:`~.native.row_sums`' memo, :func:`pooled_result`, :func:`words_result`)."""
    weights = chunk.weights
    if (weights is None or not native.usable(weights) or not weights.is_contiguous()
            or not native.openmp()):
        return
    B, H, C = weights.shape[:3]
    stats_wanted = bool(batch.memo.get(ROWS)) and bool(batch.tokens.positions[1])
    pooled_wanted: dict[int, Callable] = batch.memo.get(POOLED) or {}
    words_wanted: Callable | None = batch.memo.get(WORDS)
    if stats_wanted + bool(pooled_wanted) + (words_wanted is not None) < 2:
        return  # one reader: its own pass reads the chunk once anyway
    parts = native.chunk_parts(weights)
    pooled = {text: job for text, make in pooled_wanted.items() if (job := make(chunk, parts)) is not None}
    words = words_wanted(chunk, parts) if words_wanted is not None else {}
    if stats_wanted + bool(pooled) + bool(words) < 2:
        return
    stats = native.stats_inputs(chunk, batch.tokens, *native.batch_reads(batch)) if stats_wanted else None
    sums, columns = native.read_chunk(stats, pooled, words, B, H, C, parts)
    if stats is not None:
        chunk.memo[native.ROW_SUMS] = stats.result(sums, columns)
    for text, job in pooled.items():
        chunk.memo[(POOLED, text)] = job.result()
    for text, job in words.items():
        chunk.memo[(WORDS, text)] = job.result()


def pooled_result(chunk: AttentionChunk, text: int) -> tuple | None:
    """What :func:`~.native.row_pooled` returns for the text's pooled view of ``chunk``, where
    :func:`read_once` read it (then taken: a view's rows are read once), else None."""
    return chunk.memo.pop((POOLED, text), None)


def words_result(chunk: AttentionChunk, text: int) -> tuple[bool, tuple[int, int] | None]:
    """(whether :func:`read_once` read the text's words in ``chunk``, what
    :func:`~.native.word_predictions` returns then: the word carried on)."""
    if (WORDS, text) not in chunk.memo:
        return False, None
    return True, chunk.memo.pop((WORDS, text))
