"""The C heap's model (issue 27): glibc's rules on hand-made sequences, and against the real glibc."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multihead.attn import heap
from multihead.attn.heap import HeapPeak, HeapRules, heap_rules, replay

MiB = 2**20
#: a heap that maps nothing and never trims: every request is cut from holes or the top
KEEP_ALL = HeapRules(mmap_threshold=1 << 40, trim_threshold=1 << 40, dynamic=False)


def _resident(events, rules=None) -> int:
    return replay(events, rules).resident


def _chunk(n: int) -> int:
    return -(-(n + heap.HEADER) // heap.ALIGN) * heap.ALIGN


def _mapped(n: int) -> int:
    return -(-(_chunk(n) + heap.HEADER) // heap.PAGE) * heap.PAGE


def test_requests_above_the_threshold_are_mapped_and_given_back():
    rules = HeapRules()
    assert _resident([("a", MiB), ("a", -MiB), ("b", MiB)], rules) == _mapped(MiB)
    assert _resident([("a", MiB), ("b", MiB)], rules) == 2 * _mapped(MiB)
    assert _resident([("small", 1000)], rules) == _chunk(1000)  # below the threshold: from the heap


def test_a_freed_mapping_raises_the_threshold_and_the_next_request_of_its_size_comes_from_the_heap():
    # 20 MiB mapped and freed: the threshold becomes 20 MiB, so 10 MiB then 20 MiB come from the heap,
    # and once the 10 MiB is freed below a small chunk its hole cannot hold the 20 MiB: the heap
    # holds 30 MiB for 20 alive.
    events = [("a", 20 * MiB), ("a", -20 * MiB), ("b", 10 * MiB), ("s", 64), ("b", -10 * MiB), ("c", 20 * MiB)]
    assert _resident(events, HeapRules()) == _chunk(10 * MiB) + _chunk(64) + _chunk(20 * MiB)
    fixed = HeapRules(dynamic=False)  # MALLOC_MMAP_THRESHOLD_ set: every request stays mapped
    assert _resident(events, fixed) == _mapped(20 * MiB) + _chunk(64)
    # freed at the top, the 10 MiB merges with it and the 20 MiB starts where it did: never more
    # than one 20 MiB resident (the first, mapped, was the most)
    at_top = [("a", 20 * MiB), ("a", -20 * MiB), ("b", 10 * MiB), ("b", -10 * MiB), ("c", 20 * MiB)]
    assert _resident(at_top, HeapRules()) == _mapped(20 * MiB)


def test_a_hole_too_small_grows_the_heap_and_adjacent_holes_merge():
    grows = [("a", 20 * MiB), ("b", MiB), ("a", -20 * MiB), ("c", 24 * MiB)]
    assert _resident(grows, KEEP_ALL) == _chunk(20 * MiB) + _chunk(MiB) + _chunk(24 * MiB)
    merged = [("a", 20 * MiB), ("b", 4 * MiB), ("d", MiB), ("a", -20 * MiB), ("b", -4 * MiB), ("c", 24 * MiB)]
    assert _resident(merged, KEEP_ALL) == _chunk(20 * MiB) + _chunk(4 * MiB) + _chunk(MiB)


def test_the_best_fitting_hole_is_taken():
    # holes of 16 and 8 MiB (in that order): 8 MiB goes into the 8 MiB hole, so 16 MiB still fits
    events = [("x", 16 * MiB), ("s1", MiB), ("y", 8 * MiB), ("s2", MiB), ("x", -16 * MiB), ("y", -8 * MiB),
              ("p", 8 * MiB), ("q", 16 * MiB)]
    before = _chunk(16 * MiB) + _chunk(8 * MiB) + 2 * _chunk(MiB)
    assert _resident(events, KEEP_ALL) == before


def test_free_space_at_the_top_beyond_the_trim_threshold_goes_back():
    events = [("a", 6 * MiB), ("a", -6 * MiB), ("b", 10 * MiB)]  # 6 MiB from the heap, then 10 MiB mapped
    trimmed = HeapRules(mmap_threshold=8 * MiB, trim_threshold=4 * MiB, top_pad=0, dynamic=False)
    assert _resident(events, trimmed) == _mapped(10 * MiB)
    padded = HeapRules(mmap_threshold=8 * MiB, trim_threshold=4 * MiB, top_pad=MiB, dynamic=False)
    assert _resident(events, padded) == MiB + _mapped(10 * MiB)
    kept = HeapRules(mmap_threshold=8 * MiB, trim_threshold=32 * MiB, top_pad=0, dynamic=False)
    assert _resident(events, kept) == _chunk(6 * MiB) + _mapped(10 * MiB)


def test_the_heaps_extent_and_the_mapped_chunks_are_reported_apart():
    # the heap grows to 6 MiB and gives it back before 10 MiB is mapped: never both at once, but a
    # pass whose heap stayed grown would hold both (the bound a plan takes)
    events = [("a", 6 * MiB), ("a", -6 * MiB), ("b", 10 * MiB)]
    found = replay(events, HeapRules(mmap_threshold=8 * MiB, trim_threshold=4 * MiB, top_pad=0, dynamic=False))
    assert found == HeapPeak(_mapped(10 * MiB), _chunk(6 * MiB), _mapped(10 * MiB))
    assert found.bound == _chunk(6 * MiB) + _mapped(10 * MiB)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 40 * MiB)), max_size=40),
       st.sampled_from([HeapRules(), KEEP_ALL, HeapRules(dynamic=False),
                        HeapRules(mmap_threshold=MiB, trim_threshold=0, top_pad=0, dynamic=False)]))
def test_what_is_resident_holds_every_live_block_and_stays_within_the_bound(steps, rules):
    """Any sequence (a step on a key alive frees it, else allocates): the live bytes never exceed
    what is resident, and the resident never exceeds the heap's extent plus the most mapped."""
    alive: dict[int, int] = {}
    events, live, most = [], 0, 0
    for key, n in steps:
        if key in alive:
            events.append((key, -alive[key]))
            live -= alive.pop(key)
        else:
            alive[key] = n
            events.append((key, n))
            live += n
            most = max(most, live)
    found = replay(events, rules)
    assert most <= found.resident <= found.bound
    assert max(found.heap, found.mapped) <= found.resident


def test_frees_of_unknown_keys_are_ignored():
    assert _resident([("a", -MiB), ("b", 1000), ("b", -1000), ("b", -1000)]) == _chunk(1000)


def test_the_rules_follow_glibcs_environment_variables(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("glibc", "2.36"))
    assert heap_rules({}) == HeapRules()
    fixed = heap_rules({"MALLOC_MMAP_THRESHOLD_": "1048576"})
    assert fixed == HeapRules(mmap_threshold=MiB, trim_threshold=heap.TRIM_THRESHOLD, dynamic=False)
    assert heap_rules({"MALLOC_TRIM_THRESHOLD_": "0"}) == HeapRules(trim_threshold=0, dynamic=False)
    assert heap_rules({"MALLOC_TOP_PAD_": "lots"}) == HeapRules()  # glibc ignores what it cannot read
    assert heap_rules({"MALLOC_TOP_PAD_": "-1", "MALLOC_MMAP_THRESHOLD_": "65536"}) == HeapRules(
        mmap_threshold=65536, dynamic=False)
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("", ""))
    assert heap_rules({}) is None  # musl, macOS, Windows: not modelled


#: Allocates torch tensors in a pattern that leaves holes, touching every page, and prints the rise of
#: its peak RSS with the allocations and frees it made (as LiveBytes records them).
FRAGMENTING = r"""
import json, torch
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
events, alive = [], dict()
def new(name, mib):
    alive[name] = torch.ones(mib * 2**20, dtype=torch.uint8)
    events.append((name, mib * 2**20))
def free(name):
    del alive[name]
    events.append((name, -{sizes}[name] * 2**20))
torch.ones(30 * 2**20, dtype=torch.uint8).sum()  # a freed 30 MiB mapping: glibc's threshold is now 30 MiB
import ctypes; ctypes.CDLL("libc.so.6").malloc_trim(0)
open("/proc/self/clear_refs", "w").write("5")
base = status("VmRSS")
{steps}
print(json.dumps({{"rise": status("VmHWM") - base, "events": events}}))
"""


@pytest.mark.skipif(heap_rules() is None, reason="the model is of glibc's malloc; this C library is another")
def test_the_model_predicts_the_real_glibcs__resident():
    # 20 MiB freed below 1 MiB leaves a hole that 24 MiB cannot use; 12 MiB later fits into it
    sizes = {"a": 20, "b": 1, "c": 24, "d": 12}
    steps = ["new('a', 20)", "new('b', 1)", "free('a')", "new('c', 24)", "free('c')", "new('d', 12)"]
    script = FRAGMENTING.format(sizes=sizes, steps="\n".join(steps))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    events = [tuple(e) for e in found["events"]]
    tensors = max(sum(n for _, n in events[: i + 1]) for i in range(len(events)))
    # glibc's threshold after the warm-up is 30 MiB (dynamic); the model starts there
    predicted = _resident(events, HeapRules(mmap_threshold=_mapped(30 * MiB), trim_threshold=2 * _mapped(30 * MiB)))
    assert abs(predicted / found["rise"] - 1) < 0.1, (predicted / MiB, found["rise"] / MiB)
    assert found["rise"] > 1.3 * tensors  # the holes are real: tensors alone fall well short
