"""The base of every main-screen panel: a Static that redraws only when its text changed.

Over SSH every repaint costs bytes, so a panel keeps the markup it last showed
and skips `update()` when the new markup is the same. Panels render from a
`View` (the last Snapshot plus window stats, computed once per refresh by the
app) and keep it, so a resize can re-render at the new width without new data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from textual.events import Resize
from textual.widgets import Static

from loadgen.snapshot import Snapshot
from loadgen.windows import WindowStats


@dataclass(frozen=True)
class View:
    """What one refresh shows: the newest Snapshot and its windows ("10s", "1m", "run")."""

    snap: Snapshot
    stats: Mapping[str, WindowStats]


class Panel(Static):
    """A titled, compact panel: one top rule carrying the title, no side borders."""

    DEFAULT_CSS = """
    Panel {
        height: auto;
        padding: 0 1;
        border-top: solid $primary;
        border-title-color: $primary;
        border-title-style: bold;
        border-title-align: left;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    TITLE = ""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.border_title = self.TITLE
        self._markup: str | None = None
        self._view: View | None = None

    @property
    def text_width(self) -> int:
        """Columns available for text; 0 before the first layout (render as narrow)."""
        return self.content_size.width

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
        if markup != self._markup:
            self._markup = markup
            self.update(markup)

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        """(title, content markup) for `view` at `width` columns."""
        raise NotImplementedError
