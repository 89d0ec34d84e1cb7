"""The C heap's free pages go back to the system at most once a minute (glibc)."""

from __future__ import annotations

import sys

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
