"""The C heap's free pages go back to the system at most once a minute (glibc)."""

from __future__ import annotations

import sys

import psutil
import pytest

from loadgen.run.heap import HeapTrimmer


def test_trims_at_most_once_a_period_and_really_calls_malloc_trim():
    now = [0.0]
    trimmer = HeapTrimmer(every_s=60.0, clock=lambda: now[0])
    if not trimmer.available:
        assert sys.platform != "linux" or not trimmer.maybe_trim()
        pytest.skip("not glibc: nothing to trim")
    assert not trimmer.maybe_trim()  # not before the first period is over
    now[0] = 60.0
    assert trimmer.maybe_trim() and trimmer.trims == 1  # the real malloc_trim(0) ran
    now[0] = 119.0
    assert not trimmer.maybe_trim()
    now[0] = 120.5
    assert trimmer.maybe_trim() and trimmer.trims == 2


def test_a_trim_gives_the_holes_in_the_heap_back():
    """Judged by the kernel's RSS: freed blocks between kept ones leave the process."""
    trimmer = HeapTrimmer(every_s=0.0)
    if not trimmer.available:
        pytest.skip("not glibc: nothing to trim")
    me = psutil.Process()
    blocks = [bytearray(16384) for _ in range(2048)]  # 32 MiB of heap blocks, written
    kept = blocks[::4]  # one in four stays: 48 KiB holes between them, none at the top
    del blocks
    before = me.memory_info().rss
    assert trimmer.maybe_trim()
    after = me.memory_info().rss
    assert before - after > 12e6, (before, after)  # most of the 24 MiB of holes
    assert len(kept) == 512
