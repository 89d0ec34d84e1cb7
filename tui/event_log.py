"""Every event the console was given, in order, once: what the events panel shows the end
of and the events screen (`l`) shows whole.

Each event is kept with the Snapshot that carried it (its seq and elapsed), so that a
replay sought backwards can take back what it will give again (nothing is counted twice)
and Enter on an event can seek a replay to it. The filters are the typed event kinds of
loadgen.model.kinds, never words in a message: rewording one breaks no filter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from loadgen.model.kinds import EventKind
from loadgen.model.snapshot import Event

# a 72-hour soak in a long outage says an error event every few seconds: tens of thousands.
# Past this many the oldest tenth goes (the run directory's events.jsonl keeps them all)
KEEP = 100_000

FilterName = Literal["all", "errors", "slo", "outages", "operator", "faults"]
# what each filter keeps, by kind (errors: also any event at level "error")
FILTER_KINDS: dict[FilterName, tuple[EventKind, ...]] = {
    "all": (),
    "errors": ("error",),
    "slo": ("slo",),
    "outages": ("outage", "recovery", "stall", "restart"),
    "operator": ("operator",),
    "faults": ("fault",),
}
FILTERS: tuple[FilterName, ...] = tuple(FILTER_KINDS)
FILTER_TITLES: dict[FilterName, str] = {
    "all": "all", "errors": "errors", "slo": "SLO", "outages": "outages, stalls, restarts",
    "operator": "operator", "faults": "faults",
}


@dataclass(frozen=True, slots=True)
class Logged:
    event: Event
    seq: int | None  # the Snapshot that carried it (or was last drawn when the console said it)
    elapsed: float | None  # that Snapshot's elapsed: where a replay seeks to show it


def matches(entry: Logged, name: FilterName, search: str = "") -> bool:
    """Whether the filter keeps `entry`, and (search, any case) its text contains `search`."""
    e = entry.event
    if name != "all":
        kinds = FILTER_KINDS[name]
        if e.kind not in kinds and not (name == "errors" and e.level == "error"):
            return False
    return not search or search.casefold() in e.message.casefold()


class EventLog:
    def __init__(self, keep: int = KEEP) -> None:
        self.entries: list[Logged] = []
        self.keep = keep
        self.dropped = 0  # the oldest, let go past `keep`
        # bumped whenever entries are taken away (a rewind, the oldest let go): a view of
        # the log that only appended rebuilds then
        self.generation = 0

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, events: Iterable[Event], seq: int | None, elapsed: float | None) -> None:
        self.entries.extend(Logged(e, seq, elapsed) for e in events)
        if len(self.entries) > self.keep:
            cut = max(1, self.keep // 10)
            del self.entries[:cut]
            self.dropped += cut
            self.generation += 1

    def rewind(self, seq: int) -> None:
        """A replay went back: the Snapshots from `seq` on come again, and their events with
        them, so what they carried goes (with what the console said meanwhile)."""
        keep = len(self.entries)
        while keep and _seq(self.entries[keep - 1]) >= seq:
            keep -= 1
        if keep < len(self.entries):
            del self.entries[keep:]
            self.generation += 1

    def newest(self, n: int) -> list[Logged]:
        return self.entries[-n:] if n > 0 else []


def _seq(entry: Logged) -> int:
    # said before the first Snapshot: before anything a replay gives again
    return -1 if entry.seq is None else entry.seq
