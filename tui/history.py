"""Fixed-size rings of what the charts show, fed once per Snapshot, in time buckets.

A chart column is one bucket (`bucket_s` seconds). A bucket's value is known
when the bucket is complete, so charts change only then: a 2-second bucket
redraws a chart every 2 s at most, whatever the Snapshot tick or refresh rate.
Memory is fixed: `keep` buckets per series (10 minutes at the defaults).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from loadgen.model.snapshot import Counters, Snapshot
from loadgen.model.windows import SnapshotWindows

# the only latencies the console summarises each redraw (the rest cost CPU for nothing)
# ttfa: reasoning models only; ttft_co, e2e_co and lag: open loop only (a metric with no
# samples costs nothing: windows summarise only those they hold)
SHOWN_METRICS = ("ttft", "ttfa", "itl", "tpot", "e2e", "ttft_co", "e2e_co", "lag")

BUCKET_S = 2.0
KEEP = 300  # buckets: 10 minutes at 2 s

# rates from cumulative counters over each bucket
RATE_SERIES = ("out_tok_s", "in_tok_s", "req_s", "err_s")
# gauges: the highest value seen in the bucket (a queue's peak is what hurts)
GAUGE_SERIES = ("target", "in_flight", "backlog", "waiting", "running")
# the 10 s window's P99 at the end of each bucket, in ms (the chart's axis unit)
LATENCY_SERIES = ("ttft_p99", "itl_p99", "tpot_p99", "e2e_p99")
SERIES = RATE_SERIES + GAUGE_SERIES + LATENCY_SERIES


@dataclass
class _Open:
    index: int
    t0: float
    counters: Counters
    peaks: dict[str, float | None]


class History:
    def __init__(self, bucket_s: float = BUCKET_S, keep: int = KEEP) -> None:
        self.bucket_s = bucket_s
        self.keep = keep
        self.series: dict[str, deque[float | None]] = {s: deque(maxlen=keep) for s in SERIES}
        self.buckets = 0  # completed buckets so far: charts redraw when this changes
        self._open: _Open | None = None
        self._origin: float | None = None
        # the 10 s window's latency summaries at the last bucket end (SLO checks read it)
        self.last_latency: dict = {}

    def values(self, name: str, n: int) -> list[float | None]:
        """The last `n` completed buckets of `name`, oldest first, padded with None on the left."""
        ring = self.series[name]
        tail = list(ring)[-n:] if n > 0 else []
        return [None] * (n - len(tail)) + tail

    def add(self, snap: Snapshot, windows: SnapshotWindows) -> bool:
        """Fold one Snapshot in; True when it completed a bucket."""
        if self._origin is None:
            self._origin = snap.t
        index = int((snap.t - self._origin) // self.bucket_s)
        completed = False
        if self._open is not None and index != self._open.index:
            self._close(snap, windows)
            completed = True
        if self._open is None:
            self._open = _Open(index, snap.t, snap.counters, dict.fromkeys(GAUGE_SERIES))
            # the very first tick only opens the bucket; its gauges count too
        self._peak(snap)
        return completed

    def _peak(self, snap: Snapshot) -> None:
        assert self._open is not None
        server = snap.server if snap.server is not None and snap.server.ok else None
        now = {
            "target": float(snap.load.target_concurrency) if snap.load.mode == "closed"
            else snap.load.target_rate,
            "in_flight": float(snap.load.in_flight),
            "backlog": float(snap.load.backlog),
            "waiting": server.waiting if server else None,
            "running": server.running if server else None,
        }
        peaks = self._open.peaks
        for k, v in now.items():
            if v is not None:
                old = peaks[k]
                peaks[k] = v if old is None else max(old, v)

    def _close(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        bucket = self._open
        assert bucket is not None
        dt = snap.t - bucket.t0
        a, b = bucket.counters, snap.counters
        rates = {
            "out_tok_s": b.output_tokens - a.output_tokens,
            "in_tok_s": b.input_tokens - a.input_tokens,
            "req_s": b.requests_ok - a.requests_ok,
            "err_s": b.requests_failed - a.requests_failed,
        }
        for k, v in rates.items():
            self.series[k].append(v / dt if dt > 0 else None)
        for k, v in bucket.peaks.items():
            self.series[k].append(v)
        latency = windows.stats("10s", SHOWN_METRICS).latency
        self.last_latency = latency
        for name in LATENCY_SERIES:
            summary = latency.get(name.removesuffix("_p99"))
            p99 = summary.get("p99") if summary else None
            self.series[name].append(None if p99 is None else p99 / 1000.0)
        self.buckets += 1
        self._open = None

    def reset(self) -> None:
        for ring in self.series.values():
            ring.clear()
        self._open = None
        self.buckets += 1  # charts must redraw (empty)
