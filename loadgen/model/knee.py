"""The knee of a throughput curve: one rule, for the sweep, the eval's ramp and the auto-ramp.

Between two loads the scaling is ln(tok/s ratio) / ln(load ratio): 1 when throughput
grows as fast as the load, 0 when it is flat, below 0 when it falls. A step is past the
knee when its scaling over the step below falls under KNEE_SCALING; the knee is the last
step before that. A ratio of ratios, so a coarse step (1, 4, 16) is judged like a fine one
(a gain per added unit of load is not: over a 4× step a bending curve averages its steep
and flat parts).

KNEE_SCALING is 0.2: doubling the load for under 2^0.2 = 1.15× the throughput (+15 %) is
past the knee, and 4× the load for under 1.32×. The former 0.5 (4× for under 2×) called a
still-climbing curve a knee: on the default simulator (32 slots) 16 → 32 streams gives
+35 % tok/s, scaling 0.43, well inside any SLO; 32 → 64 gives nothing, scaling 0. A
server's batch engine bends smoothly before its slots fill (each added sequence adds
decode time per step), so a threshold near 0.5 lands one doubling early.

When the last step tried still scaled at least KNEE_SCALING over the one before it, the
curve had not bent where the steps ended: its max tok/s (and a max goodput found there) is
a lower bound, and the steps should go further (`still_rising`, LOWER_BOUND).

This is the shared vocabulary (imports nothing but units): loadgen.run.auto_ramp judges
its steps with it and loadgen.analysis.sweep finds the knee with it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

from loadgen.model import units

KNEE_SCALING = 0.2
LOWER_BOUND = "still rising at the last step: a lower bound; extend the steps"


class Measured(Protocol):
    """A step as the rule reads it (a sweep's StepResult): its load and its output tok/s."""

    @property
    def load(self) -> float: ...

    @property
    def output_tok_s(self) -> float: ...


Point = TypeVar("Point", bound="Measured | tuple[float, float]")


def _pair(p: Measured | tuple[float, float]) -> tuple[float, float]:
    if isinstance(p, tuple):
        return float(p[0]), float(p[1])
    return float(p.load), float(p.output_tok_s)


def scaling(lower_load: float, lower_tok_s: float, upper_load: float,
            upper_tok_s: float) -> float | None:
    """ln(tok/s ratio) / ln(load ratio) from the lower step to the upper one: 1 linear, 0
    flat, below 0 falling, -inf when nothing came out at the upper step. None when it
    cannot be read: the same load twice (or a lower one), or nothing measured below."""
    if upper_load <= lower_load or lower_load <= 0 or lower_tok_s <= 0:
        return None
    if upper_tok_s <= 0:
        return -math.inf
    return math.log(upper_tok_s / lower_tok_s) / math.log(upper_load / lower_load)


def past_knee(lower_load: float, lower_tok_s: float, upper_load: float, upper_tok_s: float,
              threshold: float = KNEE_SCALING, unit: str = "streams") -> str | None:
    """Why the upper step is past the knee, in words, or None when it is not (it still
    scaled, or the scaling cannot be read)."""
    e = scaling(lower_load, lower_tok_s, upper_load, upper_tok_s)
    if e is None or e >= threshold:
        return None
    gain = upper_tok_s / lower_tok_s - 1.0
    sign = "+" if gain >= 0 else "-"
    return (f"{sign}{units.pct(abs(gain))} tok/s ({units.rate(lower_tok_s)} → "
            f"{units.rate(upper_tok_s)}) for {upper_load / lower_load:.3g}× the load "
            f"({lower_load:g} → {upper_load:g} {unit}): scaling {_scaling_text(e)}, under "
            f"{threshold:g}")


def _scaling_text(e: float) -> str:
    return "n/a (nothing came out)" if math.isinf(e) else f"{e:.2f}"


def _measured(points: Sequence[Point]) -> list[Point]:
    """The steps that held a load (a step of load 0 says nothing about scaling)."""
    return [p for p in points if _pair(p)[0] > 0]


def find_knee(points: Sequence[Point], threshold: float = KNEE_SCALING) -> Point | None:
    """The last step before the first one past the knee (see scaling), over steps in
    increasing load: (load, tok/s) pairs or StepResults; None while throughput still
    scaled at every step."""
    measured = _measured(points)
    for lower, upper in itertools.pairwise(measured):
        if past_knee(*_pair(lower), *_pair(upper), threshold) is not None:
            return lower
    return None


def still_rising(points: Sequence[Measured | tuple[float, float]],
                 threshold: float = KNEE_SCALING) -> bool:
    """Whether the last step tried still scaled at least `threshold` over the one before
    it: the curve had not bent where the steps ended, so the max tok/s (and a max goodput
    at that step) is a lower bound. False with fewer than two measured steps (nothing to
    compare), and after a step its sweep found over-saturated (a StepResult's `saturated`:
    its throughput is the server's ceiling, however it compares with the step below)."""
    measured = _measured(points)
    if len(measured) < 2 or getattr(measured[-1], "saturated", False):
        return False
    e = scaling(*_pair(measured[-2]), *_pair(measured[-1]))
    return e is not None and e >= threshold


def lower_bound(load: float, points: Sequence[Measured | tuple[float, float]],
                threshold: float = KNEE_SCALING) -> bool:
    """Whether a best figure found at `load` (max tok/s, max goodput) is a lower bound: it
    is at the last step tried and the curve was still rising there."""
    measured = _measured(points)
    return bool(measured) and _pair(measured[-1])[0] == load and still_rising(measured,
                                                                               threshold)


def knee_rule(threshold: float = KNEE_SCALING) -> str:
    """The rule in words, for headlines, notes and sweep.json."""
    return (f"the last step before throughput scaling, ln(tok/s ratio) / ln(load ratio) "
            f"between steps, falls below {threshold:g} (1 = linear; at {threshold:g}, 2× "
            f"the load buys under {2 ** threshold:.3g}× the throughput, 4× under "
            f"{4 ** threshold:.3g}×)")
