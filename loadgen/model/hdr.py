"""HdrHistogram interval histograms, done with numpy where it counts.

All latencies are recorded in microseconds, 3 significant figures, 1 µs .. 1 h,
in the standard HdrHistogram counts layout so that `encode()` gives the
standard V2 compressed base64 blob (what `latency.hlog` and MQTT carry).

Why not call `HdrHistogram.record_value` per token? It is pure Python (~2 µs a
call) and would sit on the client's hot path. Workers append raw values to a
flat array and turn the whole tick into counts here with one `bincount`.
The `hdrhistogram` package still does the encoding and decoding (its codec is
in C), so the wire format is the library's, not ours. We call that codec with
buffers of our own, kept from call to call: the package's own encode and decode
allocate a 184-212 KB array every call, which at every metric of every tick
fragments the long-running consumer's heap (RSS that creeps up for hours).
"""

from __future__ import annotations

import base64
import binascii
import threading
import zlib
from collections.abc import Iterable
from ctypes import addressof, c_byte, memmove

import numpy as np
from hdrh import codec
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # one hour
SIGNIFICANT_FIGURES = 3
PERCENTILES = (50.0, 90.0, 99.0, 99.9)

_TEMPLATE = HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)
COUNTS_LEN: int = _TEMPLATE.counts_len
_HALF_MAG: int = _TEMPLATE.sub_bucket_half_count_magnitude
_HALF_COUNT: int = _TEMPLATE.sub_bucket_half_count
_SUB_MASK: int = _TEMPLATE.sub_bucket_mask
_UNIT_MAG: int = _TEMPLATE.unit_magnitude
assert _UNIT_MAG == 0, "the index maths below assumes a lowest trackable value of 1"


def _index_values() -> tuple[np.ndarray, np.ndarray]:
    """Lowest and highest equivalent value of every counts index."""
    index = np.arange(COUNTS_LEN, dtype=np.int64)
    bucket = (index >> _HALF_MAG) - 1
    sub = (index & (_HALF_COUNT - 1)) + _HALF_COUNT
    first = bucket < 0
    sub[first] -= _HALF_COUNT
    bucket[first] = 0
    lowest = sub << bucket
    # the equivalent range of the top half of bucket b is 2**b wide
    highest = lowest + (np.int64(1) << bucket) - 1
    return lowest, highest


LOWEST_AT, HIGHEST_AT = _index_values()
MID_AT = (LOWEST_AT + HIGHEST_AT) / 2  # for the mean


def counts_index(values_us: np.ndarray) -> np.ndarray:
    """Counts-array index of each (integer, µs) value, as HdrHistogram computes it."""
    v = np.clip(values_us.astype(np.int64, copy=False), 0, HIGHEST_US)
    # bit length of (v | mask); exact for values < 2**53
    pow2ceiling = np.frexp((v | _SUB_MASK).astype(np.float64))[1].astype(np.int64)
    bucket = pow2ceiling - (_HALF_MAG + 1)
    sub = v >> bucket
    return ((bucket + 1) << _HALF_MAG) + sub - _HALF_COUNT


def sparse_counts(
    values_us: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(indices, counts) of the non-empty buckets for a batch of values."""
    idx, cnt, _ = sparse_counts_clipped(values_us, weights)
    return idx, cnt


def sparse_counts_clipped(
    values_us: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """`sparse_counts`, and how many of the values (weighted) were above HIGHEST_US: those
    are recorded at the top of the range, and a reader should be told they were clipped."""
    if len(values_us) == 0:
        return np.empty(0, np.int32), np.empty(0, np.int64), 0
    rounded = np.rint(values_us)
    above = rounded > HIGHEST_US  # one vectorised comparison; nearly always all False
    clipped = 0
    if above.any():
        clipped = int(np.count_nonzero(above)) if weights is None else round(
            float(weights[above].sum()))
    idx = counts_index(rounded)
    if weights is None:
        uniq, cnt = np.unique(idx, return_counts=True)
        return uniq.astype(np.int32), cnt.astype(np.int64), clipped
    dense = np.bincount(idx, weights=weights, minlength=COUNTS_LEN)
    nz = np.flatnonzero(dense)
    return nz.astype(np.int32), np.rint(dense[nz]).astype(np.int64), clipped


def dense_from_sparse(
    pairs: Iterable[tuple[np.ndarray, np.ndarray]], out: np.ndarray | None = None
) -> np.ndarray:
    """Sum several sparse count sets into one dense counts array: `out` (overwritten) when
    given, which a caller doing this every tick keeps, rather than a fresh 184 KB array."""
    dense = _zeroed(out)
    for idx, cnt in pairs:
        if len(idx):
            np.add.at(dense, idx, cnt)
    return dense


def _zeroed(out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return np.zeros(COUNTS_LEN, np.int64)
    if out.shape != (COUNTS_LEN,) or out.dtype != np.int64 or not out.flags.c_contiguous:
        raise ValueError(f"a counts buffer is {COUNTS_LEN} contiguous int64, not {out.shape} "
                         f"{out.dtype}")
    out.fill(0)
    return out


_WORD = 8  # bytes a count: int64, what the codec calls word size 8
_VARINT_ROOM = COUNTS_LEN * codec.V2_MAX_WORD_SIZE_IN_BYTES  # the worst case: every count
_HEAD = codec.payload_header_size


class _Encoder:
    """One a thread, reused at every call: the varint buffer (212 KB, allocated once) and the
    two headers, set up as the package's HdrHistogramEncoder sets them."""

    def __init__(self) -> None:
        self.buf = (c_byte * (_HEAD + _VARINT_ROOM))()
        self.view = memoryview(self.buf).cast("B")
        p = self.payload = codec.PayloadHeader()
        p.cookie = codec.get_encoding_cookie()
        p.normalizing_index_offset = 0
        p.conversion_ratio_bits = 1
        p.significant_figures = SIGNIFICANT_FIGURES
        p.lowest_trackable_value = LOWEST_US
        p.highest_trackable_value = HIGHEST_US
        self.external = codec.ExternalHeader()
        self.external.cookie = codec.get_compression_cookie()


_encoders = threading.local()


def encode(dense: np.ndarray) -> str:
    """Standard HdrHistogram V2 compressed, base64 encoded histogram of a dense counts array
    (byte for byte what the package's HdrHistogram.encode gives for the same counts)."""
    e: _Encoder | None = getattr(_encoders, "e", None)
    if e is None:
        e = _encoders.e = _Encoder()
    counts = np.ascontiguousarray(dense, np.int64)  # no copy for the usual int64 array
    nz = np.flatnonzero(counts)
    # as the package does: the counts up to the highest non-empty one, none when empty
    limit = int(nz[-1]) + 1 if len(nz) else 0
    n = codec.encode(counts.ctypes.data, limit, _WORD, addressof(e.buf) + _HEAD, _VARINT_ROOM)
    e.payload.payload_len = n
    memmove(e.buf, addressof(e.payload), _HEAD)
    compressed = zlib.compress(e.view[:_HEAD + n])
    e.external.length = len(compressed)
    return base64.b64encode(bytes(e.external) + compressed).decode("ascii")


def _release(h: HdrHistogram) -> None:
    """hdrh's histogram and its encoder point at each other: break the cycle so the 184 KB
    counts array goes at once, not whenever the cycle collector runs (a slow leak at 2 Hz)."""
    h.encoder = None


def decode(blob: str | bytes, out: np.ndarray | None = None) -> np.ndarray:
    """Dense counts array of an encoded histogram (ours or any standard one): into `out`
    (overwritten) when given, which a caller decoding every tick keeps."""
    raw = blob.encode("ascii") if isinstance(blob, str) else blob
    payload = _our_payload(raw)
    if payload is None:
        dense = _decode_other(raw)
        if out is None:
            return dense
        _zeroed(out)[:] = dense
        return out
    dense = _zeroed(out)
    codec.decode(payload, _HEAD, dense.ctypes.data, COUNTS_LEN, _WORD)
    return dense


def _our_payload(raw: bytes) -> bytes | None:
    """The decompressed payload of a well-formed blob in our layout; None for anything else,
    which the package's decoder then takes (another layout re-bucketed, or its error)."""
    try:
        packed = base64.b64decode(raw)
    except (binascii.Error, ValueError):
        return None
    head = codec.ext_header_size
    if len(packed) < head:
        return None
    external = codec.ExternalHeader.from_buffer_copy(packed)
    if codec.get_cookie_base(external.cookie) != codec.V2_COMPRESSION_COOKIE_BASE \
            or external.length != len(packed) - head:
        return None
    try:
        payload = zlib.decompress(memoryview(packed)[head:])
    except zlib.error:
        return None
    if len(payload) < _HEAD:
        return None
    p = codec.PayloadHeader.from_buffer_copy(payload)
    layout = (p.lowest_trackable_value, p.highest_trackable_value, p.significant_figures)
    if codec.get_cookie_base(p.cookie) != codec.V2_ENCODING_COOKIE_BASE \
            or layout != (LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES):
        return None
    return payload


def _decode_other(raw: bytes) -> np.ndarray:
    """The package's own decoder, for a blob that is not plainly ours."""
    h = HdrHistogram.decode(raw)
    try:
        if h.counts_len != COUNTS_LEN:
            # a histogram with another layout: re-bucket through its values
            dense = np.zeros(COUNTS_LEN, np.int64)
            for item in h.get_recorded_iterator():
                i = counts_index(np.array([item.value_iterated_to]))[0]
                dense[i] += item.count_at_value_iterated_to
            return dense
        # the decoded counts themselves, seen as int64 (no copy: the array keeps the buffer)
        return np.ctypeslib.as_array(h.counts).view(np.int64)
    finally:
        _release(h)


class Summary(dict):
    """count, min, mean, p50, p90, p99, p99.9 and max of a dense histogram, in µs.

    A plain dict so that it serialises as it is; empty histograms give None
    values (shown as "–"), never zeros that look like a measurement.
    """


def summarize(dense: np.ndarray, percentiles: Iterable[float] = PERCENTILES) -> Summary:
    total = int(dense.sum())
    out = Summary(count=total)
    keys = [f"p{p:g}" for p in percentiles]
    if total == 0:
        out.update(min=None, mean=None, max=None, **dict.fromkeys(keys))
        return out
    # work on the non-empty buckets only: a few hundred values, not 23,552
    nz = np.flatnonzero(dense)
    counts = dense[nz]
    out["min"] = int(LOWEST_AT[nz[0]])
    out["mean"] = float((counts * MID_AT[nz]).sum() / total)
    cum = np.cumsum(counts)
    for key, p in zip(keys, percentiles, strict=True):
        out[key] = int(HIGHEST_AT[nz[_rank(cum, total, p)]])
    out["max"] = int(HIGHEST_AT[nz[-1]])
    return out


def _rank(cum: np.ndarray, total: int, percentile: float) -> int:
    target = max(1, int(percentile / 100.0 * total + 0.5))
    return min(int(np.searchsorted(cum, target, side="left")), len(cum) - 1)


def value_at_percentile(cum: np.ndarray, total: int, percentile: float) -> int:
    """HdrHistogram's definition: the highest equivalent value of the bucket that holds
    the target count (`cum`: the cumulative counts of a dense array)."""
    return int(HIGHEST_AT[_rank(cum, total, percentile)])


def percentile_curve(dense: np.ndarray, percentiles: Iterable[float]) -> list[int | None]:
    total = int(dense.sum())
    if total == 0:
        return [None for _ in percentiles]
    nz = np.flatnonzero(dense)
    cum = np.cumsum(dense[nz])
    return [int(HIGHEST_AT[nz[_rank(cum, total, p)]]) for p in percentiles]
