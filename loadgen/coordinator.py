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
from collections.abc import AsyncIterator

import aiohttp
import msgspec

from loadgen import hdr, wire
from loadgen.embedded_sim import EmbeddedSim, SimStartError
from loadgen.preflight import TargetError, check_url, resolve_model
from loadgen.snapshot import (
    METRICS,
    ClientSample,
    Control,
    Counters,
    Event,
    GpuStatus,
    LoadState,
    ServerMetrics,
    Snapshot,
    Target,
)
from loadgen.worker_pool import WorkerPool
from loadgen.workload import Workload
from probes.gpu import GpuProbe
from probes.host import HostProbe
from probes.server_metrics import ServerMetricsProbe, metrics_url_for

log = logging.getLogger("tokentop.coordinator")

PROBE_PERIOD_S = 1.0
ERROR_EVENT_EVERY_S = 5.0  # one event per error kind at most this often, with the count


class RunConfig(msgspec.Struct, kw_only=True):
    """Everything a run needs, minus secrets (the API key travels in the environment)."""

    url: str | None = None  # None: start the embedded simulator
    model: str | None = None  # None: the server's first model
    api: str = "chat"
    concurrency: int = 8
    duration: float | None = None  # seconds of load; None: until stopped
    input_tokens: int = 128
    output_tokens: int = 128
    ignore_eos: bool = True
    continuous_usage: bool = True
    workers: int = 0  # 0: cores - 1, at least 1
    tick: float = 0.5
    request_timeout: float = 600.0
    drain_grace: float = 30.0
    metrics_url: str | None = None
    sim_args: list[str] = msgspec.field(default_factory=list)
    seed: int = 0


def default_workers() -> int:
    return max(1, (os.cpu_count() or 2) - 1)


class Coordinator:
    def __init__(self, cfg: RunConfig, api_key: str | None = None) -> None:
        self.cfg = cfg
        self.api_key = api_key
        self.run_id = uuid.uuid4().hex[:12]
        self.sim: EmbeddedSim | None = None
        self.pool = WorkerPool(cfg.workers or default_workers())
        self.state = "starting"
        self.target: Target | None = None
        self.counters = Counters()
        self._events: list[Event] = []
        self._in_flight: dict[int, int] = {}
        self._stop_requested = asyncio.Event()
        self._drain: asyncio.Task | None = None
        self._server: ServerMetrics | None = None
        self._gpu = GpuStatus(message="GPU probe not started yet")
        self._probe_task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self._last_error_event: dict[str, float] = {}
        self._pending_errors: dict[str, tuple[int, str]] = {}
        self._reported_failures: set[str] = set()

    # ---- start -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start everything; raises TargetError with a message for the user."""
        try:
            await self._start()
        except SimStartError as e:
            await self.close()
            raise TargetError(str(e)) from None
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        cfg = self.cfg
        self._session = aiohttp.ClientSession()
        if cfg.url is None:
            self.sim = EmbeddedSim(cfg.sim_args)
            base = await self.sim.start()
        else:
            base = check_url(cfg.url)
        model = await resolve_model(self._session, base, cfg.model, self.api_key)
        self.target = Target(url=base, model=model, api=cfg.api, simulated=self.sim is not None)
        self.host = HostProbe()
        root = base.removesuffix("/v1")
        self.gpu = await GpuProbe.create(root, self._session)
        self.server_probe = ServerMetricsProbe(
            cfg.metrics_url or metrics_url_for(base), self._session, bearer_token=self.api_key
        )
        await self._sample_probes()
        self._probe_task = asyncio.create_task(self._probe_loop())
        await self._start_workers(base, model)
        self.pool.set_concurrency(cfg.concurrency)
        self.state = "running"
        self._event(
            "run",
            f"run started: {cfg.concurrency} streams, {cfg.api} API, "
            f"{cfg.input_tokens}→{cfg.output_tokens} tokens, model {model}",
        )

    async def _start_workers(self, base: str, model: str) -> None:
        cfg = self.cfg
        workload = Workload(
            model=model,
            api=cfg.api,
            input_tokens=cfg.input_tokens,
            output_tokens=cfg.output_tokens,
            ignore_eos=cfg.ignore_eos,
            continuous_usage=cfg.continuous_usage,
            seed=cfg.seed,
        )
        env = dict(os.environ)
        env.pop("TOKENTOP_API_KEY", None)
        if self.api_key:
            env["TOKENTOP_API_KEY"] = self.api_key
        configure = [
            wire.Configure(
                index=i, base_url=base, workload=workload, request_timeout=cfg.request_timeout
            )
            for i in range(self.pool.n)
        ]
        await self.pool.start(configure, env)

    # ---- control -------------------------------------------------------------------------

    async def control(self, msg: Control) -> None:
        op = msg.op
        if op in ("set_concurrency", "add_concurrency"):
            if self.state not in ("running", "paused") or msg.value is None:
                return
            base = self.pool.concurrency if op == "add_concurrency" else 0
            n = max(0, int(base + msg.value))
            if n != self.pool.concurrency:
                self.pool.set_concurrency(n)
                self._event("operator", f"concurrency → {n} ({msg.source})")
        elif op in ("pause", "resume") and self.state in ("running", "paused"):
            self.pool.pause(op == "pause")
            self.state = "paused" if op == "pause" else "running"
            self._event("operator", f"load {self.state} ({msg.source})")
        elif op == "stop":
            self.request_stop()
        elif op == "mark":
            self._event("operator", f"mark: {msg.note or ''}".strip())

    def request_stop(self) -> None:
        self._stop_requested.set()

    # ---- the tick ------------------------------------------------------------------------

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        """One Snapshot per tick until the run has stopped and drained (the last says 'stopped')."""
        tick = self.cfg.tick
        t0_wall, t0 = time.time(), time.monotonic()
        next_tick = t0 + tick
        last_tick = t0
        seq = 0
        while True:
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
            if self._should_stop(time.monotonic() - t0):
                self._begin_drain()
            reports = await self.pool.collect(seq, timeout=tick * 0.6)
            now = time.monotonic()
            if self._drain is not None and self._drain.done():
                reports += self.pool.drain_reports()
                self.state = "stopped"
            snap = self._build(seq, reports, t0_wall + (now - t0), now - t0, now - last_tick)
            last_tick = now
            seq += 1
            yield snap
            if self.state == "stopped":
                return
            next_tick += tick
            if next_tick < time.monotonic():  # we fell behind: skip, do not burst
                next_tick = time.monotonic() + tick

    def _should_stop(self, elapsed: float) -> bool:
        if self._drain is not None:
            return False
        if self._stop_requested.is_set():
            return True
        if self.cfg.duration is not None and elapsed >= self.cfg.duration:
            return True
        # every worker died: nothing is sending load any more
        return bool(self.pool.workers and self.pool.alive == 0)

    def _begin_drain(self) -> None:
        self.state = "draining"
        self._event("run", f"stopping: in-flight requests get {self.cfg.drain_grace:g} s to finish")
        self._drain = asyncio.create_task(self.pool.stop(self.cfg.drain_grace))

    def _build(
        self, seq: int, reports: list[wire.Report], t: float, elapsed: float, interval: float
    ) -> Snapshot:
        sparse: dict[str, list] = {m: [] for m in METRICS}
        cpu_s = 0.0
        lag = 0.0
        for r in reports:
            self.counters.add(r.counters)
            self._in_flight[r.index] = r.in_flight
            for m, h in r.hists.items():
                if m in sparse:
                    sparse[m].append(h.arrays())
            cpu_s += r.cpu_s
            lag = max(lag, r.loop_lag_ms)
            self._note_errors(r)
        self._flush_error_events(t)
        for failure in self.pool.failures():
            if failure not in self._reported_failures:
                self._reported_failures.add(failure)
                self._event("error", failure, level="error")
        hist = {m: hdr.encode(hdr.dense_from_sparse(pairs)) for m, pairs in sparse.items()}
        events, self._events = self._events, []
        assert self.target is not None
        return Snapshot(
            run_id=self.run_id,
            seq=seq,
            t=t,
            elapsed=elapsed,
            interval=interval,
            target=self.target,
            load=LoadState(
                mode="closed",
                state=self.state,
                target_concurrency=self.pool.concurrency,
                in_flight=sum(self._in_flight.values()),
            ),
            counters=msgspec.structs.replace(self.counters, errors=dict(self.counters.errors)),
            hist=hist,
            server=self._server,
            gpu=self._gpu,
            host=self.host.sample(),
            client=ClientSample(
                workers=self.pool.alive,
                cpu_pct=100.0 * cpu_s / interval if interval > 0 and reports else None,
                loop_lag_ms=lag if reports else None,
            ),
            events=events,
        )

    # ---- events --------------------------------------------------------------------------

    def _event(self, kind: str, message: str, level: str = "info") -> None:
        self._events.append(Event(t=time.time(), kind=kind, level=level, message=message))
        log.info("%s: %s", kind, message)

    def _note_errors(self, r: wire.Report) -> None:
        for kind, n in r.counters.errors.items():
            count, _ = self._pending_errors.get(kind, (0, ""))
            self._pending_errors[kind] = (count + n, r.last_errors.get(kind, ""))

    def _flush_error_events(self, now: float) -> None:
        """Errors become events, at most one per kind every few seconds, with their count."""
        for kind, (count, message) in list(self._pending_errors.items()):
            if now - self._last_error_event.get(kind, 0.0) < ERROR_EVENT_EVERY_S:
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
        server, gpu = await asyncio.gather(self.server_probe.sample(), self.gpu.sample())
        previous = self._server
        if previous is not None and previous.ok != server.ok:
            if server.ok:
                self._event("probe", f"server /metrics answering again ({server.url})")
            else:
                self._event("probe", f"server /metrics: {server.error}", level="warn")
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
