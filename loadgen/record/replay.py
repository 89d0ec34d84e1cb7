"""ReplaySource: the console fed from a run directory, at ×1, ×10, ×100, paused or seeking.

It is a SnapshotSource (loadgen.model.source), so the console does not know it is not
live. Snapshots are paced by their wall time `t` divided by the speed; a run that
is still being written is followed (tail -f) until its manifest says it is over.

Control ops (loadgen.model.snapshot.Control):
    pause / resume                 stop and go on (the same ops as a live run)
    replay_speed  value=10         ×10 (any factor > 0; 0 or less: as fast as possible)
    seek          value=S          jump to S seconds of load (Snapshot.elapsed)
    seek_by       value=±S         jump S seconds forward or back
    stop                           end the replay
Anything else (set_concurrency …) is ignored: a replay cannot change the load.
After a backward seek the Snapshots start again from earlier: `seq` goes down,
which is how a consumer knows to reset its windows and charts. The first
Snapshot after a seek carries an Event(kind="replay") that says where it is.

    tokentop replay DIR [--speed 10] [--no-follow]   the console on a replay (tui/commands)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

from loadgen.model.kinds import SourceKind
from loadgen.model.snapshot import Control, Event, Snapshot
from loadgen.model.source import SourceError
from loadgen.record.rundir import RunDirError, RunReader, is_finished, parts, read_manifest

REPLAY_OPS = ("pause", "resume", "replay_speed", "seek", "seek_by", "stop")
PREROLL_S = 60.0  # after a seek, this much before the target is sent at once (fills windows)


class ReplaySource:
    kind: SourceKind = "replay"

    def __init__(self, run_dir: Path | str, *, speed: float = 1.0, follow: bool | None = None,
                 poll_s: float = 0.25, warn=None) -> None:
        self.run_dir = Path(run_dir)
        self.speed = speed
        self.follow = follow
        self.poll_s = poll_s
        self.paused = False
        self.warnings: list[str] = []
        self._warn = warn
        self._seek_to: float | None = None
        self._stopped = False
        self._changed = asyncio.Event()
        self.position: float = 0.0  # elapsed of the last Snapshot given out
        self.description = f"replay: {self.run_dir}"

    def _note(self, message: str) -> None:
        self.warnings.append(message)
        if self._warn is not None:
            self._warn(message)

    async def start(self) -> None:
        try:
            manifest = read_manifest(self.run_dir)
        except RunDirError as e:
            raise SourceError(str(e)) from None
        if not parts(self.run_dir, "snapshots"):
            raise SourceError(f"{self.run_dir} holds no snapshots yet")
        if self.follow is None:
            self.follow = manifest.get("status") == "running"
        target = (manifest.get("target") or {}).get("url", "?")
        live = " (following)" if self.follow else ""
        self.description = (f"replay{live}: run {manifest.get('run_id', '?')} of {target} "
                            f"from {self.run_dir}")

    async def control(self, msg: Control) -> None:
        op, v = msg.op, msg.value
        if op == "pause":
            self.paused = True
        elif op == "resume":
            self.paused = False
        elif op == "replay_speed" and v is not None:
            self.speed = float(v)
        elif op == "seek" and v is not None:
            self._seek_to = max(0.0, float(v))
        elif op == "seek_by" and v is not None:
            self._seek_to = max(0.0, self.position + float(v))
        elif op == "stop":
            self._stopped = True
        else:
            return
        self._changed.set()

    async def close(self) -> None:
        self._stopped = True
        self._changed.set()

    async def _wait(self, seconds: float | None) -> None:
        """Sleep until `seconds` pass or a control message arrives."""
        self._changed.clear()
        try:
            async with asyncio.timeout(seconds):
                await self._changed.wait()
        except TimeoutError:
            pass

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        seek: float | None = None
        while not self._stopped:
            restart = False
            reader = RunReader(self.run_dir, warn=self._note)
            try:
                base_t: float | None = None  # the Snapshot time that maps to base_wall
                base_wall = 0.0
                announce = None if seek is None else f"replay: seek to {seek:.0f} s"
                while not self._stopped:
                    batch = reader.poll()
                    if not batch:
                        if not self.follow or is_finished(self.run_dir):
                            batch = reader.poll()
                            if not batch:
                                reader.finish()
                                return
                        else:
                            await self._wait(self.poll_s)
                            if self._seek_to is not None:
                                restart = True
                                break
                            continue
                    for snap in batch:
                        if seek is not None and snap.elapsed < seek - PREROLL_S:
                            continue  # skipping to the seek target
                        if seek is not None and snap.elapsed < seek:
                            yield snap  # preroll: at once, no pacing
                            self.position = snap.elapsed
                            continue
                        seek = None
                        # pacing
                        while True:
                            if self._stopped:
                                return
                            if self._seek_to is not None:
                                break
                            if self.paused:
                                await self._wait(None)
                                base_t = None
                                continue
                            if base_t is None or self.speed <= 0:
                                base_t, base_wall = snap.t, time.monotonic()
                                speed_seen = self.speed
                                break
                            if self.speed != speed_seen:  # rebase at the current position
                                base_t, base_wall = self._now_t(base_t, base_wall,
                                                                speed_seen), time.monotonic()
                                speed_seen = self.speed
                            due = base_wall + (snap.t - base_t) / self.speed
                            delay = due - time.monotonic()
                            if delay <= 0:
                                break
                            await self._wait(min(delay, 1.0))
                        if self._seek_to is not None:
                            restart = True
                            break
                        if announce:
                            snap.events.append(Event(t=snap.t, kind="replay", message=announce))
                            announce = None
                        self.position = snap.elapsed
                        yield snap
                    if restart:
                        break
            finally:
                reader.close()
            if not restart:
                return
            seek, self._seek_to = self._seek_to, None

    @staticmethod
    def _now_t(base_t: float, base_wall: float, speed: float) -> float:
        return base_t + (time.monotonic() - base_wall) * speed
