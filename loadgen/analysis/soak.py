"""Soak analysis from Snapshots alone: outages, MTTR, drift, long tail, thresholds.

It reads nothing but Snapshots, so it works the same on a live run, a run
directory (finished, crashed or still being written) and fleet data. Feed it
with `add()` in order and ask `result()` (a plain JSON-able dict) at any time.
Memory: a few dense histograms (the run so far and the current drift bucket) and
a handful of numbers per tick for the plots (~100 B/tick, ~50 MB for 72 h at
2 Hz); nothing per request or per token.

Definitions (all times are wall clock, unix seconds; `rel` = seconds since the
run started, gaps included):

* client outage: an outage by loadgen.model.outage's one definition (the server
  cannot be reached, or nothing succeeds and no tokens arrive, with evidence, held
  OUTAGE_MIN_S), found by the same OutageTracker the live run used, fed the
  recorded Snapshots: the report's outages are the live run's outage events.
* server outage: a span in which the server's /metrics did not answer, once it had
  answered at least once (a server without /metrics is not "down"), held
  OUTAGE_MIN_S like an outage (one missed scrape is not one). It is the probe's view:
  the server may still serve.
* recording gap: wall time between two Snapshots that no tick covers (more than
  `gap_s` or two ticks: tokentop was not running), or a resume (`--resume`, whose
  first Snapshot carries a "resume" event). Not an outage of the server: a gap does not
  end an outage that spans it, and is not counted in its duration (`gap_s`).
* MTTR: the mean duration of the closed outages (per kind, and of their union),
  recording gaps left out. Availability: 1 − client outage time / time the
  Snapshots cover.
* measured window: from the end of warm-up to the start of the drain, by the rule the
  run's summary follows (loadgen.model.windows.RunSpan), so a report and the summary of
  one recording say the same: the rates, requests and seconds are the window's; the
  whole-run latencies are after warm-up and hold the drain's requests (the long ones),
  as the summary's do; what the drain did is apart (`drain`).
* success rate: over the measured window, like the thresholds; during outages: over the
  ticks inside an outage of either kind.
* stalls: the tracker's stall episodes (streams in flight with no byte for
  STALL_AFTER_S), as the live run announced them.
* drift: per bucket (an hour by default) of load time from the end of warm-up to the
  drain, the P99/P99.9 of TTFT and ITL, throughput and error rate, compared with the
  first bucket; a partial bucket (less than FULL_BUCKET of its span: the last, cut by the
  drain) is listed but not compared. The server process' RSS and the GPU memory as
  least-squares slopes in MB/hour over the same ticks (their last value before the drain),
  withheld under loadgen.model.trend's span.
* long tail: ticks whose P99.9 or max of a latency is above a limit: absolute
  (`tail_abs_us`), or `tail_k` × the run's median per-tick P99 of that metric.
* thresholds (`--slo ttft_p99<500ms,error_rate<0.1%`): evaluated on the whole
  run after warm-up, each pass/fail, with `Threshold.passes`.

The result is a SoakResult (typed, `analysis()`), or the same as plain JSON-able values
(`result()`, what report.json holds): its keys are the Structs' field names, in their order.
"""

from __future__ import annotations

import heapq
import math
from array import array

import msgspec
import numpy as np

from loadgen.analysis.outage_views import OpenSpan, Outage, as_events, union
from loadgen.analysis.soak_result import (
    Bucket,
    DrainCounts,
    Drift,
    EventLine,
    Gap,
    LongTail,
    Measured,
    Mttr,
    Rates,
    Requests,
    RunTarget,
    Slope,
    SoakResult,
    Stall,
    Stalls,
    TailInterval,
    ThresholdResult,
    TickStats,
)
from loadgen.model import hdr
from loadgen.model.outage import GAP_EPSILON_S, OUTAGE_MIN_S, OutageTracker, Tick
from loadgen.model.slo import Slos, evaluate_thresholds, rates_from
from loadgen.model.snapshot import Counters, Snapshot
from loadgen.model.trend import long_enough
from loadgen.model.windows import Point, RunSpan, drain_counts

RUN_METRICS = ("ttft", "ttfa", "itl", "tpot", "e2e")  # whole-run summaries and thresholds
# info-level events a report still lists: what was done to the run, and the derived facts
KEPT_INFO_EVENTS = ("run", "resume", "operator", "record", "recording", "slo", "gpu")
CONTEXT_S = 5.0  # a long-tail row's context: the events this close to its tick
TICK_METRICS = ("ttft", "itl")  # per-tick percentiles: drift, long tail, plots
TAIL_LIST_MAX = 50
# a drift bucket covering less than this share of its span is partial: listed, not compared
FULL_BUCKET = 0.9
STALL_LIST_MAX = 200  # stall episodes listed at most (all are counted)
SERIES = (
    # per tick, for the plots and the long-tail context
    "rel", "elapsed", "interval", "ok", "failed", "output_tokens",
    "ttft_p50", "ttft_p99", "ttft_p999", "ttft_max",
    "itl_p50", "itl_p99", "itl_p999", "itl_max",
    "in_flight", "backlog", "srv_waiting", "srv_running", "kv_cache",
    "gpu_mem_mb", "gpu_power_w", "srv_rss_mb", "srv_ok",
)
NAN = float("nan")


# ---- analysing -----------------------------------------------------------------------------


class _Slope:
    """Online least squares of y (MB) against x (hours). A slope over minutes says little
    about a leak (start-up growth dominates): it is a trend only once its samples span
    loadgen.model.trend's MIN_SLOPE_SPAN_S, the rule the console's RSS slope follows too."""

    def __init__(self) -> None:
        self.n = 0
        self.x0: float | None = None
        self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.first: float | None = None
        self.last: float | None = None
        self.peak: float | None = None
        self.span_h = 0.0

    def add(self, x_h: float, y: float) -> None:
        if self.x0 is None:
            self.x0 = x_h
            self.first = y
        x = x_h - self.x0
        self.span_h = x
        self.n += 1
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.sxy += x * y
        self.last = y
        self.peak = y if self.peak is None else max(self.peak, y)

    def slope(self) -> float | None:
        if self.n < 3:
            return None
        d = self.n * self.sxx - self.sx * self.sx
        if d <= 1e-12:
            return None
        return (self.n * self.sxy - self.sx * self.sy) / d

    def record(self) -> Slope:
        s = self.slope()
        return Slope(slope_mb_h=None if s is None else round(s, 3), samples=self.n,
                     span_h=round(self.span_h, 4), trend=long_enough(self.span_h * 3600),
                     first_mb=_r(self.first), last_mb=_r(self.last), peak_mb=_r(self.peak))


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, digits)


def quick_stats(dense: np.ndarray) -> tuple[int, float, float, float, float]:
    """(count, p50, p99, p99.9, max) in µs of a dense histogram, on its non-empty buckets."""
    nz = np.flatnonzero(dense)
    if len(nz) == 0:
        return 0, NAN, NAN, NAN, NAN
    counts = dense[nz]
    cum = np.cumsum(counts)
    total = int(cum[-1])
    out = [total]
    for p in (50.0, 99.0, 99.9):
        target = max(1, int(p / 100.0 * total + 0.5))
        i = int(np.searchsorted(cum, target, side="left"))
        out.append(float(hdr.HIGHEST_AT[nz[min(i, len(nz) - 1)]]))
    out.append(float(hdr.HIGHEST_AT[nz[-1]]))
    return tuple(out)  # type: ignore[return-value]


class SoakAnalyzer:
    def __init__(self, *, slos: Slos | None = None, bucket_s: float = 3600.0,
                 tail_k: float = 5.0, tail_abs_us: dict[str, float] | None = None,
                 gap_s: float = 1.0, keep_series: bool = True) -> None:
        self.slos = slos
        self.bucket_s = bucket_s
        self.tail_k = tail_k
        self.tail_abs_us = tail_abs_us or {}
        self.gap_s = gap_s
        self.keep_series = keep_series
        self.series: dict[str, array] = {
            k: array("d" if k in ("rel", "elapsed") else "f") for k in SERIES
        }
        self.events: list[EventLine] = []  # warn/error events and run/operator notes, capped
        self.event_counts: dict[str, int] = {}
        self.outages: list[Outage] = []
        self.gaps: list[Gap] = []
        self.tracker = OutageTracker()  # the one definition (loadgen.model.outage)
        self._metrics_down: OpenSpan | None = None  # the server outage (/metrics) being seen
        self.stalls: list[Stall] = []  # stall episodes, the first STALL_LIST_MAX
        self.stall_count = 0
        # ticks of the current stretch of trouble (a quiet span or /metrics down), kept until
        # it is over and known to be an outage or not: (start, end, ok, failed) each
        self._trouble = array("d")
        self._server_seen_ok = False
        self.server_never_ok_reason: str | None = None
        self.run_dense = {m: np.zeros(hdr.COUNTS_LEN, np.int64) for m in RUN_METRICS}
        self._bucket: dict | None = None
        self.buckets: list[Bucket] = []
        self.rss = _Slope()
        self.gpu_mem = _Slope()
        self.first: Snapshot | None = None
        self.last: Snapshot | None = None
        self.ticks = 0
        self._prev_counters = Counters()
        # the measured window's ends (warm-up's end to the drain's start), by the rule the
        # run's summary follows (loadgen.model.windows.RunSpan), and the last point
        self.span = RunSpan()
        self._last_point: Point | None = None
        self._fault_ok = self._fault_failed = 0  # ticks inside an outage, resolved
        # median of the per-tick P99 (as an HDR count of those values) for the tail limit
        self._p99_of_ticks = {m: np.zeros(hdr.COUNTS_LEN, np.int64) for m in TICK_METRICS}
        self._tail: list[tuple[float, int, TailInterval]] = []  # heap of the worst ticks
        self._tail_seq = 0
        self.start_time: float | None = None

    # ---- feeding ---------------------------------------------------------------------------

    def add(self, snap: Snapshot) -> None:
        if self.first is None:
            self.first = snap
            self.start_time = snap.t - snap.elapsed
        prev = self.last
        rel = snap.t - (self.start_time or snap.t)
        tick_start = snap.t - snap.interval
        # by kind, never by wording (runs resumed before the "resume" kind existed have a gap
        # of wall time there, which the test below sees as well)
        resumed = any(e.kind == "resume" for e in snap.events)
        uncovered = tick_start - prev.t if prev is not None else 0.0
        if prev is not None and (resumed or uncovered > max(self.gap_s, 2 * prev.interval)):
            self._gap(prev, snap)
        c, pc = snap.counters, self._prev_counters
        observed = Tick.between(pc, snap)
        ok = c.requests_ok - pc.requests_ok
        failed = c.requests_failed - pc.requests_failed
        out_tok = c.output_tokens - pc.output_tokens
        self._prev_counters = c
        point = self._last_point = Point(snap.t, c, snap.elapsed)
        part = self.span.add(snap, point)
        # latencies: the load's and the drain's (the requests that finish in the drain are the
        # long ones), as the summary's; drift and slopes: the load's alone
        measured, loading = part != "warmup", part == "load"

        # latency
        decoded = {m: hdr.decode(snap.hist[m]) for m in RUN_METRICS if m in snap.hist}
        if measured:
            for m, d in decoded.items():
                self.run_dense[m] += d
        stats = {m: quick_stats(decoded[m]) if m in decoded else (0, NAN, NAN, NAN, NAN)
                 for m in TICK_METRICS}

        # outages
        self._client_outage(observed)
        self._server_outage(snap, rel, failed, uncovered)
        self._note_trouble(tick_start, snap.t, ok, failed)

        # drift buckets and slopes
        self._drift(snap, decoded, ok, failed, out_tok, loading)
        srv_rss = gpu_mem = gpu_pw = NAN
        if snap.process is not None and snap.process.rss_bytes is not None:
            srv_rss = snap.process.rss_bytes / 1e6
            if loading:
                self.rss.add(snap.elapsed / 3600.0, srv_rss)
        used = [g.memory_used_bytes for g in snap.gpu.gpus if g.memory_used_bytes is not None]
        if used:
            gpu_mem = sum(used) / 1e6
            if loading:  # "GPU memory A → B": B before the drain freed anything
                self.gpu_mem.add(snap.elapsed / 3600.0, gpu_mem)
        power = [g.power_w for g in snap.gpu.gpus if g.power_w is not None]
        if power:
            gpu_pw = sum(power)

        # long tail
        if measured:
            for m in TICK_METRICS:
                count, _p50, p99, _p999, _mx = stats[m]
                if count:
                    self._p99_of_ticks[m][hdr.counts_index(np.array([p99]))[0]] += 1
                    self._tail_candidate(snap, rel, m, stats[m])

        # events
        for ev in snap.events:
            self.event_counts[ev.kind] = self.event_counts.get(ev.kind, 0) + 1
            if (ev.level != "info" or ev.kind in KEPT_INFO_EVENTS) and len(self.events) < 5000:
                self.events.append(EventLine(
                    t=ev.t, rel=round(ev.t - (self.start_time or 0), 3), kind=ev.kind,
                    level=ev.level, message=ev.message))

        if self.keep_series:
            srv = snap.server
            row = {
                "rel": rel, "elapsed": snap.elapsed, "interval": snap.interval,
                "ok": ok, "failed": failed, "output_tokens": out_tok,
                "ttft_p50": stats["ttft"][1], "ttft_p99": stats["ttft"][2],
                "ttft_p999": stats["ttft"][3], "ttft_max": stats["ttft"][4],
                "itl_p50": stats["itl"][1], "itl_p99": stats["itl"][2],
                "itl_p999": stats["itl"][3], "itl_max": stats["itl"][4],
                "in_flight": snap.load.in_flight, "backlog": snap.load.backlog,
                "srv_waiting": _nan(srv.waiting if srv and srv.ok else None),
                "srv_running": _nan(srv.running if srv and srv.ok else None),
                "kv_cache": _nan(srv.kv_cache_usage if srv and srv.ok else None),
                "gpu_mem_mb": gpu_mem, "gpu_power_w": gpu_pw, "srv_rss_mb": srv_rss,
                "srv_ok": NAN if srv is None else float(srv.ok),
            }
            for k, v in row.items():
                self.series[k].append(v)
        self.ticks += 1
        self.last = snap

    def _gap(self, prev: Snapshot, snap: Snapshot) -> None:
        """Listed; an outage that spans it goes on (the tracker leaves the gap out of its
        duration): nobody watched, so nothing says it ended."""
        start, end = prev.t, snap.t - snap.interval
        self.gaps.append(Gap(start=start, end=end, duration_s=round(end - start, 3),
                             start_rel=round(start - (self.start_time or start), 3),
                             after_seq=prev.seq, resumed_seq=snap.seq))

    def _client_outage(self, observed: Tick) -> None:
        """The live run's tracker, over the recording: the same outages and stalls."""
        for change in self.tracker.observe(observed):
            if change.kind == "recovery" and change.outage is not None:
                self.outages.append(Outage.of_client(change.outage, self.start_time or 0.0,
                                                     ongoing=False))
            elif change.kind == "stall" and change.level != "info":
                self.stall_count += 1
                if len(self.stalls) < STALL_LIST_MAX:
                    self.stalls.append(Stall(
                        start=change.t, start_rel=round(change.t - (self.start_time or 0), 3),
                        end=None, stalled=observed.stalled, in_flight=observed.in_flight,
                        message=change.message))
            elif change.kind == "stall" and self.stalls and self.stalls[-1].end is None:
                self.stalls[-1].end = change.t

    def _server_outage(self, snap: Snapshot, rel: float, failed: int, uncovered: float) -> None:
        srv = snap.server
        if srv is None:
            return
        cur = self._metrics_down
        if srv.ok:
            self._server_seen_ok = True
            if cur is not None:
                self._metrics_down = None
                self._keep_server(cur, ongoing=False)
        elif self._server_seen_ok:
            if cur is None:
                cur = self._metrics_down = OpenSpan(snap.t - snap.interval, rel - snap.interval,
                                                 snap.t, reason=srv.error)
            elif uncovered > GAP_EPSILON_S:
                cur.gap_s += uncovered  # a recording gap: not time /metrics was seen down
            cur.last_end = snap.t
            cur.covered_s += snap.interval
            cur.failed += failed
        else:
            self.server_never_ok_reason = srv.error or "no answer"

    def _keep_server(self, cur: OpenSpan, ongoing: bool) -> Outage | None:
        """The /metrics span as a server outage, if it was held long enough to be one."""
        if cur.covered_s < OUTAGE_MIN_S - 1e-9:
            return None
        o = Outage(kind="server", start=cur.start, end=cur.last_end,
                   start_rel=round(cur.start_rel, 3), ongoing=ongoing, failed=cur.failed,
                   errors=cur.errors, reason=cur.reason, gap_s=round(cur.gap_s, 3))
        if not ongoing:
            self.outages.append(o)
        return o

    def _ongoing(self) -> list[Outage]:
        out = []
        if self.tracker.announced and self.tracker.current is not None:
            out.append(Outage.of_client(self.tracker.current, self.start_time or 0.0,
                                        ongoing=True))
        if self._metrics_down is not None:
            kept = self._keep_server(self._metrics_down, ongoing=True)
            if kept is not None:
                out.append(kept)
        return out

    def _note_trouble(self, start: float, end: float, ok: int, failed: int) -> None:
        """Ticks of trouble wait until it is over: only then is it known which of them were
        inside an outage (an outage is dated back to the start of its quiet span)."""
        if self.tracker.quiet_since is not None or self._metrics_down is not None:
            self._trouble.extend((start, end, float(ok), float(failed)))
        elif self._trouble:
            ok_in, failed_in = self._inside_outages(self.outages)
            self._fault_ok += ok_in
            self._fault_failed += failed_in
            self._trouble = array("d")

    def _inside_outages(self, outages: list[Outage]) -> tuple[int, int]:
        """(ok, failed) of the pending trouble ticks that lie inside one of `outages`."""
        ticks = np.frombuffer(self._trouble, np.float64).reshape(-1, 4)
        if len(ticks) == 0:
            return 0, 0
        inside = np.zeros(len(ticks), bool)
        for o in outages:
            if o.end >= ticks[0, 0]:
                inside |= (ticks[:, 0] >= o.start - GAP_EPSILON_S) & \
                    (ticks[:, 1] <= o.end + GAP_EPSILON_S)
        return int(ticks[inside, 2].sum()), int(ticks[inside, 3].sum())

    def _drift(self, snap: Snapshot, decoded: dict, ok: int, failed: int, out_tok: int,
               loading: bool) -> None:
        if not loading:
            return
        # buckets of load time from the measured start: the first one whole, only the last
        # one may be partial; a tick goes by its middle (its ends jitter about a boundary)
        start = self.span.start.elapsed if self.span.start is not None else 0.0
        index = int(max(0.0, snap.elapsed - snap.interval / 2 - start) // self.bucket_s)
        b = self._bucket
        if b is not None and b["index"] != index:
            self._finish_bucket()
            b = None
        if b is None:
            b = self._bucket = {
                "index": index, "start": start + index * self.bucket_s, "seconds": 0.0,
                "ok": 0, "failed": 0, "output_tokens": 0,
                "dense": {m: np.zeros(hdr.COUNTS_LEN, np.int64) for m in TICK_METRICS},
                "rss": [], "gpu": [],
            }
        b["seconds"] += snap.interval
        b["ok"] += ok
        b["failed"] += failed
        b["output_tokens"] += out_tok
        for m in TICK_METRICS:
            if m in decoded:
                b["dense"][m] += decoded[m]
        if snap.process is not None and snap.process.rss_bytes is not None:
            b["rss"] = [snap.process.rss_bytes / 1e6]  # the last value of the bucket
        used = [g.memory_used_bytes for g in snap.gpu.gpus if g.memory_used_bytes is not None]
        if used:
            b["gpu"] = [sum(used) / 1e6]

    def _finish_bucket(self) -> None:
        b = self._bucket
        if b is None:
            return
        self._bucket = None
        n = b["ok"] + b["failed"]
        secs = b["seconds"]
        stats = {m: _tick_stats(b["dense"][m]) for m in TICK_METRICS}
        self.buckets.append(Bucket(
            index=b["index"], start_elapsed_s=round(b["start"], 3),
            seconds=round(secs, 3),
            partial=True if secs < FULL_BUCKET * self.bucket_s else msgspec.UNSET,
            ttft=stats["ttft"], itl=stats["itl"],
            output_tok_s=_r(b["output_tokens"] / secs if secs > 0 else None, 1),
            req_s=_r(b["ok"] / secs if secs > 0 else None, 3),
            error_rate=_r(b["failed"] / n if n else None, 6),
            server_rss_mb=_r(b["rss"][0] if b["rss"] else None, 1),
            gpu_mem_mb=_r(b["gpu"][0] if b["gpu"] else None, 1)))

    def _tail_candidate(self, snap: Snapshot, rel: float, metric: str, st: tuple) -> None:
        count, _p50, p99, p999, mx = st
        # keep the worst ticks by max (the limit is only known at the end); bounded heap
        item = TailInterval(
            t=snap.t, rel=round(rel, 3), elapsed=round(snap.elapsed, 3), seq=snap.seq,
            metric=metric, count=count, p99_ms=_ms(p99), p99_9_ms=_ms(p999), max_ms=_ms(mx),
            in_flight=snap.load.in_flight,
            server_waiting=snap.server.waiting if snap.server and snap.server.ok else None)
        self._tail_seq += 1
        key = (mx, self._tail_seq, item)
        if len(self._tail) < 20 * TAIL_LIST_MAX:
            heapq.heappush(self._tail, key)
        elif mx > self._tail[0][0]:
            heapq.heapreplace(self._tail, key)

    # ---- results ---------------------------------------------------------------------------

    def _median_p99(self, metric: str) -> float | None:
        counts = self._p99_of_ticks[metric]
        total = int(counts.sum())
        if total == 0:
            return None
        return float(hdr.value_at_percentile(np.cumsum(counts), total, 50.0))

    def tail_limits(self) -> dict[str, float | None]:
        out = {}
        for m in TICK_METRICS:
            if m in self.tail_abs_us:
                out[m] = self.tail_abs_us[m]
            else:
                med = self._median_p99(m)
                out[m] = None if med is None else self.tail_k * med
        return out

    def long_tail(self) -> tuple[list[TailInterval], dict[str, int]]:
        limits = self.tail_limits()
        rows: list[TailInterval] = []
        counts: dict[str, int] = {}
        for _mx, _seq, item in self._tail:
            limit = limits.get(item.metric)
            if limit is None:
                continue
            worst = max(v for v in (item.p99_9_ms, item.max_ms) if v is not None)
            if worst * 1e3 > limit:
                # a copy: the heap's item stays as it was for a later result()
                rows.append(msgspec.structs.replace(item, limit_ms=_ms(limit),
                                                    x_limit=round(worst * 1e3 / limit, 2)))
                counts[item.metric] = counts.get(item.metric, 0) + 1
        # the full count needs the per-tick series (the heap keeps the worst only)
        if self.keep_series:
            for m in TICK_METRICS:
                limit = limits.get(m)
                if limit is None:
                    continue
                p999 = np.frombuffer(self.series[f"{m}_p999"], np.float32)
                mx = np.frombuffer(self.series[f"{m}_max"], np.float32)
                counts[m] = int(np.count_nonzero((np.nan_to_num(p999) > limit)
                                                 | (np.nan_to_num(mx) > limit)))
        rows.sort(key=lambda r: r.t)
        rows = sorted(rows, key=lambda r: -r.x_limit)[:TAIL_LIST_MAX]
        rows.sort(key=lambda r: r.t)
        for r in rows:
            r.context = self._context(r.t)
        return rows, counts

    def _context(self, t: float) -> list[str]:
        """The events nearest the tick ending at `t` (within CONTEXT_S), each with when it
        happened from that end: an error is dated when it happened (its worker's stamp), so
        the second it is cited at is its own."""
        near = sorted((e for e in self.events if abs(e.t - t) <= CONTEXT_S),
                      key=lambda e: abs(e.t - t))
        out = [f"{e.kind} at {e.t - t:+.1f} s: {e.message}"
               for e in sorted(near[:3], key=lambda e: e.t)]
        for o in self.outages:
            if o.start - CONTEXT_S <= t <= o.end + CONTEXT_S:
                out.append(f"near a {o.kind} outage ({o.duration_s:.1f} s)")
        return out

    def result(self) -> dict:
        """Everything, as plain JSON-able values (ms for latencies, MB for memory)."""
        return msgspec.to_builtins(self.analysis())

    def analysis(self) -> SoakResult:
        """Everything so far, typed; more Snapshots may come after."""
        last = self.last
        if self._bucket is not None:
            bucket = self._bucket
            self._finish_bucket()
            self._bucket = bucket  # keep accumulating if more Snapshots come
            finished = self.buckets.pop()
        else:
            finished = None
        buckets = self.buckets + ([finished] if finished else [])
        outages = self.outages + self._ongoing()
        pending_ok, pending_failed = self._inside_outages(outages)
        fault_ok, fault_n = self._fault_ok + pending_ok, self._fault_ok + pending_ok \
            + self._fault_failed + pending_failed
        outages.sort(key=lambda o: o.start)
        c = last.counters if last else Counters()
        measured_ok, measured_failed = self._measured_requests()
        n = measured_ok + measured_failed
        latency, rates, seconds = self.run_summary()
        ends = self._measured()
        covered = self.tracker.covered_s
        availability = _r(1.0 - self.tracker.outage_s / covered if covered > 0 else None, 6)
        # the stability thresholds judge the client's outages, as the run's summary does
        stability = {"availability": availability,
                     "outages": sum(1 for o in outages if o.kind == "client")}
        thresholds = evaluate_thresholds(self.slos.thresholds, latency, rates | stability) \
            if self.slos else []
        tail, tail_counts = self.long_tail()
        return SoakResult(
            run_id=last.run_id if last else None,
            start_time=self.start_time,
            last_t=last.t if last else None,
            wall_s=round(last.t - self.start_time, 3) if last and self.start_time else 0.0,
            elapsed_s=round(last.elapsed, 3) if last else 0.0,
            measured_s=round(seconds, 3),
            measured_from=ends[0].t if ends else None,
            measured_to=ends[1].t if ends else None,
            ticks=self.ticks,
            state=last.load.state if last else None,
            target=RunTarget(url=last.target.url, model=last.target.model,
                             simulated=last.target.simulated) if last else None,
            requests=Requests(ok=c.requests_ok, failed=c.requests_failed,
                              cancelled=c.requests_cancelled, errors=dict(c.errors),
                              output_tokens=c.output_tokens, input_tokens=c.input_tokens),
            # after warm-up and before the drain, like the thresholds and the summary
            # (requests above are the whole run's)
            measured_requests=Measured(ok=measured_ok, failed=measured_failed),
            drain=self._drain(),
            success_rate=_r(measured_ok / n if n else None, 6),
            success_rate_during_outages=_r(fault_ok / fault_n if fault_n else None, 6),
            outages=as_events(outages),
            outage_events=len(union([(o.start, o.end) for o in outages])),
            mttr_s=self._mttr(outages),
            outage_s=round(self.tracker.outage_s, 3),
            availability=availability,
            stalls=Stalls(count=self.stall_count, episodes=list(self.stalls)),
            server_metrics_never_answered=None if self._server_seen_ok
            else self.server_never_ok_reason,
            gaps=list(self.gaps),
            latency_ms={m: {k: (v if k == "count" or v is None else round(v / 1e3, 3))
                            for k, v in s.items()} for m, s in latency.items()},
            rates=Rates(**{k: _r(v, 6) for k, v in rates.items()}),
            thresholds=[ThresholdResult(**t) for t in thresholds],
            thresholds_passed=all(t["passed"] for t in thresholds) if thresholds else None,
            drift=self._drift_result(buckets),
            long_tail=LongTail(
                limits_ms={m: _ms(v) for m, v in self.tail_limits().items()},
                rule="absolute" if self.tail_abs_us
                else f"{self.tail_k:g}x the median per-tick P99",
                counts=tail_counts, intervals=tail),
            event_counts=dict(self.event_counts),
            # in the order they happened (a tick's error batch may be dated before the
            # previous tick's events: each error is dated when it happened)
            events=sorted(self.events, key=lambda e: e.t)[-200:],
        )

    def _mttr(self, outages: list[Outage]) -> Mttr:
        def mean(kind: str) -> float | None:
            closed = [o.duration_s for o in outages if o.kind == kind and not o.ongoing]
            return round(sum(closed) / len(closed), 3) if closed else None

        spans = union([(o.start, o.end) for o in outages if not o.ongoing])
        union_mean = round(sum(e - s - self._gap_within(s, e) for s, e in spans)
                           / len(spans), 3) if spans else None
        return Mttr(client=mean("client"), server=mean("server"), any=union_mean)

    def _measured(self) -> tuple[Point, Point] | None:
        """The measured window's ends (RunSpan: warm-up's end → the drain's start); None
        while nothing is measured yet (no Snapshot, or still in warm-up)."""
        last, start, end = self.last, self.span.start, self.span.end
        if last is None or last.load.warmup or start is None or end is None:
            return None
        return start, end

    def _measured_requests(self) -> tuple[int, int]:
        """(ok, failed) over the measured window: what the success rate is of."""
        ends = self._measured()
        if ends is None:
            return 0, 0
        a, b = ends[0].counters, ends[1].counters
        return b.requests_ok - a.requests_ok, b.requests_failed - a.requests_failed

    def _drain(self) -> DrainCounts | None:
        """What came after the drain began (the summary's `drain`); None before one."""
        end, last = self.span.end, self._last_point
        if self._measured() is None or last is None or end is None or end is last:
            return None
        return DrainCounts(**drain_counts(end, last))

    def _gap_within(self, start: float, end: float) -> float:
        """Seconds of recording gaps inside [start, end]: not outage time."""
        return sum(max(0.0, min(end, g.end) - max(start, g.start)) for g in self.gaps)

    def run_summary(self) -> tuple[dict[str, dict], dict, float]:
        """Whole-run latency summaries (µs: after warm-up, the drain's requests in them), and
        the rates and seconds of the measured window (after warm-up, before the drain), as
        the run's summary has them."""
        latency = {m: dict(hdr.summarize(d)) for m, d in self.run_dense.items()}
        ends = self._measured()
        if ends is None:
            return latency, rates_from(0, 0, 0, 0, 0.0), 0.0
        (a, b), seconds = (ends[0].counters, ends[1].counters), ends[1].elapsed - ends[0].elapsed
        rates = rates_from(b.requests_ok - a.requests_ok, b.requests_failed - a.requests_failed,
                           b.requests_good - a.requests_good, b.output_tokens - a.output_tokens,
                           seconds)
        return latency, rates, seconds

    def _drift_result(self, buckets: list[Bucket]) -> Drift:
        # only whole buckets are compared: a partial one (the run's last, cut by the drain)
        # is a few seconds' figures, and would read as drift
        full = [b for b in buckets if b.partial is not True]
        first = full[0] if full else None
        rows = []
        for b in buckets:
            row = msgspec.structs.replace(b)  # a copy: the kept bucket has no vs_first
            if first is not None and b is not first and b.partial is not True:
                vs = {}
                for m in TICK_METRICS:
                    a, x = getattr(first, m), getattr(b, m)
                    vs[f"{m}_p99"] = _ratio(x.p99_ms, a.p99_ms)
                    vs[f"{m}_p99.9"] = _ratio(x.p99_9_ms, a.p99_9_ms)
                vs["output_tok_s"] = _ratio(b.output_tok_s, first.output_tok_s)
                row.vs_first = vs
            rows.append(row)
        return Drift(bucket_s=self.bucket_s, buckets=rows, server_rss=self.rss.record(),
                     gpu_memory=self.gpu_mem.record(),
                     throughput_change=_ratio(full[-1].output_tok_s, first.output_tok_s)
                     if first is not None and len(full) > 1 else None)


def _tick_stats(dense: np.ndarray) -> TickStats:
    count, p50, p99, p999, mx = quick_stats(dense)
    return TickStats(count=count, p50_ms=_ms(p50), p99_ms=_ms(p99), p99_9_ms=_ms(p999),
                     max_ms=_ms(mx))


def _ratio(x: float | None, a: float | None) -> float | None:
    if x is None or a is None or a == 0:
        return None
    return round(x / a, 3)


def _ms(us: float | None) -> float | None:
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return None
    return round(us / 1e3, 3)


def _nan(x: float | None) -> float:
    return NAN if x is None else float(x)


def analyze(snapshots, **kw) -> dict:
    a = SoakAnalyzer(**kw)
    for snap in snapshots:
        a.add(snap)
    return a.result()
