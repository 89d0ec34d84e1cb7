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
from time import perf_counter

import msgspec

from loadgen.worker import wire

log = logging.getLogger("tokentop.workers")

# A new open-loop schedule starts this far ahead of the command, so that every worker has it
# before its first arrival is due (a pipe write and one loop turn away).
START_LEAD_S = 0.02
READY_TIMEOUT_S = 60.0  # a worker process that has not answered by then is left behind


class WorkerHandle:
    def __init__(self, index: int, proc: asyncio.subprocess.Process) -> None:
        self.index = index
        self.proc = proc
        self.reports: asyncio.Queue[wire.Report] = asyncio.Queue()
        self.stopped = asyncio.Event()
        self.ready = asyncio.Event()  # its first message has arrived: it is serving commands
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
                self.ready.set()
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
            self.ready.set()
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
    """The worker processes, and how the run's load is split over them.

    Closed loop: streams by whole numbers (the first workers take the remainder).
    Open loop: the process at the server must be the one asked for whatever the worker
    count, so the rate is NOT divided into independent schedules (n constant schedules
    arrive in bursts of n, and n merged gamma processes are no longer gamma). Every worker
    gets the full rate, the same epoch (the same global arrival sequence) and its phase
    `share` of `of`: worker i sends arrivals i, i + n, i + 2n … (loadgen.worker.load).
    With an in-flight cap (--max-in-flight) the whole schedule runs in ONE worker and the
    others get no open-loop arrivals: then the cap counts every request in flight and the
    backlog is one queue, exactly; the price is that one worker's CPU carries the open loop
    (a cap bounds what is in flight, so that is at most `cap` streams).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.workers: list[WorkerHandle] = []
        self.spec = wire.LoadSpec()
        self._schedule: tuple | None = None  # what the open-loop schedule depends on
        self._epoch = 0.0  # perf_counter() of the running schedule's start
        self._paused = False
        self._request_limit: int | None = None  # --requests, over all the workers
        # --trace: the trace time the running schedule's epoch stands for, and that time
        # frozen over a pause (what the workers keep too: loadgen.worker.load)
        self._trace_base = 0.0
        self._trace_frozen: float | None = None
        self._trace_started = False

    async def start(self, configure: list[wire.Configure], env: dict[str, str]) -> None:
        if all(cfg.max_requests is not None for cfg in configure):
            self._request_limit = sum(cfg.max_requests or 0 for cfg in configure)
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
            # its answer says it is up: an open-loop schedule must not start while a worker
            # is still importing, or its share of the first second goes out in a burst
            handle.send(wire.Flush(-2))
            self.workers.append(handle)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(READY_TIMEOUT_S):
                await asyncio.gather(*(w.ready.wait() for w in self.workers))
        self.drain_reports()  # the start-up answers: nothing was sent yet

    def set_load(self, spec: wire.LoadSpec) -> None:
        """Split the run's load over the workers (see the class). A change that leaves the
        open-loop schedule as it is (a new cap value, say) keeps its epoch, so the workers
        carry on with it; a new rate, process or placement starts a new one from now."""
        self.spec = spec
        schedule = self._schedule_of(spec)
        if schedule != self._schedule:
            self._schedule = schedule
            self._new_epoch(perf_counter() + START_LEAD_S)
        self._send_load()

    def _new_epoch(self, epoch: float) -> None:
        if self.spec.trace:
            if self._trace_frozen is not None:
                self._trace_base = self._trace_frozen
            elif self._trace_started:
                self._trace_base = self.trace_time(epoch)
            self._trace_frozen = None
            self._trace_started = True
        self._epoch = epoch

    def trace_time(self, now: float) -> float:
        """How far into the trace (its own seconds) the replay is at perf_counter() `now`."""
        if self._trace_frozen is not None:
            return self._trace_frozen
        if not self._trace_started:
            return 0.0
        return self._trace_base + max(0.0, now - self._epoch) * self.spec.trace_speed

    def _schedule_of(self, spec: wire.LoadSpec) -> tuple | None:
        if spec.mode != "open":
            return None
        if spec.trace:  # a trace's schedule is its own: a rate change leaves it alone
            return ("trace", spec.trace_speed, self._sender(spec))
        return (spec.rate, spec.arrival, spec.shape, self._sender(spec))

    def _sender(self, spec: wire.LoadSpec) -> int | None:
        """With a cap, the one worker that runs the whole schedule: the first live one."""
        if spec.max_in_flight is None:
            return None
        return next((i for i, w in enumerate(self.workers) if not w.stopped.is_set()), 0)

    def _send_load(self) -> None:
        spec, n = self.spec, len(self.workers)
        sender = self._sender(spec)
        streams = [_share(spec.concurrency, n, i) for i in range(n)]
        if spec.mode == "closed":
            weights = streams
        else:
            weights = [1 if sender in (None, i) else 0 for i in range(n)]
        limits = _split(self._request_limit, weights)
        for i, w in enumerate(self.workers):
            mine = msgspec.structs.replace(
                spec, concurrency=streams[i], epoch=self._epoch, max_requests=limits[i])
            if sender is None:
                mine = msgspec.structs.replace(mine, share=i, of=n)
            elif i != sender:
                mine = msgspec.structs.replace(mine, rate=0.0, trace=False)
            w.send(wire.SetLoad(mine))

    def pause(self, paused: bool) -> None:
        """Pause: every worker stops its schedule at the same instant. Resume: a fresh
        schedule from now (with whatever load was set meanwhile), sent before the resume
        itself so that no worker restarts the old one."""
        if paused == self._paused:
            return
        self._paused = paused
        now = perf_counter()
        if paused:
            self._trace_frozen = self.trace_time(now)
        else:
            self._new_epoch(now + START_LEAD_S)
            self._send_load()
        for w in self.workers:
            w.send(wire.Pause(paused, at=now))

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


def _split(total: int | None, weights: list[int]) -> list[int | None]:
    """--requests over the workers in proportion to the load each carries (a worker with
    no streams or no arrivals gets none, so the others reach the whole limit); whole
    numbers that add up to the total, the largest remainders rounded up."""
    if total is None:
        return [None] * len(weights)
    whole = sum(weights)
    if whole == 0:  # no load anywhere: nothing will be sent, split evenly
        weights, whole = [1] * len(weights), len(weights)
    exact = [total * w / whole for w in weights]
    out = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: out[i] - exact[i])
    for i in by_remainder[: total - sum(out)]:
        out[i] += 1
    return out


async def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()
    try:
        async with asyncio.timeout(3.0):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
