"""Events: a scrolling log of errors, SLO breaches, throttling, outages and recoveries,
operator actions, with wall-clock timestamps; the newest at the bottom."""

from __future__ import annotations

from collections import deque

from loadgen.model import units
from loadgen.model.snapshot import Event
from tui.format import MUTED, literal
from tui.view import View
from tui.widgets.panel import Panel

KEEP = 500
LEVEL_STYLE = {"error": "$error", "warn": "$warning", "info": "$foreground"}
KIND_STYLE = {"recovery": "$success", "outage": "b $error", "operator": "$accent"}
KIND_W = 8


def event_line(e: Event, wide: bool) -> str:
    style = KIND_STYLE.get(e.kind) or LEVEL_STYLE.get(e.level, "$foreground")
    kind = f"[{MUTED}]{literal(e.kind[:KIND_W]):<{KIND_W}}[/] " if wide else ""
    return f"[{MUTED}]{units.clock(e.t)}[/] {kind}[{style}]{literal(e.message)}[/]"


class EventsPanel(Panel):
    """Takes what height it is given (the rest of the screen) and shows the newest lines."""

    TITLE = "Events"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.events: deque[Event] = deque(maxlen=KEEP)
        self.total = 0

    def add(self, events: list[Event]) -> None:
        self.events.extend(events)
        self.total += len(events)

    def clear(self) -> None:
        self.events.clear()

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        rows = max(1, self.content_size.height or 3)
        shown = list(self.events)[-rows:]
        if not shown:
            return self.TITLE, f"[{MUTED}]no events yet[/]"
        wide = width >= 70
        title = f"{self.TITLE} · {self.total}" if self.total > rows else self.TITLE
        return title, "\n".join(event_line(e, wide) for e in shown)
