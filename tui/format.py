"""Number formatting for the console: short, fixed-ish widths, "n/a" for unknown.

A `None` is "unknown" everywhere in a Snapshot and must never be drawn as a zero,
so every formatter takes `None` and returns `missing` ("n/a" unless told).
"""

from __future__ import annotations

from textual.content import Content, Span

NA = "n/a"
MUTED = "$foreground-muted"  # the theme variable for labels and quiet text
NO_SAMPLES = "–"  # a latency window with no samples: nothing measured, not unknown


def fmt_ms(us: float | None, missing: str = NA) -> str:
    """A latency in µs as ms or s with about three significant figures: 0.42 ms, 12.3 ms, 1.24 s."""
    if us is None:
        return missing
    ms = us / 1000.0
    if ms < 10:
        return f"{ms:.2f} ms"
    if ms < 100:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    s = ms / 1000.0
    if s < 10:
        return f"{s:.2f} s"
    if s < 100:
        return f"{s:.1f} s"
    return f"{s:.0f} s"


_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _byte_unit(n: float) -> int:
    unit = 0
    while n >= 1024 and unit < len(_BYTE_UNITS) - 1:
        n /= 1024
        unit += 1
    return unit


def fmt_bytes(n: float | None, missing: str = NA) -> str:
    """Binary units, one decimal above KiB: 512 B, 12.3 GiB."""
    if n is None:
        return missing
    unit = _byte_unit(n)
    value = n / 1024**unit
    return f"{value:.0f} {_BYTE_UNITS[unit]}" if unit == 0 else f"{value:.1f} {_BYTE_UNITS[unit]}"


def fmt_bytes_pair(used: float | None, total: float | None, missing: str = NA) -> str:
    """used/total in the unit of the total, so both read at a glance: 45.2/79.6 GiB."""
    if used is None or total is None:
        return f"{fmt_bytes(used, missing)}/{fmt_bytes(total, missing)}"
    unit = _byte_unit(total)
    scale = 1024**unit
    return f"{used / scale:.1f}/{total / scale:.1f} {_BYTE_UNITS[unit]}"


def fmt_rate(per_s: float | None, missing: str = NA) -> str:
    """A rate without its unit: 0.25, 12.3, 1,234, 12.3M."""
    if per_s is None:
        return missing
    if per_s < 10:
        return f"{per_s:.2f}"
    if per_s < 100:
        return f"{per_s:.1f}"
    if per_s < 10_000_000:
        return f"{per_s:,.0f}"
    return f"{per_s / 1e6:.1f}M"


def fmt_count(n: float | None, missing: str = NA) -> str:
    """A cumulative count: 12,345 up to ten million, then 12.3M / 4.56G."""
    if n is None:
        return missing
    if n < 10_000_000:
        return f"{n:,.0f}"
    if n < 10_000_000_000:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e9:.2f}G"


def fmt_num(x: float | None, missing: str = NA) -> str:
    """A gauge that is usually whole (queue lengths scraped as floats): 3, 2.5."""
    if x is None:
        return missing
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def fmt_pct(x: float | None, missing: str = NA) -> str:
    """A percentage already in 0..100: 45.2%."""
    if x is None:
        return missing
    return f"{x:.0f}%" if x >= 100 else f"{x:.1f}%"


def fmt_elapsed(seconds: float | None, missing: str = NA) -> str:
    """h:mm:ss; hours keep growing past 24 (a 72-hour soak reads 72:00:00)."""
    if seconds is None:
        return missing
    total = max(0, int(seconds))
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


def literal(text: str) -> str:
    """`text` made literal inside Textual markup (URLs, model names, error messages).

    Every "[" is escaped: textual.markup.escape leaves a trailing "[" alone,
    which then swallows the closing tag that follows it. A trailing backslash
    would escape the next tag, so it gets a space after it.
    """
    text = text.replace("[", "\\[")
    return text + " " if text.endswith("\\") else text


def fmt_clock(t: float | None, missing: str = NA) -> str:
    """Local wall-clock time of a unix timestamp: 14:03:27."""
    if t is None:
        return missing
    import time

    return time.strftime("%H:%M:%S", time.localtime(t))


def fmt_si(x: float | None, missing: str = NA) -> str:
    """A chart axis value in three characters or so: 950, 1.2k, 34k, 1.5M."""
    if x is None:
        return missing
    ax = abs(x)
    if ax < 10:
        return f"{x:.1f}".rstrip("0").rstrip(".") if ax else "0"
    if ax < 1000:
        return f"{x:.0f}"
    if ax < 10_000:
        return f"{x / 1e3:.1f}k"
    if ax < 1_000_000:
        return f"{x / 1e3:.0f}k"
    return f"{x / 1e6:.1f}M"


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
