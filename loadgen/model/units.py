"""Units: how tokentop reads a figure people wrote, and how it writes one for people.

Reading. Every front door (the command line's flags, the eval plan's TOML, the SLO
grammar) reads its times, fractions, sizes, rates and counts with the parsers here, so
`24h`, `5%` and `500ms` mean the same wherever they are written. Each parser takes text
or (TOML) a number, and raises UnitError: its text says what was expected and what was
given, in one line a user can act on. Units are case-blind (`24H`, `500MS`: the SLO
grammar lower-cases its text, and a flag should not mean less than an SLO).

    parse_seconds    20, 0.5, "20s", "500ms", "5m", "24h", "2d"; a bare number is seconds
    parse_latency_us "500ms", "2s", "800us", "800µs", in µs; a bare number only where the
                     caller names its unit (a `--…-ms` flag), else refused (1000× off)
    parse_fraction   0.05, "5%"; 0..1
    parse_size       512, "4KiB", "64MiB", "1.5GB", "8G"; bytes (k, M, G, T: powers of
                     1000; Ki, Mi, Gi, Ti: of 1024)
    parse_rate       5, "5/s", "300/m", "3600/h"; per second, 0 or more
    parse_whole      a whole number of at least a minimum
    parse_positive   a number above 0 (or 0 or more)

Writing. The formatters are the one way a figure reaches people: the console, the reports,
the command line's lines. Each takes None for "unknown" and then writes NA, "n/a", with no
unit after it (never "n/a ms" or "– %"). A caller may name another text for a missing
value where it means something else (the console's "–": a window with no samples).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable

NA = "n/a"  # an unknown figure, wherever it is printed: never a zero, never with a unit


class UnitError(ValueError):
    """A value that cannot be read; str(e) is the line for the user."""

    def __init__(self, problem: str, *value: object) -> None:
        # `value`, when given, is what was written: the message ends "got <value>", shown
        # here as Python writes it ('lots', -1); `worded` shows it another door's way
        self.problem, self.value = problem, value
        super().__init__(self.worded(_shown))

    def worded(self, show: Callable[[object], str]) -> str:
        """The message with the value written by `show` (the plan: as TOML writes it)."""
        return f"{self.problem}, got {show(self.value[0])}" if self.value else self.problem


def _shown(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


# ---- reading --------------------------------------------------------------------------------

# a number as people write it (no inf or nan), then the unit, spaces allowed between
_FORM = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*(\S*?)\s*$", re.I)

# µs in each time unit, whole numbers, so that "800us" is 800 and "0.1s" is 0.1 exactly
US_IN = {"us": 1, "µs": 1, "ms": 10**3, "s": 10**6, "m": 60 * 10**6, "min": 60 * 10**6,
         "h": 3600 * 10**6, "d": 86400 * 10**6}
_SIZE_IN = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "ki": 2**10, "kib": 2**10,
            "m": 10**6, "mb": 10**6, "mi": 2**20, "mib": 2**20, "g": 10**9, "gb": 10**9,
            "gi": 2**30, "gib": 2**30, "t": 10**12, "tb": 10**12, "ti": 2**40, "tib": 2**40}
_PER_S = {"": 1.0, "/s": 1.0, "/m": 1 / 60, "/min": 1 / 60, "/h": 1 / 3600}

SECONDS_EXPECTED = 'expected seconds, e.g. 90, "90s", "5m" or "24h"'
LATENCY_EXPECTED = 'expected a time with its unit, e.g. "500ms", "2s" or "800us"'
FRACTION_EXPECTED = 'expected a fraction, e.g. 0.05 or "5%"'
SIZE_EXPECTED = 'expected a size in bytes, e.g. 512, "64MiB" or "1.5GB"'
RATE_EXPECTED = 'expected a rate per second, e.g. 5, "5/s" or "300/m"'


def _reading(value: object, expected: str) -> tuple[float, str, str]:
    """(number, unit lower-cased, the number as written) of a number or of text such as
    "20s"; UnitError(expected) for anything else (true, "ten", "inf", a list)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number, unit = float(value), ""
        written = str(value) if isinstance(value, int) else f"{value:f}".rstrip("0").rstrip(".")
    elif isinstance(value, str) and (m := _FORM.match(value)):
        number, unit, written = float(m[1]), m[2].lower(), m[1]
    else:
        raise UnitError(expected, value)
    if not math.isfinite(number):  # 1e999: no figure of ours is infinite
        raise UnitError(expected, value)
    return number, unit, written


def parse_seconds(value: object, *, zero: bool = False) -> float:
    """Seconds above 0 (0 too with `zero`): a bare number is seconds, or a unit of US_IN
    ("500ms", "5m", "24h", "2d")."""
    number, unit, _ = _reading(value, SECONDS_EXPECTED)
    if unit not in ("", *US_IN):
        raise UnitError(SECONDS_EXPECTED, value)
    seconds = number * US_IN[unit] / 1e6 if unit else number
    if seconds < 0 or (seconds == 0 and not zero):
        raise UnitError(f"must be {'0 or more' if zero else 'more than 0'} seconds", value)
    return seconds


def parse_latency_us(value: object, *, bare: str | None = None) -> float:
    """A time in µs, 0 or more, its unit required: `ttft<20` could be 20 ms or 20 s, and a
    guess judges a run against a limit 1000× off. `bare`: the unit a bare number is in,
    where the caller's name says it (`--ttft-ms 50`)."""
    expected = LATENCY_EXPECTED if bare is None else \
        f'expected a time, e.g. 200 ({bare}), "0.5s" or "800us"'
    number, unit, written = _reading(value, expected)
    if unit == "" and bare is None:
        raise UnitError(f"time {written!r} has no unit: write {written}ms or {written}s "
                        "(units: ms, s, us)")
    unit = unit or bare or ""
    if unit not in US_IN:
        raise UnitError(expected, value)
    if number < 0:
        raise UnitError("a time must be 0 or more", value)
    return number * US_IN[unit]


def parse_fraction(value: object) -> float:
    """A fraction 0..1, or a percentage ("5%")."""
    number, unit, _ = _reading(value, FRACTION_EXPECTED)
    if unit not in ("", "%"):
        raise UnitError(FRACTION_EXPECTED, value)
    fraction = number / 100.0 if unit == "%" else number
    if not 0.0 <= fraction <= 1.0:
        raise UnitError("must be between 0 and 1", value)
    return fraction


def parse_size(value: object) -> int:
    """Bytes, 0 or more: 512, "4KiB", "1.5GB", "8G" (decimal), "64Mi" (binary)."""
    number, unit, _ = _reading(value, SIZE_EXPECTED)
    if unit not in _SIZE_IN:
        raise UnitError(SIZE_EXPECTED, value)
    if number < 0:
        raise UnitError("a size must be 0 or more", value)
    return round(number * _SIZE_IN[unit])


def parse_rate(value: object) -> float:
    """Per second, 0 or more: 5, "5/s", "300/m", "3600/h"."""
    number, unit, _ = _reading(value, RATE_EXPECTED)
    if unit not in _PER_S:
        raise UnitError(RATE_EXPECTED, value)
    if number < 0:
        raise UnitError("a rate must be 0 or more", value)
    return number * _PER_S[unit]


def parse_whole(value: object, minimum: int = 0) -> int:
    """A whole number of at least `minimum` (streams, workers, a pid): 2.5 is refused, not
    cut to 2."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        number = int(value)
    else:
        raise UnitError("expected a whole number", value)
    if number < minimum:
        raise UnitError(f"must be at least {minimum}", value)
    return number


def parse_positive(value: object, *, zero: bool = False) -> float:
    """A number above 0 (0 too with `zero`): a speed-up, a gamma shape, a cap."""
    number, unit, _ = _reading(value, "expected a number")
    if unit:
        raise UnitError("expected a number", value)
    if number < 0 or (number == 0 and not zero):
        raise UnitError(f"must be {'0 or more' if zero else 'more than 0'}", value)
    return number


PARAMS_EXPECTED = 'expected a parameter count, e.g. "8B", "1.5B", "350M" or 7e9'
_PARAMS_IN = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_params(value: object) -> float:
    """A model's parameters, in billions: "8B", "70b", "1.5B", "350M", or a bare count
    (7e9). A bare count under a million is refused: "8" is surely 8B, not 8 parameters."""
    number, unit, written = _reading(value, PARAMS_EXPECTED)
    if unit not in _PARAMS_IN:
        raise UnitError(PARAMS_EXPECTED, value)
    count = number * _PARAMS_IN[unit]
    if count <= 0:
        raise UnitError("a parameter count must be more than 0", value)
    if unit == "" and count < 1e6:
        raise UnitError(f"{written} parameters is no model's size: write {written}B or "
                        f"{written}M")
    return count / 1e9


# ---- writing --------------------------------------------------------------------------------


def _figures(x: float) -> str:
    """About three significant figures, never an exponent: 0.42, 9.99, 12.3, 215, 1234.
    The decimals are picked after rounding, so 9.996 is "10.0", not "10.00"."""
    for digits, below in ((2, 10), (1, 100)):
        text = f"{x:.{digits}f}"
        if abs(float(text)) < below:
            return text
    return f"{x:.0f}"


def us_of_ms(value: float | None) -> float | None:
    """µs of a figure kept in ms (summaries, reports), for `ms`; None stays None."""
    return None if value is None else value * 1e3


def ms(us: float | None, missing: str = NA) -> str:
    """A latency given in µs: 0.42 ms, 9.99 ms, 12.3 ms, 215 ms, then 1.00 s, 1.52 s, 12.3 s
    (three figures, the unit changing at 1000 ms)."""
    if us is None:
        return missing
    text = _figures(us / 1e3)
    if abs(float(text)) < 1000:
        return f"{text} ms"
    return f"{_figures(us / 1e6)} s"


def duration(seconds: float | None, missing: str = NA) -> str:
    """A span of time, one decimal, in seconds under 2 minutes, in minutes under 2 hours,
    else in hours: 0.5 s, 12.3 s, 90.0 s, 2.5 min, 10.0 min, 24.0 h (an MTTR, an outage, a
    run's length; a tenth of a second is what an outage's edges are known to)."""
    if seconds is None:
        return missing
    for unit, size in (("s", 1), ("min", 60)):
        text = f"{seconds / size:.1f}"
        if abs(float(text)) < 120:  # after rounding: 119.97 s is "2.0 min", not "120.0 s"
            return f"{text} {unit}"
    return f"{seconds / 3600:.1f} h"


def elapsed(seconds: float | None, missing: str = NA) -> str:
    """A run's clock, h:mm:ss; hours keep growing past 24 (a 72-hour soak reads 72:00:00)."""
    if seconds is None:
        return missing
    h, rest = divmod(max(0, int(seconds)), 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


def clock(t: float | None, missing: str = NA) -> str:
    """The local wall-clock time of a unix timestamp: 14:03:27."""
    if t is None:
        return missing
    return time.strftime("%H:%M:%S", time.localtime(t))


BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _byte_unit(n: float) -> int:
    unit = 0
    while abs(n) >= 1024 and unit < len(BYTE_UNITS) - 1:
        n /= 1024
        unit += 1
    return unit


def bytes_(n: float | None, missing: str = NA) -> str:
    """Binary units, one decimal above bytes: 512 B, 4.0 KiB, 12.3 GiB."""
    if n is None:
        return missing
    unit = _byte_unit(n)
    if unit == 0:
        return f"{n:.0f} B"
    return f"{n / 1024**unit:.1f} {BYTE_UNITS[unit]}"


def bytes_pair(used: float | None, total: float | None, missing: str = NA) -> str:
    """used/total in the unit of the total, so both read at a glance: 45.2/79.6 GiB."""
    if used is None or total is None:
        return f"{bytes_(used, missing)}/{bytes_(total, missing)}"
    unit = _byte_unit(total)
    scale = 1024**unit
    return f"{used / scale:.1f}/{total / scale:.1f} {BYTE_UNITS[unit]}"


def rate(per_s: float | None, unit: str = "", missing: str = NA) -> str:
    """A rate, its unit after it when given: 0.25, 12.3 req/s, 1,234 tok/s, 12.3M tok/s."""
    if per_s is None:
        return missing
    if abs(per_s) < 10:
        text = f"{per_s:.2f}"
    elif abs(per_s) < 100:
        text = f"{per_s:.1f}"
    elif abs(per_s) < 10_000_000:
        text = f"{per_s:,.0f}"
    else:
        text = f"{per_s / 1e6:.1f}M"
    return f"{text} {unit}" if unit else text


def pct(fraction: float | None, missing: str = NA, *, whole: float = 1.0) -> str:
    """A fraction as a percentage, one decimal: 12.5%, 100% (whole at 100 and above). A
    fraction short of 1 (or above 0) gets up to three decimals rather than read as 100.0%
    (or 0.0%): a success rate of 0.9995 is 99.95%. `whole`: what is 100% (100 for a figure
    already in per cent, as a Snapshot's `_pct` fields are)."""
    if fraction is None:
        return missing
    x = fraction * 100.0 / whole
    if x >= 100:
        return f"{x:.0f}%"
    for digits in (1, 2, 3):
        text = f"{x:.{digits}f}"
        if float(text) not in (0.0, 100.0) or x == 0:
            break
    return f"{text}%"


def count(n: float | None, missing: str = NA) -> str:
    """A cumulative count: 12,345 up to ten million, then 12.3M, 4.56G."""
    if n is None:
        return missing
    if abs(n) < 10_000_000:
        return f"{n:,.0f}"
    if abs(n) < 10_000_000_000:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e9:.2f}G"


def number(x: float | None, missing: str = NA) -> str:
    """A gauge that is usually whole (queue lengths scraped as floats): 3, 2.5."""
    if x is None:
        return missing
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def si(x: float | None, missing: str = NA) -> str:
    """An axis value in three characters or so: 0.5, 950, 1.2k, 34k, 1.5M."""
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
