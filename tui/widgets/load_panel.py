"""Load: what we ask for (target concurrency or rate), in flight, backlog, server queue, rates."""

from __future__ import annotations

from loadgen.model import units
from loadgen.model.snapshot import ServerMetrics, Snapshot
from loadgen.model.windows import WindowStats
from tui.format import MUTED, literal
from tui.view import View
from tui.widgets.chart import spark_markup
from tui.widgets.panel import Panel


def lbl(text: str) -> str:
    return f"[{MUTED}]{text}[/] "


def target_line(snap: Snapshot) -> str:
    load = snap.load
    if load.trace_span is not None:  # --trace: how far it is, and the rate it sends at
        return (f"{lbl('trace')}[b $accent]{units.count(load.trace_sent)}[/]/"
                f"{units.count(load.trace_total)}  {units.duration(load.trace_time)}/"
                f"{units.duration(load.trace_span)}  {lbl('rate')}"
                f"[b $accent]{units.rate(load.target_rate)}[/] req/s")
    if load.mode == "open":
        rate = units.NA if load.target_rate is None else f"{load.target_rate:g}"
        arrival = f" {literal(load.arrival)}" if load.arrival else ""
        cap = f"  {lbl('cap')}{load.max_in_flight}" if load.max_in_flight else ""
        return f"{lbl('rate')}[b $accent]{rate}[/] req/s[{MUTED}]{arrival}[/]{cap}"
    return f"{lbl('concurrency')}[b $accent]{load.target_concurrency}[/]"


def server_line(server: ServerMetrics | None) -> str:
    """Server waiting/running; "n/a" (never 0) when there is no scrape or it failed."""
    if server is None:
        return f"{lbl('server')} {lbl('waiting')}{units.NA}  {lbl('running')}{units.NA}"
    if not server.ok:
        why = literal(server.error or "scrape failed")
        return f"{lbl('server')} {units.NA} [$warning]({why})[/]"
    return (
        f"{lbl('server')} {lbl('waiting')}[b]{units.number(server.waiting)}[/]"
        f"  {lbl('running')}[b]{units.number(server.running)}[/]"
    )


def rates_line(ten: WindowStats | None) -> str:
    req = units.rate(ten.req_s if ten else None)
    err_s = ten.err_s if ten else None
    err_colour = "$error" if err_s else "$foreground"
    return f"{lbl('req/s')}{req}  {lbl('err/s')}[{err_colour}]{units.rate(err_s)}[/]"


def errors_line(ten: WindowStats | None, total: dict[str, int]) -> str:
    """Errors per second by kind over the last 10 s, biggest first; else the run's total."""
    recent = ten.errors if ten is not None else {}
    secs = ten.seconds if ten is not None and ten.seconds > 0 else None
    kinds = sorted(((n, k) for k, n in recent.items() if n), reverse=True)
    if kinds and secs:
        parts = " · ".join(f"{literal(k)} {units.rate(n / secs)}/s" for n, k in kinds)
        return f"{lbl('errors')}[$error]{parts}[/]"
    n_total = sum(total.values())
    if n_total:
        return f"{lbl('errors')}none now [{MUTED}]({units.count(n_total)} in the run)[/]"
    return f"{lbl('errors')}none"


def cache_lines(snap: Snapshot, ten: WindowStats | None, run: WindowStats | None) -> list[str]:
    """Prefix caching and conversations, only where there is any, one window a line and
    the window named: the last 10 s's share of prompt tokens served from the cache, by the
    answers' usage and by the server's own counters (an engine with only a gauge: its
    value, named so); the whole run's mean TTFT of each turn (--turns), after warm-up."""
    lines = []
    cache = _cache_parts(snap.server, ten)
    if cache:
        lines.append(f"{lbl('prefix cache')}{'  '.join(cache)}{_window('10 s')}")
    c = run.counters if run is not None else None
    turns = [(i + 1, t) for i, t in enumerate(c.turns if c else []) if t.requests]
    if turns:
        shown = " ".join(f"{n}:{t.ttft_us / t.requests / 1000:.0f}" for n, t in turns[:6])
        lines.append(f"{lbl('TTFT ms by turn')}{shown}{_window('run')}")
    return lines


def _window(name: str) -> str:
    """The window a line's figures are over, after them."""
    return f"  [{MUTED}]({name})[/]"


def _cache_parts(server: ServerMetrics | None, ten: WindowStats | None) -> list[str]:
    c = ten.counters if ten is not None else None
    parts = []
    if c is not None and c.cache_reported_input_tokens:
        share = c.cached_tokens / c.cache_reported_input_tokens
        parts.append(f"[b]{units.pct(share)}[/] of prompt tokens")
    rate = ten.server_cache_hit_rate if ten is not None else None
    if rate is not None:
        parts.append(f"{lbl('server')}{units.pct(rate)}")
    elif ten is not None and ten.server_cache_queries is None and server is not None \
            and server.ok and server.prefix_cache_hit_rate is not None:
        # no counters to difference over the window: the engine's own gauge, as it says it
        parts.append(f"{lbl('server gauge')}{units.pct(server.prefix_cache_hit_rate)}")
    return parts


def load_lines(snap: Snapshot, ten: WindowStats | None,
               run: WindowStats | None = None) -> list[str]:
    load = snap.load
    state = ""
    if load.warmup:
        state = "  [$warning]warm-up[/]"
    flight = f"{lbl('in flight')}[b]{load.in_flight}[/]  {lbl('backlog')}"
    backlog = f"[$warning]{load.backlog}[/]" if load.backlog else "0"
    lines = [
        target_line(snap) + state,
        flight + backlog,
        server_line(snap.server),
        rates_line(ten),
        errors_line(ten, snap.counters.errors),
    ]
    return lines + cache_lines(snap, ten, run)


class LoadPanel(Panel):
    TITLE = "Load"

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        lines = load_lines(view.snap, view.stats.get("10s"), view.stats.get("run"))
        if view.snap.load.note:
            lines.append(f"[$accent]{literal(view.snap.load.note)}[/]")
        hist = view.history
        target = "rate" if view.snap.load.mode == "open" else "conc"
        if self._tall() and width >= 20:
            w = width - 8
            for label, series, colour in (
                (target, "target", "$accent"),
                ("flight", "in_flight", "$primary"),
                ("queue", "waiting", "$warning"),
            ):
                lines.append(f"{lbl(label.ljust(7))}{spark_markup(hist, series, w, colour)}")
        elif width >= 24:
            w = (width - 14) // 2
            lines.append(
                f"{lbl('flight')}{spark_markup(hist, 'in_flight', w, '$primary')} "
                f"{lbl('queue')}{spark_markup(hist, 'waiting', w, '$warning')}"
            )
        title = f"{self.TITLE} · open loop" if view.snap.load.mode == "open" else self.TITLE
        return title, "\n".join(lines)
