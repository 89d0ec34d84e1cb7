"""GPU energy and the tokens counted over the same times: what tokens per joule divides.

A Snapshot's counters are the tick's own, but its GPU reading is the probe's latest, taken
up to a probe period (a second) earlier: ticks come faster than the probe reads, so most
Snapshots carry the previous tick's reading again. Paired as they come, the energy of one
span would be divided into the tokens of another (±10 % over a 10 s window). So only a
fresh reading (the energy counter moved since the last tick) counts, timed at the middle
of the tick that brought it (it was taken within that tick, or just before), with the
output tokens and completed requests counted by that time, interpolated between the two
ticks. The run's live tokens per joule (loadgen.run.watch) and the eval's efficiency rows
(loadgen.eval.battery) both read energy through EnergyReadings.
"""

from __future__ import annotations

from typing import NamedTuple

from loadgen.model.snapshot import Snapshot


class Reading(NamedTuple):
    t: float  # unix time, the middle of the tick that brought the reading
    energy_j: float  # every GPU's energy counter, summed
    power_w: float  # every GPU's power, summed
    gpus: int  # how many GPUs the sums are over
    output_tokens: float  # counted by `t`
    requests_ok: float  # completed by `t`


class EnergyReadings:
    """Feed Snapshots in order; `see` gives the fresh readings, each with its tokens."""

    def __init__(self) -> None:
        self._prev: Snapshot | None = None
        self._energy: float | None = None

    def see(self, snap: Snapshot) -> Reading | None:
        prev, self._prev = self._prev, snap
        gpus = [g for g in snap.gpu.gpus if not g.lost]
        energy = [g.energy_j for g in gpus]
        if not energy or None in energy:
            self._energy = None  # a GPU without the counter: no sum to difference
            return None
        total = sum(e for e in energy if e is not None)
        fresh = total != self._energy
        self._energy = total
        if not fresh or prev is None:
            return None  # the reading of an earlier tick, or no tick to time it by
        t = snap.t - snap.interval / 2
        return Reading(t=t, energy_j=total, power_w=sum(g.power_w or 0.0 for g in gpus),
                       gpus=len(gpus),
                       output_tokens=_at(t, prev, snap, lambda s: s.counters.output_tokens),
                       requests_ok=_at(t, prev, snap, lambda s: s.counters.requests_ok))

    @property
    def counting(self) -> bool:
        """The last Snapshot had an energy counter on every GPU."""
        return self._energy is not None

    def reset(self) -> None:
        self._prev = None
        self._energy = None


def _at(t: float, a: Snapshot, b: Snapshot, value) -> float:
    """`value` at time t, linear between two ticks."""
    if b.t <= a.t:
        return float(value(b))
    f = min(1.0, max(0.0, (t - a.t) / (b.t - a.t)))
    return value(a) + f * (value(b) - value(a))


def per_joule(a: Reading, b: Reading, of: str = "output_tokens") -> float | None:
    """Tokens (or completed requests) per joule between two readings; None when the GPUs
    differ or no energy was counted (a counter that went down: a driver reload)."""
    joules = b.energy_j - a.energy_j
    if a.gpus != b.gpus or joules <= 0:
        return None
    return (getattr(b, of) - getattr(a, of)) / joules
