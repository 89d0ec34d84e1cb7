"""A small block chart drawn as text: one colour, a y-axis top and zero, one column per bucket.

Cheap on purpose: the text changes only when a History bucket completes (every
couple of seconds), and a single style per row keeps the bytes on the wire low.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.widgets import Static

from loadgen.model import units
from tui.format import MUTED, NO_SAMPLES, block_rows, nice_max, sparkline, tidy
from tui.history import History

AXIS_W = 5  # "1.2k" + the axis tick


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
        fmt: Callable[[float | None], str] = units.si,
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
        self._width = 0

    def show(self, history: History | None, width: int) -> None:
        self._history = history
        self._width = width
        if history is None or width <= AXIS_W + 4:
            return
        markup = self.render_chart(history, width, self._rows())
        if markup != self._markup:
            self._markup = markup
            # a chart sized by the layout (1fr) draws into the rows it has: no layout pass
            self.update(tidy(markup), layout=not self._fills())

    def _fills(self) -> bool:
        """The layout sizes the chart (tall screens: 1fr), not its text."""
        height = self.styles.height
        return height is not None and height.is_fraction

    def _rows(self) -> int:
        """As many rows as the layout gives the chart (its caption takes one); before the
        first layout, or where it sizes to its content, `rows`."""
        given = self.size.height - 1 if self._fills() else 0
        return max(self.rows, given) if given > 0 else self.rows

    def on_resize(self) -> None:
        # a taller or shorter terminal: the same data at the new number of rows
        if self._history is not None:
            self.show(self._history, self._width)

    def render_chart(self, history: History, width: int, rows: int) -> str:
        n = width - AXIS_W
        values = history.values(self.series, n)
        known = [v for v in values if v is not None]
        limit = self.limit() if self.limit else None
        top = nice_max(max([*known, limit or 0.0, 0.0]))
        # the time the drawn columns cover (from the oldest with data), not the chart's width:
        # 38 s of data in a 2-minute-wide chart is "last 38 s"
        first = next((i for i, v in enumerate(values) if v is not None), n)
        span = f"last {_span((n - first) * history.bucket_s)}" if first < n else "no data yet"
        last = self.fmt(known[-1]) if known else NO_SAMPLES
        lines = [f"[{MUTED}]{self.caption} [/][b]{last}[/][{MUTED}] · {span}[/]"]
        colour = self.colour
        if limit is not None and known and max(known) > limit:
            colour = "$error"
        for i, row in enumerate(block_rows(values, rows, top)):
            axis = units.si(top) if i == 0 else ("0" if i == rows - 1 else "")
            lines.append(f"[{MUTED}]{axis:>{AXIS_W - 1}}│[/][{colour}]{row}[/]")
        return "\n".join(lines)


def _span(seconds: float) -> str:
    """The window the columns cover, named in whole units as the console names its windows
    (10 s, 1 min), not a measured span (units.duration): it grows a bucket at a time."""
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def spark_markup(history: History | None, series: str, width: int, colour: str) -> str:
    """One coloured row of block characters: the last `width` buckets of `series`."""
    if history is None or width <= 0:
        return ""
    return f"[{colour}]{sparkline(history.values(series, width))}[/]"
