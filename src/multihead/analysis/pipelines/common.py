"""What every pipeline does the same way: encode a corpus, cut it into batches, run one pass.

:func:`run_pass` is the one flow of the design: one capture over the model's named layers feeding
any set of reducers (:mod:`multihead.analysis.stats`), batch by batch; whether a layer is
streamed in chunks of query rows is the memory budget's decision (by default one chunk's bytes on
the model's device, :func:`~multihead.hf.route.chunk_bytes`), not the caller's — and where every
reducer of the pass can take a layer as row sums instead (:func:`summary_request`), on CUDA a layer
the routing allows goes to them as one pass of the row-statistics kernels (:mod:`multihead.attn.rowstats`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ...attn.heap import give_back_freed
from ...collector import old_objects_frozen
from ...hf.capture import AttentionCapture
from ...hf.model import HFModel, right_padding
from ...hf.placement import NotFiniteError
from ...hf.route import SummaryRequest, chunk_bytes
from ...hf.sites import UnsupportedModelError
from ...inputs import Batch, token_info
from ...progress import bar, counted, warn
from ..stats import native, onepass
from ..stats.base import Reducer, dispatch
from ..stats.heads import kernel_key_sets
from ..stats.longcontext import BINS

__all__ = ["Encoded", "TooLongError", "all_ranks", "batch_work", "check_finite", "corpus_fingerprint",
           "encode_corpus", "process_group", "refuse_not_finite", "run_pass", "shard", "summary_request",
           "text_batches"]


@dataclass
class Encoded:
    """A corpus's token ids (and, when asked for, each token's character span)."""

    ids: list[list[int]]
    offsets: list[list[tuple[int, int]]] | None


class TooLongError(ValueError):
    """A text longer than the model's positions, read as one line: "text 3 has 12,000 tokens; …"."""

    def __init__(self, what: str, index: int, tokens: int, limit: int, remedy: str | None = "truncate=True") -> None:
        cut = f" or pass {remedy} to cut it there" if remedy else ""
        super().__init__(f"{what} {index + 1} has {tokens:,} tokens; the model takes at most {limit:,} (shorten "
                         f"it{cut})")
        self.what, self.index, self.tokens, self.limit = what, index, tokens, limit

    def flagged(self, flag: str) -> TooLongError:
        """The same error naming the command line's ``flag`` as the remedy."""
        return TooLongError(self.what, self.index, self.tokens, self.limit, flag)


def encode_corpus(model: HFModel, texts: Sequence[str], *, truncate: bool | None = False, offsets: bool = False,
                  what: str = "text", say_cut: bool = False) -> Encoded:
    """Token ids of every text; :class:`TooLongError` naming the first text longer than the model's
    positions (unless ``truncate``: cut to them, and with ``say_cut`` a line saying how much; None: the
    caller cannot cut, and the error does not offer it)."""
    tok = model.tokenizer
    limit = model.max_positions
    # verbose=False: transformers' own over-length notice would come before our one-line error.
    encoding = tok(list(texts), truncation=bool(truncate and limit), max_length=limit if truncate else None,
                   return_offsets_mapping=offsets, verbose=False)
    ids = encoding["input_ids"]
    if limit and not truncate:
        for i, row in enumerate(ids):
            if len(row) > limit:
                raise TooLongError(what, i, len(row), limit, None if truncate is None else "truncate=True")
    at_limit = [i for i, row in enumerate(ids) if len(row) == limit] if limit and truncate and say_cut else []
    if at_limit:
        _say_cut(tok, texts, at_limit, limit, what)
    spans = [[tuple(o) for o in row] for row in encoding["offset_mapping"]] if offsets else None
    return Encoded(ids, spans)


def _say_cut(tokenizer: Any, texts: Sequence[str], cut: list[int], limit: int, what: str) -> None:
    """One line on how much cutting texts ``cut`` (those at ``limit`` tokens) dropped: only their whole
    tokenization says whether they were longer."""
    longer = [(i, n) for i, n in zip(cut, map(len, tokenizer([texts[i] for i in cut], verbose=False)["input_ids"]),
                                      strict=True) if n > limit]
    if longer:
        (i, n), more = longer[0], ", …" if len(longer) > 1 else ""
        warn(f"{counted(len(longer), what)} cut to the model's {limit:,} positions ({what} {i + 1}: {n:,} tokens, "
             f"{n - limit:,} dropped{more})")


def _one_head_count(model: HFModel, capture: AttentionCapture) -> None:
    """UnsupportedModelError (one line) for captured layers of different head counts — a model pruned
    in place (`mh.prune_heads`): the reducers keep an L x H grid of heads, and a layer of 11 heads
    beside ones of 12 failed deep inside them. Gating heads off computes what pruning them does."""
    counts: dict[int, list[int]] = {}
    for site, layer in capture.where:
        counts.setdefault(site.num_heads, []).append(layer)
    if len(counts) > 1:
        most = max(counts, key=lambda n: (len(counts[n]), n))  # a tie: the larger count is the unpruned one
        fewer = ", ".join(f"{n} in {_layers_named(layers)}" for n, layers in sorted(counts.items()) if n != most)
        raise UnsupportedModelError(
            f"{model.name}'s layers have different numbers of heads ({most} in most, {fewer}: pruned, or so built); "
            "its heads are analysed as one grid of layers x heads — analyse the unpruned model, with the heads "
            "gated off (mh.hf.HeadGates) where their removal is the question")


def check_finite(stats: Any, dtype: Any, *, stack: str | None = None) -> None:
    """:class:`~multihead.hf.placement.NotFiniteError` naming the heads whose attention held NaN or
    inf — ``stats``: a reducer's running ``sums`` and ``counts`` (M, L, H), e.g. a finished
    :class:`~multihead.analysis.stats.heads.HeadStatistics` — rather than a report of NaN metrics
    beside finite ones. A metric nothing was counted for is not one (its mean is NaN by design)."""
    stats.end_batch()
    refuse_not_finite((~stats.sums.isfinite() & (stats.counts > 0)).any(0), dtype,  # (L, H)
                      f"the {stack}'s attention" if stack else "the attention")


def refuse_not_finite(bad: torch.Tensor, dtype: Any, whose: str = "the attention", on: str = "") -> None:
    """:class:`~multihead.hf.placement.NotFiniteError` naming the heads ``bad`` (L, H) bool marks — "the
    attention of 8 heads in layers 2-3 [on text 1] held NaN or inf in float16: …" — if it marks any."""
    if bool(bad.any()):
        layers = bad.any(1).nonzero().flatten().tolist()
        raise NotFiniteError.of(f"{whose} of {counted(int(bad.sum()), 'head')} in {_layers_named(layers)}"
                                + (f" on {on}" if on else ""), dtype)


def _layers_named(layers: Sequence[int]) -> str:
    """"layer 3", "layers 1-3", "layers 0, 2, 5-7": runs of consecutive layers as ranges."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    named = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"layer {named}" if len(layers) == 1 else f"layers {named}"


def text_batches(model: HFModel, encoded: Encoded, indices: Sequence[int], batch_size: int, *,
                 parses: Sequence[Any] | None = None) -> Iterator[Batch]:
    """The texts ``indices`` as right-padded batches of similar length (shortest first: little
    padding), each a :class:`~multihead.inputs.Batch` (with its parses and offsets when given)."""
    tok = model.tokenizer
    order = sorted(indices, key=lambda i: len(encoded.ids[i]))  # length buckets: little padding
    punct: dict[int, bool] = {}
    for s in range(0, len(order), batch_size):
        rows = order[s:s + batch_size]
        # Right padding: positions must not shift with padding (decoders count them from 0).
        with right_padding(tok):
            padded = tok.pad({"input_ids": [encoded.ids[i] for i in rows]}, return_tensors="pt")
        ids, mask = padded["input_ids"], padded["attention_mask"]
        yield Batch(token_info(ids, mask.bool(), tok, punct), list(rows),
                    {"input_ids": ids, "attention_mask": mask},
                    parses=None if parses is None else [parses[i] for i in rows],
                    offsets=None if encoded.offsets is None else [encoded.offsets[i] for i in rows],
                    causal=model.is_causal)


def batch_work(encoded: Encoded, indices: Sequence[int], batch_size: int) -> list[float]:
    """Each of :func:`text_batches`' batches' share of a pass's work, roughly: its padded tokens, each
    over a fixed cost and its keys (the projections and MLP per token, the attention per pair)."""
    lengths = sorted(len(encoded.ids[i]) for i in indices)
    return [float(len(rows) * rows[-1] * (rows[-1] + PAIR_WORK))
            for rows in (lengths[s:s + batch_size] for s in range(0, len(lengths), batch_size))]


#: A token's projections and MLP as the attention of this many keys, for :func:`batch_work`.
PAIR_WORK = 1024


def run_pass(model: HFModel, batches: Iterable[Batch], reducers: Sequence[Reducer], *,
             at: str | Sequence[str] | None = None, budget: int | None = None, chunk: int | None = None,
             progress: bool | None = None, desc: str = "analyze", total: int | None = None,
             work: list[float] | None = None) -> None:
    """Run the model's base once over ``batches``, every chunk of every captured layer (``at``:
    :func:`~multihead.hf.sites.select`) handed to every reducer; ``work``: each batch's share of it
    (:func:`batch_work`), for the time left the progress lines estimate."""
    device = model.device
    if budget is None:  # maps above one chunk's bytes stream: on a CPU a larger one is slower, not faster
        budget = chunk_bytes(device)
    # a reducer never keeps a chunk (the Reducer protocol): the streamed maps may reuse their buffers
    feed = dispatch(reducers)
    capture = AttentionCapture(model.model, feed, at=at, chunk=chunk, budget=budget, transient=True)
    _one_head_count(model, capture)
    with capture, torch.inference_mode(), old_objects_frozen():
        for batch in bar(batches, desc=desc, unit="batch", progress=progress, total=total, weights=work):
            batch = batch.to(device)  # the maps are captured where the model runs: so are the tokens' flags
            for reducer in reducers:
                reducer.begin_batch(batch)
            capture.summary_request, direct = summary_request(reducers, batch)
            feed.direct = frozenset(map(id, direct))
            feed.before = functools.partial(onepass.read_once, batch=batch)  # a chunk read once by its readers
            # The base model: attention is all we read, so a language-model head is skipped.
            model.body(**batch.inputs, **model.no_cache)
            capture.release()  # the streamed layers' buffers: not beside the reducers' end-of-batch work
            # nor the heap's free holes the pass left (24-60 MiB of SmolLM2 float32's at 1k tokens, the end's
            # blocks mapped on top of them: a peak 25 % above the tensors, varying from process to process)
            return_freed_memory()
            for reducer in reducers:
                reducer.end_batch()
            return_freed_memory()


def summary_request(reducers: Sequence[Reducer], batch: Batch) -> tuple[SummaryRequest | None, list[Reducer]]:
    """The row sums a pass asks of a layer instead of its map for ``batch`` (after the reducers'
    ``begin_batch``), and the reducers that read them: each that says what it reads
    (``summary_needs(batch)``: key sets, induction targets, distance bins, columns; None — or no
    such method, as the syntax scores and a page's views — where it reads the map, which it is then
    given formed from the sums, :class:`~multihead.analysis.stats.base.Dispatch`). (None, []) where
    none reads row sums."""
    wanted: set[str] = set()
    direct = []
    for reducer in reducers:
        needs = getattr(reducer, "summary_needs", None)
        found = None if needs is None else needs(batch)
        if found is not None:
            wanted |= found
            direct.append(reducer)
    if not direct:
        return None, []
    tokens = batch.tokens
    request = SummaryRequest(key_sets=kernel_key_sets(tokens) if "key_sets" in wanted else None,
                             # (previous, token) of the batch's induction pattern, set by TypicalTexts.begin_batch
                             targets=batch.memo.get(native.REPEAT) if "targets" in wanted else None,
                             bins=BINS if "bins" in wanted else 0,
                             columns=tokens.valid if "columns" in wanted else None,
                             # a padded batch's layers (mask tensors) go to the kernels if it is right-padded
                             key_valid=tokens.valid if tokens.positions[1] else None)
    return request, direct


def corpus_fingerprint(texts: Sequence[str]) -> dict:
    """What identifies the analysed corpus (``multihead compare`` refuses reports of different ones):
    the number of texts and the SHA-256 of the texts as a JSON list."""
    digest = hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode("utf-8")).hexdigest()
    return {"texts": len(texts), "sha256": digest}


# --------------------------------------------------------------------------- torch.distributed


def shard(indices: Sequence[int]) -> tuple[list[int], bool]:
    """This process's share of ``indices`` under ``torch.distributed`` (rank r takes r, r + world,
    ...) and whether the corpus is sharded at all."""
    mine = list(indices)
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return mine, False
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = mine[rank::world]
    if not mine:
        raise ValueError(f"{world} processes need at least {world} texts (one each)")
    return mine, True


def all_ranks(reducers: Sequence[Reducer]) -> list[Reducer]:
    """Every rank's reducers merged, in rank order, on every rank (so every rank holds the same
    numbers, to the last bit); torch.distributed must be initialised."""
    dist = torch.distributed
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, list(reducers))
    merged = parts[0]
    for part in parts[1:]:
        for mine, theirs in zip(merged, part, strict=True):
            mine.merge(theirs)
    return merged


@contextmanager
def process_group() -> Iterator[int]:
    """Under torchrun (WORLD_SIZE > 1): join its process group (gloo on the CPU, nccl with CUDA)
    for the body and yield this rank; otherwise (or when a group exists already) yield 0 / its rank.

    :func:`multihead.analyze` and ``multihead analyze`` shard their corpus over the group's ranks."""
    dist = torch.distributed
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not dist.is_available() or dist.is_initialized():
        yield dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return
    backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        yield dist.get_rank()
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- memory


def return_freed_memory() -> None:
    """Hand freed heap memory back to the OS after each batch (:func:`~multihead.attn.heap.give_back_freed`).

    Batches differ in shape, so glibc, having raised its mmap threshold after the first large
    frees, serves later large tensors from a heap that fragments and never shrinks: without this,
    RSS creeps up batch after batch (measured: +550 MiB over 2,000 MiniLM sentences) although
    nothing is retained.
    """
    give_back_freed()
