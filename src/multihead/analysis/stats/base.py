"""The one protocol every statistic implements: a :class:`Reducer`.

A reducer reads a corpus as one pass of the model hands it over — batch by batch, and within a
batch layer by layer in chunks of query rows (:class:`~multihead.hf.route.AttentionChunk`) — and
keeps running sums, never a chunk::

    reducer.begin_batch(batch)      # a padded batch is about to run (multihead.inputs.Batch)
    reducer.update(chunk)           # rows chunk.start .. chunk.stop of layer chunk.layer's map
    reducer.end_batch()             # every layer of the batch has been seen
    reducer.merge(other)            # add another process's shard (torchrun)
    reducer.result()                # what it found: (L, H) metrics and/or a typed report section

Chunks of one layer come in order and end with ``chunk.last``; a layer that fits the memory budget
is one chunk (``chunk.whole``). Whether a pass is chunked is decided by the budget, so a reducer
works the same on a sentence and on a 100k-token document.

What several reducers derive from the same chunk (the per-row metric values, a text's word-level
attention) is computed once through :func:`shared` on ``chunk.memo`` (one chunk),
``chunk.call_memo`` (every chunk of one layer's call) or ``batch.memo``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar, runtime_checkable

from ...hf.route import AttentionChunk, map_chunks
from ...inputs import Batch

__all__ = ["Dispatch", "Reducer", "ReducerBase", "dispatch", "shared"]

T = TypeVar("T")


@runtime_checkable
class Reducer(Protocol):
    """What a statistic implements (see the module)."""

    def begin_batch(self, batch: Batch) -> None: ...

    def update(self, chunk: AttentionChunk) -> None: ...

    def end_batch(self) -> None: ...

    def merge(self, other: Any) -> None: ...

    def result(self) -> Any: ...


class ReducerBase:
    """Defaults for the optional steps: keep the batch; nothing to do at its end."""

    batch: Batch | None = None

    def begin_batch(self, batch: Batch) -> None:
        self.batch = batch

    def end_batch(self) -> None:
        return None

    def __getstate__(self) -> dict:  # shards are merged by pickling (torchrun): the batch stays behind
        state = dict(self.__dict__)
        state.pop("batch", None)
        return state


def shared(memo: dict, key: Any, compute: Callable[[], T]) -> T:
    """``memo[key]``, computed by ``compute()`` the first time any reader asks."""
    if key not in memo:
        memo[key] = compute()
    return memo[key]


class Dispatch:
    """A capture callback handing each chunk to every reducer, in order. A layer given as row sums (a
    chunk with a ``summary`` and no ``weights``: :mod:`multihead.hf.route`) goes as it is to the
    reducers in :attr:`direct` — those that read row sums for the batch at hand, set per batch by
    :func:`~multihead.analysis.pipelines.common.run_pass` — and to every other one as its map, formed
    from the sums chunk by chunk (:func:`~multihead.hf.route.map_chunks`)."""

    def __init__(self, reducers: Iterable[Reducer]) -> None:
        self.reducers = list(reducers)
        self.direct: frozenset[int] = frozenset()  # id() of each reducer that takes the row sums
        #: called with each chunk of maps before the reducers (set per batch by run_pass: the chunk read
        #: once for all its compiled readers, :func:`~multihead.analysis.stats.onepass.read_once`)
        self.before: Callable[[AttentionChunk], None] | None = None

    def __call__(self, chunk: AttentionChunk) -> None:
        if chunk.weights is not None:
            if self.before is not None:
                self.before(chunk)
            for reducer in self.reducers:
                reducer.update(chunk)
            return
        maps = []
        for reducer in self.reducers:
            if id(reducer) in self.direct:
                reducer.update(chunk)
            else:
                maps.append(reducer)
        if maps:
            for piece in map_chunks(chunk):
                for reducer in maps:
                    reducer.update(piece)
                del piece  # not held while the next chunk's map is formed


def dispatch(reducers: Iterable[Reducer]) -> Dispatch:
    """A capture callback handing each chunk to every reducer, in order (:class:`Dispatch`)."""
    return Dispatch(reducers)
