"""tokentop's own live figures in the Prometheus text format (`--prometheus-port N`), for
Grafana: a sink of the Session, so the console's run process, `run --headless` and the agent
all serve it from where the run runs.

Nothing is counted twice: a custom prometheus_client Collector reads, at each scrape, the
last Snapshot and the windows the Session keeps (loadgen.model.windows), on the run's own
event loop, between two ticks, so a scrape never sees half a tick. A scrape says which
Snapshot it shows (`tokentop_snapshot_seq`).

Latencies are summaries, not histograms: their quantiles are the exact HdrHistogram ones
(3 significant figures, the console's and the summary's own), where Prometheus' buckets
would interpolate a P99 inside a bucket as wide as the gap between two bounds. Their
quantiles cover the last minute (as client libraries' summaries cover a recent window:
any scrape interval up to a minute misses no request); their _count and _sum the whole run
since the warm-up's end (the console's `r` starts them again: a counter reset to
Prometheus). A fleet's exact percentiles across agents are the fleet console's
(loadgen.fleet.merged): summaries are not summed across targets.

Every family carries the target's public URL as a label (no credentials, made plain and
bounded); the error kinds are tokentop's own (ERROR_KINDS), each served from zero so that a
rate() has a start.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Iterator
from typing import get_args

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from loadgen.model import hdr
from loadgen.model.kinds import ERROR_KINDS
from loadgen.model.kinds import Health as HealthKind
from loadgen.model.kinds import RunState as RunStateKind
from loadgen.model.notice import Notice, Say
from loadgen.model.snapshot import METRICS, Snapshot
from loadgen.model.text import plain
from loadgen.model.urls import public_url
from loadgen.model.windows import SnapshotWindows
from loadgen.run.sinks import RunHandle, SinkError

log = logging.getLogger("tokentop.prometheus")

PATH = "/metrics"
QUANTILE_WINDOW = "1m"  # the summaries' quantiles: the last minute (module docstring)
QUANTILES = (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99"), ("0.999", "p99.9"))
LABEL_LIMIT = 200  # characters of a label value: a URL or a model id, never a page of text
HEALTHS: tuple[str, ...] = get_args(HealthKind)
RUN_STATES: tuple[str, ...] = get_args(RunStateKind)

# Counters' integer counts served as <name>_total: (field, name, help)
COUNTED = (
    ("requests_good", "tokentop_requests_good",
     "completed requests within every per-request --slo (goodput); served with such an SLO"),
    ("output_tokens", "tokentop_output_tokens", "output tokens delivered, as they arrived"),
    ("completed_output_tokens", "tokentop_completed_output_tokens",
     "output tokens of the requests that completed"),
    ("input_tokens", "tokentop_input_tokens",
     "prompt tokens (the server's count, else the asked length)"),
    ("cached_tokens", "tokentop_cached_input_tokens",
     "prompt tokens the server reported served from its prefix cache"),
    ("reasoning_tokens", "tokentop_reasoning_tokens",
     "output tokens spent reasoning, over the requests that reasoned"),
    ("chunks", "tokentop_chunks", "streamed chunks received"),
    ("backoffs", "tokentop_backoffs",
     "closed-loop waits after a failed request (back-off or Retry-After)"),
    ("backoffs_retry_after", "tokentop_backoffs_retry_after",
     "of those, the waits the server's Retry-After set"),
    ("clipped_samples", "tokentop_clipped_samples",
     "latency samples above the histogram's range (1 h), recorded at its top"),
)


def label_text(text: object) -> str:
    """Outside text as a label value: plain (loadgen.model.text) and bounded."""
    return plain(text, LABEL_LIMIT)


class SnapshotCollector(Collector):
    """The figures of the last Snapshot and of the Session's windows, at each scrape."""

    def __init__(self, *, goodput: bool) -> None:
        self.goodput = goodput  # the run has a per-request SLO: requests_good means something
        self.snap: Snapshot | None = None
        self.windows: SnapshotWindows | None = None

    def take(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        self.snap, self.windows = snap, windows

    def collect(self) -> Iterator:
        snap, windows = self.snap, self.windows
        if snap is None or windows is None:
            return  # no tick yet: an empty page, never a zero that looks measured
        target = label_text(public_url(snap.target.url))
        yield from self._run(snap, target)
        yield from self._load(snap, target)
        yield from self._counters(snap, target)
        yield from self._latencies(windows, target)

    # ---- the run and the target ------------------------------------------------------

    def _run(self, snap: Snapshot, target: str) -> Iterator:
        info = GaugeMetricFamily("tokentop_run_info", "the run and its target (always 1)",
                                 labels=["target", "model", "run_id", "api", "simulated"])
        info.add_metric([target, label_text(snap.target.model), label_text(snap.run_id),
                         label_text(snap.target.api), str(snap.target.simulated).lower()], 1)
        yield info
        yield _gauge("tokentop_snapshot_seq", "the number of the tick these figures are of",
                     target, snap.seq)
        yield _gauge("tokentop_snapshot_timestamp_seconds",
                     "when that tick ended (unix seconds)", target, snap.t)
        yield _gauge("tokentop_run_elapsed_seconds", "seconds since the run started",
                     target, snap.elapsed)
        yield _one_of("tokentop_run_state", "the run's state (1: the one it is in)", target,
                      "state", RUN_STATES, snap.load.state)
        yield _gauge("tokentop_warmup", "1 while the tick is warm-up (left out of results)",
                     target, int(snap.load.warmup))
        yield _one_of("tokentop_target_health",
                      "the target's health by tokentop's outage definition (1: the one it is)",
                      target, "health", HEALTHS, snap.load.health)
        since = snap.load.outage_since
        yield _gauge("tokentop_outage_duration_seconds",
                     "how long the current outage has lasted (0: no outage)", target,
                     max(0.0, snap.t - since) if since is not None else 0.0)

    def _load(self, snap: Snapshot, target: str) -> Iterator:
        ld = snap.load
        yield _gauge("tokentop_in_flight_requests", "requests sent and not yet finished",
                     target, ld.in_flight)
        yield _gauge("tokentop_backlog_requests",
                     "requests due but not yet sent (open loop's queue at the client)",
                     target, ld.backlog)
        yield _gauge("tokentop_stalled_streams", "streams in flight that look frozen",
                     target, ld.stalled)
        yield _gauge("tokentop_target_concurrency_streams", "closed loop: the streams asked",
                     target, ld.target_concurrency)
        if ld.target_rate is not None:
            yield _gauge("tokentop_target_rate_requests_per_second",
                         "open loop: the request rate asked", target, ld.target_rate)
        client = snap.client
        yield _gauge("tokentop_client_workers", "load worker processes", target,
                     client.workers)
        if client.loop_lag_ms is not None:
            yield _gauge("tokentop_client_loop_lag_seconds",
                         "the worst event-loop lag of any load worker this tick: the client's "
                         "own delay, which every latency may include", target,
                         client.loop_lag_ms / 1e3)
        if client.cpu_pct is not None:
            yield _gauge("tokentop_client_cpu_cores", "CPU of the load workers (1: one core)",
                         target, client.cpu_pct / 100.0)

    # ---- counters ------------------------------------------------------------------------

    def _counters(self, snap: Snapshot, target: str) -> Iterator:
        c = snap.counters
        requests = CounterMetricFamily(
            "tokentop_requests", "requests finished, by outcome (cancelled: by the client on "
            "purpose, --cancel-rate or a stop)", labels=["target", "outcome"])
        for outcome, n in (("ok", c.requests_ok), ("failed", c.requests_failed),
                           ("cancelled", c.requests_cancelled)):
            requests.add_metric([target, outcome], n)
        yield requests
        errors = CounterMetricFamily("tokentop_errors", "failed and cancelled requests, by kind",
                                     labels=["target", "kind"])
        for kind in ERROR_KINDS:  # tokentop's kinds only, each from zero
            errors.add_metric([target, kind], c.errors.get(kind, 0))
        yield errors
        for fieldname, name, text in COUNTED:
            if fieldname == "requests_good" and not self.goodput:
                continue  # without a per-request SLO every completed request is "good"
            yield _counter(name, text, target, getattr(c, fieldname))
        yield _counter("tokentop_backoff_seconds",
                       "stream-seconds spent waiting after failed requests", target,
                       c.backoff_us / 1e6)

    # ---- latencies -----------------------------------------------------------------------

    def _latencies(self, windows: SnapshotWindows, target: str) -> Iterator:
        recent = windows.dense(QUANTILE_WINDOW)
        whole = windows.dense("run")
        for metric in METRICS:
            run = hdr.summarize(whole[metric], ())
            if not run["count"]:
                continue  # a metric with no samples is left out, as in the Snapshot
            last = hdr.summarize(recent[metric], (50.0, 90.0, 99.0, 99.9))
            family = SummaryMetricFamily(
                f"tokentop_{metric}_seconds",
                f"{metric}: quantiles over the last minute (exact, HdrHistogram), count and "
                f"sum over the run", labels=["target"])
            for q, key in QUANTILES:  # none while the last minute had no sample
                if last[key] is not None:
                    family.add_sample(family.name, {"target": target, "quantile": q},
                                      last[key] / 1e6)
            # the sum from the buckets' midpoints: within the histogram's 0.1 %
            family.add_metric([target], count_value=run["count"],
                              sum_value=run["mean"] * run["count"] / 1e6)
            yield family


def _gauge(name: str, text: str, target: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, text, labels=["target"])
    g.add_metric([target], value)
    return g


def _counter(name: str, text: str, target: str, value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(name, text, labels=["target"])
    c.add_metric([target], value)
    return c


def _one_of(name: str, text: str, target: str, label: str, values: tuple[str, ...],
            now: str) -> GaugeMetricFamily:
    """An enum as Prometheus has them: a series per value, 1 for the one it is."""
    g = GaugeMetricFamily(name, text, labels=["target", label])
    for v in values:
        g.add_metric([target, v], int(v == now))
    return g


def listen(host: str, port: int) -> socket.socket:
    """The endpoint's socket, bound now (before the load starts); SinkError in words."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise SinkError(f"cannot serve the Prometheus figures on {where} "
                        f"(--prometheus-port, --prometheus-host): {_why(e)}") from None


_REASONS = {errno.EADDRINUSE: "the port is in use",
            errno.EADDRNOTAVAIL: "this machine has no such address",
            errno.EACCES: "not allowed (a port below 1024 needs privileges)"}


def _why(e: OSError) -> str:
    """A bind's failure in words (create_server's own message names the address twice)."""
    if isinstance(e, socket.gaierror) or (e.errno or 0) < 0:  # the name did not resolve
        return "no such host"
    if e.errno in _REASONS:
        return _REASONS[e.errno]
    return os.strerror(e.errno) if e.errno else str(e)


class PrometheusEndpoint:
    """The Sink: binds at construction, serves GET /metrics from start() to close()."""

    def __init__(self, host: str, port: int, *, goodput: bool, say: Say) -> None:
        self.sock = listen(host, port)
        self.say = say
        self.collector = SnapshotCollector(goodput=goodput)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{PATH}"

    async def start(self, run: RunHandle) -> None:
        app = web.Application()
        app.router.add_get(PATH, self._metrics)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, self.sock).start()
        self._runner = runner
        self.say(Notice("serving", f"serving figures for Prometheus at {self.url}"))

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def take(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        self.collector.take(snap, windows)

    def finish(self, summary: dict) -> None:
        pass

    def release(self) -> None:
        """Let go of the socket of an endpoint that never started (the run did not)."""
        if self._runner is None:
            self.sock.close()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.sock.close()
