"""The top line: run state, elapsed, load mode, engine, what we are pointed at, any source error."""

from __future__ import annotations

from textual.widgets import Static

from loadgen.model.kinds import SourceKind
from loadgen.model.snapshot import Snapshot
from tui.format import MUTED, fmt_elapsed, literal, tidy

STATE_COLOURS = {
    "running": "$success",
    "starting": "$primary",
    "paused": "$warning",
    "draining": "$warning",
    "stopped": "$foreground-muted",
    "error": "$error",
    "outage": "$error",
}


def state_badge(state: str) -> str:
    colour = STATE_COLOURS.get(state, "$foreground")
    style = f"b reverse {colour}" if state == "outage" else f"b {colour}"
    return f"[{style}]● {literal(state)}[/]"


def trouble(snap: Snapshot) -> str:
    """What loadgen.model.outage judges short of an outage: errors among successes, and
    streams that receive nothing (a frozen server)."""
    load = snap.load
    out = "  [b $warning]degraded[/]" if load.health == "degraded" else ""
    if load.stalled:
        out += f"  [b $warning]{load.stalled} of {load.in_flight} stalled[/]"
    return out


def load_mode(snap: Snapshot) -> str:
    load = snap.load
    if load.mode == "open":
        rate = "?" if load.target_rate is None else f"{load.target_rate:g}"
        return f"open {rate} req/s"
    return f"closed c={load.target_concurrency}"


def header_markup(
    snap: Snapshot | None,
    *,
    description: str,
    ended: bool,
    error: str | None,
    outage: bool = False,
    source_kind: SourceKind = "live",
) -> str:
    """State first: on a narrow terminal the URL is what gets cut, not the run state."""
    state = "error" if error and snap is None else "stopped" if ended else None
    if snap is None:
        badge = state_badge(state or "starting")
        line = f"[b]tokentop[/]  {badge}  [{MUTED}]{literal(description)}[/]"
    else:
        run_state = state or ("outage" if outage else snap.load.state)
        sim = "  [b $accent]simulated[/]" if snap.target.simulated else ""
        warm = "  [b $warning]warm-up[/]" if snap.load.warmup else ""
        warm += trouble(snap) if not ended else ""
        engine = snap.server.engine if snap.server is not None and snap.server.engine else None
        eng = f"  [{MUTED}]engine[/] {literal(engine)}" if engine else ""
        # a replay or a fleet agent says so first: nobody should take it for a live run here
        tag = f"[b $accent]{source_kind}[/]  " if source_kind != "live" else ""
        line = (
            f"[b]tokentop[/]  {tag}{state_badge(run_state)}"
            f"  {fmt_elapsed(snap.elapsed)}  [{MUTED}]{literal(load_mode(snap))}[/]{warm}{sim}"
            f"{eng}  [b]{literal(snap.target.model)}[/] [{MUTED}]@[/] {literal(snap.target.url)}"
        )
    if error:
        line += f"\n[b $error]✖ {literal(error)}[/]"
    return line


class HeaderBar(Static):
    DEFAULT_CSS = """
    HeaderBar {
        dock: top;
        height: auto;
        padding: 0 1;
        background: $panel;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, description: str = "", *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self._markup: str | None = None
        self.show(None, description=description)

    def show(
        self,
        snap: Snapshot | None,
        *,
        description: str,
        ended: bool = False,
        error: str | None = None,
        outage: bool = False,
        source_kind: SourceKind = "live",
    ) -> None:
        markup = header_markup(snap, description=description, ended=ended, error=error,
                               outage=outage, source_kind=source_kind)
        if markup != self._markup:
            self._markup = markup
            self.update(tidy(markup))
