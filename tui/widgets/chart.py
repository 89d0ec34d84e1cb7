"""A small block chart drawn as text: one colour, a y-axis top and zero, one column per bucket.

Cheap on purpose: the text changes only when a History bucket completes (every
couple of seconds), and a single style per row keeps the bytes on the wire low.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.widgets import Static

from tui.format import MUTED, block_rows, fmt_si, nice_max, sparkline, tidy
from tui.history import History

AXIS_W = 5  # "1.2k" + the axis tick
TALL_ROWS_AT = 52


class Chart(Static):
    """`series` from the app's History, `rows` high; caption above (one muted line)."""

    DEFAULT_CSS = """
    Chart {
        height: auto;
        text-wrap: nowrap;
        text-overflow: clip;
    }
    """

    def __init__(
        self,
        series: str,
        caption: str,
        *,
        rows: int = 4,
        colour: str = "$primary",
        fmt: Callable[[float | None], str] = fmt_si,
        limit: Callable[[], float | None] | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__("", id=id, classes=classes)
        self.series = series
        self.caption = caption
        self.rows = rows
        self.colour = colour
        self.fmt = fmt
        self.limit = limit
        self._markup: str | None = None
        self._history: History | None = None

    def show(self, history: History | None, width: int) -> None:
        self._history = history
        if history is None or width <= AXIS_W + 4:
            return
        # tall terminals (200x60) get twice the rows
        tall = self.is_attached and self.app.size.height >= TALL_ROWS_AT
        markup = self.render_chart(history, width, self.rows * 2 if tall else self.rows)
        if markup != self._markup:
            self._markup = markup
            self.update(tidy(markup))

    def render_chart(self, history: History, width: int, rows: int) -> str:
        n = width - AXIS_W
        values = history.values(self.series, n)
        known = [v for v in values if v is not None]
        limit = self.limit() if self.limit else None
        top = nice_max(max([*known, limit or 0.0, 0.0]))
        span = f"last {_span(n * history.bucket_s)}"
        last = self.fmt(known[-1]) if known else "–"
        lines = [f"[{MUTED}]{self.caption} [/][b]{last}[/][{MUTED}] · {span}[/]"]
        colour = self.colour
        if limit is not None and known and max(known) > limit:
            colour = "$error"
        for i, row in enumerate(block_rows(values, rows, top)):
            axis = fmt_si(top) if i == 0 else ("0" if i == rows - 1 else "")
            lines.append(f"[{MUTED}]{axis:>{AXIS_W - 1}}│[/][{colour}]{row}[/]")
        return "\n".join(lines)


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def spark_markup(history: History | None, series: str, width: int, colour: str) -> str:
    """One coloured row of block characters: the last `width` buckets of `series`."""
    if history is None or width <= 0:
        return ""
    return f"[{colour}]{sparkline(history.values(series, width))}[/]"
