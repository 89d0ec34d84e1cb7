"""Exact-timing mode (`exact_ttft_ms` + `exact_itl_ms`): the second way of serving a request.

The scheduler is bypassed (and with it the mid-stream faults: only 500, 429 and slow first
byte apply, the handler's before it gets here), every request's first token is due exactly
`exact_ttft_ms` after it arrived and each next one `exact_itl_ms` later (by deadline, never
by accumulated sleeps), and every chunk carries `"tokentop_sent_ns"`, the wall clock
(time.time_ns) just before its write. The first token goes alone; later chunks carry
`tokens_per_chunk` tokens, or 1..`exact_chunk_tokens_max` drawn per chunk (seeded), and
each is written when the last token it carries is due, so the true per-token gap is
`exact_itl_ms` however tokens are grouped.

What it is for: a known truth to calibrate a client against (loadgen.analysis.calibrate),
whatever the load. /metrics still counts these requests, as running while they stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Iterator
from typing import Protocol

from aiohttp import web

from loadgen.sim.chunks import SSE_HEADERS, ChunkWriter, stamp
from loadgen.sim.metrics import EngineMetrics
from loadgen.sim.model import DONE, BatchModel, ContextLengthError, Sequence, SimConfig
from loadgen.sim.request import CompletionRequest


class Serving(Protocol):
    """What the exact-timing path needs of the server (loadgen.sim.server.SimServer)."""

    engine: BatchModel
    cfg: SimConfig

    def writer(self, req: CompletionRequest, seq: Sequence, *, chat: bool) -> ChunkWriter: ...

    def refuse(self, status: int, message: str, kind: str) -> web.Response: ...

    async def whole(self, req: CompletionRequest, seq: Sequence, *,
                    chat: bool) -> web.Response: ...


async def respond_exact(server: Serving, request: web.Request, req: CompletionRequest,
                        arrived: float, *, chat: bool) -> web.StreamResponse:
    """Fixed TTFT and ITL by deadline, every chunk stamped; `arrived`: the loop's clock
    when the request came in, which every deadline counts from."""
    engine, cfg = server.engine, server.cfg
    try:
        seq = engine.planned(req.prompt_tokens, req.max_tokens, req.ignore_eos, req.asked, 0,
                             arrived)
    except ContextLengthError as exc:
        return server.refuse(400, str(exc), "BadRequestError")
    target, reason = seq.target, seq.target_reason
    loop = asyncio.get_running_loop()
    ttft = (cfg.exact_ttft_ms or 0.0) / 1000.0
    itl = (cfg.exact_itl_ms or 0.0) / 1000.0
    engine.metrics.arrived += 1
    engine.exact_running += 1  # the engine's running gauge counts it while it is answered
    try:
        if not req.stream:
            await sleep_until(loop, arrived + ttft + itl * (target - 1))
            seq.generated = target
            seq.state = DONE
            seq.finish_reason = reason
            _account_whole(engine.metrics, seq, arrived, ttft, itl, loop.time())
            return await server.whole(req, seq, chat=chat)
        writer = server.writer(req, seq, chat=chat)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        with contextlib.suppress(ConnectionResetError):  # the client left
            await _stream(request, resp, writer, cfg, engine.metrics, (arrived, ttft, itl))
        return resp
    finally:
        engine.exact_running -= 1


async def _stream(request: web.Request, resp: web.StreamResponse, writer: ChunkWriter,
                  cfg: SimConfig, metrics: EngineMetrics,
                  timing: tuple[float, float, float]) -> None:
    """The stream, each chunk written at its last token's deadline and stamped; `timing`:
    (arrived, ttft, itl) in seconds of the loop's clock."""
    arrived, ttft, itl = timing
    loop = asyncio.get_running_loop()
    seq = writer.seq
    await resp.prepare(request)
    if writer.chat:
        await resp.write(stamp(writer.role(), time.time_ns()))
    target = seq.target
    writer.multi = True  # a chunk of several tokens is one chunk, as with the scheduler
    sizes = chunk_sizes(cfg, seq)
    k = 0
    while k < target:
        end = min(target, k + next(sizes))
        # a chunk goes out when its last token is due: the per-token truth stays exact
        await sleep_until(loop, arrived + ttft + itl * (end - 1))
        data = writer.tokens(k, end)
        seq.generated = end
        await resp.write(stamp(data, time.time_ns()))
        _account_chunk(metrics, seq, k, end, arrived, loop.time())
        k = end
    seq.state = DONE
    seq.finish_reason = seq.target_reason
    metrics.finished(seq.target_reason, seq.prompt_tokens, target)
    metrics.e2e.observe(seq.last_token_t - arrived)
    metrics.queue.observe(0.0)
    await resp.write(stamp(writer.ending(), time.time_ns()))
    await resp.write_eof()


def _account_chunk(metrics: EngineMetrics, seq: Sequence, k: int, end: int, arrived: float,
                   now: float) -> None:
    """/metrics for tokens k..end-1, just written: what the clock says, not the plan."""
    if k == 0:  # the first token goes alone
        metrics.ttft.observe(now - arrived)
        metrics.prompt_tokens += seq.prompt_tokens
    else:
        metrics.itl.observe((now - seq.last_token_t) / (end - k), end - k)
    seq.last_token_t = now
    metrics.generation_tokens += end - k


def chunk_sizes(cfg: SimConfig, seq: Sequence) -> Iterator[int]:
    """Tokens per chunk in exact-timing mode: the first alone (as vLLM sends it), then
    tokens_per_chunk, or 1..exact_chunk_tokens_max drawn per chunk (seeded: the
    request's text offset comes from the engine's seeded generator)."""
    yield 1
    top = cfg.exact_chunk_tokens_max
    if top <= 1:
        yield from itertools.repeat(cfg.tokens_per_chunk)
        return
    rng = random.Random(seq.offset)
    while True:
        yield rng.randint(1, top)


def _account_whole(metrics: EngineMetrics, seq: Sequence, arrived: float, ttft: float,
                   itl: float, now: float) -> None:
    """/metrics for a whole (non-streamed) exact-timing response."""
    metrics.ttft.observe(ttft)
    if seq.generated > 1:
        metrics.itl.observe(itl, seq.generated - 1)
    metrics.prompt_tokens += seq.prompt_tokens
    metrics.generation_tokens += seq.generated
    metrics.finished(seq.finish_reason or "length", seq.prompt_tokens, seq.generated)
    metrics.e2e.observe(now - arrived)
    metrics.queue.observe(0.0)


async def sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    """Sleep until the loop clock reads `deadline` (by deadline, so errors never accumulate).

    No busy-wait for the last millisecond: on a small machine the spin steals the very
    CPU the client under test needs, and the truth is in each chunk's send stamp anyway
    (`tokentop_sent_ns`), which is what calibration compares against. Sends land within
    the event loop's timer resolution (~1 ms) of the deadline.
    """
    delay = deadline - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
