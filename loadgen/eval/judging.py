"""How one eval's row is judged against another's: better, worse or the same within the
noise (the rule: loadgen.eval.compare's docstring), and an eval's column letter. Apart from
compare.py so that loadgen.eval.scenarios, which compare calls for its last section, judges
by the same rule without importing compare back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from loadgen.eval.matrix import Row

NOISE_BAND_PCT = 5.0  # one run each: a change of this much or less is the same within noise


class Judgement(StrEnum):
    BETTER = "better"
    WORSE = "worse"
    SAME = "same within noise"
    FACT = "not judged"  # better is None: the change is a fact (the knee's load)
    # a latency taken at another load in each eval (the knee's, the long tail's): the
    # change says what the load did as much as the server
    OTHER_LOAD = "not judged: at another load"
    MISSING = "n/a"  # a side has no value


class Noise(StrEnum):
    """Which rule judged a change (the output's notes say each rule used once)."""

    INTERVALS = "95 % intervals"
    BAND = "one-run band"
    RESOLUTION = "the figure's resolution"  # a change within a tick of a time dated by ticks
    NONE = ""  # not judged by noise (a fact, a missing side, no change at all)


@dataclass(frozen=True)
class Change:
    """A later eval's row against the first's."""

    judgement: Judgement
    pct: float | None  # None: from 0, or a side missing
    from_zero: bool = False
    to_zero: bool = False
    noise: Noise = Noise.NONE

    def text(self) -> str:
        """"+12.3% worse", "from 0 worse", "-100% (to 0) better", "+200% not judged"."""
        if self.judgement is Judgement.MISSING:
            return ""
        if self.from_zero:
            amount = "from 0"
        else:
            amount = f"{self.pct:+.1f}%" + (" (to 0)" if self.to_zero else "")
        return f"{amount} {self.judgement}"


@dataclass(frozen=True)
class Line:
    """One row id across the evals: each eval's Row (None where it has none) and each
    later eval's Change against the first (None for the first itself)."""

    id: str
    rows: tuple[Row | None, ...]
    changes: tuple[Change | None, ...]

    @property
    def row(self) -> Row:
        """The row that names the line: the first eval's that has it."""
        return next(r for r in self.rows if r is not None)


def judge(a: Row, b: Row) -> Change:
    """b against a, by the noise rule of the module's docstring."""
    if a.value is None or b.value is None or math.isnan(a.value) or math.isnan(b.value):
        return Change(Judgement.MISSING, None)
    diff = b.value - a.value
    from_zero = a.value == 0 and diff != 0
    pct = None if a.value == 0 else diff / abs(a.value) * 100
    to_zero = b.value == 0 and a.value != 0
    if a.better is None:
        return Change(Judgement.FACT, 0.0 if diff == 0 else pct, from_zero, to_zero)
    if a.unit == "ms" and a.load != b.load:
        return Change(Judgement.OTHER_LOAD, 0.0 if diff == 0 else pct, from_zero, to_zero)
    if diff == 0:
        return Change(Judgement.SAME, 0.0)
    if abs(diff) <= max(a.resolution, b.resolution):  # within what the figure can tell
        return Change(Judgement.SAME, pct, from_zero, to_zero, Noise.RESOLUTION)
    noise = Noise.INTERVALS if _intervals(a, b) else Noise.BAND
    if not _beyond_noise(a, b, pct):
        return Change(Judgement.SAME, pct, from_zero, to_zero, noise)
    good = (diff > 0) == (a.better == "higher")
    return Change(Judgement.BETTER if good else Judgement.WORSE, pct, from_zero, to_zero,
                  noise)


def _intervals(a: Row, b: Row) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """Both rows' 95 % intervals, when both were repeated and have one."""
    if a.repeats > 1 and b.repeats > 1 and a.interval is not None and b.interval is not None:
        return a.interval, b.interval
    return None


def _beyond_noise(a: Row, b: Row, pct: float | None) -> bool:
    both = _intervals(a, b)
    if both is not None:
        (a_low, a_high), (b_low, b_high) = both
        return a_high < b_low or b_high < a_low  # the intervals do not overlap
    return pct is None or abs(pct) > NOISE_BAND_PCT  # from 0: beyond any band


def letter(i: int) -> str:
    """An eval's column name: A, B, … (the names, which may be long paths, are listed once
    above the table instead of cut to fit a column)."""
    return chr(ord("A") + i) if i < 26 else f"E{i + 1}"
