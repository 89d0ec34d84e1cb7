"""Values above the histogram's range (1 h) are recorded at its top, and counted as clipped
so that no reader takes the top bucket for the worst value."""

import numpy as np

from loadgen.model import hdr
from loadgen.worker.interval import IntervalRecorder

TOP = hdr.HIGHEST_US


def test_values_above_the_range_are_counted():
    values = np.array([1_000.0, TOP, TOP + 0.4, TOP + 1, 2.5 * TOP, 1e15])
    above = int(np.count_nonzero(np.rint(values) > TOP))  # 3: TOP + 0.4 rounds to TOP
    idx, cnt, clipped = hdr.sparse_counts_clipped(values)
    assert clipped == above == 3
    assert cnt.sum() == len(values)  # still recorded, at the top
    assert np.array_equal((idx, cnt), hdr.sparse_counts(values))
    _, _, clipped = hdr.sparse_counts_clipped(values, np.array([1, 1, 1, 2.0, 0.5, 1]))
    assert clipped == round(2.0 + 0.5 + 1)  # weighted: ITL gaps count by their tokens
    assert hdr.sparse_counts_clipped(np.array([5.0, TOP]))[2] == 0
    assert hdr.sparse_counts_clipped(np.empty(0))[2] == 0


def test_the_recorder_adds_clipped_samples_to_its_counters():
    rec = IntervalRecorder()
    rec.ttft.extend([2_000.0, 2 * TOP])
    rec.e2e.extend([3 * TOP, 4 * TOP, 1_000.0])
    rec.itl_v.extend([10.0, 5 * TOP])
    rec.itl_w.extend([1.0, 3.0])
    counters, hists, _ = rec.take()
    assert counters.clipped_samples == 1 + 2 + 3
    assert set(hists) == {"ttft", "e2e", "itl"}
    rec.ttft.append(5_000.0)
    assert rec.take()[0].clipped_samples == 0  # a fresh count each tick
