"""Output tokens are counted as they arrive, against the simulator's own count of what it
wrote: a tick counts the tokens that arrived in it whatever becomes of the request (a
cancelled or failed stream keeps what it delivered), the final usage corrects the count,
and completed requests' tokens are counted apart. Also: open-loop goodput is judged from
the intended send time."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from time import perf_counter

import pytest
from support import WAIT_S, running_sim

from loadgen.model.slo import Slo
from loadgen.sim import RunningSim
from loadgen.sim.faults import FaultConfig
from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder

MODEL = "tokentop-sim"
PROMPT = "count these five words please"  # the simulator counts a prompt token a word
PROMPT_WORDS = 5
STREAMS = 4
# chunks a stream may have been written but not yet read when the recorder is taken (the
# simulator and the client share one event loop here, so it is a chunk or two at most)
IN_TRANSIT_CHUNKS = 3


def body(max_tokens: int, *, continuous: bool = False, usage: bool = True) -> bytes:
    options = {"include_usage": usage}
    if continuous:
        options["continuous_usage_stats"] = True
    return json.dumps({
        "model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens, "stream": True, "stream_options": options,
        "ignore_eos": True,
    }).encode()


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {WAIT_S:g} s")
        await asyncio.sleep(0.002)


def client(sim: RunningSim, rec: IntervalRecorder, **kw) -> StreamingClient:
    return StreamingClient(sim.url + "/chat/completions", rec, timeout=20.0, **kw)


@pytest.mark.parametrize(("continuous", "per_chunk"), [(False, 1), (True, 1), (True, 3)])
async def test_a_tick_counts_the_tokens_that_arrived_in_it(continuous: bool, per_chunk: int):
    max_tokens = 300
    async with running_sim(exact_ttft_ms=5.0, exact_itl_ms=2.0,
                           tokens_per_chunk=per_chunk) as sim:
        rec = IntervalRecorder()
        c = client(sim, rec)
        metrics = sim.model.metrics
        streams = [asyncio.create_task(c.request(body(max_tokens, continuous=continuous),
                                                 PROMPT_WORDS)) for _ in range(STREAMS)]
        try:
            await wait_for(lambda: metrics.generation_tokens >= STREAMS * max_tokens // 3,
                           "third of the tokens written")
            written = metrics.generation_tokens  # the server's count, read with the take
            mid, _, _ = rec.take()
            await asyncio.gather(*streams)
        finally:
            c.close()
        end, _, _ = rec.take()
    # mid-way: what arrived is counted, up to the chunks still in transit
    assert 0 <= written - mid.output_tokens <= STREAMS * IN_TRANSIT_CHUNKS * per_chunk, (
        written, mid)
    assert mid.completed_output_tokens == 0 and mid.requests_ok == 0
    # one a chunk without per-chunk usage: estimated until the final usage comes
    assert mid.estimated_output_tokens == (0 if continuous else mid.output_tokens)
    # at the end the two ticks sum to the usage, which is what the server wrote
    total = STREAMS * max_tokens
    assert mid.output_tokens + end.output_tokens == total == metrics.generation_tokens
    assert end.completed_output_tokens == total and end.requests_ok == STREAMS
    assert mid.estimated_output_tokens + end.estimated_output_tokens == 0
    assert end.input_tokens == STREAMS * PROMPT_WORDS == metrics.prompt_tokens
    assert end.input_tokens_asked == STREAMS * PROMPT_WORDS
    assert end.estimated_input_tokens == 0


async def test_chunks_of_several_tokens_without_usage_per_chunk_are_corrected_at_the_end():
    # three tokens a chunk, usage only at the end: the live count is one a chunk (all the
    # client can know), marked estimated, and the final usage puts it right
    max_tokens, k = 301, 3
    async with running_sim(exact_ttft_ms=5.0, exact_itl_ms=2.0, tokens_per_chunk=k) as sim:
        rec = IntervalRecorder()
        c = client(sim, rec)
        metrics = sim.model.metrics
        streams = [asyncio.create_task(c.request(body(max_tokens), PROMPT_WORDS))
                   for _ in range(STREAMS)]
        try:
            await wait_for(lambda: metrics.generation_tokens >= STREAMS * max_tokens // 3,
                           "third of the tokens written")
            written = metrics.generation_tokens
            mid, _, _ = rec.take()
            await asyncio.gather(*streams)
        finally:
            c.close()
        end, _, _ = rec.take()
    # chunks written: the first token alone, then k a chunk (a stream's last may be short)
    low = (written - STREAMS) / k
    assert low - STREAMS * IN_TRANSIT_CHUNKS <= mid.output_tokens <= low + 2 * STREAMS, (
        written, mid)
    assert mid.estimated_output_tokens == mid.output_tokens
    assert mid.output_tokens + end.output_tokens == STREAMS * max_tokens
    assert mid.estimated_output_tokens + end.estimated_output_tokens == 0


async def test_without_usage_the_prompt_length_stands_in_and_is_marked_estimated():
    async with running_sim(exact_ttft_ms=2.0, exact_itl_ms=1.0) as sim:
        rec = IntervalRecorder()
        c = client(sim, rec)
        try:
            await asyncio.gather(*(c.request(body(20, usage=False), PROMPT_WORDS)
                                   for _ in range(STREAMS)))
        finally:
            c.close()
        got, _, _ = rec.take()
    assert got.requests_ok == STREAMS
    assert got.output_tokens == got.estimated_output_tokens == STREAMS * 20
    assert got.input_tokens == got.estimated_input_tokens == STREAMS * PROMPT_WORDS
    assert got.input_tokens_asked == 0  # no server count to compare the asked length with


@pytest.mark.parametrize("continuous", [False, True])
async def test_a_stream_the_client_abandons_keeps_the_tokens_it_delivered(continuous: bool):
    after = 50
    async with running_sim(exact_ttft_ms=2.0, exact_itl_ms=1.0) as sim:
        rec = IntervalRecorder()
        c = client(sim, rec)
        try:
            await asyncio.gather(*(c.request(body(400, continuous=continuous), PROMPT_WORDS,
                                             cancel_after_tokens=after)
                                   for _ in range(STREAMS)))
        finally:
            c.close()
        itl_gaps = sum(rec.itl_w)
        got, _, _ = rec.take()
    assert got.requests_cancelled == STREAMS and got.requests_ok == 0
    assert got.output_tokens == STREAMS * after  # one token a chunk: exactly the cut point
    assert itl_gaps == STREAMS * (after - 1)  # what was measured is recorded, buffered or not
    assert got.completed_output_tokens == 0
    assert got.estimated_output_tokens == (0 if continuous else got.output_tokens)


async def test_a_stream_cut_off_by_time_keeps_what_the_server_wrote_before():
    async with running_sim(exact_ttft_ms=2.0, exact_itl_ms=2.0) as sim:
        rec = IntervalRecorder()
        c = client(sim, rec)
        try:
            await asyncio.gather(*(c.request(body(2000), PROMPT_WORDS, cancel_after_s=0.3)
                                   for _ in range(STREAMS)))
        finally:
            c.close()
        # the server notices the client left at its next write: then its count is final
        await wait_for(lambda: sim.model.exact_running == 0, "simulator handler ending")
        itl_gaps = sum(rec.itl_w)
        got, _, _ = rec.take()
        written = sim.model.metrics.generation_tokens
    assert got.requests_cancelled == STREAMS
    assert got.output_tokens > STREAMS * 50, got  # ~150 a stream arrived in 0.3 s
    # the ITL buffered without per-chunk usage is recorded though the stream never finished
    assert itl_gaps == got.output_tokens - STREAMS
    # the server may have written a chunk or two the client no longer read
    assert 0 <= written - got.output_tokens <= STREAMS * IN_TRANSIT_CHUNKS, (written, got)
    assert got.completed_output_tokens == 0


@pytest.mark.parametrize("continuous", [False, True])
async def test_a_dropped_stream_keeps_the_tokens_it_delivered(continuous: bool):
    # the scheduled simulator's drop fault closes the connection once half the tokens went
    max_tokens = 40
    async with running_sim(faults=FaultConfig(drop_rate=1.0)) as sim:
        rec = IntervalRecorder()
        c = client(sim, rec)
        try:
            await asyncio.gather(*(c.request(body(max_tokens, continuous=continuous),
                                             PROMPT_WORDS) for _ in range(STREAMS)))
        finally:
            c.close()
        got, _, _ = rec.take()
        injected = sim.server.faults.snapshot(outage_active=False)["injected"]["drop"]
    assert injected == STREAMS
    assert got.errors == {"stream_broken": STREAMS}
    assert got.output_tokens == STREAMS * max_tokens // 2
    assert got.completed_output_tokens == 0


# ---- goodput in open loop


async def test_open_loop_goodput_is_judged_from_the_intended_send_time():
    # the server answers in 20 ms, but the request was due 5 s before it could be sent: the
    # user waited 5 s for the first token, which breaks ttft<500ms
    slo = Slo(ttft_us=500_000.0)
    async with running_sim(exact_ttft_ms=20.0, exact_itl_ms=1.0) as sim:
        rec = IntervalRecorder()
        c = client(sim, rec, slo=slo)
        try:
            await c.request(body(5), PROMPT_WORDS, t_intended=perf_counter() - 5.0)
            late, _, _ = rec.take()
            await c.request(body(5), PROMPT_WORDS, t_intended=perf_counter())
            on_time, _, _ = rec.take()
        finally:
            c.close()
    assert late.requests_ok == 1 and late.requests_good == 0
    assert on_time.requests_ok == 1 and on_time.requests_good == 1
