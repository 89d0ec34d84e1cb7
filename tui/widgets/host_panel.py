"""Host, server process and client health: if the load generator saturates, its numbers are
suspect; if the server's RSS keeps climbing, a long soak will end badly."""

from __future__ import annotations

from loadgen.model import trend, units
from loadgen.model.snapshot import ClientSample, HostSample, ProcessSample, ServerMetrics
from loadgen.model.windows import WindowStats
from tui.format import MUTED, NO_SAMPLES, literal
from tui.view import View
from tui.widgets.panel import Panel

LAG_WARN_MS = 5.0  # a lag this long shows up in measured ITL
CPU_WARN_PER_WORKER = 90.0  # one worker near a full core queues its own chunks
RSS_GROWTH_WARN_MB_H = 100.0
KV_WARN = 95.0
WIDE_AT = 56
LABEL_W = 7


def lbl(text: str) -> str:
    return f"[{MUTED}]{text}[/] "


def _warn(text: str, warn: bool) -> str:
    return f"[$warning]{text}[/]" if warn else text


def host_parts(h: HostSample | None) -> tuple[str, str]:
    h = h or HostSample()
    cores = f" [{MUTED}]×{h.cpu_count}[/]" if h.cpu_count else ""
    load = f"{h.load1:.2f}" if h.load1 is not None else units.number(None)
    cpu = f"{lbl('CPU')}{units.pct(h.cpu_pct, whole=100)}{cores}  {lbl('load')}{load}"
    ram = f"{lbl('RAM')}{units.bytes_pair(h.mem_used_bytes, h.mem_total_bytes)}"
    return cpu, ram


def client_parts(c: ClientSample) -> tuple[str, str]:
    per_worker = None if c.cpu_pct is None else c.cpu_pct / max(c.workers, 1)
    cpu_hot = per_worker is not None and per_worker > CPU_WARN_PER_WORKER
    lag_us = None if c.loop_lag_ms is None else c.loop_lag_ms * 1000.0
    lag_hot = c.loop_lag_ms is not None and c.loop_lag_ms > LAG_WARN_MS
    workers = f"{c.workers} worker" + ("" if c.workers == 1 else "s")
    cpu = f"{workers}  {lbl('CPU')}{_warn(units.pct(c.cpu_pct, whole=100), cpu_hot)}"
    lag = f"{lbl('loop lag')}{_warn(units.ms(lag_us), lag_hot)}"
    if cpu_hot or lag_hot:
        lag += "  [b $warning]saturated[/]"
    return cpu, lag


def process_parts(p: ProcessSample | None) -> tuple[str, str]:
    if p is None:
        return f"[{MUTED}]process not found[/]", ""
    rss = f"{lbl('RSS')}{units.bytes_(p.rss_bytes)}"
    if p.rss_slope_mb_h is not None:
        slope = f"{p.rss_slope_mb_h:+.0f} MB/h"
        rss += " " + _warn(slope, p.rss_slope_mb_h > RSS_GROWTH_WARN_MB_H)
    elif p.rss_bytes is not None:
        # the probe withholds a slope over too short a span (loadgen.model.trend), as the
        # report does: say so, rather than leave the reader to wonder
        rss += f" [{MUTED}]slope {units.NA} ({trend.needs()})[/]"
    cpu = f"{lbl('CPU')}{units.pct(p.cpu_pct, whole=100)}"
    name = f" [{MUTED}]{literal(p.name or '')} {p.pid}[/]" if p.name else f" [{MUTED}]{p.pid}[/]"
    return rss, cpu + name


def kv_part(server: ServerMetrics | None) -> str:
    ok = server is not None and server.ok
    usage = server.kv_cache_usage if ok and server is not None else None
    pct = None if usage is None else usage * 100.0
    hot = pct is not None and pct >= KV_WARN
    line = f"{lbl('KV cache')}{_warn(units.pct(pct, whole=100), hot)}"
    if ok and server is not None:
        pre = server.preemptions_total
        line += f"  {lbl('preempt')}{units.count(pre)}"
        if server.restarts:
            line += f"  [$warning]restarts {server.restarts}[/]"
    return line


def ttft_part(server: ServerMetrics | None, ten: WindowStats | None) -> str:
    """Server-side vs client-side TTFT (P50): the gap is the network, the proxy, or the client."""
    srv = None
    if server is not None and server.ok:
        srv_ms = server.latency_ms.get("ttft", {}).get("p50")
        srv = units.us_of_ms(srv_ms)
    summary = ten.latency.get("ttft") if ten else None
    cli = summary.get("p50") if summary else None
    return f"{lbl('TTFT P50 srv/cli')}{units.ms(srv)} / {units.ms(cli, missing=NO_SAMPLES)}"


class HostPanel(Panel):
    TITLE = "Host · server · client"

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        snap = view.snap
        host_cpu, host_ram = host_parts(snap.host)
        rss, pcpu = process_parts(snap.process)
        client_cpu, client_lag = client_parts(snap.client)
        kv = kv_part(snap.server)
        ttft = ttft_part(snap.server, view.stats.get("10s"))
        host = f"[b]{'host':<{LABEL_W}}[/]"
        server = f"[b]{'server':<{LABEL_W}}[/]"
        client = f"[b]{'client':<{LABEL_W}}[/]"
        pad = f"[{MUTED}]{'':<{LABEL_W}}[/]"
        if width >= WIDE_AT:
            lines = [
                f"{host}{host_cpu}  {host_ram}",
                f"{server}{rss}  {pcpu}".rstrip(),
                f"{pad}{kv}",
                f"{pad}{ttft}",
                f"{client}{client_cpu}  {client_lag}",
            ]
        else:
            lines = [
                f"{host}{host_cpu}",
                f"{pad}{host_ram}",
                f"{server}{rss}",
                f"{pad}{kv}",
                f"{client}{client_cpu}",
                f"{pad}{client_lag}",
            ]
            if self._tall():
                lines.insert(4, f"{pad}{ttft}")
        return self.TITLE, "\n".join(lines)
