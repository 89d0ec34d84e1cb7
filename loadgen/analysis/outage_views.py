"""The report's outages: each view of a failure (the client's, by loadgen.model.outage's
tracker; /metrics' silence, by the soak analysis), and the events they are views of.

Two views whose spans overlap are one failure seen twice (a SIGSTOP freezes the streams and
the /metrics scrapes at once): the report counts it once (`outage_events`) and numbers both
records with its event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loadgen.analysis.soak_result import OutageRecord
from loadgen.model.outage import Outage as TrackedOutage


@dataclass
class Outage:
    kind: str  # client | server
    start: float
    end: float
    start_rel: float = 0.0
    ongoing: bool = False  # still going at the last Snapshot
    failed: int = 0  # requests that failed inside it (client)
    errors: dict[str, int] = field(default_factory=dict)
    reason: str | None = None  # client: why, in words; server: the probe's words
    gap_s: float = 0.0  # recording gaps inside it: not counted in its duration

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end - self.start - self.gap_s)

    @classmethod
    def of_client(cls, o: TrackedOutage, start_time: float, ongoing: bool) -> Outage:
        return cls(kind="client", start=o.start, end=o.last_t if o.end is None else o.end,
                   start_rel=round(o.start - start_time, 3), ongoing=ongoing, failed=o.failed,
                   errors=dict(o.errors), reason=o.words(), gap_s=round(o.gap_s, 3))

    def record(self) -> OutageRecord:
        return OutageRecord(kind=self.kind, start=self.start, end=self.end,
                            start_rel=self.start_rel, ongoing=self.ongoing, failed=self.failed,
                            errors=dict(self.errors), reason=self.reason, gap_s=self.gap_s,
                            duration_s=round(self.duration_s, 3))


@dataclass
class OpenSpan:
    """A /metrics silence under way (a server outage once it is held OUTAGE_MIN_S)."""

    start: float
    start_rel: float
    last_end: float
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    reason: str | None = None
    covered_s: float = 0.0
    gap_s: float = 0.0


def as_events(outages: list[Outage]) -> list[OutageRecord]:
    """The records, in order of start, each numbered by the event it belongs to: spans that
    overlap are one failure seen twice (the client's outage and /metrics' silence)."""
    records: list[OutageRecord] = []
    event, end = 0, None
    for o in outages:
        if end is None or o.start > end:
            event, end = event + 1, o.end
        else:
            end = max(end, o.end)
        record = o.record()
        record.event = event
        records.append(record)
    return records


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]
