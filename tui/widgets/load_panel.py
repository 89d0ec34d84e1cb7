"""Load: what we ask for (target concurrency), what is in flight, and what the server queues."""

from __future__ import annotations

from loadgen.snapshot import ServerMetrics, Snapshot
from loadgen.windows import WindowStats
from tui.format import NA, fmt_count, fmt_num, fmt_pct, fmt_rate, literal
from tui.widgets.panel import Panel, View

MUTED = "$foreground-muted"


def server_line(server: ServerMetrics | None) -> str:
    """Server waiting/running; "n/a" (never 0) when there is no scrape or it failed."""
    if server is None:
        return f"[{MUTED}]server[/]  waiting {NA}  running {NA}"
    if not server.ok:
        why = literal(server.error or "scrape failed")
        return f"[{MUTED}]server[/]  {NA} [$warning]({why})[/]"
    return (
        f"[{MUTED}]server[/]  waiting [b]{fmt_num(server.waiting)}[/]"
        f"  running [b]{fmt_num(server.running)}[/]"
    )


def kv_line(server: ServerMetrics | None) -> str:
    usage = server.kv_cache_usage if server is not None and server.ok else None
    pct = None if usage is None else usage * 100.0
    colour = "$warning" if pct is not None and pct >= 95.0 else "$foreground"
    line = f"[{MUTED}]KV cache[/] [{colour}]{fmt_pct(pct)}[/]"
    if server is not None and server.ok and server.preemptions_total:
        line += f"  [{MUTED}]preempt[/] {fmt_count(server.preemptions_total)}"
    return line


def rates_line(ten: WindowStats | None) -> str:
    req = fmt_rate(ten.req_s if ten else None)
    err_s = ten.err_s if ten else None
    err_colour = "$error" if err_s else "$foreground"
    return f"[{MUTED}]req/s[/] {req}  [{MUTED}]err/s[/] [{err_colour}]{fmt_rate(err_s)}[/]"


def errors_line(errors: dict[str, int]) -> str:
    """Cumulative errors by kind, biggest first, so the cause reads first when the line is cut."""
    kinds = sorted(((n, k) for k, n in errors.items() if n), reverse=True)
    if not kinds:
        return f"[{MUTED}]errors  none[/]"
    parts = " · ".join(f"{literal(k)} {fmt_count(n)}" for n, k in kinds)
    return f"[{MUTED}]errors[/]  [$error]{parts}[/]"


def load_lines(snap: Snapshot, ten: WindowStats | None) -> list[str]:
    load = snap.load
    return [
        f"[{MUTED}]concurrency[/] [b $accent]{load.target_concurrency}[/]",
        f"[{MUTED}]in flight[/] {load.in_flight}  [{MUTED}]backlog[/] {load.backlog}",
        server_line(snap.server),
        kv_line(snap.server),
        rates_line(ten),
        errors_line(snap.counters.errors),
    ]


class LoadPanel(Panel):
    TITLE = "Load"

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        return self.TITLE, "\n".join(load_lines(view.snap, view.stats.get("10s")))
