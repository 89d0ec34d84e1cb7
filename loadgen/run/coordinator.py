"""One run: workers, probes and the tick that turns them into Snapshots.

The coordinator starts the embedded simulator when there is no target, checks
the target, starts the worker processes and the probes, and then once per
tick asks every worker for its interval, merges the interval histograms and
counters, adds the latest probe samples and the events, and yields a
Snapshot. What the load is set to, and when the run stops, is the Steering's
(loadgen.run.steering): control messages (from keys, the CLI or MQTT), ramps,
the auto-ramp and the stop policy change the load between ticks, so a change
shows in the next Snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import NamedTuple
from urllib.parse import urlsplit

import aiohttp
import msgspec
import numpy as np

from loadgen.model import client_lag, hdr
from loadgen.model.kinds import EventKind, Level
from loadgen.model.notice import OPERATOR_STOP
from loadgen.model.outage import OutageTracker, Stalled, Tick
from loadgen.model.snapshot import (
    METRICS,
    ClassTick,
    ClientSample,
    Control,
    Counters,
    Event,
    GpuStatus,
    LoadState,
    ProcessSample,
    ServerMetrics,
    Snapshot,
    Target,
)
from loadgen.run.config import ConfigError, RunConfig, default_workers
from loadgen.run.embedded_sim import EmbeddedSim, SimStartError
from loadgen.run.heap import HeapTrimmer
from loadgen.run.pool import WorkerPool
from loadgen.run.preflight import TargetError, check_url, resolve_lengths, resolve_model
from loadgen.run.resume import ResumeFrom
from loadgen.run.secrets import Secrets
from loadgen.run.steering import Steering, TraceProgress
from loadgen.sim.presets import describe
from loadgen.worker import wire
from loadgen.worker.limits import (
    FD_MARGIN,
    one_blas_thread,
    raise_open_file_limit,
    streams_that_fit,
)
from probes.gpu import GpuProbe
from probes.host import HostProbe
from probes.process import ProcessProbe, local_port
from probes.server_metrics import ServerMetricsProbe, metrics_url_for

log = logging.getLogger("tokentop.coordinator")

PROBE_PERIOD_S = 1.0
ERROR_EVENT_EVERY_S = 5.0  # one event per error kind at most this often, with the count
TRACE_TICK_AFTER_S = 0.02  # a tick this soon after a trace's last entry: its window's end


class Merged(NamedTuple):
    """One tick's worker reports, merged."""

    dense: dict[str, np.ndarray]  # metric -> this tick's histogram (dense counts, µs)
    lag_ms: float | None  # the worst event-loop lag of any worker (None: none reported)


class Coordinator:
    def __init__(
        self, cfg: RunConfig, secrets: Secrets | None = None, resume: ResumeFrom | None = None
    ) -> None:
        self.cfg = cfg
        self.parsed = cfg.parsed()  # raises ConfigError before anything starts
        self.secrets = secrets or Secrets()
        self.resume = resume
        self.run_id = resume.run_id if resume else uuid.uuid4().hex[:12]
        self.sim: EmbeddedSim | None = None
        self.pool = WorkerPool(cfg.workers or default_workers())
        self.steer = Steering(cfg, self.parsed, self.pool.set_load,
                              lambda kind, message: self._event(kind, message))
        self.state = "starting"
        self.target: Target | None = None
        # a resumed run carries its totals on, so cumulative counters never go backwards
        self.counters = (
            msgspec.structs.replace(resume.counters, errors=dict(resume.counters.errors))
            if resume else Counters()
        )
        # --mix: each class's totals, by name in the mix's order (carried on by a resume)
        before = resume.class_counters if resume else {}
        self.class_counters = {c.name: _copy(before[c.name]) if c.name in before
                               else Counters() for c in self.parsed.mix}
        self._class_hist: dict[str, dict[str, str]] = {}
        self._class_dense = np.zeros(hdr.COUNTS_LEN, np.int64)  # one kept, as _tick_dense's
        self._events: list[Event] = []
        self._in_flight: dict[int, int] = {}
        self._backlog: dict[int, int] = {}
        self._worker_cpu: dict[int, float] = {}
        self._stop_requested = asyncio.Event()
        self._stop_reason: str | None = None
        self._grace: float | None = None  # a stop's own drain grace (None: --drain-grace)
        self._drain_grace = 0.0  # the grace the drain under way was given
        self._cut_short = False  # the operator made the stop immediate (a second Ctrl-C)
        self._drain: asyncio.Task | None = None
        self._server: ServerMetrics | None = None
        self._gpu = GpuStatus(message="GPU probe not started yet")
        self._process: ProcessSample | None = None
        self._probe_task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self._last_error_event: dict[str, float] = {}
        # per error kind, what is held back for its next event: (count, the last message,
        # when that last error happened: unix seconds, the worker's own stamp)
        self._pending_errors: dict[str, tuple[int, str, float]] = {}
        self._reported_failures: set[str] = set()
        self._client = client_lag.ClientWatch()
        # per worker: its last report's stalled streams, and of those the first-token waits
        self._stalled: dict[int, Stalled] = {}
        self._outages = OutageTracker()  # health, outages and stalls (loadgen.model.outage)
        # a tick's merged histograms, one kept array a metric: a fresh 184 KB one a metric a
        # tick fragments a long run's heap (whoever is handed them must copy what it keeps)
        self._tick_dense: dict[str, np.ndarray] = {}
        self._heap = HeapTrimmer()  # a long run's freed C heap goes back to the system
        span = self.parsed.trace_span
        self.trace = TraceProgress(span, cfg.trace_speed) if span is not None else None

    # ---- start -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start everything; raises TargetError with a message for the user."""
        try:
            await self._start()
        except (SimStartError, ConfigError) as e:
            await self.close()
            raise TargetError(str(e)) from None
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        cfg = self.cfg
        self._check_open_files()
        self._session = aiohttp.ClientSession()
        if cfg.url is None:
            self.sim = EmbeddedSim(cfg.embedded_sim())
            base = await self.sim.start()
        else:
            base = check_url(cfg.url)
        headers = self.secrets.other_headers()
        model = await resolve_model(self._session, base, cfg.model,
                                    self.secrets.authorization(), headers)
        # --tokenizer: a local one, the server's /tokenize, or approx. (before any load)
        self.lengths = await resolve_lengths(self._session, base, model, cfg.tokenizer,
                                             self.secrets.authorization(), headers)
        self.target = Target(url=base, model=model, api=cfg.api, simulated=self.sim is not None,
                             lengths=self.lengths.source, about=self._about())
        self.host = HostProbe()
        root = base.removesuffix("/v1")
        self.gpu = await GpuProbe.create(root, self._session)
        metrics_url = cfg.metrics_url or metrics_url_for(base)
        # a token of its own for /metrics (--metrics-token-file); else the API key, but only
        # on the target's own origin, never sent to another host
        same_origin = urlsplit(metrics_url)[:2] == urlsplit(base)[:2]
        own = self.secrets.metrics_token
        auth = f"Bearer {own}" if own else (self.secrets.authorization() if same_origin else None)
        self.server_probe = ServerMetricsProbe(metrics_url, self._session, authorization=auth)
        self.process_probe = self._process_probe(base)
        await self._sample_probes()
        self._probe_task = asyncio.create_task(self._probe_loop())
        await self._start_workers(base, model)
        self.steer.begin()
        self.state = "running"
        workload = self.parsed.workload(cfg, model, self.lengths)
        self._event("run", f"run started: {self.steer.load_text()}{self.steer.stagger_text()}; "
                    f"{workload.describe()}; model {model}; {self.lengths.note}")

    def _about(self) -> str | None:
        """The embedded simulator in words (profile, slots, KV budget, faults at start), the
        same words `tokentop sim` says; None for a real server."""
        if self.sim is None:
            return None
        return f"simulator, {describe(self.sim.config, self.cfg.sim_profile())}"

    def _check_open_files(self) -> None:
        """Raise the open-file limit (the workers inherit it) and refuse, before any load, a
        start that cannot fit under it: one socket a stream, in each worker."""
        limit = raise_open_file_limit()
        n = self.pool.n
        spec = self.steer.spec
        if spec.mode == "closed":
            streams = spec.concurrency
            per_worker = -(-streams // n)  # the first workers take the remainder
            where, more = f"each of the {n} load worker(s)", "add --workers, "
        else:
            # an in-flight cap is one queue: the whole open-loop schedule runs in one worker
            # (loadgen.run.pool), so all of it must fit there
            streams = per_worker = spec.max_in_flight or 0
            where, more = "the one load worker that holds an in-flight cap", ""
        if per_worker > streams_that_fit(limit):
            raise ConfigError(
                f"{streams} streams need about {per_worker + FD_MARGIN} open files in {where}, "
                f"and this machine allows {limit} (ulimit -n): lower the load, {more}or "
                "raise the hard limit")

    def _process_probe(self, base: str) -> ProcessProbe:
        """The server's process: the embedded simulator's, or by --server-pid, the local
        port of the URL, or --server-name."""
        cfg = self.cfg
        if self.sim is not None and self.sim.proc is not None:
            return ProcessProbe(pid=self.sim.proc.pid)
        return ProcessProbe(pid=cfg.server_pid, port=local_port(base), name=cfg.server_name)

    async def _start_workers(self, base: str, model: str) -> None:
        cfg = self.cfg
        workload = self.parsed.workload(cfg, model, self.lengths)
        # the credential goes down each worker's control pipe, never into its environment
        # (where `ps e` would show it)
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        one_blas_thread(env)  # a worker imports numpy: see loadgen.worker.limits
        n = self.pool.n
        configure = [
            wire.Configure(
                index=i, base_url=base, workload=workload, request_timeout=cfg.request_timeout,
                client=cfg.client, slo=self.parsed.slo, cancelling=self.parsed.cancelling,
                max_requests=None if cfg.max_requests is None
                else cfg.max_requests // n + (1 if i < cfg.max_requests % n else 0),
                calibrate=cfg.calibrate, authorization=self.secrets.authorization(),
                headers=self.secrets.other_headers(), trace=cfg.trace, stagger=cfg.stagger,
            )
            for i in range(n)
        ]
        await self.pool.start(configure, env)

    # ---- control -------------------------------------------------------------------------

    @property
    def spec(self):
        """The load as it is set now (loadgen.worker.wire.LoadSpec)."""
        return self.steer.spec

    @property
    def auto(self):
        """The auto-ramp under way (loadgen.run.auto_ramp.AutoRamp), else None."""
        return self.steer.auto

    async def control(self, msg: Control) -> None:
        if self.state not in ("running", "paused"):
            if msg.op == "stop":
                self.request_stop()
            return
        op = msg.op
        if op in ("pause", "resume"):
            state = "paused" if op == "pause" else "running"
            if state != self.state:  # a second pause would restart nothing but the clock
                self.pool.pause(op == "pause")
                self.state = state
                self._event("operator", f"load {self.state} ({msg.source})")
        elif op == "stop":
            self.request_stop(OPERATOR_STOP)
        elif op == "mark":
            self._event("operator", f"mark: {msg.note or ''}".strip())
        else:
            self.steer.control(msg, paused=self.state == "paused")

    def request_stop(self, reason: str | None = None, *, grace: float | None = None) -> None:
        """Stop at the next tick; `grace`: this stop's drain, shorter than --drain-grace (a
        second signal, a console gone): the first reason is kept, the shortest grace."""
        if self._stop_reason is None:
            self._stop_reason = reason
        if grace is not None:
            self._grace = grace if self._grace is None else min(self._grace, grace)
        self._stop_requested.set()

    def cut_drain_short(self) -> None:
        """A drain under way ends now: every worker cancels what it still has in flight (a
        second Stop, with no grace), and reports as ever."""
        self._cut_short = True
        if self.state == "draining":
            for worker in self.pool.workers:
                worker.send(wire.Stop(0.0))

    # ---- the tick ------------------------------------------------------------------------

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        """One Snapshot per tick until the run has stopped and drained (the last says 'stopped')."""
        tick = self.cfg.tick
        t0_wall, t0 = time.time(), time.monotonic()
        next_tick = t0 + tick
        last_tick = t0
        seq = self.resume.seq if self.resume else 0
        # elapsed counts on from the resumed run's last Snapshot; the gap itself is not load
        offset = self.resume.elapsed if self.resume else 0.0
        if self.resume:
            self._event("resume", f"resumed run {self.run_id} after a gap; numbering continues "
                        f"at seq {seq}", level="warn")
        if self.trace is not None:
            self.trace.mark(t0)
        while True:
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
            elapsed = time.monotonic() - t0
            self._advance(elapsed)
            reports = await self.pool.collect(seq, timeout=tick * 0.6)
            now = time.monotonic()
            if self._drain is not None and self._drain.done():
                reports += self.pool.drain_reports()
                self.state = "stopped"
            t, elapsed, interval = t0_wall + (now - t0), offset + now - t0, now - last_tick
            merged = self._merge(reports, t, interval)
            # the auto-ramp judges its step on what this tick measured, beside the stop policy
            self.steer.track(t, self.counters)
            self.steer.after_tick(elapsed, merged.dense, self.counters,
                                  running=self.state == "running")
            self._end_trace(now)
            snap = self._snapshot(seq, t, elapsed, interval, merged)
            last_tick = now
            seq += 1
            yield snap
            if self.state == "stopped":
                return
            self._heap.maybe_trim()  # between ticks, at most once a minute
            next_tick = self._trace_tick(next_tick + tick)
            if next_tick < time.monotonic():  # we fell behind: skip, do not burst
                next_tick = time.monotonic() + tick

    def _advance(self, elapsed: float) -> None:
        """Once a tick, before collecting: warm-up, ramps, limits."""
        self.steer.elapsed = elapsed
        if self._drain is not None:
            return
        self.steer.advance(elapsed, running=self.state == "running")
        reason = self._stop_due(elapsed)
        if reason is not None:
            self.request_stop(reason)
        if self._stop_requested.is_set():
            self._begin_drain()

    def _stop_due(self, elapsed: float) -> str | None:
        reason = self.steer.stop_due(elapsed, self.counters)
        if reason is not None:
            return reason
        if self.pool.workers and self.pool.alive == 0:
            return "every load worker has exited"
        return None

    def _end_trace(self, now: float) -> None:
        """--trace: once every entry is sent (by this tick's reports), the drain begins in
        this tick, so the run's window is the trace's span / speed; what is still in flight
        finishes in the drain, counted there as any run's."""
        trace = self.trace
        if trace is None:
            return
        trace.mark(now)
        if self.state != "running" or self._drain is not None:
            return
        if trace.done(self.pool.trace_time(time.perf_counter()), sum(self._backlog.values())):
            self.request_stop("trace done")
            self._begin_drain()

    def _trace_tick(self, next_tick: float) -> float:
        """The next tick's time: just after a trace's last entry is due when that comes
        first, so the window ends with the trace and not up to a tick after it."""
        trace = self.trace
        if trace is None or self.state != "running":
            return next_tick
        left = trace.seconds_left(self.pool.trace_time(time.perf_counter()))
        if left <= 0:
            return next_tick
        return min(next_tick, time.monotonic() + left + TRACE_TICK_AFTER_S)

    def _begin_drain(self) -> None:
        self.state = "draining"
        reason = self._stop_reason or "stop requested"
        grace = self.cfg.drain_grace if self._grace is None else min(self._grace,
                                                                     self.cfg.drain_grace)
        self._drain_grace = grace
        self._cut_short = self._cut_short or grace == 0
        self._event("run", f"stopping ({reason}): in-flight requests get {grace:g} s to finish")
        self._drain = asyncio.create_task(self.pool.stop(grace))

    def _merge(self, reports: list[wire.Report], t: float, interval: float) -> Merged:
        """The workers' intervals into the run's counters and one histogram a metric, and
        what they show: outages, errors, a saturated client, a worker that died."""
        sparse: dict[str, list] = {m: [] for m in METRICS}
        lag = 0.0
        tick = Counters()
        for r in reports:
            tick.add(r.counters)
            self.counters.add(r.counters)
            self._in_flight[r.index] = r.in_flight
            self._backlog[r.index] = r.backlog
            self._stalled[r.index] = Stalled(r.stalled, r.stalled_first)
            if self.trace is not None:
                self.trace.report(r.index, r.trace_sent, r.trace_total)
            for m, h in r.hists.items():
                if m in sparse:
                    sparse[m].append(h.arrays())
            self._worker_cpu[r.index] = 100.0 * r.cpu_s / interval if interval > 0 else 0.0
            lag = max(lag, r.loop_lag_ms)
            self._note_errors(r)
        self._merge_classes(reports)
        self._track_outage(t, interval, tick)
        # the last tick says every error still held back, so the events add up to the totals
        self._flush_error_events(t, everything=self.state == "stopped")
        for failure in self.pool.failures():
            if failure not in self._reported_failures:
                self._reported_failures.add(failure)
                self._event("error", failure, level="error")
        dense = {m: hdr.dense_from_sparse(p, out=self._tick_dense.get(m))
                 for m, p in sparse.items() if p}
        self._tick_dense.update(dense)
        self._check_client(lag if reports else None, dense.get("itl"))
        return Merged(dense, lag if reports else None)

    def _merge_classes(self, reports: list[wire.Report]) -> None:
        """Each class's part of the workers' reports (--mix): its totals, and its tick's
        histograms encoded at once (one kept array for them all)."""
        self._class_hist = {}
        scratch = self._class_dense
        for i, (name, total) in enumerate(self.class_counters.items()):
            sparse: dict[str, list] = {}
            for r in reports:
                if i < len(r.classes):
                    part = r.classes[i]
                    total.add(part.counters)
                    for m, h in part.hists.items():
                        sparse.setdefault(m, []).append(h.arrays())
            self._class_hist[name] = {m: hdr.encode(hdr.dense_from_sparse(p, out=scratch))
                                      for m, p in sparse.items() if m in METRICS}

    def _snapshot(self, seq: int, t: float, elapsed: float, interval: float,
                  merged: Merged) -> Snapshot:
        """The tick as every consumer reads it; its events are all this tick raised."""
        hist = {m: hdr.encode(d) for m, d in merged.dense.items()}
        events, self._events = self._events, []
        # in the order they happened: an error batch dated before the outage change that
        # followed it, an event from beside the run (note) at its own time
        events.sort(key=lambda e: e.t)
        assert self.target is not None
        measured = merged.lag_ms is not None  # some worker reported this tick
        cpu = [self._worker_cpu.get(i, 0.0) for i in range(self.pool.n)]
        return Snapshot(
            run_id=self.run_id,
            seq=seq,
            t=t,
            elapsed=elapsed,
            interval=interval,
            target=self.target,
            load=self._load_state(),
            counters=self._counters_now(),
            hist=hist,
            server=self._server,
            gpu=self._gpu,
            host=self.host.sample(),
            process=self._process,
            client=ClientSample(
                workers=self.pool.alive,
                cpu_pct=sum(cpu) if measured else None,
                worker_cpu_pct=cpu if measured else None,
                loop_lag_ms=merged.lag_ms,
            ),
            events=events,
            classes={name: ClassTick(counters=_copy(c), hist=self._class_hist.get(name, {}))
                     for name, c in self.class_counters.items()},
        )

    def _counters_now(self) -> Counters:
        return _copy(self.counters)

    def _load_state(self) -> LoadState:
        s = self.steer.spec
        open_loop = s.mode == "open"
        arrival = None
        if open_loop:
            arrival = f"gamma(k={s.shape:g})" if s.arrival == "gamma" else s.arrival
        trace = self.trace
        return LoadState(
            mode=s.mode,
            state=self.state,
            target_concurrency=s.concurrency,
            # a trace's rate is what it sends (its --rate is an unused default)
            target_rate=(trace.rate() if trace is not None else s.rate) if open_loop else None,
            arrival="trace" if trace is not None else arrival,
            max_in_flight=s.max_in_flight if open_loop else None,
            in_flight=sum(self._in_flight.values()),
            backlog=sum(self._backlog.values()),
            warmup=self.steer.warming_up,
            stalled=sum(s.stalled for s in self._stalled.values()),
            stalled_first=sum(s.stalled_first for s in self._stalled.values()),
            health=self._outages.health,
            outage_since=self._outages.outage_since,
            note=self.steer.note(running=self.state == "running"),
            **self._trace_state(),
        )

    def _trace_state(self) -> dict:
        """LoadState's trace fields: entries sent of all, the trace's clock and span."""
        trace = self.trace
        if trace is None:
            return {}
        return {"trace_sent": trace.sent, "trace_total": trace.total, "trace_span": trace.span,
                "trace_time": round(min(self.pool.trace_time(time.perf_counter()), trace.span),
                                    3)}

    def _track_outage(self, t: float, interval: float, tick: Counters) -> None:
        """Outages, stalls and health by loadgen.model.outage's one definition (the soak
        report replays the same tracker over the recording); what it sees start or end is
        an event: outage (why, in words), recovery (with MTTR), stall."""
        stalled = self._stalled.values()
        observed = Tick.of(t, interval, tick, in_flight=sum(self._in_flight.values()),
                           stalled=sum(s.stalled for s in stalled),
                           stalled_first=sum(s.stalled_first for s in stalled),
                           server=self._server)
        changes = self._outages.observe(observed)
        if changes:
            # the errors held back happened before this change: said first, never after
            # the recovery that followed them
            self._flush_error_events(t, everything=True)
        for change in changes:
            self._event(change.kind, change.message, level=change.level, **change.payload())

    def _check_client(self, lag_ms: float | None, itl: np.ndarray | None) -> None:
        """Say when the client itself threatens the numbers (loadgen.model.client_lag: lag
        against this tick's median inter-token latency, while requests are in flight)."""
        summary = hdr.summarize(itl, (50.0,)) if itl is not None else None
        p50 = summary["p50"] if summary is not None else None
        verdict = client_lag.judge(lag_ms, sum(self._in_flight.values()),
                                   None if p50 is None else p50 / 1000.0)
        busy = sum(1 for pct in self._worker_cpu.values() if pct > client_lag.CPU_BUSY_PCT)
        said = self._client.see(verdict, lag_ms, busy, self.pool.n)
        if said is not None:
            self._event("client", said[1], level=said[0])

    # ---- events --------------------------------------------------------------------------

    def _event(self, kind: str, message: str, level: str = "info", **payload) -> None:
        """One event of this tick; `payload`: Event's typed fields (count, error, since…)."""
        self._events.append(Event(t=time.time(), kind=kind, level=level, message=message,
                                  **payload))
        log.info("%s: %s", kind, message)

    def note(self, kind: EventKind, message: str, level: Level = "info", *,
             t: float | None = None, **payload) -> None:
        """An event from beside the run (the eval's fault proxy): recorded with the next
        tick's Snapshot like the run's own. `t`: when it happened (unix seconds), when
        that was before now; `payload`: Event's typed fields."""
        self._events.append(Event(t=time.time() if t is None else t, kind=kind, level=level,
                                  message=message, **payload))
        log.info("%s: %s", kind, message)

    def _note_errors(self, r: wire.Report) -> None:
        for kind, n in r.counters.errors.items():
            count, message, at = self._pending_errors.get(kind, (0, "", 0.0))
            # the latest error's message and time, of whichever worker it was
            when = r.error_at.get(kind, time.time())
            if when >= at:
                message, at = r.last_errors.get(kind, message), when
            self._pending_errors[kind] = (count + n, message, at)

    def _flush_error_events(self, now: float, everything: bool = False) -> None:
        """Errors become events, at most one per kind every few seconds, with their count;
        each is dated when its last error happened (what its message quotes), not now."""
        for kind, (count, message, at) in list(self._pending_errors.items()):
            recent = now - self._last_error_event.get(kind, 0.0) < ERROR_EVENT_EVERY_S
            if recent and not everything:
                continue
            self._last_error_event[kind] = now
            del self._pending_errors[kind]
            if kind == "cancelled":
                self._events.append(self._cancelled_event(count, message, min(at, now)))
                continue
            self._events.append(Event(t=min(at, now), kind="error", level="error",
                                      message=f"{count}× {kind}: {message}", count=count,
                                      error=kind))
            log.info("error: %d× %s: %s", count, kind, message)

    def _cancelled_event(self, count: int, message: str, t: float) -> Event:
        """Requests cancelled on purpose are no failure, so no error event: abandoned by the
        workload's users (--cancel-rate) while the load runs; at the drain, cut by the
        operator's immediate stop or by the end of the drain's grace. Said in words, with
        the count (and the kind, for code) as an error event's."""
        n = f"{count} request{'' if count == 1 else 's'}"
        if self._drain is None:
            return Event(t=t, kind="run", message=f"{n} abandoned by the client as asked "
                         f"(--cancel-rate): {message}", count=count, error="cancelled")
        if self._cut_short:
            return Event(t=t, kind="operator", message=f"{n} in flight cancelled by the "
                         "operator (the stop was made immediate): not failures", count=count,
                         error="cancelled")
        return Event(t=t, kind="run", message=f"{n} in flight cancelled when the drain's "
                     f"{self._drain_grace:g} s ran out (--drain-grace): not failures",
                     count=count, error="cancelled")

    # ---- probes --------------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(PROBE_PERIOD_S)
            try:
                await self._sample_probes()
            except Exception:  # a probe bug must not end the run; it is logged in full
                log.exception("probe failed")

    async def _sample_probes(self) -> None:
        server, gpu, process = await asyncio.gather(
            self.server_probe.sample(), self.gpu.sample(),
            asyncio.to_thread(self.process_probe.sample),
        )
        self._process = process
        self.gpu.set_server_pids(self.process_probe.pids())
        self._events += self.gpu.drain_events() + self.process_probe.drain_events()
        previous = self._server
        was_ok = previous.ok if previous is not None else True
        if was_ok != server.ok:
            if server.ok:
                self._event("probe", f"server /metrics answering again ({server.url})")
            else:
                self._event("probe", f"server /metrics: {server.error}", level="warn")
        if previous is not None and server.restarts > previous.restarts:
            self._event("restart", "the server restarted: its /metrics counters went back to "
                        "zero", level="warn")
        self._server = server
        self._gpu = gpu

    # ---- shutdown --------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop everything that was started; safe to call at any point, more than once."""
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        if self.pool.workers and self._drain is None:
            self._drain = asyncio.create_task(self.pool.stop(0.0))
        if self._drain is not None:
            await self._drain
        gpu = getattr(self, "gpu", None)
        if gpu is not None:
            gpu.close()
        if self.sim is not None:
            await self.sim.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _copy(c: Counters) -> Counters:
    """A copy of counters that later ticks cannot change: a Snapshot is a value (a struct
    copy alone would share the errors and the per-turn rows)."""
    return msgspec.structs.replace(c, errors=dict(c.errors),
                                   turns=[msgspec.structs.replace(t) for t in c.turns])
