"""Our numpy HDR maths against the hdrhistogram package itself."""

import numpy as np
from hdrh.histogram import HdrHistogram

from loadgen.model import hdr
from loadgen.model.snapshot import Counters, LoadState, Snapshot, Target
from loadgen.model.windows import SnapshotWindows


def _values(n=5000, seed=3):
    rng = np.random.default_rng(seed)
    v = rng.lognormal(9, 2.2, n).astype(np.int64)
    return np.clip(np.concatenate([v, [0, 1, 2047, 2048, 4095, hdr.HIGHEST_US]]), 0, hdr.HIGHEST_US)


def test_counts_match_record_value():
    vals = _values()
    lib = HdrHistogram(hdr.LOWEST_US, hdr.HIGHEST_US, hdr.SIGNIFICANT_FIGURES)
    for v in vals:
        lib.record_value(int(v))
    dense = hdr.dense_from_sparse([hdr.sparse_counts(vals.astype(float))])
    assert np.array_equal(dense, np.ctypeslib.as_array(lib.counts))
    s = hdr.summarize(dense)
    for p in hdr.PERCENTILES:
        assert s[f"p{p:g}"] == lib.get_value_at_percentile(p)
    assert s["max"] == lib.get_max_value()
    assert s["count"] == lib.get_total_count()


def test_weighted_counts_are_repeats():
    weighted = hdr.sparse_counts(np.array([10.0, 5000.0]), np.array([3.0, 2.0]))
    dense = hdr.dense_from_sparse([weighted])
    same = hdr.dense_from_sparse([hdr.sparse_counts(np.array([10.0] * 3 + [5000.0] * 2))])
    assert np.array_equal(dense, same)


def test_encode_is_the_standard_format():
    vals = _values(2000, seed=5)
    dense = hdr.dense_from_sparse([hdr.sparse_counts(vals.astype(float))])
    blob = hdr.encode(dense)
    lib = HdrHistogram.decode(blob)
    assert lib.get_total_count() == len(vals)
    assert lib.get_value_at_percentile(99) == hdr.summarize(dense)["p99"]
    assert np.array_equal(hdr.decode(blob), dense)


def test_empty_summary_is_none_not_zero():
    s = hdr.summarize(np.zeros(hdr.COUNTS_LEN, np.int64))
    assert s["count"] == 0 and s["p99"] is None and s["max"] is None


def _snap(seq, t, values_us, ok):
    dense = hdr.dense_from_sparse([hdr.sparse_counts(np.array(values_us, float))])
    return Snapshot(
        run_id="r", seq=seq, t=t, elapsed=t - 1000.0, interval=1.0,
        target=Target(url="http://127.0.0.1:1/v1", model="m"),
        load=LoadState(), counters=Counters(requests_ok=ok, output_tokens=ok * 10),
        hist={"ttft": hdr.encode(dense)},
    )


def test_windows_forget_old_intervals_and_keep_the_run():
    w = SnapshotWindows()
    # 30 one-second ticks: the first 20 at 1 ms, the last 10 at 100 ms
    for i in range(30):
        w.add(_snap(i, 1001.0 + i, [1000.0 if i < 20 else 100_000.0], ok=i + 1))
    ten = w.stats("10s")
    assert ten.latency["ttft"]["count"] == 10
    assert ten.latency["ttft"]["p50"] > 99_000
    run = w.stats("run")
    assert run.latency["ttft"]["count"] == 30
    assert run.latency["ttft"]["p50"] < 1100
    assert abs(ten.req_s - 1.0) < 1e-9
    assert abs(run.output_tok_s - 300 / 30) < 1e-9


def test_encoder_reuse_leaves_nothing_behind():
    """The encoder's histogram is reused: an empty one after a full one must read empty."""
    full = hdr.dense_from_sparse([hdr.sparse_counts(_values(500).astype(float))])
    empty = np.zeros(hdr.COUNTS_LEN, np.int64)
    hdr.encode(full)
    lib = HdrHistogram.decode(hdr.encode(empty))
    assert lib.get_total_count() == 0 and lib.get_max_value() == 0
    small = hdr.dense_from_sparse([hdr.sparse_counts(np.array([123.0]))])
    lib = HdrHistogram.decode(hdr.encode(small))
    assert lib.get_total_count() == 1 and lib.get_max_value() == 123


def test_percentile_curve_matches_the_library():
    vals = _values(3000, seed=9)
    lib = HdrHistogram(hdr.LOWEST_US, hdr.HIGHEST_US, hdr.SIGNIFICANT_FIGURES)
    for v in vals:
        lib.record_value(int(v))
    dense = hdr.dense_from_sparse([hdr.sparse_counts(vals.astype(float))])
    ps = [50.0, 90.0, 99.0, 99.9, 99.99]
    assert hdr.percentile_curve(dense, ps) == [lib.get_value_at_percentile(p) for p in ps]
