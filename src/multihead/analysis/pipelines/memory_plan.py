"""The memory plan of an analysis: what a run will hold on its device, from the model's config
alone — before a weight is read, and for devices this machine does not have.

    weights    every parameter and buffer, in the run's dtype (counted on the ``meta`` device)
    pass       the model's own forward above the weights, with its attention streamed to the
               readers as the run streams it: traced op by op on ``meta`` (:class:`~multihead.attn.memory.LiveBytes`),
               the readers' work on each chunk included (:data:`READER_WORK` × its rows' float32 map;
               :data:`NATIVE_READER_WORK` for the compiled readers of a CPU run)
    statistics what the readers hold on the device through a batch: redundancy's sampled rows,
               head outputs in the model's dtype (:meth:`RedundancyStatistics.planned_bytes`), and
               their end-of-batch work; the typical texts' candidates of every layer
               (:meth:`TypicalTexts.batch_bytes`)
    host       what is kept in host memory whatever the device: the head metrics' running sums
               (:meth:`HeadStatistics.planned_bytes`), the typical texts' and the syntax scores'
               tables per relation the parses hold (:meth:`TypicalTexts.planned_bytes`,
               :meth:`SyntaxStatistics.planned_bytes`) and the syntax hits a batch holds to its end
               (:meth:`SyntaxStatistics.batch_bytes`), and the page's views of the chosen texts
               (:meth:`TextViews.planned_bytes`) — with the probes, their inputs' views too (the
               induction probe's first sequence, the retrieval probe's first trial: read in the
               probes' passes, kept for the page); on a CPU it adds to the device's total
    probes     the induction and retrieval probes' own passes (fixed, small shapes; a causal model's)
    process    on a CPU, for the model loaded in this process: what the process holds now beside the
               model's resident weights (the libraries, the tokenizer, the parses: VmRSS less the
               weights' pages present, :func:`~multihead.attn.memory.pages_in_memory`), so that the
               total is what the system will see the process hold at the run's peak
    holes      on a CPU with glibc: the free holes the C heap keeps resident beside the pass's
               tensors — the traced pass's allocations replayed under malloc's rules, the heap's
               highest extent and the most mapped at once (:func:`~multihead.attn.heap.replay`,
               :attr:`~multihead.attn.heap.HeapPeak.bound`); RSS is the tensors plus these

``total = process + weights + statistics + max(pass + holes, end-of-batch work, probes)``. A layer's activations
do not pile up (no cache, no hidden states kept), so the pass is traced through one layer of each
kind the config names (full and sliding attention) and holds for any depth.

    >>> from transformers import LlamaConfig
    >>> p = plan(LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    ...          num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
    ...          max_position_embeddings=131072), 32768,
    ...          dtype="bfloat16", device="cuda", available=80 * 10**9)      # doctest: +SKIP
    >>> print(p)                                                                 # doctest: +SKIP
"""

from __future__ import annotations

import copy
import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...attn.cpu_trace import traced_as_cpu
from ...attn.heap import HeapRules, heap_rules, replay
from ...attn.memory import LiveBytes, available_memory, pages_in_memory, process_resident
from ...hf.capture import AttentionCapture
from ...hf.load import check_room, empty_model, is_causal_config, is_language_model, max_positions, quiet_logger
from ...hf.model import HFModel, takes
from ...hf.paths import model_path
from ...hf.placement import (
    accelerate_device,
    device_named,
    dtype_named,
    execution_devices,
    mapped_places,
    mapped_weights,
    memory_entries,
    resident_bytes,
    size_in_bytes,
)
from ...hf.route import AttentionChunk, chunk_bytes
from ..probes.retrieval import NEEDLE
from ..probes.retrieval import PROBE as RETRIEVAL
from ..stats import native
from ..stats.heads import HeadStatistics
from ..stats.maps import EVIDENCE_TOP_K, TextViews
from ..stats.redundancy import RedundancyStatistics, gram_dtype, js_budget
from ..stats.syntax import SyntaxStatistics
from ..stats.typical import TypicalTexts

__all__ = ["NATIVE_READER_WORK", "READER_WORK", "MemoryPlan", "PlanError", "check_plan", "plan", "plan_devices"]

#: The readers' temporaries on one chunk of c rows over K keys, in units of its float32 map
#: (B·H·c·K·4 bytes; measured when every chunk held the rows of S keys its bytes fit, so that the
#: largest was c rows over all S; a causal layer's first chunks now take more rows of fewer keys, and
#: the most a run held stayed where it was — SmolLM2 float32, 2,048 tokens: 240 MiB of tensors with
#: either): the most any reader took on SmolLM2 at 700 and 2,048 tokens (the long-context prefix sums 2.5,
#: typical texts 2.4, head metrics 1.2, redundancy 1.3), rounded up. The readers run one after
#: another, so the most, not the sum.
READER_WORK = 2.5
#: The same for the compiled readers (:mod:`~multihead.analysis.stats.native`: a CPU run in float32
#: or bfloat16 where a C compiler is): they allocate only each row's count of visible keys and
#: (B, H)-sized sums, and redundancy copies a document's sampled rows as one strided view — the most
#: any chunk's readers held beyond what they kept (LiveBytes around each chunk's dispatch; SmolLM2
#: bfloat16 at 1k, 4k and 8k tokens: 0.19, 0.06, 0.03; float32 at 1k and 4k: 0.18, 0.10), rounded up.
#: (It was 1.5 while redundancy gathered its rows; with the chunks' workspace left out of the trace,
#: that stood in for it.)
NATIVE_READER_WORK = 0.25
#: Passes the heap model replays the traced one (one layer of each kind) for its holes to settle:
#: glibc's threshold moves after the first, and a pass's holes are the next one's to fill.
REPLAYS = 3
#: The induction probe's shape: texts x tokens (two copies of 40 random tokens and a BOS).
INDUCTION_SHAPE = (16, 81)


class PlanError(MemoryError):
    """A run that will not fit its device, said before it starts (the plan in the message)."""


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes a run will hold on ``device`` (see the module); ``available``: the device's memory
    for it (None: unknown)."""

    model: str
    device: str
    dtype: str
    tokens: int
    batch: int
    weights: int
    forward: int
    statistics: int
    end_of_batch: int
    probes: int
    chunk: int
    host: int
    available: int | None
    #: the C heap's free holes resident beside the pass's tensors (0: not modelled: not a CPU, not glibc)
    holes: int = 0
    #: where a device-mapped model's weights are (``cpu + disk``; "" for a model on one device): its
    #: ``weights`` are then those on ``device`` alone
    mapped: str = ""
    #: for a device that only runs layers of a model spread over several: the device its chunks are
    #: handed to, where the readers' sums are ("" where they are on this one)
    readers_on: str = ""
    #: what the process running it holds beside the weights before the run (a loaded model's CPU plan;
    #: 0: not counted — a plan from a config, or for an accelerator)
    process: int = 0
    #: of ``host``, the bootstrap's per-group zeros the run never writes (groups no text of it meets):
    #: tensors that hold no memory (:func:`~multihead.analysis.stats.bootstrap.group_zeros`)
    unwritten: int = 0

    @property
    def working(self) -> int:
        """Bytes above the weights at the run's peak, on the device (and the host's share on a CPU),
        as the system counts them: the tensors and the allocator's holes."""
        return self.statistics + self._resident_pass + (self._held if self.device == "cpu" else 0)

    @property
    def tensors(self) -> int:
        """The tensors alone above the weights at the run's peak (what :class:`LiveBytes` counts; of the
        bootstrap's per-group tables, mapped outside PyTorch's operations and not seen by it, the pages of
        the groups the run writes: a few, ``unwritten`` left out)."""
        return self.statistics + self._pass + (self._held if self.device == "cpu" else 0)

    @property
    def _held(self) -> int:
        """The host's share that takes memory: its tables less the bootstrap's groups never written."""
        return self.host - self.unwritten

    @property
    def _pass(self) -> int:
        return max(self.forward, self.end_of_batch, self.probes)

    @property
    def _resident_pass(self) -> int:
        """The pass's peak with the heap's holes beside its forward."""
        return max(self.forward + self.holes, self.end_of_batch, self.probes)

    @property
    def total(self) -> int:
        """Bytes on the device at the run's peak, weights included (and on a CPU, the process's own)."""
        return self.process + self.weights + self.working

    @property
    def fits(self) -> bool:
        return self.available is None or self.total <= self.available

    def __str__(self) -> str:
        room = "" if self.available is None else f" of {_gib(self.available)} available"
        held = self._held
        on_cpu = f" + host {_gib(held)}" if held and self.device == "cpu" else ""
        beside = f"; {_gib(held)} of sums and views in host memory" if held and self.device != "cpu" else ""
        work = self._resident_pass
        counted = work - self._pass  # what the holes add to the tensors' peak (none where the end of batch is it)
        holes = f"; {_gib(counted)} of it the heap's holes" if counted > 0 else ""
        place = f"{self.mapped} (device map), planned for {self.device}" if self.mapped else self.device
        if self.readers_on:
            place += f": its layers only, the readers on {self.readers_on}"
        process = f"this process {_gib(self.process)} + " if self.process else ""
        # the verdict in words, not only in .fits: a plan read as text once said "16.18 GiB of 14.90 GiB available"
        over = "" if self.fits else f": the run would not fit, {_gib(self.total - self.available)} over"
        return (f"memory plan for {self.model} ({self.dtype} on {place}, {self.batch} x {self.tokens:,} "
                f"tokens): {process}weights {_gib(self.weights)} + pass {_gib(work)} (chunks of at most "
                f"{self.chunk / 2**20:.0f} MiB{holes}) + statistics {_gib(self.statistics)}{on_cpu} = "
                f"{_gib(self.total)}{room}{over}{beside}")


def plan(model: HFModel | Any, tokens: int, *, batch: int = 1, dtype: Any = None, device: Any = None,
         available: int | str | None = None, redundancy: bool = True, views: int = 1, probes: bool = True,
         relations: int = 0, chunk: int | None = None, budget: int | None = None, weights: int | None = None,
         readers_on: Any = None, chunk_limit: int | None = None, texts: int | None = None) -> MemoryPlan:
    """The memory plan of analysing ``batch`` texts of ``tokens`` tokens with ``model``: a loaded
    :class:`~multihead.hf.HFModel`, a transformers config, or a local model folder / known name
    (its config only). ``dtype`` / ``device``: the run's (default: the loaded model's, else
    :func:`~multihead.hf.load`'s rule: the config's dtype on an accelerator, float32 on the CPU);
    ``available``: the device's memory for the run, in bytes or as text ("24GB") (default: what it has free now, plus
    the loaded model's own weights — on a CPU, plus all the process holds now, since the total
    counts the process: a given one for a loaded model's CPU plan is for the whole process, what it
    holds already included); ``views``: texts of this length whose page views are kept;
    ``relations``: the relation keys the run may score (0: no parses; ``stats.syntax.relation_keys``:
    spaCy's parse of a Penn Treebank document of 1k-8k tokens has 76-86, a causal model scores up
    to 48-60 of them: ~43 MiB of tables for a 28 x 12-head model, ~128 MiB for 32 x 32). Nothing
    is allocated: every tensor is on ``meta``. ``weights``: the bytes of weights on ``device``
    (default: the model's, or for a device-mapped one those it holds there); ``readers_on``: for a
    device that only runs layers of a model spread over several (:func:`plan_devices`), the device
    its chunks go to — the readers' sums, views and end-of-batch work are planned there, not here;
    ``chunk_limit``: the most bytes of one chunk, where the run sets it (default: the device's own,
    :func:`~multihead.hf.route.chunk_bytes`); ``texts``: the texts the whole run analyses (default
    ``batch``: one batch) — the bootstrap's per-group tables hold memory at the groups those meet
    (:func:`~multihead.analysis.stats.bootstrap.group_zeros`)."""
    if not isinstance(tokens, int) or tokens < 1 or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"tokens and batch must be positive integers; got {tokens!r}, {batch!r}")
    if not isinstance(relations, int) or isinstance(relations, bool) or relations < 0:
        raise ValueError(f"relations must be a count of relation keys (0 or more); got {relations!r}")
    available = _size(available)
    loaded = model if isinstance(model, HFModel) else None
    config = loaded.model.config if loaded else _config(model)
    positions = loaded.max_positions if loaded else max_positions(config)
    if positions and tokens > positions:  # analyze refuses such a text (or cuts it, --truncate): no run to plan
        raise ValueError(f"{tokens:,} tokens is more than the {positions:,} positions the model reads; plan for at "
                         f"most {positions:,} tokens (what analyze --truncate keeps), or for a config with more "
                         "positions")
    # as load reads them: one line (a PlacementError, a ValueError) for a device or dtype that is none
    device = device_named(device if device is not None else (loaded.device if loaded else "cpu"))
    if dtype is None and loaded is not None:
        dtype = loaded.dtype
    dtype = dtype_named(dtype, config, accelerated=device.type != "cpu")
    name = loaded.name if loaded else str(model) if isinstance(model, (str, Path)) else \
        f"a {config.model_type} config"
    # a device-mapped model: only its weights on this device (kept there, or swapped in one module at a time)
    mapped = resident_bytes(loaded.model, device) if loaded and loaded.dtype == dtype and weights is None else None
    places = (mapped_places(loaded.model) or "") if loaded and loaded.dtype == dtype else ""
    tensors = _tensors(loaded.model) if loaded else []  # one walk of the model's modules for both below
    if weights is None:
        weights = mapped if mapped is not None else _bytes(tensors if loaded and loaded.dtype == dtype
                                                           else _tensors(empty_model(config, dtype)))
    process = 0
    if loaded is not None and device.type == "cpu":  # this process runs it: what it holds beside the weights counts
        held, present = process_resident(), pages_in_memory(tensors)
        if held is not None and present is not None:
            process = max(held - present, 0)
            if available is None:  # all it holds now, weights' pages present or not yet read, plus what is free
                free = available_memory(device)
                available = None if free is None else free + held
    if available is None:  # a loaded model's own weights are there already
        available = _free_beside(device, weights if loaded is not None else 0)
    room = None if available is None else max(available - process - weights, 0)
    limit = chunk_bytes(device, free=room) if chunk_limit is None else chunk_limit
    budget = limit if budget is None else budget  # as the pipelines stream
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    L = _depth(text)
    H = int(text.num_attention_heads)
    D = int(text.hidden_size)
    Dv = int(getattr(text, "head_dim", None) or D // H)
    statistics = end = host = unwritten = 0
    if readers_on is not None:  # the readers' sums are on another device: none of what follows is here
        redundancy, views, relations = False, 0, 0
    if redundancy:
        held, end = RedundancyStatistics.planned_bytes(L, H, batch * tokens, tokens, D, Dv,
                                                       element_size=dtype.itemsize,
                                                       gram_size=gram_dtype(dtype, device).itemsize,
                                                       budget=js_budget(device))
        statistics += held
    # the head metrics' running sums and bootstrap groups, the top texts, the syntax counts per relation
    if readers_on is None:
        host = (HeadStatistics.planned_bytes(L, H) + TypicalTexts.planned_bytes(L, H, relations)
                + SyntaxStatistics.planned_bytes(L, H, relations)
                + SyntaxStatistics.batch_bytes(L, H, relations, batch))
        # the per-group tables' zeros at the groups the run does not meet: tensors, but never written
        met = batch if texts is None else texts
        unwritten = (HeadStatistics.planned_bytes(L, H) - HeadStatistics.planned_bytes(L, H, texts=met)
                     + SyntaxStatistics.planned_bytes(L, H, relations)
                     - SyntaxStatistics.planned_bytes(L, H, relations, texts=met))
        statistics += TypicalTexts.batch_bytes(L, H, relations, batch)  # a batch's candidates, where the model runs
    if views and tokens > 1:
        host += views * TextViews.planned_bytes(L, H, tokens)
    body = empty_model(_one_layer_of_each_kind(config), dtype, base=True)
    work = NATIVE_READER_WORK if device.type == "cpu" and dtype != torch.float64 and native.available() else \
        READER_WORK
    def bytes_for(texts: int, length: int) -> int:  # a chunk's bytes as the run's capture takes them on its device
        return chunk_limit if chunk_limit is not None else chunk_bytes(device, free=room,
                                                                       row_bytes=texts * H * length * 4)

    on_cpu = device.type == "cpu"  # the trace takes this CPU's kernels where they hold other buffers (AMX's tiles)
    forward, largest, events, kept = _traced(body, batch, tokens, chunk=chunk, budget=budget,
                                             limit=bytes_for(batch, tokens), work=work, on_cpu=on_cpu)
    rules = heap_rules() if device.type == "cpu" else None
    holes = max(_replayed(events, rules, kept) - forward, 0) if rules else 0
    probe = 0
    haystack = RETRIEVAL["haystack"] + 2 * NEEDLE + 1  # the retrieval probe's trial: its tokens
    # as the run reads them: the induction probe on a causal model, the retrieval probe on one with its LM head
    # and the trial's positions (an encoder's 512 took no 633-token trial)
    probes = probes and (loaded.is_causal if loaded else is_causal_config(config))
    retrieval = probes and (loaded.has_lm_head if loaded else is_language_model(config)) and \
        not (positions and haystack > positions)
    if probes and views:  # the page's views of the probes' inputs, read in their passes and kept with the others
        host += TextViews.planned_bytes(L, H, INDUCTION_SHAPE[1]) + \
            (TextViews.planned_bytes(L, H, haystack, top_k=EVIDENCE_TOP_K) if retrieval else 0)
    if probes:
        probe = _traced(body, *INDUCTION_SHAPE, chunk=None, budget=budget, limit=bytes_for(*INDUCTION_SHAPE),
                        work=work, on_cpu=on_cpu)[0]
    if retrieval:
        probe = max(probe, _traced(body, 1, haystack, chunk=256, budget=budget, limit=bytes_for(1, haystack),
                                   work=work, on_cpu=on_cpu)[0])
    return MemoryPlan(name, str(device), str(dtype).removeprefix("torch."), tokens, batch, weights, forward,
                      statistics, end, probe, largest, host, available, holes, places,
                      "" if readers_on is None else str(torch.device(readers_on)), process, unwritten)


def plan_devices(model: HFModel | Any, tokens: int, *, device_map: str | dict | None = None,
                 max_memory: str | dict | None = None, available: int | dict | None = None, dtype: Any = None,
                 **options: Any) -> list[MemoryPlan]:
    """A memory plan for each device a run computes on (:func:`plan` for each; ``options`` are
    its). A model on one device has one. A model spread over several GPUs by accelerate — a loaded
    one with its ``hf_device_map``, or a config or folder given ``device_map`` (``"auto"``,
    ``"balanced"``, ``"sequential"`` with ``max_memory``, as :func:`~multihead.hf.load` takes
    them, or accelerate's dict of module names to devices) — has one per GPU: each with the weights
    the map puts there (the first also the largest module swapped in from the host or disk), the
    pass of its own layers, and on the map's main device (the first) the readers' sums and views,
    since the capture hands every chunk there (every chunk no larger than any device takes). ``available``: bytes per
    device (a dict keyed as ``max_memory``: 0, "cuda:1", …), one number for every device, or None
    (for a loaded model, as :func:`plan` measures it: what each has free now beside what the run
    holds there already). Nothing is allocated."""
    loaded = model if isinstance(model, HFModel) else None
    config = loaded.model.config if loaded else _config(model)
    mapping = getattr(loaded.model, "hf_device_map", None) if loaded else None
    if loaded is None and device_map is not None:
        mapping = _inferred_map(config, dtype, device_map, max_memory)
        if available is None and max_memory is not None:  # each device's share is what the run may take there
            available = memory_entries(max_memory)
    if not mapping:
        return [plan(model, tokens, dtype=dtype, available=_room(available, options.get("device")), **options)]
    options.pop("device", None)  # the map's devices
    devices = execution_devices(mapping)
    home = devices[0]
    if loaded is not None:  # the weights its hooks keep (or swap in) on each device
        weights = {d: resident_bytes(loaded.model, d) for d in devices}
    else:
        weights = mapped_weights(empty_model(config, dtype_named(dtype, config, accelerated=True)), mapping)
    rooms = {d: _room(available, d) for d in devices}  # for a loaded model, None: plan() measures it
    free = rooms
    if loaded is not None:  # as plan() counts it: what is free now beside the weights already there
        free = {d: room if room is not None else _free_beside(d, weights[d]) for d, room in rooms.items()}
    # the capture's rule over several devices: every chunk no larger than any of them takes, each handed to
    # the first (one device: its own rule, as plan() has it)
    limit = min(chunk_bytes(d, free=None if free[d] is None else max(free[d] - weights[d], 0))
                for d in devices) if len(devices) > 1 else None
    return [plan(model, tokens, dtype=dtype, device=d, available=rooms[d], weights=weights[d],
                 readers_on=None if d == home else home, chunk_limit=limit, **options) for d in devices]


def _free_beside(device: Any, weights: int) -> int | None:
    """What ``device`` has free now, plus the loaded weights already there (None: unknown — a device
    this machine does not have, planned for without a verdict unless ``available`` is given)."""
    free = available_memory(device)
    return None if free is None else free + weights


def _inferred_map(config: Any, dtype: Any, device_map: str | dict, max_memory: str | dict | None) -> dict:
    """accelerate's device map of ``config``'s model in ``dtype``, inferred on the meta device as
    ``from_pretrained`` infers it (a dict is taken as it is)."""
    if isinstance(device_map, dict):
        return dict(device_map)
    if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise ValueError(f"device_map must be 'auto', 'balanced', 'sequential' or a dict; got {device_map!r}")
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    dtype = dtype_named(dtype, config, accelerated=True)
    empty = empty_model(config, dtype)
    limits = memory_entries(max_memory)  # GPUs this machine may not have: planned for
    if limits is None:
        raise ValueError("a device map planned without the devices needs max_memory (e.g. 0=80GiB,1=80GiB)")
    # as load refuses it: a share too small for one block leaves the map nothing but the host or disk
    check_room(config, {"max_memory": limits, "dtype": dtype}, f"a {config.model_type} config")
    # accelerate's "Device 0 is not available" (it is planned for), transformers' note on a buffer for
    # offloaded layers (what the plan's own weights line says)
    with quiet_logger("accelerate.utils.modeling"), quiet_logger("transformers.integrations.accelerate"):
        try:  # what from_pretrained itself calls (its own sizes and buffers, not accelerate's)
            from transformers.integrations.accelerate import _get_device_map
        except ImportError:
            _get_device_map = None
        if _get_device_map is not None:
            return _get_device_map(empty, device_map, limits, None)
        blocks = list(getattr(empty, "_no_split_modules", None) or ())
        if device_map != "sequential":
            limits = get_balanced_memory(empty, max_memory=limits, no_split_module_classes=blocks, dtype=dtype,
                                         low_zero=device_map == "balanced_low_0")
        return infer_auto_device_map(empty, max_memory=limits, no_split_module_classes=blocks, dtype=dtype)


def _room(available: int | str | dict | None, device: Any) -> int | None:
    """The bytes ``available`` gives ``device`` (a dict keyed by accelerate's 0, 1, … or names; a size
    in bytes or as text, "24GB")."""
    if not isinstance(available, dict):
        return _size(available)
    device = torch.device(device) if device is not None else None
    for key, value in available.items():
        if device is not None and accelerate_device(key) == device:
            return _size(value, key)
    return None


def _size(value: int | str | None, key: Any = None) -> int | None:
    """``available``'s bytes: an int, or a size as text ("24GB", "80 GiB"); ValueError in one line."""
    if value is None:
        return None
    try:
        return size_in_bytes(value)
    except ValueError as err:
        named = f"available[{key!r}]" if key is not None else "available"
        raise ValueError(f"{named}={value!r}: {err}") from None


def check_plan(found: MemoryPlan) -> None:
    """Raise :class:`PlanError` when the plan does not fit its device (one line: the plan and a remedy)."""
    if not found.fits:
        raise PlanError(f"{found}; analyse shorter texts (or fewer at once), skip redundancy "
                        "(redundancy=False), or use a device with more memory")


def _traced(body: Any, batch: int, tokens: int, *, chunk: int | None, budget: int, limit: int,
            work: float, on_cpu: bool = False) -> tuple[int, int, list[tuple[int, int]], set[int]]:
    """(peak bytes above the weights, largest chunk's map bytes, the allocations and frees in order,
    the keys of those the pass keeps for its next layers) of one pass of ``body`` on meta, its
    attention streamed to a reader that takes ``work`` (:data:`READER_WORK`,
    :data:`NATIVE_READER_WORK`) × each chunk's float32 map; ``on_cpu``: the pass as this machine's
    CPU runs it (its kernels' paths — the AMX tiles', the compiled softmax's —
    :func:`~multihead.attn.cpu_trace.traced_as_cpu`,
    and the chunks' buffers lent from layer to layer, :class:`~multihead.attn.workspace.Workspace`)."""
    largest = 0

    def reader(part: AttentionChunk) -> None:
        nonlocal largest
        largest = max(largest, part.weights.numel() * 4)  # the readers' float32 map
        torch.empty(int(work * part.weights.numel() * 4), dtype=torch.uint8, device="meta")  # freed at once

    ids = torch.zeros(batch, tokens, dtype=torch.long, device="meta")
    extra = {"use_cache": False} if takes(body, "use_cache") else {}
    # The chunks' buffers as a pipeline's capture holds them on a CPU: lent from layer to layer (its
    # readers keep nothing of a chunk), so the workspace's blocks sit beside the MLP's activations too
    # (a Qwen2-1.5B shape at 8k tokens: 90 MiB of tensors a trace that made and freed them each chunk
    # missed, -12 %); elsewhere (CUDA's caching allocator) made and freed each chunk.
    # The chunks as rows of every key (Attachment.grow off): the run's grow where its rows see fewer keys, but
    # its workspace's blocks are of the largest chunk's size whichever they are; with the grown chunks the
    # heap's holes replayed beside them passed the RSS peak by 27-43 % at 1k (SmolLM2, AMD EPYC).
    capture = AttentionCapture(body, reader, chunk=chunk, budget=budget, chunk_bytes=limit, transient=True)
    capture.grow = False
    with torch.inference_mode(), capture, traced_as_cpu(on_cpu), _FullBatch("meta", record=True) as live:
        body(input_ids=ids, attention_mask=torch.ones_like(ids), **extra)
        lent = capture.workspace.buffers() if capture.workspace is not None else []
        kept = {t.untyped_storage()._cdata for t in lent}
    return live.peak, largest, list(live.events or ()), kept


def _replayed(events: list[tuple[int, int]], rules: HeapRules, kept: AbstractSet[int] = frozenset()) -> int:
    """What :data:`REPLAYS` passes of ``events`` one after another make resident under ``rules``
    (the heap's highest extent and the most mapped at once: a long pass's heap, once grown, stays);
    what one pass leaves alive is freed before the next (a layer's output, once the next has read it)
    but for the blocks ``kept`` for the next layers (a lent workspace's: made in the first, alive
    at the last pass's end)."""
    alive_at_end: dict[int, int] = {}  # key -> the index of the allocation still alive at the pass's end
    for i, (key, size) in enumerate(events):
        if size > 0:
            alive_at_end[key] = i
        else:
            alive_at_end.pop(key, None)
    made_once = {i for key, i in alive_at_end.items() if key in kept}
    sequence: list[tuple[tuple[int, int], int]] = []
    for n in range(REPLAYS):
        alive: dict[int, int] = {}
        for i, (key, size) in enumerate(events):
            if i in made_once:
                if n == 0:
                    sequence.append(((0, key), size))
                continue
            sequence.append(((n, key), size))
            if size > 0:
                alive[key] = size
            else:
                alive.pop(key, None)
        sequence += [((n, key), -size) for key, size in alive.items()]
    return replay(sequence, rules).bound


#: the ops that bring a tensor's value to the host
_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.is_nonzero.default)


class _FullBatch(LiveBytes):
    """:class:`LiveBytes` for a batch of real tokens only: the questions a model asks of its mask
    on the host ("is every token real?", "is the batch unpacked?") are answered yes — true of the
    traced batch, and the answer that forms no mask, as for a real unpadded run. Any other read of
    a value is an error: the pass would depend on data the plan does not have."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _READS and args[0].device.type == "meta":
            if args[0].dtype != torch.bool:
                raise RuntimeError("the model reads a value of its input on the host; its memory cannot be planned "
                                   "from the config alone")
            return True
        return super().__torch_dispatch__(func, types, args, kwargs)


def _one_layer_of_each_kind(config: Any) -> Any:
    """The config with one layer of each kind it names (``layer_types``), or one layer: enough to
    trace a pass whose activations do not pile up across layers."""
    shallow = copy.deepcopy(config)
    text = shallow.get_text_config() if hasattr(shallow, "get_text_config") else shallow
    kinds = list(dict.fromkeys(getattr(text, "layer_types", None) or ()))
    depth = max(1, len(kinds))
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(text, name):
            setattr(text, name, depth)
    if kinds:
        text.layer_types = kinds
    return shallow


def _depth(config: Any) -> int:
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ValueError(f"{type(config).__name__} names no number of layers (num_hidden_layers, n_layer, num_layers)")


def _config(model: Any) -> Any:
    if isinstance(model, (str, Path)):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model_path(model))
    if hasattr(model, "model_type") and hasattr(model, "to_dict"):
        return model
    raise TypeError(f"plan reads a loaded model, a transformers config or a model folder; got {type(model).__name__}")


def _tensors(model: Any) -> list[torch.Tensor]:
    """Every parameter and buffer."""
    return [*model.parameters(), *model.buffers()]


def _bytes(tensors: list[torch.Tensor]) -> int:
    """The bytes of a model's parameters and buffers (:func:`_tensors`), each once (tied weights are one tensor)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        seen[id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{math.ceil(n / 2**20)} MiB"
