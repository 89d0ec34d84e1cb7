"""The run in its own process, for the console: Snapshots out, control in.

The console never runs the session on its own event loop: a slow frame must not
delay a tick, and if the terminal goes away (SSH drops) the run process sees its
stdin close and stops the load by itself.

Protocol, one JSON object per line:
  console → run: Start (the RunConfig, the Secrets, whether to record), then
                 Control messages.
  run → console: Ready (the resolved target) or Fatal (why not), then one
                 Snapshot message per tick until the run has stopped.
Secrets travel on this pipe only, never in the argv or the environment.

The run is an ordinary Session (loadgen.run.session): recorded, watched,
published with --publish, its summary written into the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

from loadgen.model.kinds import SourceKind
from loadgen.model.snapshot import Control, Snapshot, Target
from loadgen.model.source import SourceError
from loadgen.model.windows import SnapshotWindows
from loadgen.run.config import RunConfig
from loadgen.run.secrets import Secrets
from loadgen.run.session import Session, SessionError
from loadgen.worker import eventloop

log = logging.getLogger("tokentop.run_process")


class Start(msgspec.Struct, tag="start"):
    config: RunConfig
    secrets: Secrets
    record: bool = True


class Ready(msgspec.Struct, tag="ready"):
    target: Target


class Fatal(msgspec.Struct, tag="fatal"):
    message: str


class SnapshotMsg(msgspec.Struct, tag="snapshot"):
    snapshot: Snapshot


RunMsg = Ready | Fatal | SnapshotMsg
_decode_msg = msgspec.json.Decoder(RunMsg).decode
_encode = msgspec.json.Encoder().encode


class RunProcess:
    """A SnapshotSource backed by a live run in a child process."""

    kind: SourceKind = "live"

    def __init__(self, cfg: RunConfig, secrets: Secrets | None = None, *, record: bool = True,
                 log_path: Path | None = None):
        self.cfg = cfg
        self.secrets = secrets or Secrets()
        self.record = record
        default_log = Path(tempfile.gettempdir()) / f"tokentop-run-{os.getpid()}.log"
        self.log_path = log_path or default_log
        target = cfg.url or "the embedded simulator"
        self.description = f"live: {target}"
        self.proc: asyncio.subprocess.Process | None = None
        self.target: Target | None = None

    async def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadgen.run.run_process",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
            limit=2**24,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(_encode(Start(config=self.cfg, secrets=self.secrets,
                                            record=self.record)) + b"\n")
        msg = await self._next_message(timeout=90.0)
        if isinstance(msg, Fatal):
            await self._reap()
            raise SourceError(msg.message)
        if not isinstance(msg, Ready):
            await self._reap()
            raise SourceError(f"the run did not start; see {self.log_path}")
        self.target = msg.target
        self.description = f"live: {msg.target.url}"

    async def _next_message(self, timeout: float | None = None) -> RunMsg | None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                line = await self.proc.stdout.readline()
        except TimeoutError:
            return None
        if not line:
            return None
        return _decode_msg(line)

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        while (msg := await self._next_message()) is not None:
            if isinstance(msg, SnapshotMsg):
                yield msg.snapshot
            elif isinstance(msg, Fatal):
                raise SourceError(msg.message)

    async def control(self, msg: Control) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            return
        proc.stdin.write(_encode(msg) + b"\n")
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()

    async def close(self) -> None:
        """Ask for a clean stop, wait for the drain, and make sure the child is gone."""
        await self.control(Control(op="stop", source="key"))
        await self._reap(wait=self.cfg.drain_grace + 10.0)

    async def _reap(self, wait: float = 5.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        # keep its stdout flowing so a full pipe cannot block its exit
        drain = asyncio.create_task(_discard(proc.stdout))
        try:
            async with asyncio.timeout(wait):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        drain.cancel()
        self._log.close()


async def _discard(stream: asyncio.StreamReader | None) -> None:
    if stream is None:
        return
    with contextlib.suppress(Exception):
        while await stream.read(65536):
            pass


# ---- the child side ---------------------------------------------------------------------


async def _child() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    out = sys.stdout.buffer

    def send(msg: msgspec.Struct) -> None:
        out.write(_encode(msg) + b"\n")
        out.flush()

    try:
        start = msgspec.json.decode(await reader.readline(), type=Start)
    except msgspec.DecodeError as e:
        send(Fatal(f"bad run configuration: {e}"))
        return 2
    session = Session(start.config, start.secrets, sinks=[ToConsole(send)], record=start.record)
    try:
        await session.start()
    except SessionError as e:
        send(Fatal(str(e)))
        return 2
    assert session.coord is not None and session.coord.target is not None
    send(Ready(session.coord.target))
    controls = asyncio.create_task(_read_controls(reader, session))
    try:
        async for _ in session.snapshots():
            pass
    except BrokenPipeError:
        pass  # the console is gone; finish() below still stops the load
    finally:
        controls.cancel()
        outcome = await session.finish()
    log.info("%s", outcome.reason)
    return 0


class ToConsole:
    """The sink that is the console: every Snapshot down the pipe."""

    def __init__(self, send) -> None:
        self.send = send

    async def start(self, session: Session) -> None:
        pass

    def take(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        self.send(SnapshotMsg(snap))

    def finish(self, summary: dict) -> None:
        pass

    async def close(self) -> None:
        pass


async def _read_controls(reader: asyncio.StreamReader, session: Session) -> None:
    while line := await reader.readline():
        try:
            await session.control(msgspec.json.decode(line, type=Control))
        except msgspec.DecodeError as e:
            log.warning("ignored a bad control line: %s", e)
    # stdin closed: the console went away without a word; stop now, nobody is watching
    session.cfg.drain_grace = min(session.cfg.drain_grace, 2.0)
    session.request_stop()


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    return eventloop.run(_child)


if __name__ == "__main__":
    sys.exit(main())
