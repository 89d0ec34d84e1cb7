"""The run in its own process, for the console: Snapshots out, control in.

The console never runs the session on its own event loop: a slow frame must not
delay a tick, and if the terminal goes away (SSH drops) the run process sees its
stdin close and stops the load by itself.

Protocol, one JSON object per line:
  console → run: Start (the RunConfig, the Secrets, whether to record), then
                 Control messages (a stop is honoured while the target is waited for too).
  run → console: Waiting (the target does not answer yet: what the run says, since when,
                 the host meanwhile; once a second), Said (anything else the run says:
                 where it records, that the target answers), then Ready (the resolved
                 target and the run directory) or Fatal (why not), then one Snapshot
                 message per tick until the run has stopped, and Finished (the outcome:
                 exit code, reason, the last line) once its summary is written.
Secrets travel on this pipe only, never in the argv or the environment.

The run speaks for itself, so the console rebuilds nothing: the wait for the target is
the child's Session's, the run directory comes with Ready, the outcome with Finished. A
child that dies without Finished (kill -9, a crash) is an outcome too, in words.

The run is an ordinary Session (loadgen.run.session): recorded, watched,
published with --publish, its figures served for Prometheus with --prometheus-port (from
this child, where the run runs), its summary written into the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from loadgen.model.notice import Notice
from loadgen.model.snapshot import Control, Target
from loadgen.model.source import RunOutcome, SourceError, SourceStatus, Waiting
from loadgen.run.child import (
    Fatal,
    PipedChild,
    Said,
    SnapshotMsg,
    ToConsole,
    encode,
    run_child,
)
from loadgen.run.config import RunConfig
from loadgen.run.secrets import Secrets
from loadgen.run.session import HANGUP_GRACE_S, Session, SessionError, asked_stop
from probes.host import HostProbe

log = logging.getLogger("tokentop.run_process")

START_SILENCE_S = 90.0  # the child says something (Waiting once a second) well within this
WAITING_BEAT_S = 1.0  # how often a waiting run sends the host and its words again
MAX_SAID = 100  # notices kept for status(); a run says a handful before its first tick


class Start(msgspec.Struct, tag="start"):
    config: RunConfig
    secrets: Secrets
    record: bool = True


class WaitingMsg(msgspec.Struct, tag="waiting"):
    waiting: Waiting


class Ready(msgspec.Struct, tag="ready"):
    target: Target
    run_dir: str | None = None


class Finished(msgspec.Struct, tag="finished"):
    outcome: RunOutcome


RunMsg = WaitingMsg | Said | Ready | Fatal | SnapshotMsg | Finished
_decode_msg = msgspec.json.Decoder(RunMsg).decode


class RunProcess(PipedChild):
    """A SnapshotSource backed by a live run in a child process."""

    program = "loadgen.run.run_process"
    decode = staticmethod(_decode_msg)

    def __init__(self, cfg: RunConfig, secrets: Secrets | None = None, *, record: bool = True,
                 log_path: Path | None = None):
        default_log = Path(tempfile.gettempdir()) / f"tokentop-run-{os.getpid()}.log"
        super().__init__(log_path or default_log)
        self.cfg = cfg
        self.secrets = secrets or Secrets()
        self.record = record
        self.target: Target | None = None
        self._description = f"live: {cfg.url or 'the embedded simulator'}"
        self._run_dir: str | None = None
        self._waiting: Waiting | None = None
        self._said: list[Notice] = []
        self._outcome: RunOutcome | None = None

    def status(self) -> SourceStatus:
        return SourceStatus(kind="live", description=self._description, run_dir=self._run_dir,
                            waiting=self._waiting, outcome=self._outcome,
                            said=tuple(self._said))

    async def start(self) -> None:
        await self.spawn(Start(config=self.cfg, secrets=self.secrets, record=self.record))
        while True:  # what it says while it waits for the target, until it is ready or not
            msg = await self.next_message(timeout=START_SILENCE_S)
            if isinstance(msg, Ready):
                break
            if msg is None or isinstance(msg, Fatal):
                await self.reap()
                raise SourceError(msg.message if msg is not None else
                                  f"the run did not start; see {self.log_path}")
            self.took(msg)
        self.target = msg.target
        self._run_dir = msg.run_dir
        self._waiting = None
        self._description = f"live: {msg.target.url}"
        self.read_on()

    def took(self, msg: RunMsg) -> None:
        """A message: a Snapshot for the console, else the run's state as status() tells."""
        if isinstance(msg, SnapshotMsg):
            self.queue(msg.snapshot)
        elif isinstance(msg, Fatal):
            self.queue(SourceError(msg.message))
        elif isinstance(msg, WaitingMsg):
            self._waiting = msg.waiting
        elif isinstance(msg, Said):
            if msg.notice.kind == "up":
                self._waiting = None
            if len(self._said) < MAX_SAID:
                self._said.append(msg.notice)
        elif isinstance(msg, Finished):
            self._outcome = msg.outcome

    def finished(self) -> bool:
        return self._outcome is not None

    async def died(self, how: str) -> None:
        """The outcome of a child that ended without a word: how it ended, in words."""
        where = f"; its recording in {self._run_dir} is interrupted" if self._run_dir else ""
        reason = f"the run process died ({how}) before it finished the run{where}"
        self._outcome = RunOutcome(code=1, reason=reason, line=reason, run_dir=self._run_dir,
                                   ending="died")

    async def close(self) -> None:
        """Ask for a clean stop, wait for the drain and the outcome, and make sure the child
        is gone."""
        await self.stop(wait=self.cfg.drain_grace + 10.0)


# ---- the child side ---------------------------------------------------------------------


Send = Callable[[msgspec.Struct], None]


async def _child() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    out = sys.stdout.buffer

    def send(msg: msgspec.Struct) -> None:
        out.write(encode(msg) + b"\n")
        out.flush()

    try:
        start = msgspec.json.decode(await reader.readline(), type=Start)
    except msgspec.DecodeError as e:
        send(Fatal(f"bad run configuration: {e}"))
        return 2
    say = ToConsoleSay(send)
    # the console waits for its --url as long as it takes unless --wait says otherwise
    session = Session(start.config, start.secrets, sinks=[ToConsole(send)],
                      record=start.record, say=say, wait=start.config.wait)
    controls = asyncio.create_task(_read_controls(reader, session))
    try:
        await session.start()
    except SessionError as e:
        send(Fatal(str(e)))
        controls.cancel()
        return 2
    finally:
        say.stop_waiting()
    assert session.coord is not None and session.coord.target is not None
    run_dir = session.recording.run_dir if session.recording is not None else None
    send(Ready(session.coord.target, str(run_dir) if run_dir is not None else None))
    try:
        async for _ in session.snapshots():
            pass
    except BrokenPipeError:
        pass  # the console is gone; finish() below still stops the load
    finally:
        controls.cancel()
        outcome = await session.finish()
        with contextlib.suppress(BrokenPipeError):
            send(Finished(outcome.said()))
    log.info("%s", outcome.reason)
    return 0


class ToConsoleSay:
    """The child Session's `say`: every notice to the console; while the target is waited
    for, the waiting words and a host sample once a second (the host panel is live)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self._beat: asyncio.Task | None = None

    def __call__(self, notice: Notice) -> None:
        log.info("%s: %s", notice.kind, notice.text)
        if notice.kind == "waiting":
            self.stop_waiting()
            self._beat = asyncio.create_task(self._waiting(notice.text, time.time()))
            return
        self.stop_waiting()
        with contextlib.suppress(BrokenPipeError):
            self.send(Said(notice))

    def stop_waiting(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None

    async def _waiting(self, text: str, since: float) -> None:
        probe = HostProbe()
        with contextlib.suppress(BrokenPipeError):
            while True:
                self.send(WaitingMsg(Waiting(text=text, since=since, host=probe.sample())))
                await asyncio.sleep(WAITING_BEAT_S)


async def _read_controls(reader: asyncio.StreamReader, session: Session) -> None:
    while line := await reader.readline():
        try:
            msg = msgspec.json.decode(line, type=Control)
        except msgspec.DecodeError as e:
            log.warning("ignored a bad control line: %s", e)
            continue
        if msg.op == "stop":  # also before the run has started: it ends a wait for the target
            reason, grace = asked_stop(msg)
            session.request_stop(reason, grace=grace)
        else:
            await session.control(msg)
    # stdin closed: the console went away without a word; stop now, nobody is watching
    session.request_stop("the console went away", grace=HANGUP_GRACE_S)


def main() -> int:
    return run_child(_child)


if __name__ == "__main__":
    sys.exit(main())
