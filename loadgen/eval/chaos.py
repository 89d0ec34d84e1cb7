"""--chaos-restart-cmd: the server process killed in the middle of the faults phase and
started again by the user's command; MTTR from the kill to the first success after it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

from loadgen.eval.results import ChaosFigures
from loadgen.record.rundir import iter_snapshots
from probes.process import find_listener


class Chaos:
    """--chaos-restart-cmd: the server process (the one listening on the target's port) is
    killed (SIGKILL) and CMD is run, in a shell of its own, to start it again. MTTR is from
    the kill to the first request that succeeds after it. The command's text is not kept:
    it may hold credentials."""

    def __init__(self, cmd: str | None, port: int) -> None:
        self.cmd = cmd
        self.port = port
        self.killed_at: float | None = None
        self.pid: int | None = None
        self.why = ""
        self.restart: asyncio.subprocess.Process | None = None

    async def run(self, at: float) -> None:
        await asyncio.sleep(at)
        pid = listener_pid(self.port)
        if pid is None or pid in _own_family():
            self.why = (f"nothing to kill: no process of ours may be killed, and none other "
                        f"listens on port {self.port}")
            return
        self.pid = pid
        self.killed_at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.restart = await asyncio.create_subprocess_shell(
            self.cmd or "", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True)

    def result(self, run_dir: Path) -> ChaosFigures:
        if self.killed_at is None:
            return ChaosFigures(killed=False, why=self.why or "the run ended before the kill")
        first = None
        prev = None
        for snap in iter_snapshots(run_dir):
            # the first tick wholly after the kill with a success in it: the success came
            # between its start and its end (a tick holding the kill counts what finished
            # before it too)
            if first is None and prev is not None and prev.t >= self.killed_at and (
                    snap.counters.requests_ok > prev.counters.requests_ok):
                first = (prev.t + snap.t) / 2
            prev = snap
        rc = self.restart.returncode if self.restart is not None else None
        return ChaosFigures(
            killed=True, pid=self.pid, killed_at=self.killed_at,
            mttr_s=None if first is None else round(first - self.killed_at, 3),
            restart_exit=rc, why="" if first is not None else "no success after the kill")


def listener_pid(port: int) -> int | None:
    proc = find_listener(port)
    return proc.pid if proc is not None else None


def _own_family() -> set[int]:
    """This process and its ancestors: never the one to kill."""
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}
