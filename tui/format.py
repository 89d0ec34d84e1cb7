"""What the console draws besides figures: Textual markup made safe (literal, tidy), the
theme's quiet colour, and charts in text (sparklines, block rows).

Figures are written by loadgen.model.units (units.ms, units.rate, units.pct, …), the one
way tokentop prints them, so the console and the reports read alike. A `None` is
"unknown" and is drawn as units.NA, never as a zero; NO_SAMPLES is the console's own
text for a latency window that measured nothing yet (known to be empty, not unknown).
"""

from __future__ import annotations

from textual.content import Content, Span

MUTED = "$foreground-muted"  # the theme variable for labels and quiet text
NO_SAMPLES = "–"  # a latency window with no samples: nothing measured, not unknown


def literal(text: str) -> str:
    """`text` made literal inside Textual markup (URLs, model names, error messages).

    Every "[" is escaped: textual.markup.escape leaves a trailing "[" alone,
    which then swallows the closing tag that follows it. A trailing backslash
    would escape the next tag, so it gets a space after it.
    """
    text = text.replace("[", "\\[")
    return text + " " if text.endswith("\\") else text


# ------------------------------------------------------------------ fitting a width

def cells(markup: str) -> int:
    """Columns `markup` takes on a terminal (its plain text's cell length)."""
    return Content.from_markup(markup).cell_length


def first_fit(width: int, *candidates: str) -> str:
    """The first candidate that fits `width` columns, else the last (the shortest a caller
    has): a panel offers a line from the fullest to the barest wording, so that a narrow
    terminal loses words, never the figure at the end of a cut line."""
    for markup in candidates:
        if cells(markup) <= width:
            return markup
    return candidates[-1]


def joined_to_fit(width: int, head: str, parts: list[str], sep: str = "  ") -> str:
    """`head` then as many of `parts` (most important first) as fit in `width` columns."""
    line = head
    for part in parts:
        if not part:
            continue
        longer = f"{line}{sep}{part}" if line else part
        if cells(longer) > width:
            break
        line = longer
    return line


# ------------------------------------------------------------------ markup → Content

def tidy(markup: str) -> Content:
    """Markup as Content, with every run of blanks kept out of the *start* of a styled run.

    A terminal draws "label 63" the same whichever style the blank has. SVG viewers
    do not: librsvg (rsvg-convert) drops the leading blanks of a <text> element, and
    Textual's screenshots start a new <text> at every style change, so "[dim]label[/] 63"
    shows as "label63" in a picture. Blanks after a styled run join that run (a
    foreground-only style is invisible on a blank), blanks at the start of a run leave
    it, and a line's leading blanks get a style of their own, so no run starts blank.
    """
    content = Content.from_markup(markup)
    text = content.plain
    n = len(text)
    spans: list[Span] = []
    for s in content.spans:
        start, end = s.start, s.end
        while start < end and text[start] == " ":
            start += 1
        if start >= end:
            continue
        if _blank_safe(s.style):
            while end < n and text[end] == " ":
                end += 1
        spans.append(Span(start, end, s.style))
    # leading blanks of each line: a style nothing else uses, so they stay their own run
    pos = 0
    for line in text.split("\n"):
        stripped = len(line) - len(line.lstrip(" "))
        if 0 < stripped < len(line):
            spans.insert(0, Span(pos, pos + stripped, _INDENT_STYLE))
        pos += len(line) + 1
    return Content(text, spans)


_INDENT_STYLE = "$background"


def _blank_safe(style: object) -> bool:
    text = str(style)
    return not any(word in text for word in (" on ", "on $", "reverse", "underline", "strike"))


# ------------------------------------------------------------------ charts in text

BLOCKS = " ▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], vmax: float | None = None) -> str:
    """One row of block characters, one per value (None: a blank)."""
    known = [v for v in values if v is not None]
    top = vmax if vmax else (max(known) if known else 0.0)
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif top <= 0:
            out.append(BLOCKS[1] if v is not None else " ")
        else:
            out.append(BLOCKS[max(1, min(8, round(v / top * 8)))])
    return "".join(out)


def block_rows(values: list[float | None], height: int, vmax: float) -> list[str]:
    """`height` rows of block characters, top row first; each column is one value."""
    rows = []
    full = height * 8
    eighths = [
        0 if v is None or vmax <= 0 or v <= 0 else max(1, min(full, round(v / vmax * full)))
        for v in values
    ]
    for r in range(height):
        base = (height - 1 - r) * 8
        rows.append("".join(BLOCKS[min(8, max(0, e - base))] for e in eighths))
    return rows


def nice_max(x: float) -> float:
    """The chart's top: 1, 2 or 5 times a power of ten at or above `x`."""
    if x <= 0:
        return 1.0
    import math

    p = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if x <= m * p:
            return m * p
    return 10 * p
