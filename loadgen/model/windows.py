"""Windows over a stream of Snapshots: percentiles and rates for the last N seconds.

A window is a sum of interval histograms, kept as a dense running sum: each
new interval is added, and intervals that fall out of the window are
subtracted. Intervals are held sparse (only non-empty buckets), and long
windows are held in coarser blocks, so memory stays bounded for a 72-hour run
whatever the request rate. A tick allocates only its sparse intervals (decoded
into one kept buffer, made sparse once for every window): a fresh 184 KB dense
array a metric a tick is what fragments a long run's heap.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from loadgen.model import hdr
from loadgen.model.snapshot import METRICS, Counters, Snapshot

WINDOWS = {"10s": 10.0, "1m": 60.0, "10m": 600.0, "run": None}


Sparse = tuple[np.ndarray, np.ndarray]  # (indices, counts) of the non-empty buckets


@dataclass
class _Block:
    t_end: float
    sparse: dict[str, Sparse]  # shared between windows: never modified


def _sparse(dense: np.ndarray) -> Sparse:
    nz = np.flatnonzero(dense)
    return nz.astype(np.int32), dense[nz]


class RollingHistograms:
    """Dense running sums of every metric over the last `span` seconds.

    `granularity` > 0 groups intervals into blocks of that many seconds before
    they enter the ring (the 10-minute window is exact to 10 s).
    """

    def __init__(self, span: float | None, granularity: float = 0.0) -> None:
        self.span = span
        self.granularity = granularity
        self.dense = {m: np.zeros(hdr.COUNTS_LEN, np.int64) for m in METRICS}
        self._ring: deque[_Block] = deque()
        self._pending = (
            {m: np.zeros(hdr.COUNTS_LEN, np.int64) for m in METRICS} if granularity > 0 else {}
        )
        self._pending_start: float | None = None

    def add(self, t: float, interval: dict[str, Sparse]) -> None:
        """Add one interval, by metric its non-empty buckets (unique indices)."""
        for m, (idx, cnt) in interval.items():
            self.dense[m][idx] += cnt
        if self.span is None:
            return
        if self.granularity <= 0:
            self._ring.append(_Block(t, interval))
        else:
            if self._pending_start is None:
                self._pending_start = t
            for m, (idx, cnt) in interval.items():
                self._pending[m][idx] += cnt
            if t - self._pending_start >= self.granularity:
                self._ring.append(_Block(t, {m: _sparse(d) for m, d in self._pending.items()}))
                for d in self._pending.values():
                    d[:] = 0  # reused: no fresh 184 KB arrays every block
                self._pending_start = None
        self._expire(t)

    def _expire(self, now: float) -> None:
        while self._ring and self._ring[0].t_end <= now - self.span:
            block = self._ring.popleft()
            for m, (idx, cnt) in block.sparse.items():
                self.dense[m][idx] -= cnt

    def reset(self) -> None:
        for d in self.dense.values():
            d[:] = 0
        self._ring.clear()
        for d in self._pending.values():
            d[:] = 0
        self._pending_start = None


# the server's prompt count this far from the asked length is flagged (a chat template's
# tokens, or a tokenizer that is not one token a word)
INPUT_DIFFERS = 0.05


@dataclass
class WindowStats:
    name: str
    seconds: float  # how much time the window actually covers so far
    latency: dict[str, hdr.Summary]  # metric -> summary (µs)
    output_tok_s: float | None
    input_tok_s: float | None
    req_s: float | None
    err_s: float | None
    requests_ok: int
    requests_failed: int
    requests_cancelled: int = 0
    output_tokens: int = 0
    input_tokens: int = 0
    goodput_req_s: float | None = None  # requests/s that met every per-request SLO
    errors: dict[str, int] = field(default_factory=dict)
    tokens_estimated: bool = False
    completed_output_tokens: int = 0  # tokens of the requests that completed in the window
    itl_estimated: bool = False  # some ITL token gaps were spread over multi-token chunks
    clipped_samples: int = 0  # latency samples above the histogram's range (1 h)
    # prompt tokens a request, as the server counted them and as asked, over the same
    # requests (those whose server reported its count); None where none reported one
    input_per_request: float | None = None
    input_asked_per_request: float | None = None
    # everything counted in the window (the difference of the cumulative counters), for the
    # figures no field above names; None while the window covers no time
    counters: Counters | None = None

    @property
    def input_differs(self) -> bool:
        server, asked = self.input_per_request, self.input_asked_per_request
        return server is not None and bool(asked) and abs(server - asked) > INPUT_DIFFERS * asked


class SnapshotWindows:
    """Feed Snapshots in; ask for WindowStats of any named window.

    Warm-up is excluded here, once for every consumer (headless summary, agent, console,
    replay): the Snapshot in which the warm-up ends, and all before it, are forgotten, so
    results start at the first tick measured wholly after the warm-up.
    """

    def __init__(self) -> None:
        self._rolling = {
            "10s": RollingHistograms(10.0),
            "1m": RollingHistograms(60.0),
            "10m": RollingHistograms(600.0, granularity=10.0),
            "run": RollingHistograms(None),
        }
        # (t, counters) per tick for rates, 10 minutes at most (a few small objects a tick)
        # (t, counters, elapsed) per tick: windows are chosen by wall time t, but rates divide
        # by elapsed load time, which a resumed run's gap (tokentop not running) is not part of
        self._counters: deque[tuple[float, Counters, float]] = deque()
        self._first: tuple[float, Counters, float] | None = None
        # the last point before the drain began: the whole-run window ends here, so that a
        # run's duration and rates are its load, not the drain after it (see `drain`)
        self._load_end: tuple[float, Counters, float] | None = None
        self._loading = False  # the last Snapshot was under load (not draining or stopped)
        self.last: Snapshot | None = None
        self._decoded = np.zeros(hdr.COUNTS_LEN, np.int64)  # every histogram decodes here

    def add(self, snap: Snapshot) -> None:
        interval = {m: _sparse(hdr.decode(blob, out=self._decoded))
                    for m, blob in snap.hist.items() if m in METRICS}
        for r in self._rolling.values():
            r.add(snap.t, interval)
        point = (snap.t, snap.counters, snap.elapsed)
        if self._first is None:
            # rates over the whole run start from zero at the run's start
            self._first = (snap.t - snap.elapsed, Counters(), 0.0)
            self._counters.append(self._first)
        self._counters.append(point)
        # The tick in which the drain began still covers load (the stop reached the workers
        # as it closed), so the load ends at the first draining Snapshot, not the one before.
        loading = snap.load.state not in ("draining", "stopped")
        if loading or self._loading or self._load_end is None:
            self._load_end = point
        self._loading = loading
        while self._counters and self._counters[0][0] < snap.t - 600.0 - 10.0:
            self._counters.popleft()
        warmup_over = self.last is not None and self.last.load.warmup and not snap.load.warmup
        self.last = snap
        if warmup_over:
            self.reset()

    def reset(self) -> None:
        """Forget everything so far (the `r` key): windows restart from now."""
        for r in self._rolling.values():
            r.reset()
        self._counters.clear()
        if self.last is not None:
            self._first = (self.last.t, self.last.counters, self.last.elapsed)
            self._counters.append(self._first)
        self._load_end = self._first

    def drain(self) -> dict | None:
        """What happened after the drain began (requests finishing or cancelled), which the
        whole-run window leaves out of its duration, counts and rates; None before a drain.
        Its latencies are in the whole-run histograms: the requests that finish in the drain
        are the long ones, and leaving them out would cut the tail."""
        if self._load_end is None or not self._counters or self._load_end is self._counters[-1]:
            return None
        (_, a, ea), (_, b, eb) = self._load_end, self._counters[-1]
        return {"seconds": round(eb - ea, 3), "errors": b.since(a).errors,
                "requests_ok": b.requests_ok - a.requests_ok,
                "requests_failed": b.requests_failed - a.requests_failed,
                "requests_cancelled": b.requests_cancelled - a.requests_cancelled,
                "output_tokens": b.output_tokens - a.output_tokens,
                "input_tokens": b.input_tokens - a.input_tokens}

    def dense(self, name: str) -> dict[str, np.ndarray]:
        """The window's summed histograms (dense counts, µs), by metric; do not modify."""
        return self._rolling[name].dense

    def stats(self, name: str, metrics: Iterable[str] | None = None) -> WindowStats:
        """Percentiles and rates of a window; `metrics` limits the (costly) percentile work
        to the latencies the caller shows."""
        span = WINDOWS[name]
        dense = self._rolling[name].dense
        wanted = dense.keys() if metrics is None else [m for m in metrics if m in dense]
        latency = {m: hdr.summarize(dense[m]) for m in wanted}
        start, end = self._rate_points(span)
        rates = _rates(start, end)
        return WindowStats(
            name=name,
            seconds=(end[2] - start[2]) if start and end else 0.0,
            latency=latency,
            **rates,
        )

    def _rate_points(self, span: float | None):
        if not self._counters:
            return None, None
        end = self._counters[-1]
        if span is None:
            return self._first, self._load_end or end
        start = self._counters[0]
        for point in self._counters:
            if point[0] >= end[0] - span - 1e-6:
                start = point
                break
        return start, end


def _rates(start, end) -> dict:
    if not start or not end or end[2] - start[2] <= 0:
        # no time covered yet (just started, or just reset): nothing counted, no rates
        return dict(output_tok_s=None, input_tok_s=None, req_s=None, err_s=None,
                    requests_ok=0, requests_failed=0)
    dt = end[2] - start[2]  # load seconds: a resumed run's gap is not in them
    a, b = start[1], end[1]
    errors = {k: v - a.errors.get(k, 0) for k, v in b.errors.items() if v - a.errors.get(k, 0)}
    return dict(
        output_tok_s=(b.output_tokens - a.output_tokens) / dt,
        input_tok_s=(b.input_tokens - a.input_tokens) / dt,
        req_s=(b.requests_ok - a.requests_ok) / dt,
        err_s=(b.requests_failed - a.requests_failed) / dt,
        requests_ok=b.requests_ok - a.requests_ok,
        requests_failed=b.requests_failed - a.requests_failed,
        requests_cancelled=b.requests_cancelled - a.requests_cancelled,
        output_tokens=b.output_tokens - a.output_tokens,
        input_tokens=b.input_tokens - a.input_tokens,
        goodput_req_s=(b.requests_good - a.requests_good) / dt,
        errors=errors,
        tokens_estimated=b.estimated_output_tokens > a.estimated_output_tokens,
        completed_output_tokens=b.completed_output_tokens - a.completed_output_tokens,
        itl_estimated=b.estimated_itl_tokens > a.estimated_itl_tokens,
        clipped_samples=b.clipped_samples - a.clipped_samples,
        counters=b.since(a),
        **_input_per_request(a, b),
    )


def _input_per_request(a: Counters, b: Counters) -> dict:
    """Prompt tokens a request as the server counted them, beside the asked length.

    The server's count is compared only with the asked lengths of the requests it counted
    (input_tokens_asked), so a run where some answers lack usage still compares like with
    like; that ratio is then applied to the asked length a request over all requests."""
    asked = b.input_tokens_asked - a.input_tokens_asked
    reported = (b.input_tokens - b.estimated_input_tokens) - (a.input_tokens
                                                              - a.estimated_input_tokens)
    ok = b.requests_ok - a.requests_ok
    if asked <= 0 or reported <= 0 or ok <= 0:
        return {}
    asked_all = asked + b.estimated_input_tokens - a.estimated_input_tokens
    per_request = asked_all / ok
    return {"input_per_request": reported / asked * per_request,
            "input_asked_per_request": per_request}
