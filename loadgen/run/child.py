"""A SnapshotSource whose work runs in a child process speaking JSON lines: the console's
live run (loadgen.run.run_process) and its eval (loadgen.eval.eval_process). The plumbing
both share, once: the child started with one message on its stdin (secrets travel there,
never in argv or the environment), one reader of its stdout (so a close() while the
console still iterates cannot race it), Controls down the pipe, a stop that waits for the
child and kills it past its time, and a child gone without a word told in words.

A subclass says which program runs (`program`), how its lines decode (`decode`), what
each message means to it (`took`), and what a death means (`died`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import msgspec

from loadgen.model.notice import Notice
from loadgen.model.snapshot import Control, Snapshot
from loadgen.model.source import SourceError
from loadgen.model.windows import SnapshotWindows
from loadgen.run.sinks import RunHandle
from loadgen.worker import eventloop

log = logging.getLogger("tokentop.child")

encode = msgspec.json.Encoder().encode
Send = Callable[[msgspec.Struct], None]


# ---- the messages both children send ----------------------------------------------------


class Said(msgspec.Struct, tag="said"):
    notice: Notice


class Fatal(msgspec.Struct, tag="fatal"):
    message: str


class SnapshotMsg(msgspec.Struct, tag="snapshot"):
    snapshot: Snapshot


class ToConsole:
    """The sink that is the console, in the child: every Snapshot down the pipe."""

    def __init__(self, send: Send) -> None:
        self.send = send

    async def start(self, run: RunHandle) -> None:
        pass

    def take(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        self.send(SnapshotMsg(snap))

    def finish(self, summary: dict) -> None:
        pass

    async def close(self) -> None:
        pass


# ---- the console's side -------------------------------------------------------------------
EXIT_WAIT_S = 5.0  # how long a child that closed its stdout gets to exit, before "no answer"


class PipedChild:
    program = ""  # the module run as `python -m program`
    decode: Callable[[bytes], Any]  # one line of the child's stdout as a message

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self._snapshots: asyncio.Queue[Snapshot | SourceError | None] = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self._log: IO[bytes] | None = None

    # ---- what a subclass says

    def took(self, msg: Any) -> None:
        """A message the reader got (a Snapshot's is queued for snapshots() here)."""

    def finished(self) -> bool:
        """Whether the child said how it ended (else its end is a death)."""
        return True

    async def died(self, how: str) -> None:
        """The child ended without saying so: `how` (killed by SIGKILL, exit status 1)."""

    # ---- the child

    async def spawn(self, start: msgspec.Struct) -> None:
        """Start the child and send it `start`, its stderr to the log."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", self.program,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self._log,
            start_new_session=True, limit=2**24)
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode(start) + b"\n")

    async def next_message(self, timeout: float | None = None) -> Any:
        """The child's next message; None when it closed its stdout or said nothing within
        `timeout`."""
        assert self.proc is not None and self.proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                line = await self.proc.stdout.readline()
        except TimeoutError:
            return None
        return self.decode(line) if line else None

    def read_on(self) -> None:
        """From now on one task reads every message."""
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while (msg := await self.next_message()) is not None:
                self.took(msg)
        except (msgspec.DecodeError, ValueError) as e:  # a torn line: the child is dying
            log.warning("the %s process sent a bad line: %s", self.program, e)
        if not self.finished():
            await self.died(await self._how_it_ended())
        self._snapshots.put_nowait(None)

    def queue(self, item: Snapshot | SourceError) -> None:
        self._snapshots.put_nowait(item)

    async def _how_it_ended(self) -> str:
        assert self.proc is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(EXIT_WAIT_S):
                await self.proc.wait()
        return how_it_ended(self.proc.returncode)

    # ---- the SnapshotSource's part

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        while (item := await self._snapshots.get()) is not None:
            if isinstance(item, SourceError):
                raise item
            yield item

    async def control(self, msg: Control) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            return
        proc.stdin.write(encode(msg) + b"\n")
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()

    async def stop(self, wait: float) -> None:
        """Ask for a clean stop, wait up to `wait` seconds for the child's end, and make
        sure it is gone."""
        await self.control(Control(op="stop", source="key"))
        await self.reap(wait)

    async def reap(self, wait: float = EXIT_WAIT_S) -> None:
        """Wait up to `wait` seconds for the reader to end (the child to close its stdout),
        kill the child past that, and close what is open."""
        proc = self.proc
        if proc is None:
            return
        if self._reader is None:  # not read on yet: keep its stdout flowing so it can exit
            self._reader = asyncio.create_task(_discard(proc.stdout))
        try:
            async with asyncio.timeout(wait):
                await asyncio.shield(self._reader)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        await proc.wait()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        if self._log is not None:
            self._log.close()


def run_child(child: Callable[[], Awaitable[int]]) -> int:
    """A child's program: its log lines on stderr (the console's log file), its loop."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    return eventloop.run(child)


def how_it_ended(returncode: int | None) -> str:
    """A child's end in words: "killed by SIGKILL", "exit status 1"."""
    if returncode is None:
        return "it no longer answers"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


async def _discard(stream: asyncio.StreamReader | None) -> None:
    if stream is None:
        return
    with contextlib.suppress(Exception):
        while await stream.read(65536):
            pass
