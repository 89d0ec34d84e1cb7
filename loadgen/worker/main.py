"""A load worker process: its own event loop (uvloop where available), nothing else.

Started by the coordinator as `python -m loadgen.worker.main`; commands arrive on
stdin and reports leave on stdout (see `loadgen.worker.wire`). Nothing in this
process draws or parses more than it must, so its timestamps are honest.
"""

from __future__ import annotations

import gc

if __name__ == "__main__":  # the worker process (imported, as by tests, nothing changes)
    # No collection while this process loads its modules: they allocate tens of thousands
    # of objects, none garbage, and the collections that set off were ~20 % of a worker's
    # start-up CPU. Frozen and collected again from the end of the imports (below).
    gc.disable()

import asyncio
import logging
import os
import random
import signal
import sys
import time

from loadgen.model.snapshot import Counters
from loadgen.worker import eventloop, wire
from loadgen.worker.client import StreamingClient
from loadgen.worker.conversation import Conversation
from loadgen.worker.interval import IntervalRecorder, merge_sparse
from loadgen.worker.limits import raise_open_file_limit
from loadgen.worker.load import ClosedLoop, OpenLoop, Schedule, Stagger
from loadgen.worker.mix import class_limits
from loadgen.worker.pacing import Backoff
from loadgen.worker.stream_measure import Turn
from loadgen.worker.tokenizer import ChunkTokens
from loadgen.worker.trace import read_trace
from loadgen.worker.workload import Prepared, RequestFactory

log = logging.getLogger("tokentop.worker")

LAG_PROBE_S = 0.02


class LagMeter:
    """Event-loop lag: how late a short sleep wakes up. Worst value per report."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            lag = loop.time() - t - LAG_PROBE_S
            if lag > self.worst:
                self.worst = lag

    def take_ms(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst * 1000.0


class Worker:
    def __init__(self, cfg: wire.Configure) -> None:
        self.cfg = cfg
        self.rec = IntervalRecorder()
        # --mix: each class's requests recorded apart (the report sums them into the
        # totals), with the class's own per-request limits, else the run's
        classes = cfg.workload.classes
        self.class_recs = [IntervalRecorder() for _ in classes]
        self.class_slos = class_limits(classes, cfg.slo)
        self.lag = LagMeter()
        self.factory = RequestFactory(cfg.workload, cfg.index)
        self.rng = random.Random(cfg.workload.seed * 7919 + cfg.index)
        self._cpu_mark = time.process_time()
        self.sent = 0
        url = cfg.base_url.rstrip("/") + cfg.workload.path
        self.client = make_client(cfg, url, self.rec, self.factory.chunk_tokens)
        # multi-turn: each closed-loop user's conversation, by user
        self.conversations: dict[int, Conversation] = {}
        turns = cfg.workload.turns > 1
        self.closed = ClosedLoop(self._send_turn if turns else self._send_one,
                                 self._think if turns else None,
                                 Stagger(cfg.stagger, cfg.workload.seed * 31 + cfg.index),
                                 self.rec.backed_off)
        # one seed for every worker: they all draw the same global arrival sequence
        self.open = OpenLoop(self._send_at, cfg.workload.seed, self._backlog_overflow)
        # read now, before this worker answers that it is up: not while arrivals are due
        self.trace = read_trace(cfg.trace) if cfg.trace else None
        self.open.trace = self.trace
        self.spec = wire.LoadSpec()

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.lag.start()
        try:
            await self._serve(reader, writer)
        finally:
            self.client.close()

    # ---- sending ------------------------------------------------------------------------

    async def _send_one(self, user: int = 0, pace: Backoff | None = None) -> bool:
        return await self._send_at(None, pace=pace)

    async def _send_turn(self, user: int, pace: Backoff | None = None) -> bool:
        """User `user`'s next turn of its conversation (loadgen.worker.conversation)."""
        if self._used_up():
            return True
        conv = self.conversations.get(user)
        if conv is None:
            conv = self.conversations[user] = Conversation()
        prep, turn = self.factory.turn(conv)
        try:
            return await self._send(prep, None, turn, pace)
        finally:
            conv.answered(turn)

    def _think(self, user: int) -> float:
        """The think time before user `user`'s next turn: none before a new conversation."""
        conv = self.conversations.get(user)
        if conv is None or not conv.turn or conv.turn >= conv.limit:
            return 0.0
        return self.cfg.workload.think_time.draw(self.rng)

    async def _send_at(self, t_intended: float | None, entry: int = -1,
                       pace: Backoff | None = None) -> bool:
        """One request; False when the server could not be reached. `pace`: a closed-loop
        user's back-off (open loop has none: its schedule holds whatever the server says)."""
        if self._used_up():
            return True
        if entry >= 0 and self.trace is not None:  # a trace's entry: its own lengths
            prep = self.factory.sized(int(self.trace.inputs[entry]),
                                      int(self.trace.outputs[entry]), self.trace.blocks(entry))
        else:
            prep = self.factory.next()
        return await self._send(prep, t_intended, pace=pace)

    def _used_up(self) -> bool:
        """True when this worker's share of --requests is used up (it then stops asking for
        more); else counts the request about to go."""
        limit = self.spec.max_requests
        if limit is None:
            limit = self.cfg.max_requests
        if limit is not None and self.sent >= limit:
            self.closed.set_target(0)
            self.open.set(None, self.open.cap)
            return True
        self.sent += 1
        return False

    async def _send(self, prep: Prepared, t_intended: float | None,
                    turn: Turn | None = None, pace: Backoff | None = None) -> bool:
        c = self.cfg.cancelling
        abandon = c.rate > 0 and self.rng.random() < c.rate
        classed = prep.cls >= 0
        return await self.client.request(
            prep.body, prep.asked, t_intended,
            cancel_after_tokens=c.after_tokens if abandon else None,
            cancel_after_s=c.after_s if abandon else None,
            asked_out=prep.asked_out, turn=turn, pace=pace,
            rec=self.class_recs[prep.cls] if classed else None,
            slo=self.class_slos[prep.cls] if classed else None,
        )

    def _backlog_overflow(self) -> None:
        self.rec.error("client_backlog_full", "open-loop backlog full: dropped the oldest request")

    def apply(self, spec: wire.LoadSpec) -> None:
        """Move to the wanted load; switching mode winds the other loop down gently. While
        paused the change is kept and sends nothing until the resume."""
        self.spec = spec
        if spec.mode == "closed":
            self.open.set(None, spec.max_in_flight)
            self.closed.set_target(spec.concurrency)
        else:
            self.closed.set_target(0)
            self.open.set(Schedule(rate=spec.rate, kind=spec.arrival, shape=spec.shape,
                                   epoch=spec.epoch, share=spec.share, of=spec.of,
                                   trace_speed=spec.trace_speed if spec.trace else 0.0),
                          spec.max_in_flight)

    # ---- the pipe -----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        finishing: asyncio.Task | None = None
        cut_short: list[asyncio.Task] = []  # kept referenced until done
        while True:
            raw = await wire.read_frame(reader)
            if raw is None:
                # the coordinator is gone (or done with us): stop at once, nobody is listening
                await self._drain(0.0)
                return
            msg = wire.to_worker_decoder.decode(raw)
            if isinstance(msg, wire.SetLoad):
                self.apply(msg.spec)
            elif isinstance(msg, wire.Pause):
                self.closed.pause(msg.paused)
                self.open.pause(msg.paused, msg.at or time.perf_counter())
            elif isinstance(msg, wire.Flush):
                writer.write(wire.frame(self._report(msg.seq)))
                await writer.drain()
            elif isinstance(msg, wire.Stop) and finishing is None:
                # drain in the background so that flushes keep answering while it runs
                finishing = asyncio.create_task(self._finish(msg.grace, writer))
            elif isinstance(msg, wire.Stop) and msg.grace == 0:
                # a second Ctrl-C during the drain: cancel what is still in flight now (the
                # drain under way then ends, and reports as ever)
                cut_short.append(asyncio.create_task(self._drain(0.0)))

    async def _drain(self, grace: float) -> None:
        await asyncio.gather(self.closed.drain(grace), self.open.drain(grace))

    async def _finish(self, grace: float, writer: asyncio.StreamWriter) -> None:
        await self._drain(grace)
        writer.write(wire.frame(self._report(-1)))
        writer.write(wire.frame(wire.Stopped(self.cfg.index)))
        await writer.drain()

    def _report(self, seq: int) -> wire.Report:
        error_at = self.rec.error_at  # take() starts a fresh one
        counters, hists, errors = self.rec.take()
        classes = self._take_classes(counters, errors, error_at)
        if classes:
            hists = merge_sparse([hists, *(c.hists for c in classes)])
        cpu = time.process_time()
        cpu_s, self._cpu_mark = cpu - self._cpu_mark, cpu
        return wire.Report(
            index=self.cfg.index,
            seq=seq,
            in_flight=self.client.in_flight,
            backlog=len(self.open.backlog),
            counters=counters,
            hists=hists,
            last_errors=errors,
            error_at=error_at,
            loop_lag_ms=self.lag.take_ms(),
            cpu_s=cpu_s,
            trace_sent=self.open.trace_sent,
            trace_total=len(self.trace) if self.trace is not None else 0,
            **self.client.stalled(time.perf_counter())._asdict(),
            classes=classes,
        )

    def _take_classes(self, counters: Counters, errors: dict[str, str],
                      error_at: dict[str, float]) -> list[wire.ClassReport]:
        """Each class's interval (--mix), its counts and errors added to the totals."""
        out = []
        for rec in self.class_recs:
            error_at.update(rec.error_at)
            c, h, e = rec.take()
            counters.add(c)
            errors.update(e)
            out.append(wire.ClassReport(c, h))
        return out


def make_client(cfg: wire.Configure, url: str, rec: IntervalRecorder,
                chunk_tokens: ChunkTokens | None = None):
    """The client; `chunk_tokens` (a local tokenizer's count of a chunk's tokens) counts
    them when the server sends no per-chunk usage."""
    kw = {"authorization": cfg.authorization, "headers": cfg.headers,
          "timeout": cfg.request_timeout, "slo": cfg.slo, "calibrate": cfg.calibrate,
          "chunk_tokens": chunk_tokens}
    if cfg.client == "openai":
        from loadgen.worker.openai_client import OpenAIClient

        return OpenAIClient(url, rec, **kw)
    return StreamingClient(url, rec, **kw)


async def _stdio() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return reader, writer


async def _main() -> int:
    reader, writer = await _stdio()
    raw = await wire.read_frame(reader)
    if raw is None:
        return 0
    cfg = wire.to_worker_decoder.decode(raw)
    if not isinstance(cfg, wire.Configure):
        return 2
    try:
        await Worker(cfg).run(reader, writer)
    except Exception as e:  # reported to the coordinator in words, then logged in full
        log.exception("worker %d failed", cfg.index)
        writer.write(wire.frame(wire.Failed(cfg.index, f"{type(e).__name__}: {e}")))
        await writer.drain()
        return 1
    return 0


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="worker: %(message)s")
    # Ctrl-C belongs to the coordinator, which drains the load in order
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_open_file_limit()  # every stream is a socket
    return eventloop.run(_main)


if __name__ == "__main__":
    gc.freeze()  # what the imports made: later collections pass it by
    gc.enable()
    sys.exit(main())
