"""What the load saw while one fault was on (the faults phase, loadgen.eval.battery.faults),
from its run's recording: the requests that ended in it, the silence, the recovery."""

from __future__ import annotations

from pathlib import Path

from loadgen.eval.proxy import FaultSpan
from loadgen.eval.results import UnderFault
from loadgen.record.rundir import iter_snapshots


def under_fault(run_dir: Path, span: FaultSpan, tick_s: float) -> UnderFault:
    """While the fault was on: the requests that ended (success rate, errors by kind), the
    longest silence the client saw (no token, no answer: what a blackhole is, as measured),
    and the recovery: from the fault's end to the first success after it."""
    end = span.end if span.end is not None else float("inf")
    before = inside = prev = None
    recovered = None
    quiet = Silence()
    for snap in iter_snapshots(run_dir):
        if snap.t < span.start:
            before = snap.counters
        elif snap.t <= end:
            inside = snap.counters
        elif recovered is None and inside is not None and (
                snap.counters.requests_ok > inside.requests_ok):
            recovered = snap.t - end
        if prev is not None and snap.t > span.start and prev.t < end + tick_s:
            quiet.tick(prev, snap)
        prev = snap
    ok = failed_n = 0
    errors: dict[str, int] = {}
    if inside is not None:
        d = inside.since(before) if before is not None else inside
        ok, failed_n, errors = d.requests_ok, d.requests_failed, d.errors
    total = ok + failed_n
    return UnderFault(fault=span.fault, params=span.params, start=span.start, end=span.end,
                      requests_ok=ok, requests_failed=failed_n, errors=errors,
                      success_rate=ok / total if total else None, silence_s=quiet.longest,
                      recovery_s=None if recovered is None else round(recovered, 2))


class Silence:
    """The longest run of ticks in which nothing arrived (no output token, no request
    ended), in seconds: whole quiet ticks, plus half a tick at each side (the silence began
    and ended somewhere inside the ticks around them), so the estimate is centred."""

    def __init__(self) -> None:
        self.longest: float | None = None
        self._began: float | None = None

    def tick(self, prev, snap) -> None:
        a, b = prev.counters, snap.counters
        if b.output_tokens == a.output_tokens and b.requests_ok == a.requests_ok:
            self._began = prev.t if self._began is None else self._began
            width = snap.t - self._began + (snap.t - prev.t)
            self.longest = max(self.longest or 0.0, round(width, 3))
        else:
            self._began = None
