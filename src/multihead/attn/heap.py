"""What the C heap makes resident for a sequence of allocations: glibc's malloc, replayed.

Tensors on a CPU come from ``malloc``. On Linux (glibc) a request of at least the *mmap threshold*
gets its own mapping and goes back to the system when freed; a smaller one is cut from the heap,
best fit among the free holes, else from the top. Free space goes back to the system only at the
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
heap's highest extent plus the most mapped at once — is what a plan takes.

The rules are glibc's (malloc/malloc.c: ``sysmalloc``, ``_int_free``, ``systrim``), simplified:
best fit over every hole (glibc's bins give the same choice for the large requests that matter),
no per-thread arenas, small requests treated as large ones. Its environment variables
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``) are read as glibc reads
them: setting any turns the dynamic threshold off.
"""

from __future__ import annotations

import bisect
import os
import platform
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

__all__ = ["HeapPeak", "HeapRules", "heap_rules", "replay"]

#: glibc's defaults on 64-bit systems
MMAP_THRESHOLD = 128 * 1024
MMAP_THRESHOLD_MAX = 32 * 2**20
TRIM_THRESHOLD = 128 * 1024
TOP_PAD = 128 * 1024
PAGE = 4096
#: a chunk's header and alignment (SIZE_SZ, MALLOC_ALIGNMENT) and its smallest size
HEADER, ALIGN, MIN_CHUNK = 8, 16, 32


@dataclass(frozen=True)
class HeapRules:
    """The allocator's settings: requests of ``mmap_threshold`` bytes or more are mapped; with
    ``dynamic``, freeing a mapped chunk of up to ``MMAP_THRESHOLD_MAX`` raises the threshold to its
    size (and ``trim_threshold`` to twice that); free space above ``trim_threshold`` at the heap's top
    goes back to the system, down to ``top_pad``."""

    mmap_threshold: int = MMAP_THRESHOLD
    trim_threshold: int = TRIM_THRESHOLD
    top_pad: int = TOP_PAD
    dynamic: bool = True


def heap_rules(environ: dict[str, str] | None = None) -> HeapRules | None:
    """This process's allocator rules: glibc's, with its environment variables; None where the C
    library is not glibc (macOS, Windows, musl: their allocators are not modelled)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    env = os.environ if environ is None else environ
    names = {"mmap_threshold": "MALLOC_MMAP_THRESHOLD_", "trim_threshold": "MALLOC_TRIM_THRESHOLD_",
             "top_pad": "MALLOC_TOP_PAD_"}
    values: dict[str, int] = {}
    for field, name in names.items():
        text = env.get(name, "").strip()
        if text.isdigit():  # glibc ignores a value it cannot read; so does the model
            values[field] = int(text)
    if not values:
        return HeapRules()
    return HeapRules(**values, dynamic=False)


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
    rules = rules or HeapRules()
    threshold, trim = rules.mmap_threshold, rules.trim_threshold
    holes: list[tuple[int, int]] = []  # (address, size), sorted by address, never adjacent
    top = 0  # the heap's end: every byte below it is in use or in a hole
    placed: dict[Hashable, tuple[int, int]] = {}  # key -> (address or -1 if mapped, chunk size)
    mapped = peak = highest = most_mapped = 0
    for key, n in events:
        if n > 0:
            size = max(MIN_CHUNK, -(-(n + HEADER) // ALIGN) * ALIGN)
            if size >= threshold:
                size = -(-(size + HEADER) // PAGE) * PAGE
                placed[key] = (-1, size)
                mapped += size
                most_mapped = max(most_mapped, mapped)
            else:
                address, top = _take(holes, size, top)
                placed[key] = (address, size)
                highest = max(highest, top)
            peak = max(peak, mapped + top)
            continue
        found = placed.pop(key, None)
        if found is None:
            continue
        address, size = found
        if address < 0:
            mapped -= size
            if rules.dynamic and threshold < size <= MMAP_THRESHOLD_MAX:
                threshold, trim = size, 2 * size
            continue
        top = _give_back(holes, address, size, top, trim, rules.top_pad)
    return HeapPeak(peak, highest, most_mapped)


def _take(holes: list[tuple[int, int]], size: int, top: int) -> tuple[int, int]:
    """Cut ``size`` bytes from the best-fitting hole, else from the top: (address, new top)."""
    best = -1
    for i, (_, room) in enumerate(holes):
        if room >= size and (best < 0 or room < holes[best][1]):
            best = i
            if room == size:
                break
    if best >= 0:
        address, room = holes.pop(best)
        if room - size >= MIN_CHUNK:
            holes.insert(best, (address + size, room - size))
        return address, top
    if holes and holes[-1][0] + holes[-1][1] == top:  # the last hole is the top chunk's start: extend it
        address, _ = holes.pop()
        return address, address + size
    return top, top + size


def _give_back(holes: list[tuple[int, int]], address: int, size: int, top: int, trim: int, pad: int) -> int:
    """Free a heap chunk: merge it with the holes beside it; trim the top above ``trim``. The new top."""
    i = bisect.bisect(holes, (address, size))
    if i < len(holes) and holes[i][0] == address + size:
        size += holes.pop(i)[1]
    if i > 0 and holes[i - 1][0] + holes[i - 1][1] == address:
        i -= 1
        address, before = holes.pop(i)
        size += before
    if address + size == top and size > trim:  # systrim: the free top goes back, but for the padding
        kept = min(size, -(-pad // PAGE) * PAGE)
        if kept:
            holes.insert(i, (address, kept))
        return address + kept
    holes.insert(i, (address, size))
    return top
