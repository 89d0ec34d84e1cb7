"""Events: the newest lines of the run's log (errors, SLO breaches, throttling, outages and
recoveries, operator actions), with wall-clock timestamps; the newest at the bottom.

A line longer than the panel is wrapped under its own text, never cut: the end of a
message is often its advice ("… add --max-in-flight"). When even the newest event is
taller than the panel, its start is shown and the title points to the events screen
(`l`), which holds every event of the run, whole.
"""

from __future__ import annotations

import textwrap

from loadgen.model import units
from loadgen.model.snapshot import Event
from tui.event_log import EventLog
from tui.format import MUTED, literal
from tui.view import View
from tui.widgets.panel import Panel

LEVEL_STYLE = {"error": "$error", "warn": "$warning", "info": "$foreground"}
KIND_STYLE = {"recovery": "$success", "outage": "b $error", "operator": "$accent"}
KIND_W = 8
CLOCK_W = 8  # 14:03:27
WIDE = 70  # from this many columns the kind has a column of its own
EVENTS_KEY = "l"  # the events screen (tui/app.py binds it)


def event_style(e: Event) -> str:
    return KIND_STYLE.get(e.kind) or LEVEL_STYLE.get(e.level, "$foreground")


def event_prefix(e: Event, wide: bool) -> tuple[str, int]:
    """(markup, columns) of what comes before the message: the clock, and the kind."""
    kind = f"[{MUTED}]{literal(e.kind[:KIND_W]):<{KIND_W}}[/] " if wide else ""
    return f"[{MUTED}]{units.clock(e.t)}[/] {kind}", CLOCK_W + 1 + (KIND_W + 1 if wide else 0)


def event_line(e: Event, wide: bool) -> str:
    """One event on one line, as long as its message (the events screen wraps it)."""
    prefix, _ = event_prefix(e, wide)
    return f"{prefix}[{event_style(e)}]{literal(e.message)}[/]"


def wrapped_lines(e: Event, width: int, wide: bool) -> list[str]:
    """The event in lines of at most `width` columns, the message wrapped under itself."""
    prefix, used = event_prefix(e, wide)
    room = max(8, width - used)
    pieces = textwrap.wrap(e.message, room, break_long_words=True,
                           break_on_hyphens=False) or [""]
    style = event_style(e)
    lines = [f"{prefix}[{style}]{literal(pieces[0])}[/]"]
    lines += [f"{' ' * used}[{style}]{literal(p)}[/]" for p in pieces[1:]]
    return lines


def newest_lines(events: list[Event], rows: int, width: int) -> tuple[list[str], bool]:
    """The last `rows` lines of the newest events, each whole (an older one that does not
    fit whole is left out); (lines, whether the newest itself was cut to fit)."""
    wide = width >= WIDE
    shown: list[str] = []
    for e in reversed(events):
        lines = wrapped_lines(e, width, wide)
        if not shown and len(lines) > rows:  # the newest alone is taller than the panel
            return lines[:rows], True
        if len(shown) + len(lines) > rows:
            break
        shown[:0] = lines
    return shown, False


class EventsPanel(Panel):
    """Takes what height it is given (the rest of the screen) and shows the newest lines of
    the console's one EventLog."""

    TITLE = "Events"

    def __init__(self, log: EventLog, *, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.event_log = log

    def _redraw(self) -> None:
        # drawn from the log, not from a View: the console's own notes come before any
        # Snapshot does (the wait for the target)
        title, markup = self.render_log(self.text_width)
        if title != self.border_title:
            self.border_title = title
        self.body.set_markup(markup)

    def show_log(self) -> None:
        self._redraw()

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        return self.render_log(width)

    def render_log(self, width: int) -> tuple[str, str]:
        rows = max(1, self.content_size.height or 3)
        total = len(self.event_log) + self.event_log.dropped
        if not total:
            return self.TITLE, f"[{MUTED}]no events yet[/]"
        # a screenful of the newest is all that can show: each has one line at least
        lines, cut = newest_lines([x.event for x in self.event_log.newest(rows)], rows,
                                  max(1, width))
        title = f"{self.TITLE} · {total}"
        if cut or total > len(lines):
            title += f" · {EVENTS_KEY}: all, whole"
        return title, "\n".join(lines)
