"""Failed requests are paced (loadgen.worker.pacing), judged where it counts: at the server.

The simulator stamps every completion request as it arrives (GET /sim/arrivals, its loop
clock, this test's loop); how many attempts a failing server took, the gaps between one
stream's attempts and the arrivals of an open-loop schedule are read from there, never
from the load generator's own counters. The run's own account of its pacing (the
Snapshot's backoff counters) is then held against those same arrivals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import aiohttp
import numpy as np
import pytest
from support import chat_body, root, running_sim, server_arrivals

from loadgen.model.snapshot import Event, Snapshot
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.run.summary import pacing_text
from loadgen.sim.faults import FaultConfig
from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.openai_client import OpenAIClient
from loadgen.worker.pacing import RETRY_AFTER_MAX_S, backoff_step, retry_after

SMALL = {"output_tokens": "4", "input_tokens": "8", "workers": 1, "tick": 0.25,
         "drain_grace": 1.0}


class Run:
    """A coordinator driven tick by tick, every Snapshot kept."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.snaps: list[Snapshot] = []
        self._it = coord.snapshots()

    @classmethod
    async def start(cls, cfg: RunConfig) -> Run:
        coord = Coordinator(cfg)
        await coord.start()
        return cls(coord)

    async def for_seconds(self, seconds: float, max_ticks: int = 200) -> None:
        end = (self.snaps[-1].elapsed if self.snaps else 0.0) + seconds
        for _ in range(max_ticks):
            snap = await anext(self._it)
            self.snaps.append(snap)
            if snap.elapsed >= end:
                return
        raise AssertionError("the run did not reach its time")

    async def finish(self) -> None:
        self.coord.request_stop("test over")
        self.snaps += [s async for s in self._it]
        await self.coord.close()

    @property
    def events(self) -> list[Event]:
        """Every event, in the order a reader of the Snapshots gets them."""
        return [e for s in self.snaps for e in s.events]


async def set_faults(sim, **changes) -> None:
    async with aiohttp.ClientSession() as http, \
            http.post(root(sim) + "/sim/faults", json=changes) as resp:
        assert resp.status == 200, await resp.text()


def most_attempts(span: float) -> int:
    """The most requests one stream can send within `span` seconds of failures: each wait
    is at least half its back-off step (equal jitter), whatever the request took."""
    n, t = 1, 0.0
    while True:
        t += backoff_step(n) / 2.0
        if t > span:
            return n
        n += 1


async def test_a_server_that_fails_at_once_gets_a_bounded_number_of_attempts():
    """Four streams against a server that answers 500 at once: the attempts the server saw
    stay under what the back-off allows (before pacing it was thousands a second), and the
    time the run says its streams backed off is the time between their attempts."""
    async with running_sim(faults=FaultConfig(error_rate=1.0)) as sim:
        run = await Run.start(RunConfig(url=sim.url, concurrency=4, **SMALL))
        try:
            await run.for_seconds(3.0)
        finally:
            await run.finish()
        arrivals = await server_arrivals(sim)
    span = arrivals[-1] - arrivals[0]
    assert span > 2.0, span
    assert 4 * 3 <= len(arrivals) <= 4 * most_attempts(span), (len(arrivals), span)
    c = run.snaps[-1].counters
    assert c.requests_ok == 0 and c.errors == {"http_5xx": len(arrivals)}
    # a wait after every failure but those the drain caught in flight (a stream each)
    assert len(arrivals) - 4 <= c.backoffs <= len(arrivals) and c.backoffs_retry_after == 0
    assert c.backoff_us / 1e6 <= 4 * (span + backoff_step(99)), (c.backoff_us, span)


async def test_one_streams_attempts_are_apart_by_the_retry_after_asked():
    """429 with Retry-After: 1: one stream's attempts reach the server a second apart or
    more, though its own back-off would have come back in 25 ms."""
    async with running_sim(faults=FaultConfig(rate_limit_rate=1.0, retry_after_s=1.0)) as sim:
        run = await Run.start(RunConfig(url=sim.url, concurrency=1, **SMALL))
        try:
            await run.for_seconds(3.5)
        finally:
            await run.finish()
        arrivals = await server_arrivals(sim)
    gaps = np.diff(arrivals)
    assert len(gaps) >= 2, arrivals
    assert gaps.min() >= 1.0, gaps
    c = run.snaps[-1].counters
    assert c.errors == {"http_429": len(arrivals)}
    assert c.backoffs_retry_after >= len(gaps)  # the server's wait, every time but the last
    # the time the run says its stream backed off is the time between its attempts at the
    # server, less what each attempt took (a 429 at once: milliseconds), and at most the
    # last wait (cut by the drain) more
    span, backoff_s = arrivals[-1] - arrivals[0], c.backoff_us / 1e6
    assert span - 0.05 * len(arrivals) <= backoff_s <= span + 1.0 + 0.05, (backoff_s, span)
    assert "streams backed off" in pacing_text({"backoffs": c.backoffs,
                                                "backoff_s": backoff_s})


async def test_a_success_resets_the_back_off():
    """A stream that failed for a while (its step grown to the cap) and then succeeded
    comes back quickly after its next failure: the back-off starts again from its first
    step."""
    loop = asyncio.get_running_loop()
    async with running_sim(faults=FaultConfig(error_rate=1.0)) as sim:
        run = await Run.start(RunConfig(url=sim.url, concurrency=1, **SMALL))
        try:
            await run.for_seconds(2.5)  # 0.05 + 0.1 + … : the step is at its cap by now
            await set_faults(sim, error_rate=0.0)
            await run.for_seconds(1.5)  # the stream wakes within a step and succeeds
            await set_faults(sim, error_rate=1.0)
            failing_again = loop.time()
            await run.for_seconds(1.0)
        finally:
            await run.finish()
        arrivals = await server_arrivals(sim)
    grown = np.diff(arrivals[arrivals < failing_again - 1.5])
    assert grown.max() >= backoff_step(5) / 2, grown  # it had backed off long before
    after = arrivals[arrivals >= failing_again]
    assert len(after) >= 3, after
    # the first failure's wait is within the first step (plus one request's time)
    assert after[1] - after[0] <= backoff_step(1) + 0.05, np.diff(after)
    assert run.snaps[-1].counters.requests_ok > 0


async def test_open_loop_keeps_its_schedule_against_a_failing_server():
    """Open loop at 20/s against a server that fails everything: the arrivals at the server
    stay the schedule's (a failed arrival is a failed arrival: no pause, no retry), and no
    stream backs off."""
    rate = 20.0
    async with running_sim(faults=FaultConfig(error_rate=1.0)) as sim:
        run = await Run.start(RunConfig(url=sim.url, mode="open", rate=rate,
                                        arrival="constant", max_in_flight=2, **SMALL))
        try:
            await run.for_seconds(3.0)
        finally:
            await run.finish()
        arrivals = await server_arrivals(sim)
    span = arrivals[-1] - arrivals[0]
    assert len(arrivals) - 1 == pytest.approx(rate * span, abs=2), (len(arrivals), span)
    assert np.diff(arrivals).max() < 2.5 / rate, np.diff(arrivals).max()
    c = run.snaps[-1].counters
    assert c.backoffs == 0 and c.backoff_us == 0
    assert c.errors == {"http_5xx": len(arrivals)}


def test_retry_after_is_read_in_both_forms_and_bounded():
    """Seconds and an HTTP date; a hostile value is capped at RETRY_AFTER_MAX_S; only 429
    and 503 carry it; what cannot be read is not a wait."""
    in_90 = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True).encode()
    assert retry_after(429, {b"retry-after": b"2"}) == 2.0
    assert retry_after(503, {b"retry-after": in_90}) == pytest.approx(30.0, abs=2.0)
    assert retry_after(429, {b"retry-after-ms": b"1500", b"retry-after": b"9"}) == 1.5
    assert retry_after(429, {b"retry-after": b"86400"}) == RETRY_AFTER_MAX_S
    assert retry_after(503, {b"retry-after": b"-5"}) == 0.0
    assert retry_after(500, {b"retry-after": b"2"}) is None
    for junk in (b"soon", b"nan", b"\x1b[2J", b"1e999"):
        assert retry_after(429, {b"retry-after": junk}) is None


# ---- outside text in the errors the worker reports ---------------------------------------------

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mdisk on fire\x9b1m\x07"


def answers() -> list[bytes]:
    """A 500 with an OpenAI-style body and a hostile reason, a 503 with a plain body and a
    Retry-After of the year 9999, a 429: raw bytes, as a hostile server sends them (aiohttp
    would not send a control character in a status line)."""
    body_json = json.dumps({"error": {"message": HOSTILE}}).encode()
    text = HOSTILE.encode()
    out = []
    for status, reason, extra, body in (
            (500, "Internal \x1b[2J Error", b"", body_json),
            (503, "Busy", b"Retry-After: Fri, 31 Dec 9999 23:59:59 GMT\r\n", text),
            (429, "Too Many", b"Retry-After: 3\r\n", text)):
        out.append(f"HTTP/1.1 {status} {reason}\r\n".encode() + extra
                   + b"Content-Type: text/plain\r\nConnection: close\r\n"
                   + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return out


@contextlib.asynccontextmanager
async def hostile_server():
    """Answers each request with the next of answers(); its chat URL."""
    queue = answers()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        await reader.readexactly(length)
        writer.write(queue.pop(0))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("kind", ["raw", "openai"])
async def test_a_hostile_error_body_reaches_no_report_raw(kind):
    """The server's words (its body, its reason, its Retry-After) are in the errors the
    worker reports, with none of their escape sequences or control bytes."""
    async with hostile_server() as url:
        rec = IntervalRecorder()
        client = OpenAIClient(url, rec) if kind == "openai" else StreamingClient(url, rec)
        for _ in range(3):
            await client.request(chat_body(), 2)
        client.close()
    counters, _, errors = rec.take()
    assert counters.errors == {"http_5xx": 2, "http_429": 1}, errors
    for message in errors.values():
        assert not any(c in message for c in "\x1b\x07\x9b"), repr(message)
        assert "disk on fire" in message
    assert "Retry-After 3 s" in errors["http_429"]
    assert f"Retry-After {RETRY_AFTER_MAX_S:g} s, {RETRY_AFTER_MAX_S:g} s at most" in \
        errors["http_5xx"]


def test_an_error_is_dated_by_the_worker_when_it_happened():
    rec = IntervalRecorder()
    before = time.time()
    rec.error("http_5xx", "HTTP 500: x")
    assert before <= rec.error_at["http_5xx"] <= time.time()
