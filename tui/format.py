"""Number formatting for the console: short, fixed-ish widths, "n/a" for unknown.

A `None` is "unknown" everywhere in a Snapshot and must never be drawn as a zero,
so every formatter takes `None` and returns `missing` ("n/a" unless told).
"""

from __future__ import annotations

NA = "n/a"
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
