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
from typing import NamedTuple

import numpy as np

from loadgen.model import hdr
from loadgen.model.snapshot import METRICS, Counters, ServerMetrics, Snapshot

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

# the load states of the drain: what follows the first of them is not load
DRAIN_STATES = ("draining", "stopped")


class Point(NamedTuple):
    """The run's cumulative counts at one Snapshot: what a window's rates are differences of."""

    t: float  # wall clock: windows are chosen by it
    counters: Counters
    elapsed: float  # load time: rates divide by it (a resumed run's gap is not in it)
    # the server's prefix-cache (hits, queries) counted since the stream began, restarts
    # summed across (ServerCache); None while the server has reported none
    cache: tuple[float, float] | None = None


class ServerCache:
    """The server's prefix-cache counters (vLLM's prefix_cache_hits_total and _queries_total)
    summed across its restarts, so a window's difference is what the server counted in it:
    a counter that went down is a restart that counted from zero again. Counting starts at
    the first scrape seen (earlier traffic is not the run's)."""

    def __init__(self) -> None:
        self.total: tuple[float, float] | None = None
        self._last: tuple[float, float] | None = None

    def see(self, server: ServerMetrics | None) -> tuple[float, float] | None:
        now = _cache_counters(server)
        if now is None:
            return self.total
        last, self._last = self._last, now
        if last is None:
            self.total = (0.0, 0.0)
        else:
            assert self.total is not None
            restarted = now[0] < last[0] or now[1] < last[1]
            step = now if restarted else (now[0] - last[0], now[1] - last[1])
            self.total = (self.total[0] + step[0], self.total[1] + step[1])
        return self.total


def _cache_counters(server: ServerMetrics | None) -> tuple[float, float] | None:
    if server is None or not server.ok:
        return None
    hits, queries = server.prefix_cache_hits_total, server.prefix_cache_queries_total
    return None if hits is None or queries is None else (hits, queries)


class RunSpan:
    """The whole-run window's two ends, one rule for the summary (SnapshotWindows) and the
    report (loadgen.analysis.soak), so that both say the same of one recording.

    It starts where the warm-up ends: the Snapshot in which it ends, and all before it, are
    left out (that tick was partly warm-up). It ends where the drain begins: the first
    draining Snapshot still counts as load (the stop reached the workers as its tick
    closed), what comes after it is the drain. Without warm-up it starts at zero, at the
    run's start."""

    def __init__(self) -> None:
        self.start: Point | None = None
        self.end: Point | None = None
        self._loading = False  # the last Snapshot was under load (not draining or stopped)
        self._warmup = False  # the last Snapshot was in warm-up

    def add(self, snap: Snapshot, point: Point) -> str:
        """Move the ends for this Snapshot; what it is to the run: "warmup" (in it, or the
        tick that ended it), "load" or "drain"."""
        if self.start is None:
            self.start = Point(snap.t - snap.elapsed, Counters(), 0.0)
        loading = snap.load.state not in DRAIN_STATES
        part = "load" if loading or self._loading or self.end is None else "drain"
        if part == "load":
            self.end = point
        self._loading = loading
        warmup_over = self._warmup and not snap.load.warmup
        self._warmup = snap.load.warmup
        if warmup_over:
            self.restart(point)
        return "warmup" if warmup_over or snap.load.warmup else part

    def restart(self, point: Point) -> None:
        """The run starts again from `point` (the warm-up's end, or the `r` key)."""
        self.start = self.end = point


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
    # prompt tokens the server looked up in its prefix cache, and found there, over the
    # window, by its own counters (ServerCache); None where it has no such counters
    server_cache_hits: float | None = None
    server_cache_queries: float | None = None

    @property
    def server_cache_hit_rate(self) -> float | None:
        """The server's prefix-cache hit rate over the window (hits / queries, 0..1)."""
        q = self.server_cache_queries
        return None if not q or self.server_cache_hits is None else self.server_cache_hits / q

    @property
    def user_tok_s(self) -> dict[str, float | None]:
        """What one user sees stream in, tokens per second (per_user_tok_s): the median and
        the slow tail (p10) of 1 / TPOT over the window's completed requests."""
        return per_user_tok_s(self.latency.get("tpot"))

    @property
    def input_differs(self) -> bool:
        server, asked = self.input_per_request, self.input_asked_per_request
        return server is not None and bool(asked) and abs(server - asked) > INPUT_DIFFERS * asked


def per_user_tok_s(tpot: hdr.Summary | None) -> dict[str, float | None]:
    """User tok/s, one definition for the console and the summary: 1 / TPOT, request by
    request (TPOT: the request's (last − first text chunk) / (output tokens − 1)), so each
    user's speed counts once whatever it generated. 1 / x falls as x rises, so the median
    speed is 1 / the median TPOT and the slow tail (p10) is 1 / TPOT's p90. A mean over all
    token gaps (1 / mean ITL) would weigh the slow users' many gaps and read a speed nobody
    saw: half the users at 100 tok/s and half at 10 read 18."""
    def inv(us: float | None) -> float | None:
        return None if not us else 1e6 / us

    return {"p50": inv((tpot or {}).get("p50")), "p10": inv((tpot or {}).get("p90"))}


class SnapshotWindows:
    """Feed Snapshots in; ask for WindowStats of any named window.

    Warm-up is excluded here, once for every consumer (headless summary, agent, console,
    replay): the Snapshot in which the warm-up ends, and all before it, are forgotten, so
    results start at the first tick measured wholly after the warm-up (RunSpan, the rule the
    report follows too).
    """

    def __init__(self) -> None:
        self._rolling = {
            "10s": RollingHistograms(10.0),
            "1m": RollingHistograms(60.0),
            "10m": RollingHistograms(600.0, granularity=10.0),
            "run": RollingHistograms(None),
        }
        # a Point per tick for rates, 10 minutes at most (a few small objects a tick): windows
        # are chosen by wall time t, but rates divide by elapsed load time, which a resumed
        # run's gap (tokentop not running) is not part of
        self._counters: deque[Point] = deque()
        # the whole-run window's ends: from the end of warm-up to the last point before the
        # drain began, so that a run's duration and rates are its load (see `drain`)
        self._span = RunSpan()
        self._cache = ServerCache()
        # the load's setting (mode, level, running or paused) and the point where it took it:
        # a rate measured across a change is of neither setting (`setting_rate`)
        self._setting: tuple | None = None
        self._setting_since: Point | None = None
        self.last: Snapshot | None = None
        self._decoded = np.zeros(hdr.COUNTS_LEN, np.int64)  # every histogram decodes here
        # --mix: each class's windows, fed the class's view of each tick (Snapshot.of_class),
        # so a class is asked for its windows as the run is (empty: no mix)
        self.classes: dict[str, SnapshotWindows] = {}

    def add(self, snap: Snapshot) -> None:
        interval = {m: _sparse(hdr.decode(blob, out=self._decoded))
                    for m, blob in snap.hist.items() if m in METRICS}
        for r in self._rolling.values():
            r.add(snap.t, interval)
        point = Point(snap.t, snap.counters, snap.elapsed, self._cache.see(snap.server))
        first = self._span.start is None
        part = self._span.add(snap, point)
        if first:
            # rates over the whole run start from zero at the run's start
            self._counters.append(self._span.start)
        self._counters.append(point)
        self._note_setting(snap, point, first)
        while self._counters and self._counters[0].t < snap.t - 600.0 - 10.0:
            self._counters.popleft()
        warmup_over = part == "warmup" and not snap.load.warmup
        self.last = snap
        if warmup_over:
            self.reset()
        for name in snap.classes:
            sub = self.classes.get(name)
            if sub is None:
                sub = self.classes[name] = SnapshotWindows()
            sub.add(snap.of_class(name))

    def _note_setting(self, snap: Snapshot, point: Point, first: bool) -> None:
        ld = snap.load
        setting = (ld.mode, ld.target_concurrency if ld.mode == "closed" else ld.target_rate,
                   ld.state)
        if setting != self._setting:
            # the tick that carried the change ran partly at the old setting: it is left out,
            # but a run's first setting holds from its start
            self._setting_since = self._span.start if first else point
            self._setting = setting

    def reset(self) -> None:
        """Forget everything so far (the `r` key): windows restart from now."""
        for r in self._rolling.values():
            r.reset()
        for sub in self.classes.values():
            sub.reset()
        self._counters.clear()
        if self.last is not None:
            point = Point(self.last.t, self.last.counters, self.last.elapsed, self._cache.total)
            self._span.restart(point)
            self._counters.append(point)
            if self._setting_since is not None and self._setting_since.t < point.t:
                self._setting_since = point

    def drain(self) -> dict | None:
        """What happened after the drain began (requests finishing or cancelled), which the
        whole-run window leaves out of its duration, counts and rates; None before a drain.
        Its latencies are in the whole-run histograms: the requests that finish in the drain
        are the long ones, and leaving them out would cut the tail."""
        end = self._span.end
        if end is None or not self._counters or end is self._counters[-1]:
            return None
        return drain_counts(end, self._counters[-1])

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
            seconds=(end.elapsed - start.elapsed) if start and end else 0.0,
            latency=latency,
            **rates,
        )

    def setting_rate(self, span: float = 10.0) -> tuple[float | None, float]:
        """(completed requests/s, seconds) over the last `span` seconds in which the load ran
        at its current setting: since its last change of mode or level, pause or resume, so
        that a paused or c=0 stretch does not dilute the rate of the load running now. None
        while that stretch has covered no load time."""
        if not self._counters or self._setting_since is None:
            return None, 0.0
        end = self._counters[-1]
        start = self._setting_since
        for point in self._counters:
            if point.t >= max(end.t - span - 1e-6, start.t):
                start = point
                break
        seconds = end.elapsed - start.elapsed
        if seconds <= 0:
            return None, 0.0
        return (end.counters.requests_ok - start.counters.requests_ok) / seconds, seconds

    def _rate_points(self, span: float | None) -> tuple[Point | None, Point | None]:
        if not self._counters:
            return None, None
        end = self._counters[-1]
        if span is None:
            return self._span.start, self._span.end or end
        start = self._counters[0]
        for point in self._counters:
            if point.t >= end.t - span - 1e-6:
                start = point
                break
        return start, end


def drain_counts(end: Point, last: Point) -> dict:
    """The drain's counts: from the load's last point (RunSpan.end) to the last one."""
    a, b = end.counters, last.counters
    return {"seconds": round(last.elapsed - end.elapsed, 3), "errors": b.since(a).errors,
            "requests_ok": b.requests_ok - a.requests_ok,
            "requests_failed": b.requests_failed - a.requests_failed,
            "requests_cancelled": b.requests_cancelled - a.requests_cancelled,
            "output_tokens": b.output_tokens - a.output_tokens,
            "input_tokens": b.input_tokens - a.input_tokens}


def _rates(start: Point | None, end: Point | None) -> dict:
    if not start or not end or end.elapsed - start.elapsed <= 0:
        # no time covered yet (just started, or just reset): nothing counted, no rates
        return dict(output_tok_s=None, input_tok_s=None, req_s=None, err_s=None,
                    requests_ok=0, requests_failed=0)
    dt = end.elapsed - start.elapsed  # load seconds: a resumed run's gap is not in them
    a, b = start.counters, end.counters
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
        **_server_cache(start.cache, end.cache),
    )


def _server_cache(a: tuple[float, float] | None, b: tuple[float, float] | None) -> dict:
    """What the server's prefix-cache counters counted between two points; nothing when it
    reported none (no counters: an engine with a gauge only, or no /metrics). A start before
    the first scrape counts from that scrape (ServerCache starts at zero there)."""
    if b is None:
        return {}
    a = a or (0.0, 0.0)
    return {"server_cache_hits": b[0] - a[0], "server_cache_queries": b[1] - a[1]}


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
