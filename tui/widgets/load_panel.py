"""Load: what we ask for (target concurrency or rate), in flight, backlog, server queue, rates."""

from __future__ import annotations

from loadgen.model import units
from loadgen.model.snapshot import ServerMetrics, Snapshot
from loadgen.model.windows import WindowStats
from tui.format import MUTED, cells, first_fit, literal
from tui.view import View
from tui.widgets.chart import spark_markup
from tui.widgets.panel import Panel, keep_within


def lbl(text: str) -> str:
    return f"[{MUTED}]{text}[/] "


def target_line(snap: Snapshot, width: int = 10**6) -> str:
    load = snap.load
    if load.trace_span is not None:  # --trace: how far it is, and the rate it sends at
        sent = f"{lbl('trace')}[b $accent]{units.count(load.trace_sent)}[/]/" \
            f"{units.count(load.trace_total)}"
        times = f"{units.duration(load.trace_time)}/{units.duration(load.trace_span)}"
        rate = f"{lbl('rate')}[b $accent]{units.rate(load.target_rate)}[/] req/s"
        return first_fit(width, f"{sent}  {times}  {rate}", f"{sent}  {rate}", sent)
    if load.mode == "open":
        rate = units.NA if load.target_rate is None else f"{load.target_rate:g}"
        arrival = f" {literal(load.arrival)}" if load.arrival else ""
        cap = f"  {lbl('cap')}{load.max_in_flight}" if load.max_in_flight else ""
        head = f"{lbl('rate')}[b $accent]{rate}[/] req/s"
        return first_fit(width, f"{head}[{MUTED}]{arrival}[/]{cap}", f"{head}{cap}", head)
    return f"{lbl('concurrency')}[b $accent]{load.target_concurrency}[/]"


def server_line(server: ServerMetrics | None, width: int = 10**6) -> str:
    """Server waiting/running; "n/a" (never 0) when there is no scrape or it failed."""
    if server is None:
        return first_fit(width, f"{lbl('server')} {lbl('waiting')}{units.NA}  "
                         f"{lbl('running')}{units.NA}", f"{lbl('server')}{units.NA}")
    if not server.ok:
        why = literal(server.error or "scrape failed")
        return f"{lbl('server')} {units.NA} [$warning]({why})[/]"
    waiting, running = units.number(server.waiting), units.number(server.running)
    return first_fit(
        width,
        f"{lbl('server')} {lbl('waiting')}[b]{waiting}[/]  {lbl('running')}[b]{running}[/]",
        f"{lbl('server')}{lbl('waiting')}[b]{waiting}[/] {lbl('running')}[b]{running}[/]",
        f"{lbl('server')}{lbl('wait')}[b]{waiting}[/] {lbl('run')}[b]{running}[/]",
    )


def rates_line(ten: WindowStats | None) -> str:
    req = units.rate(ten.req_s if ten else None)
    err_s = ten.err_s if ten else None
    err_colour = "$error" if err_s else "$foreground"
    return f"{lbl('req/s')}{req}  {lbl('err/s')}[{err_colour}]{units.rate(err_s)}[/]"


def errors_line(ten: WindowStats | None, total: dict[str, int], width: int = 10**6) -> str:
    """Errors per second by kind over the last 10 s, biggest first; else the run's total.
    Narrow: the biggest kinds that fit and how many more (`x` lists them all)."""
    recent = ten.errors if ten is not None else {}
    secs = ten.seconds if ten is not None and ten.seconds > 0 else None
    kinds = sorted(((n, k) for k, n in recent.items() if n), reverse=True)
    if kinds and secs:
        parts = [f"{literal(k)} {units.rate(n / secs)}/s" for n, k in kinds]
        tries = [f"{lbl('errors')}[$error]{' · '.join(parts[:i])}[/]"
                 + (f" [{MUTED}]+{len(parts) - i}{more} (x)[/]" if i < len(parts) else "")
                 for i in range(len(parts), 0, -1) for more in (" more", "")]
        every = units.rate(sum(n for n, _ in kinds) / secs)
        tries.append(f"{lbl('errors')}[$error]{every}/s[/] [{MUTED}]{len(parts)} kinds (x)[/]")
        return first_fit(width, *tries)
    n_total = sum(total.values())
    if n_total:
        return first_fit(width,
                         f"{lbl('errors')}none now [{MUTED}]({units.count(n_total)} in the run)[/]",
                         f"{lbl('errors')}none now [{MUTED}]({units.count(n_total)} in run)[/]",
                         f"{lbl('errors')}none now")
    return f"{lbl('errors')}none"


def cache_lines(snap: Snapshot, ten: WindowStats | None, run: WindowStats | None,
                width: int = 10**6) -> list[str]:
    """Prefix caching and conversations, only where there is any, one window a line and
    the window named: the last 10 s's share of prompt tokens served from the cache, by the
    answers' usage and by the server's own counters (an engine with only a gauge: its
    value, named so); the whole run's mean TTFT of each turn (--turns), after warm-up.
    Narrow: the words go before the figures, the window's name last."""
    lines = []
    full, short = _cache_parts(snap.server, ten, True), _cache_parts(snap.server, ten, False)
    if full:
        lines.append(first_fit(
            width,
            f"{lbl('prefix cache')}{'  '.join(full)}{_window('10 s')}",
            f"{lbl('prefix cache')}{'  '.join(short)}{_window('10 s')}",
            f"{lbl('cache')}{'  '.join(short)}{_window('10 s')}",
            f"{lbl('cache')}{'  '.join(short)}",
            f"{lbl('cache')}{short[0]}",
        ))
    c = run.counters if run is not None else None
    turns = [(i + 1, t) for i, t in enumerate(c.turns if c else []) if t.requests]
    if turns:
        def by_turn(n: int, label: str, window: str) -> str:
            shown = " ".join(f"{i}:{t.ttft_us / t.requests / 1000:.0f}" for i, t in turns[:n])
            return f"{lbl(label)}{shown}{window}"

        most = min(len(turns), 6)
        tries = [by_turn(n, "TTFT ms by turn", _window("run")) for n in range(most, 0, -1)]
        tries += [by_turn(n, "turn TTFT ms", "") for n in range(most, 0, -1)]
        lines.append(first_fit(width, *tries))
    return lines


def _window(name: str) -> str:
    """The window a line's figures are over, after them."""
    return f"  [{MUTED}]({name})[/]"


def _cache_parts(server: ServerMetrics | None, ten: WindowStats | None,
                 words: bool = True) -> list[str]:
    c = ten.counters if ten is not None else None
    parts = []
    if c is not None and c.cache_reported_input_tokens:
        share = c.cached_tokens / c.cache_reported_input_tokens
        parts.append(f"[b]{units.pct(share)}[/]" + (" of prompt tokens" if words else ""))
    rate = ten.server_cache_hit_rate if ten is not None else None
    if rate is not None:
        parts.append(f"{lbl('server' if words else 'srv')}{units.pct(rate)}")
    elif ten is not None and ten.server_cache_queries is None and server is not None \
            and server.ok and server.prefix_cache_hit_rate is not None:
        # no counters to difference over the window: the engine's own gauge, as it says it
        label = "server gauge" if words else "srv gauge"
        parts.append(f"{lbl(label)}{units.pct(server.prefix_cache_hit_rate)}")
    return parts


def load_lines(snap: Snapshot, ten: WindowStats | None,
               run: WindowStats | None = None, width: int = 10**6) -> list[str]:
    return [line for line, _ in ranked_lines(snap, ten, run, width)]


def ranked_lines(snap: Snapshot, ten: WindowStats | None, run: WindowStats | None,
                 width: int) -> list[tuple[str, int]]:
    """The panel's figures (markup, rank: 0 always shown, higher left out sooner)."""
    load = snap.load
    state = "  [$warning]warm-up[/]" if load.warmup else ""
    flight = f"{lbl('in flight')}[b]{load.in_flight}[/]  {lbl('backlog')}"
    backlog = f"[$warning]{load.backlog}[/]" if load.backlog else "0"
    lines = [
        (target_line(snap, width - cells(state)) + state, 0),
        (flight + backlog, 0),
        (server_line(snap.server, width), 0),
        (rates_line(ten), 0),
        (errors_line(ten, snap.counters.errors, width), 0),
    ]
    lines += [(line, 2) for line in cache_lines(snap, ten, run, width)]
    if load.note:
        lines.append((f"[$accent]{literal(load.note)}[/]", 1))
    return lines


class LoadPanel(Panel):
    TITLE = "Load"

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        lines = ranked_lines(view.snap, view.stats.get("10s"), view.stats.get("run"), width)
        hist = view.history
        target = "rate" if view.snap.load.mode == "open" else "conc"
        # the history: the first to go on a short screen (the charts and `d` have it too)
        if self._tall() and width >= 20:
            w = width - 8
            for label, series, colour in (
                (target, "target", "$accent"),
                ("flight", "in_flight", "$primary"),
                ("queue", "waiting", "$warning"),
            ):
                lines.append((f"{lbl(label.ljust(7))}{spark_markup(hist, series, w, colour)}", 3))
        elif width >= 24:
            w = (width - 14) // 2
            lines.append((
                f"{lbl('flight')}{spark_markup(hist, 'in_flight', w, '$primary')} "
                f"{lbl('queue')}{spark_markup(hist, 'waiting', w, '$warning')}", 3))
        title = f"{self.TITLE} · open loop" if view.snap.load.mode == "open" else self.TITLE
        return title, "\n".join(keep_within(lines, self.line_budget()))
