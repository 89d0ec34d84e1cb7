"""What the load saw while one fault was on (the faults phase, loadgen.eval.battery.faults),
from its run's recording: the requests that ended in it, the silence, the recovery, the
throughput and the latencies; and the faults as events of that run (FaultNotes), so its
recording, replay and report say when each was on."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from loadgen.analysis.report import DuringSpan
from loadgen.eval.proxy import FaultEvent, FaultSpan, Spans, fault_words
from loadgen.eval.results import UnderFault
from loadgen.model import units
from loadgen.model.kinds import EventKind, Level
from loadgen.record.rundir import iter_snapshots

FAULT_TICK_S = 0.25  # the faults phase's tick: a fault's effect dated within a quarter second


def under_fault(run_dir: Path, span: FaultSpan, tick_s: float) -> UnderFault:
    """While the fault was on: the requests that ended (success rate, errors by kind), the
    longest silence the client saw (no token, no answer: what a blackhole is, as measured),
    and the recovery: from the fault's end to the first success after it."""
    end = span.end if span.end is not None else float("inf")
    before = inside = prev = None
    recovered = None
    quiet = Silence()
    during = DuringSpan(span.start, span.end)
    for snap in iter_snapshots(run_dir):
        during.see(snap)
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
    f = during.figures()
    return UnderFault(fault=span.fault, params=span.params, start=span.start, end=span.end,
                      requests_ok=ok, requests_failed=failed_n, errors=errors,
                      success_rate=ok / total if total else None, silence_s=quiet.longest,
                      recovery_s=None if recovered is None else round(recovered, 2),
                      output_tok_s=f.output_tok_s, itl_p50_ms=f.itl_p50_ms,
                      itl_p99_ms=f.itl_p99_ms, e2e_p50_ms=f.e2e_p50_ms,
                      e2e_p90_ms=f.e2e_p90_ms, e2e_p99_ms=f.e2e_p99_ms)


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


class Notes(Protocol):
    """What takes an event into a run (loadgen.run.session.Session.note)."""

    def note(self, kind: EventKind, message: str, level: Level = "info", *,
             t: float | None = None, **payload) -> None: ...


class FaultNotes:
    """The proxy's FaultEvents as "fault" events of the run it is in front of: a start
    (warn: the load is being hurt on purpose) and an end whose `since` is the start's time
    and `seconds` its length, both dated when the proxy applied or cleared the fault. Wired
    as FaultProxy(on_change=notes.take), then attach(session) once the Session exists: a
    fault before that is held, and noted with its own time."""

    def __init__(self) -> None:
        self._spans = Spans()
        self._session: Notes | None = None
        self._held: list[tuple[str, Level, float, dict]] = []

    def take(self, ev: FaultEvent) -> None:
        ended = self._spans.see(ev)
        if ended is not None and ended.end is not None:
            length = round(ended.end - ended.start, 3)
            self._note(f"fault off: {fault_words(ended.fault, ended.params)}, after "
                       f"{units.duration(length)}", "info", ended.end, since=ended.start,
                       seconds=length)
        if ev.action == "apply":
            self._note(f"fault on: {fault_words(ev.fault, ev.params)}", "warn", ev.t)

    def attach(self, session: Notes) -> None:
        self._session = session
        for message, level, t, payload in self._held:
            session.note("fault", message, level, t=t, **payload)
        self._held = []

    def _note(self, message: str, level: Level, t: float, **payload) -> None:
        if self._session is None:
            self._held.append((message, level, t, payload))
        else:
            self._session.note("fault", message, level, t=t, **payload)
