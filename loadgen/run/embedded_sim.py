"""The embedded simulator as a child process: what `tokentop` with no --url points at.

It runs in its own process so its engine loop never competes with the
client's timing, listens on a free loopback port, and exits by itself when
our end of its stdin closes (so it dies with us, even on kill -9).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

log = logging.getLogger("tokentop.sim")

ANNOUNCE = b"TOKENTOP_SIM_LISTENING "


class SimStartError(Exception):
    pass


class EmbeddedSim:
    def __init__(self, extra_args: list[str] | None = None) -> None:
        self.extra_args = extra_args or []
        self.proc: asyncio.subprocess.Process | None = None
        self.port: int | None = None
        self._stderr: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self, timeout: float = 20.0) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadgen.sim",
            "--host", "127.0.0.1", "--port", "0", "--announce", "--exit-with-parent",
            *self.extra_args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
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
