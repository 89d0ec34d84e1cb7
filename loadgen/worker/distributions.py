"""The distributions a workload draws from: request lengths and think times.

A distribution is given as text:
  128                fixed
  uniform:64:256     uniform between the two
  normal:128:32      mean, standard deviation
  lognormal:128:0.5  median, sigma of the underlying normal
Lengths (LengthDist, tokens) are clamped to at least 1, think times (ThinkTime, seconds)
to at least 0. Both are frozen structs, so they travel to the workers inside the workload
(loadgen.worker.workload) as they are.
"""

from __future__ import annotations

import math
import random

import msgspec

DIST_KINDS = ("fixed", "uniform", "normal", "lognormal")


class WorkloadError(ValueError):
    """A workload setting that cannot be used; the text says why."""


def _parse_dist(text: str | int, what: str, example: str, minimum: float) -> tuple:
    """(kind, a, b) of a distribution's text (module docstring), values ≥ `minimum`."""
    parts = str(text).strip().split(":")
    try:
        if len(parts) == 1:  # a plain number is a fixed value, checked below like any
            kind, values = "fixed", [float(parts[0])]
        else:
            kind, *nums = parts
            values = [float(x) for x in nums]
    except ValueError:
        raise WorkloadError(f"bad {what} {text!r}: use e.g. {example}") from None
    if kind not in DIST_KINDS or len(values) != (1 if kind == "fixed" else 2):
        raise WorkloadError(f"bad {what} {text!r}: kinds are {', '.join(DIST_KINDS)}")
    if values[0] < minimum or (kind == "uniform" and values[1] < values[0]):
        raise WorkloadError(f"bad {what} {text!r}: values must be ≥ {minimum:g} and "
                            "low ≤ high")
    return kind, values[0], values[1] if len(values) > 1 else 0.0


def _draw(kind: str, a: float, b: float, rng: random.Random) -> float:
    if kind == "fixed":
        return a
    if kind == "uniform":
        return rng.uniform(a, b)
    if kind == "normal":
        return rng.gauss(a, b)
    return rng.lognormvariate(math.log(a), b) if a > 0 else 0.0


def _describe(kind: str, a: float, b: float) -> str:
    return f"{a:g}" if kind == "fixed" else f"{kind}:{a:g}:{b:g}"


class LengthDist(msgspec.Struct, frozen=True):
    kind: str = "fixed"
    a: float = 128.0
    b: float = 0.0

    @classmethod
    def parse(cls, text: str | int) -> LengthDist:
        kind, a, b = _parse_dist(text, "length", "128, uniform:64:256, normal:128:32 or "
                                 "lognormal:128:0.5", 1)
        if kind == "fixed" and a != int(a):
            raise WorkloadError(f"bad length {text!r}: a fixed length is a whole number")
        return cls(kind, a, b)

    def draw(self, rng: random.Random) -> int:
        return max(1, round(_draw(self.kind, self.a, self.b, rng)))

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "lognormal":
            return self.a * math.exp(self.b**2 / 2)
        return self.a

    def __str__(self) -> str:
        return _describe(self.kind, self.a, self.b)


class ThinkTime(msgspec.Struct, frozen=True):
    """Seconds a user of a conversation waits before its next turn (`--think-time`), the
    same forms as the lengths (2, uniform:1:3, lognormal:2:0.5), clamped at 0."""

    kind: str = "fixed"
    a: float = 0.0
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> ThinkTime:
        text = str(text).strip()
        return cls(*_parse_dist(text.removesuffix("s") if ":" not in text else text,
                                "think time", "2, 0.5s, uniform:1:3 or lognormal:2:0.5", 0))

    def draw(self, rng: random.Random) -> float:
        return max(0.0, _draw(self.kind, self.a, self.b, rng))

    def __str__(self) -> str:
        return _describe(self.kind, self.a, self.b) + " s"
