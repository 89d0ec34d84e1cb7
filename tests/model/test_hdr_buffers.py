"""Our encode and decode, on kept buffers, against the hdrhistogram package's own codec."""

import numpy as np
from hdrh.histogram import HdrHistogram

from loadgen.model import hdr
from loadgen.model.snapshot import Counters, LoadState, Snapshot, Target
from loadgen.model.windows import SnapshotWindows


def _library(values) -> HdrHistogram:
    lib = HdrHistogram(hdr.LOWEST_US, hdr.HIGHEST_US, hdr.SIGNIFICANT_FIGURES)
    for v in values:
        lib.record_value(int(v))
    return lib


def _lib_counts(lib: HdrHistogram) -> np.ndarray:
    return np.ctypeslib.as_array(lib.counts).view(np.int64).copy()


def test_encode_is_byte_for_byte_the_package_encoder():
    rng = np.random.default_rng(11)
    cases = [[], [0], [1], [hdr.HIGHEST_US], [5, 5, 5, 2048]]
    for _ in range(40):
        n = int(rng.integers(1, 2000))
        mu, sigma = rng.uniform(0, 18), rng.uniform(0.1, 3)
        cases.append(np.clip(rng.lognormal(mu, sigma, n), 0, hdr.HIGHEST_US).astype(np.int64))
    for values in cases:
        lib = _library(values)
        ours = hdr.dense_from_sparse([hdr.sparse_counts(np.asarray(values, float))])
        assert hdr.encode(ours) == lib.encode().decode("ascii")


def test_decoding_into_a_kept_buffer_leaves_nothing_of_the_last_one():
    big = _library(np.random.default_rng(4).lognormal(10, 2, 3000).clip(0, hdr.HIGHEST_US))
    small = _library([123, 123, 90_000])
    buf = np.zeros(hdr.COUNTS_LEN, np.int64)
    assert hdr.decode(big.encode(), out=buf) is buf
    assert np.array_equal(buf, _lib_counts(big))
    hdr.decode(small.encode().decode("ascii"), out=buf)
    assert np.array_equal(buf, _lib_counts(small))
    assert np.array_equal(hdr.decode(small.encode()), _lib_counts(small))


def test_another_layout_is_rebucketed_into_the_buffer():
    values = [7, 1500, 250_000, 59_000_000]
    other = HdrHistogram(1, 60_000_000, 3)
    for v in values:
        other.record_value(v)
    buf = np.full(hdr.COUNTS_LEN, 9, np.int64)  # stale content must go
    hdr.decode(other.encode(), out=buf)
    assert np.array_equal(buf, _lib_counts(_library(values)))


def test_dense_from_sparse_overwrites_its_buffer():
    buf = hdr.dense_from_sparse([hdr.sparse_counts(np.array([10.0, 20.0, 30.0]))])
    again = hdr.dense_from_sparse([hdr.sparse_counts(np.array([40.0]))], out=buf)
    assert again is buf
    assert np.array_equal(buf, _lib_counts(_library([40])))


def _snap(seq: int, t: float, ttft_us: list[float], itl_us: list[float]) -> Snapshot:
    hist = {m: hdr.encode(hdr.dense_from_sparse([hdr.sparse_counts(np.array(v, float))]))
            for m, v in (("ttft", ttft_us), ("itl", itl_us))}
    return Snapshot(run_id="r", seq=seq, t=t, elapsed=t - 1000.0, interval=1.0,
                    target=Target(url="http://127.0.0.1:1/v1", model="m"), load=LoadState(),
                    counters=Counters(), hist=hist)


def test_windows_keep_each_metric_apart_through_the_shared_decode_buffer():
    """Every histogram of a tick decodes into the same buffer: each window must still hold
    exactly each metric's own values (judged against the library over the raw values)."""
    rng = np.random.default_rng(8)
    w = SnapshotWindows()
    ttft: list[list[float]] = []
    itl: list[list[float]] = []
    for i in range(90):  # 90 one-second ticks: the 10 s and 1 min windows both roll
        ttft.append(list(rng.lognormal(11, 0.5, 3)))
        itl.append(list(rng.lognormal(8, 0.3, int(rng.integers(0, 40)))))
        w.add(_snap(i, 1001.0 + i, ttft[-1], itl[-1]))
    for name, ticks in (("10s", 10), ("1m", 60), ("run", 90)):
        stats = w.stats(name)
        for metric, per_tick in (("ttft", ttft), ("itl", itl)):
            raw = [v for tick in per_tick[-ticks:] for v in tick]
            lib = _library(np.rint(raw))
            got = stats.latency[metric]
            assert got["count"] == len(raw), (name, metric)
            assert got["p99"] == lib.get_value_at_percentile(99), (name, metric)
            assert got["max"] == lib.get_max_value(), (name, metric)
