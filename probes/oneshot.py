"""`tokentop probe`: what every probe sees right now, once, with no load.

Two rounds about a second apart, so that rates (host network and disk, token
rates) and the server's own latency quantiles exist; the second round is what
is reported, in readable form or as JSON (`--json`). A probe that has nothing
says why in words; the exit status is 0 then. A bad URL exits 2 (and so does an
unreadable key file, read by the command line, tui/commands/probe.py). Nothing here
lets a traceback through.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any, TextIO
from urllib.parse import urlsplit

import aiohttp
import msgspec

from loadgen.model.snapshot import (
    Event,
    GpuSample,
    GpuStatus,
    HostSample,
    ProcessSample,
    ServerMetrics,
)
from probes.gpu import GpuProbe
from probes.host import HostProbe
from probes.process import ProcessProbe, local_port
from probes.server_metrics import ServerMetricsProbe, metrics_url_for, server_root

log = logging.getLogger(__name__)

GAP_S = 1.0  # between the two rounds


class _UsageError(Exception):
    pass


async def run_probe(
    *,
    url: str | None = None,
    metrics_url: str | None = None,
    server_pid: int | None = None,
    server_name: str | None = None,
    token: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
) -> int:
    """Run every probe twice, print what they see; 0, or 2 for a bad URL.

    `url` is the server's OpenAI base URL (None: GPUs, host and a server process found
    by name); `metrics_url` defaults to /metrics at its root; `token` is a bearer token
    for /metrics, never printed; `as_json` prints JSON instead of text.
    """
    out = out if out is not None else sys.stdout
    try:
        url, metrics_url = _check_urls(url, metrics_url)
    except _UsageError as exc:
        print(f"tokentop probe: {exc}", file=sys.stderr)
        return 2
    try:
        report = await _collect(url, metrics_url, token, server_pid, server_name)
    except Exception as exc:  # a bug in a probe: say so in one line, no traceback
        log.debug("probe failed", exc_info=True)
        print(f"tokentop probe: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        out.write(json.dumps(msgspec.to_builtins(report), indent=2) + "\n")
    else:
        out.write(format_report(report))
    out.flush()
    return 0


def _check_urls(url: str | None, metrics_url: str | None) -> tuple[str | None, str | None]:
    """Both URLs checked (a bad one is a _UsageError), and /metrics found from the URL."""
    for name, value in (("--url", url), ("--metrics-url", metrics_url)):
        if value is not None:
            _check_url(name, value)
    if url is not None:
        url = url.rstrip("/")
    if metrics_url is None and url is not None:
        metrics_url = metrics_url_for(url)
    return url, metrics_url


def _check_url(option: str, url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _UsageError(f"{option}: not an http(s) URL: {url!r} (e.g. http://127.0.0.1:8000/v1)")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise _UsageError(f"{option}: bad port in URL: {url!r}") from None


class ProbeReport(msgspec.Struct, kw_only=True):
    url: str | None = None
    gpu: GpuStatus
    host: HostSample | None = None
    process: ProcessSample | None = None
    process_message: str | None = None  # why there is no process, in words
    server: ServerMetrics | None = None
    server_message: str | None = None
    events: list[Event] = msgspec.field(default_factory=list)
    probe_ms: dict[str, float] = msgspec.field(default_factory=dict)


async def _collect(
    url: str | None, metrics_url: str | None, token: str | None, pid: int | None,
    name: str | None,
) -> ProbeReport:
    port = local_port(url) if url is not None else None
    process: ProcessProbe | None
    process_message: str | None = None
    if pid is not None or name is not None or port is not None:
        # The engines' usual names as a last resort only when nothing else was given.
        process = ProcessProbe(pid=pid, port=port, name=name)
    elif url is not None:
        process = None
        process_message = "the server is on another host: no local process to watch"
    else:
        process = ProcessProbe()

    async with aiohttp.ClientSession() as session:
        host = HostProbe()
        gpu = await GpuProbe.create(server_root(url) if url else None, session)
        auth = f"Bearer {token}" if token else None
        server = (
            ServerMetricsProbe(metrics_url, session, authorization=auth) if metrics_url else None
        )
        try:
            await _round(host, gpu, process, server)
            await asyncio.sleep(GAP_S)
            if process is not None:
                gpu.set_server_pids(process.pids())
            report = await _round(host, gpu, process, server)
        finally:
            gpu.close()
    report.url = url
    if process is not None and report.process is None:
        process_message = process.message or "no server process found"
    report.process_message = process_message
    if server is None:
        report.server_message = "no --url or --metrics-url given: server metrics not read"
    events = gpu.drain_events()
    if process is not None:
        events += process.drain_events()
    report.events = events
    return report


async def _round(
    host: HostProbe,
    gpu: GpuProbe,
    process: ProcessProbe | None,
    server: ServerMetricsProbe | None,
) -> ProbeReport:
    loop = asyncio.get_running_loop()
    ms: dict[str, float] = {}

    t = loop.time()
    host_sample = host.sample()
    ms["host"] = (loop.time() - t) * 1000.0
    t = loop.time()
    proc_sample = process.sample() if process is not None else None
    ms["process"] = (loop.time() - t) * 1000.0
    gpu_status, server_metrics = await asyncio.gather(
        gpu.sample(), server.sample() if server is not None else _none()
    )
    if gpu_status.poll_ms is not None:
        ms["gpu"] = gpu_status.poll_ms
    if server_metrics is not None and server_metrics.scrape_ms is not None:
        ms["server_metrics"] = server_metrics.scrape_ms
    return ProbeReport(
        gpu=gpu_status,
        host=host_sample,
        process=proc_sample,
        server=server_metrics,
        probe_ms={k: round(v, 3) for k, v in ms.items()},
    )


async def _none() -> None:
    return None


# -- readable form ---------------------------------------------------------------------


def format_report(r: ProbeReport) -> str:
    lines: list[str] = []
    lines += _gpu_lines(r.gpu)
    lines.append("")
    lines += _host_lines(r.host)
    lines.append("")
    lines += _process_lines(r.process, r.process_message)
    lines.append("")
    lines += _server_lines(r.server, r.server_message)
    if r.events:
        lines.append("")
        lines.append("Events")
        for e in r.events:
            lines.append(f"  [{e.level}] {e.kind}: {e.message}")
    if r.probe_ms:
        lines.append("")
        cost = ", ".join(f"{k} {v:.1f} ms" for k, v in r.probe_ms.items())
        lines.append(f"Probe cost (one poll): {cost}")
    return "\n".join(lines) + "\n"


def _na(value: Any, fmt: str = "{}", unit: str = "") -> str:
    if value is None:
        return "n/a"
    return fmt.format(value) + unit


def _bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _rate(n: float | None) -> str:
    return "n/a" if n is None else _bytes(n) + "/s"


def _gpu_lines(g: GpuStatus) -> list[str]:
    head = {"nvml": "GPUs (NVML", "simulated": "GPUs (SIMULATED by the embedded simulator"}.get(
        g.source
    )
    if head is None:
        return ["GPUs", f"  none: {g.message or 'no GPU data source'}"]
    extra = []
    if g.driver:
        extra.append(f"driver {g.driver}")
    if g.poll_ms is not None:
        extra.append(f"poll {g.poll_ms:.1f} ms")
    lines = [head + "".join(f", {e}" for e in extra) + ")"]
    if g.message:
        lines.append(f"  note: {g.message}")
    if not g.gpus:
        lines.append("  no GPU reported")
    for gpu in g.gpus:
        lines += _one_gpu(gpu)
    return lines


def _one_gpu(gpu: GpuSample) -> list[str]:
    title = f"  GPU {gpu.index}  {gpu.name}"
    if gpu.simulated:
        title += "  [simulated]"
    if gpu.uuid:
        title += f"  {gpu.uuid}"
    lines = [title]
    if gpu.lost:
        lines.append(f"    LOST: {gpu.message or 'stopped answering'}")
        return lines
    if gpu.message:
        lines.append(f"    note: {gpu.message}")
    lines.append(
        f"    memory {_bytes(gpu.memory_used_bytes)} / {_bytes(gpu.memory_total_bytes)}"
        f"   util {_na(gpu.utilization_pct, '{:.0f}', ' %')}"
        f"   power {_na(gpu.power_w, '{:.0f}')} / {_na(gpu.power_limit_w, '{:.0f}', ' W')}"
        f"   temp {_na(gpu.temperature_c, '{:.0f}', ' °C')}"
        f"   energy {_na(gpu.energy_j, '{:.0f}', ' J')}"
    )
    reasons = gpu.throttle_reasons
    throttle = "n/a" if reasons is None else (", ".join(reasons) or "none")
    lines.append(
        f"    clocks SM {_na(gpu.sm_clock_mhz, '{:.0f}', ' MHz')}"
        f"  mem {_na(gpu.mem_clock_mhz, '{:.0f}', ' MHz')}   clock events: {throttle}"
    )
    lines.append(
        f"    PCIe TX {_na(gpu.pcie_tx_kbs, '{:.0f}', ' KB/s')}"
        f"  RX {_na(gpu.pcie_rx_kbs, '{:.0f}', ' KB/s')}"
        f"   ECC corrected {_na(gpu.ecc_corrected)}  uncorrected {_na(gpu.ecc_uncorrected)}"
    )
    if gpu.mig:
        lines.append("    MIG: " + "; ".join(gpu.mig))
    if gpu.processes is None:
        lines.append("    processes: n/a")
    elif not gpu.processes:
        lines.append("    processes: none")
    else:
        for p in gpu.processes:
            lines.append(f"    process {p.pid} {p.name or '?'}  {_bytes(p.used_bytes)}")
    return lines


def _host_lines(h: HostSample | None) -> list[str]:
    if h is None:
        return ["Host", "  n/a"]
    per_core = ""
    if h.cpu_per_core:
        per_core = "  per core: " + " ".join(f"{c:.0f}" for c in h.cpu_per_core)
    return [
        "Host",
        f"  CPU {_na(h.cpu_pct, '{:.0f}', ' %')} of {_na(h.cpu_count)} cores"
        f"   load {_na(h.load1, '{:.2f}')}{per_core}",
        f"  memory {_bytes(h.mem_used_bytes)} / {_bytes(h.mem_total_bytes)}"
        f"   swap {_bytes(h.swap_used_bytes)} / {_bytes(h.swap_total_bytes)}",
        f"  network rx {_rate(h.net_rx_bps)}  tx {_rate(h.net_tx_bps)}"
        f"   disk read {_rate(h.disk_read_bps)}  write {_rate(h.disk_write_bps)}",
    ]


def _process_lines(p: ProcessSample | None, why: str | None) -> list[str]:
    if p is None:
        return ["Server process", f"  none: {why or 'not looked for'}"]
    slope = _na(p.rss_slope_mb_h, "{:+.1f}", " MB/h")
    if p.rss_slope_mb_h is None:
        slope += " (needs a longer watch)"
    return [
        "Server process",
        f"  pid {p.pid} ({p.name or '?'}, found by {p.found_by or '?'})"
        f"   children {_na(p.children)}",
        f"  RSS {_bytes(p.rss_bytes)} (with children)   CPU {_na(p.cpu_pct, '{:.0f}', ' %')}"
        f"   threads {_na(p.threads)}   open fds {_na(p.open_files)}",
        f"  RSS trend {slope}",
    ]


def _server_lines(m: ServerMetrics | None, why: str | None) -> list[str]:
    if m is None:
        return ["Server metrics", f"  none: {why or 'not read'}"]
    lines = [f"Server metrics ({m.url})"]
    if not m.ok:
        lines.append(f"  cannot read: {m.error}")
        return lines
    engine = m.engine or "unknown"
    if engine == "unknown":
        lines.append("  engine: not recognised; the gauges it has:")
        if not m.generic:
            lines.append("    (no gauges)")
        for name, value in m.generic.items():
            lines.append(f"    {name} = {value:g}")
        return lines
    kv = None if m.kv_cache_usage is None else m.kv_cache_usage * 100.0
    lines.append(
        f"  engine {engine}   waiting {_na(m.waiting, '{:g}')}   running {_na(m.running, '{:g}')}"
        f"   KV cache {_na(kv, '{:.1f}', ' %')}"
    )
    lines.append(
        f"  prompt {_na(m.prompt_tok_s, '{:.1f}', ' tok/s')}"
        f"   generation {_na(m.generation_tok_s, '{:.1f}', ' tok/s')}"
        f"   preemptions {_na(m.preemptions_total, '{:g}')}   restarts seen {m.restarts}"
    )
    if m.latency_ms:
        lines.append("  server-side latency over the last interval (ms):")
        for key, q in m.latency_ms.items():
            qs = "  ".join(f"{name} {value:.1f}" for name, value in q.items())
            lines.append(f"    {key.upper():<6} {qs}")
    else:
        lines.append("  server-side latency: no requests finished in the last interval")
    return lines
