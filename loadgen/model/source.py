"""What every Snapshot consumer talks to: a live run, a replay, a fleet agent.

A source speaks for itself: `status()` says what it is, where its run records, where a
replay stands, whether a live run still waits for its target, and how the run ended,
so a front end never guesses any of it from file names, wrappers or message wording.
A wrapper (a WatchedSource) forwards its inner source's status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

import msgspec

from loadgen.model.kinds import SourceKind
from loadgen.model.notice import Notice
from loadgen.model.snapshot import Control, HostSample, Snapshot


class SourceError(Exception):
    """A source could not start or went away; the text is for the user, as it is."""


class ReplayStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Where a replay stands, for the console's header and keys."""

    position: float  # elapsed of the last Snapshot given out
    length: float  # elapsed of the last Snapshot recorded (so far, while following)
    speed: float
    paused: bool  # the replay's own pause, not the recorded run's
    following: bool  # the run is still written: the length grows
    at_end: bool  # all that is recorded has been given out and no seek is under way
    # how the recorded run ended, once the reader knows (its writer finished, died,
    # stopped recording): "finished", "interrupted", "recording stopped"; None while it is
    # still written. The last Snapshot of a killed run says "running": this does not
    ended: str | None = None


class Waiting(msgspec.Struct, frozen=True, kw_only=True):
    """A live run whose target does not answer yet: what it says, since when, and the host
    meanwhile (the host is local: its panel can be live before the run is)."""

    text: str
    since: float  # unix seconds
    host: HostSample | None = None


# how a run ended: it finished (whatever its verdict), or the process that ran it died
# without a word (kill -9, a crash), so its recording was never closed
Ending = Literal["finished", "died"]


class RunOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """A run's end, in words: its exit code and reason, and the line a terminal keeps."""

    code: int
    reason: str  # "done: duration of 20 s reached", "the run process died …"
    line: str  # the reason and the P50/P99 figures: a headless run's last line
    run_dir: str | None = None
    ending: Ending = "finished"


class SourceStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a front end may ask a source, in one value (equal values: nothing new)."""

    kind: SourceKind  # live (a run we drive), replay, fleet (over MQTT), eval (a battery)
    description: str  # one line for the header, e.g. "live: http://127.0.0.1:8000/v1"
    run_dir: str | None = None  # where the run records (a replay: the directory it reads)
    waiting: Waiting | None = None  # a live run still waiting for its target
    replay: ReplayStatus | None = None  # a replay: position, length, speed, paused
    outcome: RunOutcome | None = None  # once the run has ended
    # what the run said besides its Snapshots (where it records, its target answering…),
    # in order since it started
    said: tuple[Notice, ...] = ()


class SnapshotSource(Protocol):
    def status(self) -> SourceStatus:
        """What the source is and how it stands now; cheap, called at every redraw."""

    async def start(self) -> None:
        """Start producing; raises SourceError with a user-facing message."""

    def snapshots(self) -> AsyncIterator[Snapshot]:
        """Snapshots in order, one per tick, until the source ends."""

    async def control(self, msg: Control) -> None:
        """Apply a control message (ignored by read-only sources such as replay)."""

    async def close(self) -> None:
        """Stop the load cleanly (in-flight requests drain) and release everything."""
