"""What every Snapshot consumer talks to: a live run, a replay, a fleet agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from loadgen.model.kinds import SourceKind
from loadgen.model.snapshot import Control, Snapshot


class SourceError(Exception):
    """A source could not start or went away; the text is for the user, as it is."""


class SnapshotSource(Protocol):
    #: one line for the header, e.g. "live: http://127.0.0.1:8000/v1 (simulated)"
    description: str
    #: live (a run we drive), replay (a run directory) or fleet (agents over MQTT)
    kind: SourceKind

    async def start(self) -> None:
        """Start producing; raises SourceError with a user-facing message."""

    def snapshots(self) -> AsyncIterator[Snapshot]:
        """Snapshots in order, one per tick, until the source ends."""

    async def control(self, msg: Control) -> None:
        """Apply a control message (ignored by read-only sources such as replay)."""

    async def close(self) -> None:
        """Stop the load cleanly (in-flight requests drain) and release everything."""
