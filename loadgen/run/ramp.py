"""Ramps: the load changing by itself over time, until someone touches a key.

  linear:1:64:60      from 1 to 64 over 60 s, then hold
  step:8:8:30[:128]   start at 8, add 8 every 30 s (up to 128, then hold)

In closed loop the value is streams; in open loop it is requests per second.
"""

from __future__ import annotations

import math

import msgspec


class RampError(ValueError):
    pass


class Ramp(msgspec.Struct, frozen=True):
    kind: str  # linear | step
    start: float
    amount: float  # linear: the end value; step: the increment
    period: float  # linear: the duration; step: seconds per step
    limit: float | None = None  # step: the value to stop at

    @classmethod
    def parse(cls, text: str) -> Ramp:
        kind, *rest = text.split(":")
        try:
            nums = [float(x) for x in rest]
        except ValueError:
            raise RampError(f"bad ramp {text!r}: numbers expected") from None
        if kind == "linear" and len(nums) == 3 and nums[2] > 0:
            return cls(kind, nums[0], nums[1], nums[2])
        if kind == "step" and len(nums) in (3, 4) and nums[2] > 0:
            return cls(kind, nums[0], nums[1], nums[2], nums[3] if len(nums) == 4 else None)
        raise RampError(f"bad ramp {text!r}: use linear:FROM:TO:SECONDS or "
                        "step:START:STEP:SECONDS[:MAX]")

    def value_at(self, t: float) -> float:
        if self.kind == "linear":
            return self.start + (self.amount - self.start) * min(1.0, max(0.0, t) / self.period)
        v = self.start + self.amount * math.floor(max(0.0, t) / self.period)
        return min(v, self.limit) if self.limit is not None else v

    def finished(self, t: float) -> bool:
        if self.kind == "linear":
            return t >= self.period
        return self.limit is not None and self.value_at(t) >= self.limit

    def describe(self, t: float) -> str:
        if self.kind == "linear":
            left = max(0.0, self.period - t)
            return f"ramp {self.start:g}→{self.amount:g}, {left:.0f} s left"
        nxt = self.period - (max(0.0, t) % self.period)
        return f"step ramp +{self.amount:g} every {self.period:g} s, next in {nxt:.0f} s"
