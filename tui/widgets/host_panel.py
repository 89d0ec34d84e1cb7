"""Host, server process and client health: if the load generator saturates, its numbers are
suspect; if the server's RSS keeps climbing, a long soak will end badly."""

from __future__ import annotations

from loadgen.model import trend, units
from loadgen.model.snapshot import ClientSample, HostSample, ProcessSample, ServerMetrics
from loadgen.model.windows import WindowStats
from tui.format import MUTED, NO_SAMPLES, cells, first_fit, literal
from tui.view import View
from tui.widgets.panel import Panel, keep_within

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


def process_parts(p: ProcessSample | None, width: int = 10**6) -> tuple[str, str]:
    """(RSS and its slope, CPU and the process); the RSS fitted to `width` (the reason a
    slope is withheld goes first, then the words)."""
    if p is None:
        return f"[{MUTED}]process not found[/]", ""
    rss = f"{lbl('RSS')}{units.bytes_(p.rss_bytes)}"
    if p.rss_slope_mb_h is not None:
        slope = f"{p.rss_slope_mb_h:+.0f} MB/h"
        rss += " " + _warn(slope, p.rss_slope_mb_h > RSS_GROWTH_WARN_MB_H)
    elif p.rss_bytes is not None:
        # the probe withholds a slope over too short a span (loadgen.model.trend), as the
        # report does: say so, rather than leave the reader to wonder
        rss = first_fit(width, f"{rss} [{MUTED}]slope {units.NA} ({trend.needs()})[/]",
                        f"{rss} [{MUTED}]slope {units.NA}[/]", rss)
    cpu = f"{lbl('CPU')}{units.pct(p.cpu_pct, whole=100)}"
    name = f" [{MUTED}]{literal(p.name or '')} {p.pid}[/]" if p.name else f" [{MUTED}]{p.pid}[/]"
    return rss, cpu + name


def kv_part(server: ServerMetrics | None, width: int = 10**6) -> str:
    ok = server is not None and server.ok
    usage = server.kv_cache_usage if ok and server is not None else None
    pct = None if usage is None else usage * 100.0
    hot = pct is not None and pct >= KV_WARN
    kv = _warn(units.pct(pct, whole=100), hot)
    if not ok or server is None:
        return f"{lbl('KV cache')}{kv}"
    pre = f"{lbl('preempt')}{units.count(server.preemptions_total)}"
    restarts = f"  [$warning]restarts {server.restarts}[/]" if server.restarts else ""
    return first_fit(width, f"{lbl('KV cache')}{kv}  {pre}{restarts}",
                     f"{lbl('KV')}{kv}  {pre}{restarts}", f"{lbl('KV')}{kv}{restarts}")


def ttft_values(server: ServerMetrics | None, ten: WindowStats | None) -> tuple[str, str]:
    """Server-side and client-side TTFT P50 (the gap is the network, the proxy, or the
    client): the server's from its /metrics histogram, the client's over the last 10 s."""
    srv = None
    if server is not None and server.ok:
        srv_ms = server.latency_ms.get("ttft", {}).get("p50")
        srv = units.us_of_ms(srv_ms)
    summary = ten.latency.get("ttft") if ten else None
    cli = summary.get("p50") if summary else None
    return units.ms(srv), units.ms(cli, missing=NO_SAMPLES)


def ttft_part(server: ServerMetrics | None, ten: WindowStats | None) -> str:
    """Both TTFTs in one line, side by side."""
    srv, cli = ttft_values(server, ten)
    return f"{lbl('TTFT P50 srv/cli')}{srv} / {cli}"


class HostPanel(Panel):
    TITLE = "Host · server · client"

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        lines = (self._wide_lines if width >= WIDE_AT else self._narrow_lines)(view, width)
        return self.TITLE, "\n".join(keep_within(lines, self.line_budget()))

    def _wide_lines(self, view: View, width: int) -> list[tuple[str, int]]:
        snap = view.snap
        host_cpu, host_ram = host_parts(snap.host)
        rss, pcpu = process_parts(snap.process, width - LABEL_W)
        client_cpu, client_lag = client_parts(snap.client)
        return [
            (f"{HOST}{host_cpu}  {host_ram}", 0),
            (first_fit(width, f"{SERVER}{rss}  {pcpu}".rstrip(), f"{SERVER}{rss}"), 0),
            (f"{PAD}{kv_part(snap.server, width - LABEL_W)}", 0),
            (f"{PAD}{ttft_part(snap.server, view.stats.get('10s'))}", 1),
            (f"{CLIENT}{client_cpu}  {client_lag}", 0),
        ]

    def _narrow_lines(self, view: View, width: int) -> list[tuple[str, int]]:
        """A label column and one figure a line; the TTFT comparison on one line where it
        fits, else each side under its own (server, client), so no value is cut."""
        snap = view.snap
        host_cpu, host_ram = host_parts(snap.host)
        rss, _ = process_parts(snap.process, width - LABEL_W)
        client_cpu, client_lag = client_parts(snap.client)
        ttft = ttft_part(snap.server, view.stats.get("10s"))
        srv, cli = ttft_values(snap.server, view.stats.get("10s"))
        lines = [
            (f"{HOST}{host_cpu}", 0),
            (f"{PAD}{host_ram}", 0),
            (f"{SERVER}{rss}", 0),
            (f"{PAD}{kv_part(snap.server, width - LABEL_W)}", 0),
        ]
        split = cells(f"{PAD}{ttft}") > width
        budget = self.line_budget()
        if not split:
            lines.append((f"{PAD}{ttft}", 1))
        # the two halves go together or not at all: one alone compares nothing
        both = split and (budget is None or budget >= len(lines) + 4)
        if both:
            lines.append((f"{PAD}{lbl('TTFT P50')}{srv}", 0))
        lines += [(f"{CLIENT}{client_cpu}", 0), (f"{PAD}{client_lag}", 0)]
        if both:
            lines.append((f"{PAD}{lbl('TTFT P50')}{cli}", 0))
        return lines


HOST = f"[b]{'host':<{LABEL_W}}[/]"
SERVER = f"[b]{'server':<{LABEL_W}}[/]"
CLIENT = f"[b]{'client':<{LABEL_W}}[/]"
PAD = f"[{MUTED}]{'':<{LABEL_W}}[/]"
