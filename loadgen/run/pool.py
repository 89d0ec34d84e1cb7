"""The coordinator's side of the worker processes: start, command, collect, stop.

Each worker is a child process in its own session (so a Ctrl-C in the
terminal reaches only the coordinator, which then drains the load in order)
that exits by itself when its stdin closes (so it never outlives us).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

import msgspec

from loadgen.worker import wire

log = logging.getLogger("tokentop.workers")


class WorkerHandle:
    def __init__(self, index: int, proc: asyncio.subprocess.Process) -> None:
        self.index = index
        self.proc = proc
        self.reports: asyncio.Queue[wire.Report] = asyncio.Queue()
        self.stopped = asyncio.Event()
        self.failure: str | None = None
        self.latest_seq = -1
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())
        self._stderr = asyncio.create_task(self._log_stderr())

    def send(self, msg: msgspec.Struct) -> None:
        if self.proc.stdin is None or self.proc.stdin.is_closing():
            return
        self.proc.stdin.write(wire.frame(msg))

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while (raw := await wire.read_frame(self.proc.stdout)) is not None:
                msg = wire.from_worker_decoder.decode(raw)
                if isinstance(msg, wire.Report):
                    self.reports.put_nowait(msg)
                    self.latest_seq = max(self.latest_seq, msg.seq)
                    self._arrived.set()
                elif isinstance(msg, wire.Failed):
                    self.failure = msg.message
                elif isinstance(msg, wire.Stopped):
                    break
        except (asyncio.IncompleteReadError, msgspec.DecodeError) as e:
            self.failure = f"worker {self.index} sent a broken message: {e}"
        finally:
            if self.failure is None and self.proc.returncode not in (None, 0):
                self.failure = f"worker {self.index} exited with code {self.proc.returncode}"
            self.stopped.set()
            self._arrived.set()

    async def wait_for(self, seq: int) -> None:
        """Until the report for `seq` has arrived or the worker has ended."""
        while self.latest_seq < seq and not self.stopped.is_set():
            self._arrived.clear()
            await self._arrived.wait()

    async def _log_stderr(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            log.warning("worker %d: %s", self.index, line.decode(errors="replace").rstrip())


class WorkerPool:
    def __init__(self, n: int) -> None:
        self.n = n
        self.workers: list[WorkerHandle] = []
        self.spec = wire.LoadSpec()

    async def start(self, configure: list[wire.Configure], env: dict[str, str]) -> None:
        for cfg in configure:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "loadgen.worker.main",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
            handle = WorkerHandle(cfg.index, proc)
            handle.send(cfg)
            self.workers.append(handle)

    def set_load(self, spec: wire.LoadSpec) -> None:
        """Split the run's load over the workers: streams and caps by whole numbers (the
        first workers take the remainder), the rate evenly (a split Poisson process is
        still Poisson)."""
        self.spec = spec
        n = len(self.workers)
        for i, w in enumerate(self.workers):
            w.send(wire.SetLoad(msgspec.structs.replace(
                spec,
                concurrency=_share(spec.concurrency, n, i),
                rate=spec.rate / n,
                max_in_flight=None if spec.max_in_flight is None
                else max(1, _share(spec.max_in_flight, n, i)),
            )))

    def pause(self, paused: bool) -> None:
        for w in self.workers:
            w.send(wire.Pause(paused))

    async def collect(self, seq: int, timeout: float) -> list[wire.Report]:
        """Ask every live worker for its interval; whatever is late arrives with the next tick."""
        live = [w for w in self.workers if not w.stopped.is_set()]
        for w in live:
            w.send(wire.Flush(seq))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(w.wait_for(seq) for w in live))
        return self.drain_reports()

    def drain_reports(self) -> list[wire.Report]:
        out = []
        for w in self.workers:
            while not w.reports.empty():
                out.append(w.reports.get_nowait())
        return out

    async def stop(self, grace: float) -> None:
        for w in self.workers:
            w.send(wire.Stop(grace))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace + 5.0):
                await asyncio.gather(*(w.stopped.wait() for w in self.workers))
        for w in self.workers:
            await _end(w.proc)

    def failures(self) -> list[str]:
        return [w.failure for w in self.workers if w.failure]

    @property
    def alive(self) -> int:
        return sum(1 for w in self.workers if not w.stopped.is_set())


def _share(total: int, n: int, i: int) -> int:
    return total // n + (1 if i < total % n else 0)


async def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()
    try:
        async with asyncio.timeout(3.0):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
