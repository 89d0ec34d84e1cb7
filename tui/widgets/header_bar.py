"""The top line: run state, elapsed, load mode, what we are pointed at, and any source error."""

from __future__ import annotations

from textual.widgets import Static

from loadgen.snapshot import Snapshot
from tui.format import fmt_elapsed, literal

MUTED = "$foreground-muted"
STATE_COLOURS = {
    "running": "$success",
    "starting": "$primary",
    "paused": "$warning",
    "draining": "$warning",
    "stopped": "$foreground-muted",
    "error": "$error",
}


def state_badge(state: str) -> str:
    colour = STATE_COLOURS.get(state, "$foreground")
    return f"[b {colour}]● {literal(state)}[/]"


def header_markup(
    snap: Snapshot | None, *, description: str, ended: bool, error: str | None
) -> str:
    """State first: on a narrow terminal the URL is what gets cut, not the run state."""
    state = "error" if error and snap is None else "stopped" if ended else None
    if snap is None:
        badge = state_badge(state or "starting")
        line = f"[b]tokentop[/]  {badge}  [{MUTED}]{literal(description)}[/]"
    else:
        sim = "  [b $accent]simulated[/]" if snap.target.simulated else ""
        line = (
            f"[b]tokentop[/]  {state_badge(state or snap.load.state)}"
            f"  {fmt_elapsed(snap.elapsed)}  [{MUTED}]{literal(snap.load.mode)}[/]{sim}"
            f"  [b]{literal(snap.target.model)}[/] [{MUTED}]@[/] {literal(snap.target.url)}"
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
    ) -> None:
        markup = header_markup(snap, description=description, ended=ended, error=error)
        if markup != self._markup:
            self._markup = markup
            self.update(markup)
