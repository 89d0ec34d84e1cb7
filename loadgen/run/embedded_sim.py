"""The embedded simulator as a child process: what `tokentop` with no --url points at.

It runs in its own process so its scheduling loop never competes with the
client's timing, listens on a free loopback port, and exits by itself when
our end of its stdin closes (so it dies with us, even on kill -9).

Its settings are a typed SimConfig (resolved from `--sim-profile`/`--sim-arg` by
the command line, tui/commands/); the child `python -m loadgen.sim` reads them as
one JSON line on stdin (loadgen/sim/launch.py), so no flag is parsed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from loadgen.sim.launch import SimLaunch, encode_launch
from loadgen.sim.model import SimConfig

log = logging.getLogger("tokentop.sim")

ANNOUNCE = b"TOKENTOP_SIM_LISTENING "


class SimStartError(Exception):
    pass


class EmbeddedSim:
    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.proc: asyncio.subprocess.Process | None = None
        self.port: int | None = None
        self._stderr: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self, timeout: float = 20.0) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadgen.sim",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        # the stdin pipe stays open after the launch line: its EOF is "the parent is gone"
        self.proc.stdin.write(encode_launch(SimLaunch(config=self.config, port=0)))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # died: said below
            await self.proc.stdin.drain()
        try:
            async with asyncio.timeout(timeout):
                while line := await self.proc.stdout.readline():
                    if line.startswith(ANNOUNCE):
                        self.port = int(line[len(ANNOUNCE):])
                        # keep reading its log so a full pipe never blocks it
                        self._stderr = asyncio.create_task(self._log_stderr())
                        return self.url
        except TimeoutError:
            pass
        err = b""
        if self.proc.returncode is not None and self.proc.stderr is not None:
            err = await self.proc.stderr.read()
        await self.stop()
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no reason given"]
        raise SimStartError(f"the embedded simulator did not start: {last[0]}")

    async def _log_stderr(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stderr is not None
        async for line in proc.stderr:
            log.info("sim: %s", line.decode(errors="replace").rstrip())

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(5.0):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
