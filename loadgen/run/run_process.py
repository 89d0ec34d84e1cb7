"""The engine in its own process, for the console: Snapshots out, control in.

The console never runs the coordinator on its own event loop: a slow frame
must not delay a tick, and if the terminal goes away (SSH drops) the engine
sees its stdin close and stops the load by itself.

Protocol, one JSON object per line:
  console → engine: the RunConfig first, then Control messages.
  engine → console: Ready (the resolved target) or Fatal (why not), then
                    one Snapshot message per tick until the run has stopped.
The API key travels in the environment (TOKENTOP_API_KEY), never on a line.

The engine records the run (loadgen.record.recorder) to `cfg.out` or the default run
directory; the first Snapshot carries a "recording to DIR" event. When recording
fails, an error Event says so in the console, and the load stops
(`cfg.on_disk_full == "stop"`, the default) or goes on unrecorded ("continue").
TOKENTOP_NO_RECORD=1 in the environment turns recording off.
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

from loadgen.model.snapshot import Control, Snapshot, Target
from loadgen.model.source import SourceError
from loadgen.record.recorder import Recording, RecordingError, resumed
from loadgen.run.config import ConfigError, RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.run.preflight import TargetError
from loadgen.worker import eventloop

log = logging.getLogger("tokentop.engine")


class Ready(msgspec.Struct, tag="ready"):
    target: Target


class Fatal(msgspec.Struct, tag="fatal"):
    message: str


class SnapshotMsg(msgspec.Struct, tag="snapshot"):
    snapshot: Snapshot


EngineMsg = Ready | Fatal | SnapshotMsg
_decode_msg = msgspec.json.Decoder(EngineMsg).decode
_encode = msgspec.json.Encoder().encode


class EngineProcess:
    """A SnapshotSource backed by a live engine in a child process."""

    def __init__(self, cfg: RunConfig, api_key: str | None = None, log_path: Path | None = None):
        self.cfg = cfg
        self.api_key = api_key
        default_log = Path(tempfile.gettempdir()) / f"tokentop-engine-{os.getpid()}.log"
        self.log_path = log_path or default_log
        target = cfg.url or "the embedded simulator"
        self.description = f"live: {target}"
        self.proc: asyncio.subprocess.Process | None = None
        self.target: Target | None = None

    async def start(self) -> None:
        env = dict(os.environ)
        env.pop("TOKENTOP_API_KEY", None)
        if self.api_key:
            env["TOKENTOP_API_KEY"] = self.api_key
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadgen.run.run_process",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,
            limit=2**24,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(_encode(self.cfg) + b"\n")
        msg = await self._next_message(timeout=90.0)
        if isinstance(msg, Fatal):
            await self._reap()
            raise SourceError(msg.message)
        if not isinstance(msg, Ready):
            await self._reap()
            raise SourceError(f"the engine did not start; see {self.log_path}")
        self.target = msg.target
        self.description = f"live: {msg.target.url}"

    async def _next_message(self, timeout: float | None = None) -> EngineMsg | None:
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

    line = await reader.readline()
    try:
        cfg = msgspec.json.decode(line, type=RunConfig)
    except msgspec.DecodeError as e:
        send(Fatal(f"bad engine configuration: {e}"))
        return 2
    try:
        resume = None
        if cfg.resume:
            cfg, resume = resumed(cfg)
        coord = Coordinator(cfg, os.environ.get("TOKENTOP_API_KEY"), resume=resume)
        recording = Recording.open(cfg, run_id=coord.run_id,
                                   record=os.environ.get("TOKENTOP_NO_RECORD") != "1")
    except (ConfigError, RecordingError) as e:
        send(Fatal(str(e)))
        return 2
    try:
        await coord.start()
    except (TargetError, ConfigError) as e:
        recording.discard({"error": str(e)})
        send(Fatal(str(e)))
        return 2
    assert coord.target is not None
    send(Ready(coord.target))
    controls = asyncio.create_task(_read_controls(reader, coord))
    publisher = await _publisher(cfg, coord.run_id)
    stopping = False
    try:
        async for snap in coord.snapshots():
            recording.take(snap)
            if recording.stop_load and not stopping:
                stopping = True
                coord.request_stop("recording failed")
            if publisher is not None:
                publisher.publish(snap)
            send(SnapshotMsg(snap))
    except BrokenPipeError:
        pass  # the console is gone; close() below still stops the load
    finally:
        controls.cancel()
        await coord.close()
        if publisher is not None:
            await publisher.close()
        error = recording.close()
        if error:
            log.error("%s", error)
    return 0


async def _publisher(cfg: RunConfig, run_id: str):
    """`--publish`: the console's Snapshots go to MQTT too (read-only: no remote control)."""
    if cfg.publish is None:
        return None
    from types import SimpleNamespace

    from loadgen.fleet.link import broker_from_args
    from loadgen.fleet.publisher import TelemetryPublisher

    p = cfg.publish
    settings = broker_from_args(SimpleNamespace(
        broker=p.broker, mqtt_password_file=None, mqtt_ca_file=p.ca_file,
        mqtt_cert_file=p.cert_file, mqtt_key_file=p.key_file, mqtt_keepalive=p.keepalive,
    ))
    publisher = TelemetryPublisher(settings, fleet=p.fleet, agent=p.name, run_id=run_id)
    await publisher.start()
    return publisher


async def _read_controls(reader: asyncio.StreamReader, coord: Coordinator) -> None:
    while line := await reader.readline():
        try:
            await coord.control(msgspec.json.decode(line, type=Control))
        except msgspec.DecodeError as e:
            log.warning("ignored a bad control line: %s", e)
    # stdin closed: the console went away without a word; stop now, nobody is watching
    coord.cfg.drain_grace = min(coord.cfg.drain_grace, 2.0)
    coord.request_stop()


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    return eventloop.run(_child)


if __name__ == "__main__":
    sys.exit(main())
