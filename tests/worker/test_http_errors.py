"""How both clients end a request the server did not stream: a redirect, and a stream the
client abandons on purpose (what the load loop is told, and how it is counted)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from support import chat_body, running_sim

from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.openai_client import OpenAIClient


@contextlib.asynccontextmanager
async def redirecting(status: int, location: str) -> AsyncIterator[str]:
    """A server that answers every POST with `status` to `location`; its chat URL."""

    async def moved(_request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": location}, text="moved")

    app = web.Application()
    app.router.add_post("/v1/{tail:.*}", moved)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
    finally:
        await runner.cleanup()


def make(kind: str, url: str, rec: IntervalRecorder) -> StreamingClient | OpenAIClient:
    return OpenAIClient(url, rec) if kind == "openai" else StreamingClient(url, rec)


# 307 keeps the POST: a client that followed it would get a good stream from the simulator
@pytest.mark.parametrize("status", [301, 307])
@pytest.mark.parametrize("kind", ["raw", "openai"])
async def test_a_redirect_is_http_3xx_with_where_it_points(kind: str, status: int) -> None:
    async with running_sim() as sim:
        target = sim.url + "/chat/completions"
        async with redirecting(status, target) as url:
            rec = IntervalRecorder()
            client = make(kind, url, rec)
            assert await client.request(chat_body(), 2) is True  # the server was reached
            client.close()
    c = rec.counters
    assert c.errors == {"http_3xx": 1} and c.requests_failed == 1 and c.requests_ok == 0
    message = rec.last_errors["http_3xx"]
    assert f"HTTP {status} redirect to {target}" in message
    assert "does not follow redirects" in message
    assert sim.model.metrics.arrived == 0  # nothing followed it to the real server


@pytest.mark.parametrize("kind", ["raw", "openai"])
async def test_an_abandoned_stream_is_cancelled_and_the_user_goes_on(kind: str) -> None:
    # a user who stops reading after 2 tokens: counted "cancelled", not a failure, and the
    # load loop is told the server was reached (False would make a closed-loop user back off)
    async with running_sim() as sim:
        rec = IntervalRecorder()
        client = make(kind, sim.url + "/chat/completions", rec)
        results = [await client.request(chat_body(50), 2, cancel_after_tokens=2) for _ in range(3)]
        client.close()
    assert results == [True, True, True]
    c = rec.counters
    assert c.errors == {"cancelled": 3} and c.requests_cancelled == 3
    assert c.requests_failed == 0 and c.requests_ok == 0
    assert len(rec.ttft) == 3
    assert sim.model.metrics.arrived == 3
