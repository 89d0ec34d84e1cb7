"""The base of every main-screen panel: a titled box whose text redraws only when it changed.

Over SSH every repaint costs bytes, so a panel keeps the markup it last showed
and skips `update()` when the new markup is the same. Panels render from a
`View` (the last Snapshot, window stats and history rings, computed once per
refresh by the app) and keep it, so a resize can re-render at the new width
without new data. A panel may hold charts below its text (see `Chart`); they
redraw on their own schedule (when a chart column completes), not every tick.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Resize
from textual.widgets import Static

from tui.format import tidy
from tui.view import View

# Content rows a grid panel may take below the "-tall" breakpoint: at 80x24 two rows of
# panels, each a rule and 7 lines, leave the GPU panel and 3 rows of events their room.
# One more line would push the screen past the terminal's height (a scrollbar then takes
# two columns from every panel, and the events log is lost).
SHORT_LINES = 7


def keep_within(lines: list[tuple[str, int]], budget: int | None) -> list[str]:
    """The lines (markup, rank) in their order, the highest ranks left out first (the last
    of equals first) until `budget` lines remain; rank 0 always stays. None: no limit."""
    kept = list(lines)
    while budget is not None and len(kept) > budget:
        worst = max(range(len(kept)), key=lambda i: (kept[i][1], i))
        if kept[worst][1] == 0:
            break
        del kept[worst]
    return [markup for markup, _ in kept]


class Line(Static):
    DEFAULT_CSS = """
    Line {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """


class Body(Vertical):
    """A panel's text, one widget per line, so that a tick repaints only the lines whose
    markup changed (every repainted line is bytes on an SSH link)."""

    DEFAULT_CSS = """
    Body {
        height: auto;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: list[str] = []
        # held here, not queried: a mount is applied later, so a query right after it (or
        # while the screen comes up or goes away) may not see the new lines yet
        self._widgets: list[Line] = []

    def set_markup(self, markup: str) -> None:
        lines = markup.split("\n")
        if lines == self._lines:
            return
        if len(self._widgets) < len(lines):
            more = [Line("") for _ in range(len(lines) - len(self._widgets))]
            self._widgets += more
            self.mount(*more)
        for extra in self._widgets[len(lines):]:
            extra.remove()
        del self._widgets[len(lines):]
        widgets = self._widgets
        old = self._lines
        for i, line in enumerate(lines):
            if i >= len(old) or old[i] != line:
                # a line is one row whatever its text: no layout pass (reflowing the whole
                # screen for a changed number was most of the console's CPU)
                widgets[i].update(tidy(line), layout=False)
        self._lines = lines

    @property
    def plain(self) -> str:
        return "\n".join(str(w.render()) for w in self.query_children(Line))


class Panel(Vertical):
    """A titled, compact panel: one top rule carrying the title, no side borders."""

    DEFAULT_CSS = """
    Panel {
        height: auto;
        padding: 0 1;
        border-top: solid $primary;
        border-title-color: $primary;
        border-title-style: bold;
        border-title-align: left;
    }
    """

    TITLE = ""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = self.TITLE
        self._view: View | None = None
        self.body = Body(classes="body")

    def compose(self) -> ComposeResult:
        yield self.body
        yield from self.compose_extra()

    def compose_extra(self) -> ComposeResult:
        """Charts or other widgets below the text."""
        yield from ()

    @property
    def text_width(self) -> int:
        """Columns available for text; 0 before the first layout (render as narrow)."""
        return self.content_size.width

    @property
    def plain(self) -> str:
        """The panel's text as shown (for tests and the `s` snapshot)."""
        return self.body.plain

    def show(self, view: View) -> None:
        self._view = view
        self._redraw()

    def on_resize(self, event: Resize) -> None:
        # layouts differ by width (extra columns when there is room)
        self._redraw()

    def _redraw(self) -> None:
        if self._view is None:
            return
        title, markup = self.render_view(self._view, self.text_width)
        if title != self.border_title:
            self.border_title = title
        self.body.set_markup(markup)
        self.show_extra(self._view, self.text_width)

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        """(title, content markup) for `view` at `width` columns."""
        raise NotImplementedError

    def show_extra(self, view: View, width: int) -> None:
        """Update charts; called after the text on every redraw."""

    def _tall(self) -> bool:
        # the screen carries "-tall" (App.VERTICAL_BREAKPOINTS) when there are rows to spare
        return self.is_attached and self.screen.has_class("-tall")

    def line_budget(self) -> int | None:
        """How many lines the panel may take: SHORT_LINES on a short screen, else any."""
        return None if self._tall() else SHORT_LINES

    def _wide(self) -> bool:
        if not self.is_attached:
            return False
        return self.screen.has_class("-wide") or self.screen.has_class("-xwide")
