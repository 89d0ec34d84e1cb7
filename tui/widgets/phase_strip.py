"""The phase strip: where a running eval stands, one line under the header.

    eval · phase 3/7 long tail · 0:12:04 left in phase · 3:10:00 left in eval · 17/52 rows

The line is one of a few wordings, longest first, the first that fits the width taken
(a terminal 80 columns wide gets a shorter one): it is never wrapped, and never cut in
the middle of a word; on a wide terminal what the phase measures follows, cut at a word.
Only the console over an eval (a source that WatchesEval) has one.
"""

from __future__ import annotations

from collections.abc import Iterator

from rich.cells import cell_len
from textual.events import Resize
from textual.widgets import Static

from loadgen.eval.eval_process import EvalProgress
from loadgen.model import units
from tui.format import MUTED, literal, tidy

SEP = " · "
ELLIPSIS = "…"


def _phase(p: EvalProgress) -> str:
    return f"{p.index}/{p.count} {p.name.replace('_', ' ')}"


def _rows(p: EvalProgress) -> str:
    return f"{p.rows_filled}/{p.rows_total} rows"


def wordings(p: EvalProgress | None) -> Iterator[list[str]]:
    """The strip's parts, longest wording first; the last is short enough for any width the
    console is drawn at (80 columns and up)."""
    if p is None:
        yield ["eval", "starting: the first phase begins when the target answers"]
        yield ["eval", "starting"]
        return
    if p.state != "running":
        yield from _ended(p)
        return
    phase, eval_ = units.elapsed(p.phase_left_s), units.elapsed(p.eval_left_s)
    yield ["eval", f"phase {_phase(p)}", f"{phase} left in phase", f"{eval_} left in eval",
           _rows(p)]
    yield ["eval", _phase(p), f"{phase} left in phase", f"{eval_} in eval", _rows(p)]
    yield ["eval", _phase(p), f"{phase}/{eval_} left", _rows(p)]
    yield ["eval", _phase(p), f"{eval_} left"]


def _ended(p: EvalProgress) -> Iterator[list[str]]:
    if p.state == "finished":
        yield ["eval", f"finished, all {p.count} phases", _rows(p)]
        yield ["eval", "finished", _rows(p)]
        return
    what = "stopped" if p.state == "stopped" else "failed"
    yield ["eval", f"{what} in phase {_phase(p)}", f"{_rows(p)} kept", "the same --out resumes"]
    yield ["eval", f"{what} in phase {_phase(p)}", _rows(p)]
    yield ["eval", what, _phase(p)]


def strip_text(p: EvalProgress | None, width: int) -> str:
    """The longest wording that fits `width` cells; the longest of all with what the phase
    measures after it, while there is room for a few words of it (plain text; the widget
    styles it)."""
    options = list(wordings(p))
    for i, parts in enumerate(options):
        line = SEP.join(parts)
        if cell_len(line) <= width:
            return line + (_about(p, width - cell_len(line)) if i == 0 else "")
    return SEP.join(options[-1])  # narrower than any wording: the terminal cuts it


MIN_ABOUT = 16  # fewer columns than this left: what the phase measures is left out


def _about(p: EvalProgress | None, room: int) -> str:
    if p is None or p.state != "running" or room < MIN_ABOUT + len(SEP):
        return ""
    return SEP + cut_at_word(p.about, room - len(SEP))


def cut_at_word(text: str, width: int) -> str:
    """`text` in at most `width` cells, cut after a whole word with an ellipsis."""
    if cell_len(text) <= width:
        return text
    out = ""
    for word in text.split():
        longer = f"{out} {word}" if out else word
        if cell_len(longer) + len(ELLIPSIS) > width:
            break
        out = longer
    return out + ELLIPSIS if out else ""


def strip_markup(text: str) -> str:
    """The strip's text styled: the parts after the first muted, the separators dimmer."""
    first, _, rest = text.partition(SEP)
    shown = f"[b $accent]{literal(first)}[/]"
    if rest:
        parts = [literal(part) for part in rest.split(SEP)]
        shown += f"[{MUTED}]{SEP}[/]" + f"[{MUTED}]{SEP}[/]".join(parts)
    return shown


class PhaseStrip(Static):
    """Where the eval stands, one line; repainted only when its text changes."""

    DEFAULT_CSS = """
    PhaseStrip {
        height: 1;
        text-wrap: nowrap;
    }
    """

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self.progress: EvalProgress | None = None
        self._text: str | None = None

    def show(self, progress: EvalProgress | None) -> None:
        self.progress = progress
        self._draw()

    def on_resize(self, event: Resize) -> None:
        self._draw()

    def _draw(self) -> None:
        width = self.size.width or 80
        text = strip_text(self.progress, width)
        if text != self._text:
            self._text = text
            self.update(tidy(strip_markup(text)))
