"""ReplaySource: the console fed from a run directory, at ×1, ×10, ×100, paused or seeking.

It is a SnapshotSource (loadgen.model.source), so the console does not know it is not
live. Snapshots are paced by their wall time `t` divided by the speed; a run that
is still being written is followed (tail -f) until its writer is done: finished,
recording stopped, or gone (rundir.run_state knows a killed writer by its lock, so
a killed run's replay ends instead of waiting forever). The last Snapshot of the
recording carries an Event(kind="replay") that says how the run ended, and the
description says it from the start.

Control ops (loadgen.model.snapshot.Control):
    pause / resume                 stop and go on (the same ops as a live run)
    replay_speed  value=10         ×10 (any factor > 0; 0 or less: as fast as possible)
    seek          value=S          jump to S seconds of load (Snapshot.elapsed)
    seek_by       value=±S         jump S seconds forward or back, from where the last
                                   seek goes if it is still under way (fast presses add up)
    stop                           end the replay
Anything else (set_concurrency …) is ignored: a replay cannot change the load.
Seeks are held within the recording (0 to its length so far). After a backward seek
the Snapshots start again from earlier: `seq` goes down, which is how a consumer knows
to reset its windows and charts. The first Snapshot after a seek carries an
Event(kind="replay") that says where it is, and is given out at once, even paused.
With hold=True (the console) the end of the recording waits for a seek or a stop
instead of ending the iterator, so that ← still works there; `status()` says where
the replay stands (position / length, speed, paused, at the end).

    tokentop replay DIR [--speed 10] [--no-follow]   the console on a replay (tui/commands)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from loadgen.model.snapshot import Control, Event, Snapshot
from loadgen.model.source import ReplayStatus, SourceError, SourceStatus
from loadgen.model.text import plain, plain_all
from loadgen.record.rundir import (
    FINISHED,
    INTERRUPTED,
    RECORDING_STOPPED,
    RUNNING,
    RunDirError,
    RunReader,
    last_snapshot,
    parts,
    read_manifest,
    run_state,
    still_written,
)

PREROLL_S = 60.0  # after a seek, this much before the target is sent at once (fills windows)


def check_replayable(run_dir: Path | str) -> dict:
    """The manifest of a directory a replay can show; SourceError in one line when there is
    nothing to show (not a directory, not a run directory, no Snapshot yet)."""
    run_dir = Path(run_dir)
    try:
        manifest = read_manifest(run_dir)
    except RunDirError as e:
        raise SourceError(str(e)) from None
    if not parts(run_dir, "snapshots"):
        raise SourceError(f"{run_dir} holds no snapshots yet")
    return manifest


def end_note(state: str, manifest: dict) -> tuple[str, str]:
    """(level, words) for how a recorded run ended, as the replay tells the console."""
    if state == INTERRUPTED:
        return "warn", "the run was interrupted: its writer died without finishing"
    if state == RECORDING_STOPPED:
        why = manifest.get("recording_stopped") or "recording failed"
        return "warn", f"recording stopped early ({why})"
    if state == RUNNING:
        return "info", "the run is still being written"
    return "info", "the run finished" if state == FINISHED else f"the run is {state}"


class _Clock:
    """Recorded time → wall time at the replay speed; rebased on a pause or a new speed."""

    def __init__(self) -> None:
        self.base_t: float | None = None  # the Snapshot time that maps to base_wall
        self.base_wall = 0.0
        self.speed = 1.0

    def reset(self) -> None:
        self.base_t = None

    def delay(self, t: float, speed: float) -> float:
        """Seconds until a Snapshot of time `t` is due (≤ 0: now)."""
        now = time.monotonic()
        if self.base_t is None or speed <= 0:
            self.base_t, self.base_wall, self.speed = t, now, speed
            return 0.0
        if speed != self.speed:  # rebase at the current position
            self.base_t += (now - self.base_wall) * self.speed
            self.base_wall, self.speed = now, speed
        return self.base_wall + (t - self.base_t) / speed - now


class ReplaySource:
    def __init__(self, run_dir: Path | str, *, speed: float = 1.0, follow: bool | None = None,
                 poll_s: float = 0.25, warn=None, hold: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.speed = speed
        self.follow = follow
        self.hold = hold
        self.poll_s = poll_s
        self.paused = False
        self.warnings: list[str] = []
        self._warn = warn
        self._seek_to: float | None = None  # a seek the playing reader has not taken up yet
        self._target: float | None = None  # the seek under way, until its Snapshot is out
        self._stopped = False
        self._changed = asyncio.Event()
        self._manifest: dict = {}
        self.position: float = 0.0  # elapsed of the last Snapshot given out
        self.length: float = 0.0  # elapsed of the last Snapshot recorded so far
        self.description = f"replay: {self.run_dir}"
        self.ended: str | None = None  # how the recorded run ended, once known (RunState's)

    def _note(self, message: str) -> None:
        message = plain(message)  # the reader may quote a line of the recording
        self.warnings.append(message)
        if self._warn is not None:
            self._warn(message)

    async def start(self) -> None:
        self._manifest = plain_all(check_replayable(self.run_dir))
        last = last_snapshot(self.run_dir, warn=lambda _m: None)  # the reader warns itself
        self.length = max(self.length, last.elapsed if last is not None else 0.0)
        state = self._state()
        if self.follow is None:
            self.follow = state == RUNNING  # a live writer: more is coming
        self.ended = None if state == RUNNING else state
        self._describe(state)

    def _state(self) -> str:
        """How the run stands now (a live writer, or how it ended)."""
        try:
            return run_state(self.run_dir)
        except RunDirError as e:
            raise SourceError(str(e)) from None

    def _describe(self, state: str) -> None:
        target = (self._manifest.get("target") or {}).get("url", "?")
        live = " (following)" if self.follow and state == RUNNING else ""
        how = "" if state in (RUNNING, FINISHED) else f"; {end_note(state, self._manifest)[1]}"
        self.description = (f"replay{live}: run {self._manifest.get('run_id', '?')} of "
                            f"{target} from {self.run_dir}{how}")

    async def control(self, msg: Control) -> None:
        op, v = msg.op, msg.value
        if op == "pause":
            self.paused = True
        elif op == "resume":
            self.paused = False
        elif op == "replay_speed" and v is not None:
            self.speed = float(v)
        elif op == "seek" and v is not None:
            self._seek(float(v))
        elif op == "seek_by" and v is not None:
            # from the seek under way, not from a position it has not reached yet: a
            # second press before the first landed would otherwise be lost
            self._seek((self.position if self._target is None else self._target) + float(v))
        elif op == "stop":
            self._stopped = True
        else:
            return
        self._changed.set()

    def _seek(self, to: float) -> None:
        self._target = self._seek_to = min(max(0.0, to), self.length)

    def status(self) -> SourceStatus:
        replay = ReplayStatus(
            position=self.position, length=max(self.length, self.position), speed=self.speed,
            paused=self.paused, following=bool(self.follow),
            at_end=self._target is None and self.position >= self.length,
            ended=self.ended if not self.follow else None)
        return SourceStatus(kind="replay", description=self.description,
                            run_dir=str(self.run_dir), replay=replay)

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
        """Every Snapshot, paced; a seek starts a fresh reader at the new position."""
        seek: float | None = None
        while not self._stopped:
            with RunReader(self.run_dir, warn=self._note) as reader:
                async for snap in self._play(reader, seek):
                    yield snap
            if self._seek_to is None:
                self._target = None  # nothing is under way any more (stopped, or the end)
                if not await self._hold_at_end():
                    return  # the end of the recording (or stopped)
            seek, self._seek_to = self._seek_to, None

    async def _hold_at_end(self) -> bool:
        """With hold: wait at the end for a seek (True) or a stop (False)."""
        while self.hold and not self._stopped and self._seek_to is None:
            await self._wait(None)
        return self.hold and not self._stopped

    async def _play(self, reader: RunReader, seek: float | None) -> AsyncIterator[Snapshot]:
        """From `seek` (after a preroll) to the end, or until stopped or sought elsewhere."""
        clock = _Clock()
        announce = None if seek is None else f"replay: seek to {seek:.0f} s"
        while True:
            batch, last = await self._next_batch(reader)
            if batch:
                self.length = max(self.length, batch[-1].elapsed)
            for snap in batch:
                if seek is not None and snap.elapsed < seek:
                    if snap.elapsed >= seek - PREROLL_S:  # preroll: at once, no pacing
                        self.position = snap.elapsed
                        yield snap
                    continue
                if seek is not None:
                    # where the seek went is shown at once, even paused; the clock starts here
                    seek = None
                    clock.delay(snap.t, self.speed)
                    if self._seek_to is not None or self._stopped:
                        return
                    self._target = None
                elif not await self._pace(snap, clock):
                    return
                if announce:
                    snap.events.append(Event(t=snap.t, kind="replay", message=announce))
                    announce = None
                self.position = snap.elapsed
                yield snap
            if last:
                return

    async def _next_batch(self, reader: RunReader) -> tuple[list[Snapshot], bool]:
        """(Snapshots, whether they are the last). While following, waits for more until the
        writer is done; the end is asked *before* the poll, so that poll reads all there is."""
        while not self._stopped and self._seek_to is None:
            more = self.follow and still_written(self.run_dir)
            # a recording is outside text: the reader made every string of it plain
            batch = reader.poll()
            if not more:
                reader.finish()
                self._ended(batch)
                return batch, True
            if batch:
                return batch, False
            await self._wait(self.poll_s)
        return [], True

    def _ended(self, batch: list[Snapshot]) -> None:
        """The recording is over: say how the run ended, on its last Snapshot and in the
        description (a followed run that ended after its last Snapshot has only the latter)."""
        with contextlib.suppress(RunDirError):
            self._manifest = plain_all(read_manifest(self.run_dir)) or self._manifest
        state = self._state()
        self.follow = False
        self.ended = None if state == RUNNING else state  # --no-follow of a live run
        self._describe(state)
        if batch:
            level, words = end_note(state, self._manifest)
            last = batch[-1]
            last.events.append(Event(t=last.t, kind="replay", level=level,
                                     message=f"replay: end of the recording; {words}"))

    async def _pace(self, snap: Snapshot, clock: _Clock) -> bool:
        """Wait until `snap` is due at the replay speed; False when stopped or sought."""
        while not self._stopped and self._seek_to is None:
            if self.paused:
                await self._wait(None)
                clock.reset()
                continue
            delay = clock.delay(snap.t, self.speed)
            if delay <= 0:
                return True
            await self._wait(min(delay, 1.0))
        return False
