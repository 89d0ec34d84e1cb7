"""Both clients (raw and `--client openai`) wear one request envelope
(loadgen.worker.envelope): the same in-flight count, lag stamp, calibration stamp, limit,
and the same classification of a timeout, an abandonment after `--cancel-at` seconds and
a request cancelled from outside. Against the real simulator over 127.0.0.1."""

from __future__ import annotations

import asyncio
from time import perf_counter

import pytest
from support import WAIT_S, chat_body, running_sim

from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.openai_client import OpenAIClient

KINDS = ["raw", "openai"]
# FAST steps of 1 ms and more: 5000 tokens stream for seconds, far past every limit here
LONG = 5000


def make(kind: str, url: str, rec: IntervalRecorder, **kw) -> StreamingClient | OpenAIClient:
    cls = OpenAIClient if kind == "openai" else StreamingClient
    return cls(url + "/chat/completions", rec, **kw)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_request_past_the_timeout_is_timeout(kind: str) -> None:
    async with running_sim() as sim:
        rec = IntervalRecorder()
        client = make(kind, sim.url, rec, timeout=0.5)
        assert await client.request(chat_body(LONG), 2) is True  # the server was reached
        assert client.in_flight == 0
        client.close()
    c = rec.counters
    assert c.errors == {"timeout": 1} and c.requests_failed == 1
    assert c.requests_cancelled == 0 and c.requests_ok == 0
    assert "no complete answer within 0.5 s" in rec.last_errors["timeout"]
    assert len(rec.ttft) == 1  # what it measured before the limit counts


@pytest.mark.parametrize("kind", KINDS)
async def test_an_abandonment_after_seconds_is_cancelled_not_timeout(kind: str) -> None:
    # --cancel-at 0.5s: the user stops reading on purpose, under the request timeout
    async with running_sim() as sim:
        rec = IntervalRecorder()
        client = make(kind, sim.url, rec, timeout=30.0)
        t = perf_counter()
        assert await client.request(chat_body(LONG), 2, cancel_after_s=0.5) is True
        took = perf_counter() - t
        assert client.in_flight == 0
        client.close()
    assert 0.5 <= took < 5.0
    c = rec.counters
    assert c.errors == {"cancelled": 1} and c.requests_cancelled == 1
    assert c.requests_failed == 0 and c.requests_ok == 0
    assert "abandoned by the client after 0.5 s" in rec.last_errors["cancelled"]
    assert len(rec.ttft) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_a_request_cancelled_from_outside_is_counted_and_re_raised(kind: str) -> None:
    async with running_sim() as sim:
        rec = IntervalRecorder()
        client = make(kind, sim.url, rec)
        task = asyncio.create_task(client.request(chat_body(LONG), 2))
        deadline = perf_counter() + WAIT_S
        while not rec.ttft:  # streaming: the cancel lands mid-stream
            assert perf_counter() < deadline, "no first token"
            await asyncio.sleep(0.01)
        assert client.in_flight == 1 and client.stalled(perf_counter()).stalled == 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.in_flight == 0
        client.close()
    c = rec.counters
    assert c.errors == {"cancelled": 1} and c.requests_cancelled == 1
    assert "request cancelled before it finished" in rec.last_errors["cancelled"]


@pytest.mark.parametrize("kind", KINDS)
async def test_both_clients_stamp_lag_and_calibration_alike(kind: str) -> None:
    # the exact-timing simulator stamps each chunk with its wall-clock write time: with
    # calibrate, both clients take the wall stamp beside t0 and measure their TTFT error
    async with running_sim(exact_ttft_ms=30.0, exact_itl_ms=5.0) as sim:
        rec = IntervalRecorder()
        client = make(kind, sim.url, rec, calibrate=True)
        intended = perf_counter() - 0.002  # open loop: 2 ms late already
        assert await client.request(chat_body(10), 2, t_intended=intended) is True
        client.close()
    assert rec.counters.requests_ok == 1 and rec.counters.errors == {}
    assert len(rec.lag) == 1 and rec.lag[0] >= 2000  # µs
    assert len(rec.ttft_co) == 1 and rec.ttft_co[0] > rec.ttft[0]
    assert len(rec.ttft_err) == 1 and len(rec.itl_err) == 9
    assert 29_000 <= rec.ttft[0] <= 60_000
