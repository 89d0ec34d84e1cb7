"""One tick's measurements inside a worker, handed over and cleared at each flush.

Recording is an `array.append` (tens of nanoseconds): the per-token hot path
never touches a histogram. At flush the raw values become sparse HDR counts in
one vectorised pass, so memory is bounded by one tick of traffic.
"""

from __future__ import annotations

from array import array
from time import time

import msgspec
import numpy as np

from loadgen.model import hdr
from loadgen.model.snapshot import Counters
from loadgen.model.text import plain

# an error's message as the worker reports it: the server's words in it (a body, a reason,
# a header) are outside text, made plain here, the one door every error message goes through
ERROR_MESSAGE_MAX = 300


class SparseHist(msgspec.Struct, array_like=True):
    """Non-empty buckets of an interval histogram (HdrHistogram counts layout)."""

    index: bytes  # int32 little-endian
    count: bytes  # int64 little-endian

    @classmethod
    def of(cls, idx: np.ndarray, cnt: np.ndarray) -> SparseHist:
        return cls(idx.astype("<i4").tobytes(), cnt.astype("<i8").tobytes())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.frombuffer(self.index, "<i4"), np.frombuffer(self.count, "<i8")


class IntervalRecorder:
    __slots__ = (
        "chunk_tokens", "connect", "counters", "e2e", "e2e_co", "error_at", "icl", "itl_err",
        "itl_v", "itl_w", "lag", "last_errors", "tpot", "ttfa", "ttft", "ttft_co", "ttft_err",
        "usage_tokens",
    )

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.ttft = array("d")
        self.ttfa = array("d")  # reasoning streams only: to the first answer token
        self.e2e = array("d")
        self.tpot = array("d")
        self.icl = array("d")
        self.itl_v = array("d")  # per-token gap, µs
        self.itl_w = array("d")  # how many tokens shared that gap
        self.lag = array("d")  # open loop: intended → actual send
        self.ttft_co = array("d")  # open loop: from the intended send time
        self.e2e_co = array("d")
        self.ttft_err = array("d")  # calibration: |measured − true|
        self.itl_err = array("d")
        self.connect = array("d")  # setup time of each new connection (TCP, TLS)
        self.counters = Counters()
        # Output tokens as they arrive, kept here as plain ints (a Counters field costs twice
        # as much to bump, once a chunk) and folded into the counters at take: per-chunk
        # usage deltas, and tokens counted one a chunk (estimated until a usage corrects).
        self.usage_tokens = 0
        self.chunk_tokens = 0
        self.last_errors: dict[str, str] = {}
        # unix time of each kind's last error this interval (its message is last_errors'):
        # the coordinator dates the kind's event by it, not by when the event is made
        self.error_at: dict[str, float] = {}

    def error(self, kind: str, message: str) -> None:
        c = self.counters
        if kind == "cancelled":
            c.requests_cancelled += 1  # abandoned on purpose: not a server failure
        else:
            c.requests_failed += 1
        c.errors[kind] = c.errors.get(kind, 0) + 1
        self.last_errors[kind] = plain(message, ERROR_MESSAGE_MAX)
        self.error_at[kind] = time()  # when it happened: its event is dated so

    def backed_off(self, seconds: float, asked: bool) -> None:
        """A closed-loop stream waited `seconds` after a failure (loadgen.worker.pacing);
        `asked`: the server's Retry-After set the wait."""
        c = self.counters
        c.backoffs += 1
        c.backoffs_retry_after += asked
        c.backoff_us += round(seconds * 1e6)

    def take(self) -> tuple[Counters, dict[str, SparseHist], dict[str, str]]:
        """Everything recorded since the last take, as counters and sparse histograms."""
        counters, errors = self.counters, self.last_errors
        counters.output_tokens += self.usage_tokens + self.chunk_tokens
        counters.estimated_output_tokens += self.chunk_tokens
        hists: dict[str, SparseHist] = {}
        if self.itl_v:
            hists["itl"] = _sparse(self.itl_v, self.itl_w, counters)
        for name in _PLAIN:
            values = getattr(self, name)
            if values:  # only what was measured: an empty metric costs nothing on the wire
                hists[name] = _sparse(values, None, counters)
        self._clear()
        return counters, hists, errors


_PLAIN = ("ttft", "ttfa", "e2e", "tpot", "icl", "lag", "ttft_co", "e2e_co", "ttft_err", "itl_err",
          "connect")


def _sparse(values: array, weights: array | None, counters: Counters) -> SparseHist:
    v = np.frombuffer(values, np.float64) if len(values) else np.empty(0)
    w = np.frombuffer(weights, np.float64) if weights is not None and len(weights) else None
    idx, cnt, clipped = hdr.sparse_counts_clipped(v, w)
    # a value above the range is recorded at its top: say how many, so none passes unseen
    counters.clipped_samples += clipped
    return SparseHist.of(idx, cnt)


def merge_sparse(parts: list[dict[str, SparseHist]]) -> dict[str, SparseHist]:
    """Sparse histograms of the same interval summed by metric (a mix's classes into the
    worker's totals): each bucket once, its counts added exactly."""
    out: dict[str, SparseHist] = {}
    for name in {n for hists in parts for n in hists}:
        given = [hists[name] for hists in parts if name in hists]
        if len(given) == 1:
            out[name] = given[0]
            continue
        arrays = [h.arrays() for h in given]
        idx, inverse = np.unique(np.concatenate([a[0] for a in arrays]), return_inverse=True)
        cnt = np.zeros(len(idx), np.int64)
        np.add.at(cnt, inverse, np.concatenate([a[1] for a in arrays]))
        out[name] = SparseHist.of(idx, cnt)
    return out
