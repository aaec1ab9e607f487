"""What the C heap makes resident for a sequence of allocations: glibc's malloc, replayed.

Tensors on a CPU come from ``malloc``. On Linux (glibc) a request is cut from the heap — best fit
among its free holes, else from the free space at its top; one that fits neither and asks at least
the *mmap threshold* gets its own mapping, which goes back to the system when freed; a smaller one
grows the heap. Free space goes back to the system only at the
heap's top, and only beyond the *trim threshold*: a hole below a block in use stays resident. The
mmap threshold is dynamic: freeing a mapped chunk of up to
32 MiB raises it to that chunk's size (and the trim threshold to twice that), so a streamed pass
whose chunks are 24 MiB soon takes them from the heap, and a later, larger request that fits no
hole grows the heap although the tensors alive are fewer. On SmolLM2 and a Qwen2-1.5B shape these
holes were 20-40 % of the bytes held as tensors (docs/scale.md), so a plan that counts tensors alone
falls short of the resident memory by as much; :func:`replay` runs the plan's traced allocations
under these rules to close that gap.

Once grown, a heap seldom shrinks in a long pass: glibc gives back only free space at its top, and
a block that lives through a layer soon sits there. (SmolLM2 in float32 at 8,192 tokens, its real
allocations replayed: the heap reached its extent in the third of 30 layers and kept it, and the
peak came when a layer's MLP mapped its 48 MiB blocks on top of it.) :attr:`HeapPeak.bound` — the
heap's highest extent plus the most mapped at once — is what a plan takes. A streamed capture on a
CPU gives the heap's free pages back between its layers (:class:`PacedGiveBack`): the extent stays,
the pages of its holes go until reused, so the bound holds them resident at most.

The rules are glibc's (malloc/malloc.c: ``_int_malloc``, ``sysmalloc``, ``_int_free``, ``systrim``),
simplified: best fit over every hole (glibc's bins give the same choice for the large requests that
matter), no per-thread arenas, small requests treated as large ones (no tcache or fastbins), the
top padding ``sysmalloc`` adds when it grows the heap left out, and of ``posix_memalign`` only the
larger request it makes (PyTorch aligns to 64 bytes). Its settings (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_`` and their ``GLIBC_TUNABLES``
names) are read from the environment: setting any turns the dynamic threshold off.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import os
import platform
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

__all__ = ["Heap", "HeapPeak", "HeapRules", "PacedGiveBack", "give_back_freed", "heap_rules", "replay"]

#: glibc's defaults on 64-bit systems
MMAP_THRESHOLD = 128 * 1024
MMAP_THRESHOLD_MAX = 32 * 2**20
TRIM_THRESHOLD = 128 * 1024
TOP_PAD = 128 * 1024
PAGE = 4096
#: a chunk's header and alignment (SIZE_SZ, MALLOC_ALIGNMENT) and its smallest size
HEADER, ALIGN, MIN_CHUNK = 8, 16, 32
#: a free of at least this much checks the top for trimming (FASTBIN_CONSOLIDATION_THRESHOLD)
CONSOLIDATE = 64 * 1024
#: the alignment PyTorch's CPU allocator asks ``posix_memalign`` for
MEMALIGN = 64


@dataclass(frozen=True)
class HeapRules:
    """The allocator's settings: requests of ``mmap_threshold`` bytes or more that no hole holds are
    mapped (none where not ``maps``: ``MALLOC_MMAP_MAX_=0``); with ``dynamic``, freeing a mapped
    chunk of up to ``MMAP_THRESHOLD_MAX`` raises the threshold to its size (and ``trim_threshold`` to
    twice that); free space of ``trim_threshold`` or more at the heap's top goes back to the system,
    but for ``top_pad``."""

    mmap_threshold: int = MMAP_THRESHOLD
    trim_threshold: int = TRIM_THRESHOLD
    top_pad: int = TOP_PAD
    dynamic: bool = True
    maps: bool = True


def heap_rules(environ: dict[str, str] | None = None) -> HeapRules | None:
    """This process's allocator rules: glibc's, with its settings from the environment
    (``GLIBC_TUNABLES``' ``glibc.malloc.*``, before the ``MALLOC_*_`` variables); None where the C
    library is not glibc (macOS, Windows, musl: their allocators are not modelled)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    env = os.environ if environ is None else environ
    names = {"mmap_threshold": "MALLOC_MMAP_THRESHOLD_", "trim_threshold": "MALLOC_TRIM_THRESHOLD_",
             "top_pad": "MALLOC_TOP_PAD_", "mmap_max": "MALLOC_MMAP_MAX_"}
    given = {field: env.get(name, "") for field, name in names.items()}
    for item in env.get("GLIBC_TUNABLES", "").split(":"):
        name, _, text = item.partition("=")
        if name.startswith("glibc.malloc.") and name.removeprefix("glibc.malloc.") in names:
            given[name.removeprefix("glibc.malloc.")] = text
    values: dict[str, int] = {}
    for field, text in given.items():
        try:  # glibc reads decimal, hex and octal, and ignores a value it cannot read; so does the model
            values[field] = int(text.strip(), 0)
        except ValueError:
            continue
        if values[field] < 0:
            del values[field]
    if not values:
        return HeapRules()
    maps = values.pop("mmap_max", 1) > 0  # any of these set turns glibc's dynamic threshold off
    return HeapRules(**values, dynamic=False, maps=maps)


def give_back_freed() -> None:
    """Give the system the heap's free pages back — its holes too, not only its top (glibc's
    ``malloc_trim(0)`` advises them away); nothing where the C library is not glibc. What the rules
    above keep resident is then returned, at the cost of faulting those pages in again when reused."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class PacedGiveBack:
    """:func:`give_back_freed` between the steps of a long pass (a streamed forward's layers), at most
    once every ``interval`` seconds.

    Why: a heap's free pages stay resident, and in a long pass they can add a mode to its peak
    (a Qwen2-1.5B shape at 4,096 tokens, AMD EPYC: 573-607 MiB in nine processes, 632-675 MiB in
    three, the difference the main arena's free part). Given back after every layer, every process
    peaked low (557-582 MiB in seven) — but each give-back costs its pages faulted in again when
    the next layer reuses them (~20-110 MiB a layer on SmolLM2 and the Qwen2 shape): after every one
    of SmolLM2's 30 short layers at 1k tokens, 9-13 % of the pass. Paced, that cost stays a few
    per cent of the work between (a layer of 0.3-1.4 s at 4k tokens gives back after each or every
    few layers; a 1k text's 40 ms layers seldom): once a second, the Qwen2 shape's eight processes
    peaked at 556-587 MiB, and SmolLM2's 1k pass took what it took without (docs/scale.md). A
    clock, not the free heap's size: ``mallinfo2`` walks every free chunk, ~2 ms a call."""

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.interval, self.clock = interval, clock
        self.last = clock()
        #: how many times it gave back
        self.given = 0

    def __call__(self) -> bool:
        """Give back if ``interval`` has passed since the last time (or since made); True if it did."""
        if self.clock() - self.last < self.interval:
            return False
        give_back_freed()
        self.given += 1
        self.last = self.clock()
        return True


@functools.cache
def _malloc_trim():
    try:  # glibc's alone (the name is glibc's: macOS and musl have none)
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


@dataclass(frozen=True)
class HeapPeak:
    """Bytes resident while a sequence ran: ``resident`` the most at once (mapped chunks, page-rounded,
    plus the heap up to its highest byte in use or in a hole; untouched top padding not counted),
    ``heap`` the heap's highest extent, ``mapped`` the most in mapped chunks at once."""

    resident: int
    heap: int
    mapped: int

    @property
    def bound(self) -> int:
        """The heap's highest extent and the most mapped together: the peak of a pass whose heap,
        once grown, stays (see the module)."""
        return self.heap + self.mapped


def replay(events: Iterable[tuple[Hashable, int]], rules: HeapRules | None = None) -> HeapPeak:
    """Run ``events`` in order under ``rules`` (default: glibc's): ``(key, +n)`` allocates n bytes
    under ``key``; ``(key, -n)`` frees that allocation (frees of unknown keys are ignored)."""
    heap = Heap(rules or HeapRules())
    peak = highest = most_mapped = 0
    for key, n in events:
        if n > 0:
            heap.allocate(key, n)
            peak = max(peak, heap.mapped + heap.top)
            highest = max(highest, heap.top)
            most_mapped = max(most_mapped, heap.mapped)
        else:
            heap.free(key)
    return HeapPeak(peak, highest, most_mapped)


class Heap:
    """glibc's main arena as the module describes it: ``holes`` (address, size) sorted by address,
    never adjacent, every byte below ``top`` in a hole or a placed chunk (a hole ending at ``top`` is
    the top chunk's free part); ``placed`` maps a key to (address, or -1 if mapped; chunk size);
    ``mapped``: bytes in mapped chunks."""

    def __init__(self, rules: HeapRules) -> None:
        self.rules = rules
        self.threshold, self.trim = rules.mmap_threshold, rules.trim_threshold
        self.holes: list[tuple[int, int]] = []
        self.top = 0
        self.placed: dict[Hashable, tuple[int, int]] = {}
        self.mapped = 0

    def allocate(self, key: Hashable, n: int) -> None:
        """``_int_malloc``: the best-fitting hole, else the top chunk's free part, else a mapping (at
        least the threshold), else the heap grown from its top."""
        size = max(MIN_CHUNK, -(-(n + HEADER) // ALIGN) * ALIGN)
        at_top = self.holes[-1] if self.holes and sum(self.holes[-1]) == self.top else None
        best = -1
        for i in range(len(self.holes) - (at_top is not None)):  # the top chunk only when no hole fits
            room = self.holes[i][1]
            if room >= size and (best < 0 or room < self.holes[best][1]):
                best = i
                if room == size:
                    break
        if best >= 0 or (at_top and at_top[1] >= size):
            i = best if best >= 0 else len(self.holes) - 1
            address, room = self.holes.pop(i)
            if room - size >= MIN_CHUNK:
                self.holes.insert(i, (address + size, room - size))
            else:  # too little left to be a chunk: it goes with this one
                size = room
            self.placed[key] = (address, size)
            return
        # PyTorch asks posix_memalign for 64-byte alignment: glibc requests that much and a chunk more
        request = size + MEMALIGN + MIN_CHUNK
        if self.rules.maps and request >= self.threshold:
            mapping = -(-(request + HEADER) // PAGE) * PAGE
            self.placed[key] = (-1, mapping)
            self.mapped += mapping
            return
        address = self.holes.pop()[0] if at_top else self.top
        self.placed[key] = (address, size)
        self.top = address + size

    def free(self, key: Hashable) -> None:
        """``_int_free``: a mapping goes back (and may raise the threshold); a heap chunk merges with
        the holes beside it, and free space at the top beyond the trim threshold goes back."""
        found = self.placed.pop(key, None)
        if found is None:
            return
        address, size = found
        if address < 0:
            self.mapped -= size
            # glibc compares the size with its IS_MMAPPED bit set (chunksize_nomask)
            if self.rules.dynamic and self.threshold < (size | 2) <= MMAP_THRESHOLD_MAX:
                self.threshold, self.trim = size, 2 * size
            return
        holes = self.holes
        i = bisect.bisect(holes, (address, size))
        if i < len(holes) and holes[i][0] == address + size:
            size += holes.pop(i)[1]
        if i > 0 and sum(holes[i - 1]) == address:
            i -= 1
            address, before = holes.pop(i)
            size += before
        if address + size == self.top and size >= CONSOLIDATE and size >= self.trim:
            # systrim: whole pages go back, but for the padding and a chunk's worth
            extra = (size - MIN_CHUNK - 1 - self.rules.top_pad) // PAGE * PAGE
            if extra > 0:
                size -= extra
                self.top -= extra
        holes.insert(i, (address, size))
