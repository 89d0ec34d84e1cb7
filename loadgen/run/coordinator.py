"""One run: workers, probes and the tick that turns them into Snapshots.

The coordinator starts the embedded simulator when there is no target, checks
the target, starts the worker processes and the probes, and then once per
tick asks every worker for its interval, merges the interval histograms and
counters, adds the latest probe samples and the events, and yields a
Snapshot. Control messages (from keys, the CLI or MQTT) change the load
between ticks, so a change shows in the next Snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import msgspec
import numpy as np

from loadgen.model import hdr
from loadgen.model.outage import OutageTracker, Tick
from loadgen.model.snapshot import (
    METRICS,
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
from loadgen.run.auto_ramp import AutoRamp
from loadgen.run.config import ConfigError, RunConfig, default_workers
from loadgen.run.embedded_sim import EmbeddedSim, SimStartError
from loadgen.run.heap import HeapTrimmer
from loadgen.run.pool import WorkerPool
from loadgen.run.preflight import TargetError, check_url, resolve_lengths, resolve_model
from loadgen.run.resume import ResumeFrom
from loadgen.run.secrets import Secrets
from loadgen.worker import wire
from loadgen.worker.limits import FD_MARGIN, raise_open_file_limit, streams_that_fit
from probes.gpu import GpuProbe
from probes.host import HostProbe
from probes.process import ProcessProbe, local_port
from probes.server_metrics import ServerMetricsProbe, metrics_url_for

log = logging.getLogger("tokentop.coordinator")

PROBE_PERIOD_S = 1.0
ERROR_EVENT_EVERY_S = 5.0  # one event per error kind at most this often, with the count
ERROR_RATE_WINDOW_S = 10.0  # --stop-error-rate looks this far back …
ERROR_RATE_MIN_REQUESTS = 20  # … and needs at least this many requests to judge
TRACE_MARGIN_S = 0.3  # a trace's last entry is sent and counted in flight by then
LAG_WARN_MS = 5.0  # event-loop lag that starts to show in latencies
TICK_EARLY_S = 0.01


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
        self.spec = cfg.load_spec()
        self.ramp = self.parsed.ramp
        self.auto: AutoRamp | None = None
        self.state = "starting"
        self.target: Target | None = None
        # a resumed run carries its totals on, so cumulative counters never go backwards
        self.counters = (
            msgspec.structs.replace(resume.counters, errors=dict(resume.counters.errors))
            if resume else Counters()
        )
        self._events: list[Event] = []
        self._in_flight: dict[int, int] = {}
        self._backlog: dict[int, int] = {}
        self._worker_cpu: dict[int, float] = {}
        self._stop_requested = asyncio.Event()
        self._stop_reason: str | None = None
        self._drain: asyncio.Task | None = None
        self._server: ServerMetrics | None = None
        self._gpu = GpuStatus(message="GPU probe not started yet")
        self._process: ProcessSample | None = None
        self._probe_task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self._last_error_event: dict[str, float] = {}
        self._pending_errors: dict[str, tuple[int, str]] = {}
        self._reported_failures: set[str] = set()
        self._recent: deque[tuple[float, int, int]] = deque()  # (t, ok, failed) for error rate
        self._lag_warned = 0.0
        self._load_started: float | None = None  # elapsed seconds when warm-up ended
        self._elapsed = 0.0
        self._stalled: dict[int, int] = {}  # per worker: its last report's stalled streams
        self._outages = OutageTracker()  # health, outages and stalls (loadgen.model.outage)
        # a tick's merged histograms, one kept array a metric: a fresh 184 KB one a metric a
        # tick fragments a long run's heap (whoever is handed them must copy what it keeps)
        self._tick_dense: dict[str, np.ndarray] = {}
        self._heap = HeapTrimmer()  # a long run's freed C heap goes back to the system

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
            self.sim = EmbeddedSim(cfg.sim)
            base = await self.sim.start()
        else:
            base = check_url(cfg.url)
        model = await resolve_model(self._session, base, cfg.model,
                                    self.secrets.authorization())
        # --tokenizer: a local one, the server's /tokenize, or approx. (before any load)
        self.lengths = await resolve_lengths(self._session, base, model, cfg.tokenizer,
                                             self.secrets.authorization())
        self.target = Target(url=base, model=model, api=cfg.api, simulated=self.sim is not None,
                             lengths=self.lengths.source)
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
        if self.ramp is not None:
            self._set_main_value(self.ramp.value_at(0.0))
        if cfg.auto_ramp:
            self._start_auto_ramp("cli")
        self.pool.set_load(self.spec)
        self.state = "running"
        workload = self.parsed.workload(cfg, model, self.lengths)
        self._event("run", f"run started: {self._load_text()}; {workload.describe()}; "
                    f"model {model}; {self.lengths.note}")

    def _check_open_files(self) -> None:
        """Raise the open-file limit (the workers inherit it) and refuse, before any load, a
        start that cannot fit under it: one socket a stream, in each worker."""
        limit = raise_open_file_limit()
        n = self.pool.n
        spec = self.spec
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
        n = self.pool.n
        configure = [
            wire.Configure(
                index=i, base_url=base, workload=workload, request_timeout=cfg.request_timeout,
                client=cfg.client, slo=self.parsed.slo, cancelling=self.parsed.cancelling,
                max_requests=None if cfg.max_requests is None
                else cfg.max_requests // n + (1 if i < cfg.max_requests % n else 0),
                calibrate=cfg.calibrate, authorization=self.secrets.authorization(),
                trace=cfg.trace,
            )
            for i in range(n)
        ]
        await self.pool.start(configure, env)

    # ---- control -------------------------------------------------------------------------

    async def control(self, msg: Control) -> None:
        if self.state not in ("running", "paused"):
            if msg.op == "stop":
                self.request_stop()
            return
        op, v = msg.op, msg.value
        if op in ("set_concurrency", "add_concurrency", "set_rate", "add_rate") and v is not None:
            self._manual_change(op, v, msg.source)
        elif op == "auto_ramp":
            self._start_auto_ramp(msg.source)
            self.pool.set_load(self.spec)
        elif op == "set_mode" and msg.note in ("closed", "open") and msg.note != self.spec.mode:
            self.ramp = None
            self.auto = None
            self.spec = msgspec.structs.replace(self.spec, mode=msg.note)
            self.pool.set_load(self.spec)  # while paused the workers keep it for the resume
            later = "; from the resume" if self.state == "paused" else ""
            self._event("operator", f"switched to {self._load_text()} ({msg.source}){later}")
        elif op in ("pause", "resume"):
            state = "paused" if op == "pause" else "running"
            if state != self.state:  # a second pause would restart nothing but the clock
                self.pool.pause(op == "pause")
                self.state = state
                self._event("operator", f"load {self.state} ({msg.source})")
        elif op == "stop":
            self.request_stop("stopped by the operator")
        elif op == "mark":
            self._event("operator", f"mark: {msg.note or ''}".strip())

    def _start_auto_ramp(self, source: str) -> None:
        cfg = self.cfg
        self.ramp = None
        self.auto = AutoRamp(self.parsed.slos, hold_s=cfg.auto_ramp_hold,
                             warmup_s=cfg.auto_ramp_warmup)
        self.spec = msgspec.structs.replace(self.spec, mode="closed", concurrency=self.auto.load)
        self._event("operator", f"auto-ramp started ({source}): doubling from "
                    f"{self.auto.load} stream while the SLOs hold ({cfg.slo or 'knee rule'})")

    def _manual_change(self, op: str, v: float, source: str) -> None:
        """A manual change takes control back from a ramp."""
        if self.ramp is not None or self.auto is not None:
            self.ramp = None
            self.auto = None
            self._event("operator", f"ramp stopped by a manual change ({source})")
        spec = self.spec
        if op.endswith("concurrency"):
            n = max(0, round((spec.concurrency if op == "add_concurrency" else 0) + v))
            new = msgspec.structs.replace(spec, concurrency=n)
        else:
            r = max(0.0, (spec.rate if op == "add_rate" else 0.0) + v)
            new = msgspec.structs.replace(spec, rate=round(r, 3))
        if new != spec:
            self.spec = new
            self.pool.set_load(new)  # while paused the workers keep it for the resume
            later = "; from the resume" if self.state == "paused" else ""
            self._event("operator", f"{self._load_text()} ({source}){later}")

    def _set_main_value(self, value: float) -> None:
        if self.spec.mode == "closed":
            self.spec = msgspec.structs.replace(self.spec, concurrency=max(0, round(value)))
        else:
            self.spec = msgspec.structs.replace(self.spec, rate=max(0.0, round(value, 3)))

    def _load_text(self) -> str:
        s = self.spec
        if s.mode == "closed":
            return f"{s.concurrency} streams (closed loop)"
        if s.trace:
            span = self.parsed.trace_span or 0.0
            return (f"trace {self.cfg.trace} at {s.trace_speed:g}× ({span / s.trace_speed:.0f} s, "
                    "open loop)")
        shape = f" k={s.shape:g}" if s.arrival == "gamma" else ""
        cap = f", at most {s.max_in_flight} in flight" if s.max_in_flight else ""
        return f"{s.rate:g} req/s {s.arrival}{shape} (open loop{cap})"

    def request_stop(self, reason: str | None = None) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop_requested.set()

    def cut_drain_short(self) -> None:
        """A drain under way ends now: every worker cancels what it still has in flight (a
        second Stop, with no grace), and reports as ever."""
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
        while True:
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
            elapsed = time.monotonic() - t0
            self._advance(elapsed)
            reports = await self.pool.collect(seq, timeout=tick * 0.6)
            now = time.monotonic()
            if self._drain is not None and self._drain.done():
                reports += self.pool.drain_reports()
                self.state = "stopped"
            snap = self._build(
                seq, reports, t0_wall + (now - t0), offset + now - t0, now - last_tick
            )
            last_tick = now
            seq += 1
            yield snap
            if self.state == "stopped":
                return
            self._heap.maybe_trim()  # between ticks, at most once a minute
            next_tick += tick
            if next_tick < time.monotonic():  # we fell behind: skip, do not burst
                next_tick = time.monotonic() + tick

    def _advance(self, elapsed: float) -> None:
        """Once a tick, before collecting: warm-up, ramps, limits."""
        self._elapsed = elapsed
        if self._drain is not None:
            return
        if self._load_started is None and elapsed >= self.cfg.warmup:
            # without a warm-up the load is measured from the start (as the windows are);
            # with one, from the tick in which it ended (the windows forget up to there)
            self._load_started = elapsed if self.cfg.warmup > 0 else 0.0
            if self.cfg.warmup > 0:
                self._event("run", f"warm-up over after {self.cfg.warmup:g} s: measuring")
        if self.ramp is not None and self.state == "running":
            before = self.spec
            self._set_main_value(self.ramp.value_at(elapsed))
            if self.spec != before:
                self.pool.set_load(self.spec)
            if self.ramp.finished(elapsed):
                self._event("run", f"ramp finished at {self._load_text()}")
                self.ramp = None
        reason = self._stop_due(elapsed)
        if reason is not None:
            self.request_stop(reason)
        if self._stop_requested.is_set():
            self._begin_drain()

    def _stop_due(self, elapsed: float) -> str | None:
        cfg = self.cfg
        measured = elapsed - (self._load_started if self._load_started is not None else elapsed)
        # a tick's timer may fire a little early (uvloop's have millisecond resolution): a
        # tick within TICK_EARLY_S of the duration is the one that reaches it
        if (cfg.duration is not None and self._load_started is not None
                and measured >= cfg.duration - TICK_EARLY_S):
            return f"duration of {cfg.duration:g} s reached"
        c = self.counters
        if cfg.max_requests is not None and c.requests_ok + c.requests_failed \
                + c.requests_cancelled >= cfg.max_requests:
            return f"{cfg.max_requests} requests done"
        if cfg.stop_error_rate is not None and self._recent:
            _, ok0, failed0 = self._recent[0]
            ok, failed = c.requests_ok - ok0, c.requests_failed - failed0
            n = ok + failed
            if n >= ERROR_RATE_MIN_REQUESTS and failed / n > cfg.stop_error_rate:
                return (f"error rate {failed / (ok + failed):.0%} over the last "
                        f"{ERROR_RATE_WINDOW_S:g} s passed --stop-error-rate "
                        f"{cfg.stop_error_rate:g}")
        if self.pool.workers and self.pool.alive == 0:
            return "every load worker has exited"
        if self._trace_done():
            return "trace done"
        return None

    def _trace_done(self) -> bool:
        """--trace: past its last entry's time (and a margin for the worker that sends it)
        with nothing left waiting or in flight."""
        span = self.parsed.trace_span
        if span is None or self.state != "running":
            return False
        margin = TRACE_MARGIN_S * self.cfg.trace_speed
        past = self.pool.trace_time(time.perf_counter()) >= span + margin
        return past and not any(self._backlog.values()) and not any(self._in_flight.values())

    def _begin_drain(self) -> None:
        self.state = "draining"
        reason = self._stop_reason or "stop requested"
        self._event("run", f"stopping ({reason}): in-flight requests get "
                    f"{self.cfg.drain_grace:g} s to finish")
        self._drain = asyncio.create_task(self.pool.stop(self.cfg.drain_grace))

    def _build(
        self, seq: int, reports: list[wire.Report], t: float, elapsed: float, interval: float
    ) -> Snapshot:
        sparse: dict[str, list] = {m: [] for m in METRICS}
        lag = 0.0
        tick = Counters()
        for r in reports:
            tick.add(r.counters)
            self.counters.add(r.counters)
            self._in_flight[r.index] = r.in_flight
            self._backlog[r.index] = r.backlog
            self._stalled[r.index] = r.stalled
            for m, h in r.hists.items():
                if m in sparse:
                    sparse[m].append(h.arrays())
            self._worker_cpu[r.index] = 100.0 * r.cpu_s / interval if interval > 0 else 0.0
            lag = max(lag, r.loop_lag_ms)
            self._note_errors(r)
        self._track_error_rate(t)
        self._track_outage(t, interval, tick)
        # the last tick says every error still held back, so the events add up to the totals
        self._flush_error_events(t, everything=self.state == "stopped")
        self._check_client(lag if reports else None, t)
        for failure in self.pool.failures():
            if failure not in self._reported_failures:
                self._reported_failures.add(failure)
                self._event("error", failure, level="error")
        dense = {m: hdr.dense_from_sparse(p, out=self._tick_dense.get(m))
                 for m, p in sparse.items() if p}
        self._tick_dense.update(dense)
        hist = {m: hdr.encode(d) for m, d in dense.items()}
        self._step_auto_ramp(elapsed, dense)
        events, self._events = self._events, []
        assert self.target is not None
        cpu = [self._worker_cpu.get(i, 0.0) for i in range(self.pool.n)]
        return Snapshot(
            run_id=self.run_id,
            seq=seq,
            t=t,
            elapsed=elapsed,
            interval=interval,
            target=self.target,
            load=self._load_state(),
            counters=msgspec.structs.replace(self.counters, errors=dict(self.counters.errors)),
            hist=hist,
            server=self._server,
            gpu=self._gpu,
            host=self.host.sample(),
            process=self._process,
            client=ClientSample(
                workers=self.pool.alive,
                cpu_pct=sum(cpu) if reports else None,
                worker_cpu_pct=cpu if reports else None,
                loop_lag_ms=lag if reports else None,
            ),
            events=events,
        )

    def _step_auto_ramp(self, elapsed: float, dense: dict) -> None:
        auto = self.auto
        if auto is None or auto.settled or self.state != "running":
            return
        nxt = auto.observe(elapsed, dense, self.counters)
        if nxt is None:
            return
        self.spec = msgspec.structs.replace(self.spec, concurrency=nxt)
        self.pool.set_load(self.spec)
        self._event("run", auto.describe(elapsed))

    def _load_state(self) -> LoadState:
        s = self.spec
        open_loop = s.mode == "open"
        arrival = None
        if open_loop:
            arrival = f"gamma(k={s.shape:g})" if s.arrival == "gamma" else s.arrival
        note = None
        if self.ramp is not None and self.state == "running":
            note = self.ramp.describe(self._elapsed)
        elif self.auto is not None:
            note = self.auto.describe(self._elapsed)
        return LoadState(
            mode=s.mode,
            state=self.state,
            target_concurrency=s.concurrency,
            target_rate=s.rate if open_loop else None,
            arrival=arrival,
            max_in_flight=s.max_in_flight if open_loop else None,
            in_flight=sum(self._in_flight.values()),
            backlog=sum(self._backlog.values()),
            warmup=self._load_started is None,
            stalled=sum(self._stalled.values()),
            health=self._outages.health,
            outage_since=self._outages.outage_since,
            note=note,
        )

    def _track_outage(self, t: float, interval: float, tick: Counters) -> None:
        """Outages, stalls and health by loadgen.model.outage's one definition (the soak
        report replays the same tracker over the recording); what it sees start or end is
        an event: outage (why, in words), recovery (with MTTR), stall."""
        observed = Tick.of(t, interval, tick, in_flight=sum(self._in_flight.values()),
                           stalled=sum(self._stalled.values()), server=self._server)
        for change in self._outages.observe(observed):
            self._event(change.kind, change.message, level=change.level)

    def _track_error_rate(self, t: float) -> None:
        c = self.counters
        self._recent.append((t, c.requests_ok, c.requests_failed))
        while self._recent and self._recent[0][0] < t - ERROR_RATE_WINDOW_S:
            self._recent.popleft()

    def _check_client(self, lag_ms: float | None, t: float) -> None:
        """Warn (at most once a minute) when the client itself threatens the numbers."""
        if lag_ms is None or t - self._lag_warned < 60.0:
            return
        busy = [i for i, pct in self._worker_cpu.items() if pct > 90.0]
        if lag_ms > LAG_WARN_MS or busy:
            self._lag_warned = t
            why = f"event-loop lag {lag_ms:.1f} ms" if lag_ms > LAG_WARN_MS else ""
            if busy:
                why += (", " if why else "") + f"worker CPU > 90 % ({len(busy)} of {self.pool.n})"
            self._event("client", f"the load generator is saturated ({why}): latencies may "
                        "include client delay; add --workers or lower the load", level="warn")

    # ---- events --------------------------------------------------------------------------

    def _event(self, kind: str, message: str, level: str = "info") -> None:
        self._events.append(Event(t=time.time(), kind=kind, level=level, message=message))
        log.info("%s: %s", kind, message)

    def _note_errors(self, r: wire.Report) -> None:
        for kind, n in r.counters.errors.items():
            count, _ = self._pending_errors.get(kind, (0, ""))
            self._pending_errors[kind] = (count + n, r.last_errors.get(kind, ""))

    def _flush_error_events(self, now: float, everything: bool = False) -> None:
        """Errors become events, at most one per kind every few seconds, with their count."""
        for kind, (count, message) in list(self._pending_errors.items()):
            recent = now - self._last_error_event.get(kind, 0.0) < ERROR_EVENT_EVERY_S
            if recent and not everything:
                continue
            self._last_error_event[kind] = now
            del self._pending_errors[kind]
            self._event("error", f"{count}× {kind}: {message}", level="error")

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
