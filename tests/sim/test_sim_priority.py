"""The simulator's priority scheduling (vLLM's --scheduling-policy priority): under it the
waiting request of the lowest `priority` is admitted first; without it a nonzero priority
is refused in vLLM's words. The truth is the order of the first tokens the server wrote,
from its own record (GET /sim/requests)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from support import root, running_sim


def _body(priority, max_tokens=4) -> dict:
    return {"model": "tokentop-sim", "prompt": "hello there", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "priority": priority}


async def _post(http: aiohttp.ClientSession, sim, body: dict) -> tuple[int, bytes]:
    async with http.post(root(sim) + "/v1/completions", data=json.dumps(body)) as resp:
        return resp.status, await resp.read()


async def _served(http: aiohttp.ClientSession, sim) -> list[dict]:
    async with http.get(root(sim) + "/sim/requests") as resp:
        assert resp.status == 200
        return await resp.json()


async def _wait_for(predicate, *, deadline_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not predicate():
        assert loop.time() < end, "condition not met before the deadline"
        await asyncio.sleep(0.01)


async def test_the_lowest_priority_waiting_is_admitted_first():
    # one slot held by a long request (1000 steps: a second at least, long enough for the
    # three to queue on a loaded machine); then 9, 5, 1 queue in that order: served 1, 5, 9
    async with running_sim(scheduling_policy="priority", slots=1) as sim, \
            aiohttp.ClientSession() as http:
        engine = sim.server.engine
        first = asyncio.create_task(_post(http, sim, _body(3, max_tokens=1000)))
        await _wait_for(lambda: engine.num_running == 1)
        queued = []
        for n, priority in enumerate((9, 5, 1), start=1):
            queued.append(asyncio.create_task(_post(http, sim, _body(priority))))
            await _wait_for(lambda n=n: engine.num_waiting == n)
        answers = await asyncio.gather(first, *queued)
        assert [status for status, _ in answers] == [200] * 4
        served = await _served(http, sim)
    by_first_token = sorted(served, key=lambda s: s["arrived_s"] + s["first_token_s"])
    assert [s["priority"] for s in by_first_token] == [3, 1, 5, 9]
    assert [s["priority"] for s in sorted(served, key=lambda s: s["arrived_s"])] == [3, 9, 5, 1]


async def test_first_come_first_served_keeps_arrival_order_and_refuses_a_priority():
    async with running_sim(slots=1) as sim, aiohttp.ClientSession() as http:
        status, text = await _post(http, sim, _body(2))
        assert status == 400
        assert "Got priority 2 but Priority scheduling is not enabled." in text.decode()
        ok, _ = await _post(http, sim, _body(0))
        assert ok == 200
        served = await _served(http, sim)
    assert [(s["priority"], s["status"]) for s in served] == [(0, 200)]
    assert served[0]["first_token_s"] > 0


@pytest.mark.parametrize("bad", ["high", 1.5, True])
async def test_a_priority_not_an_integer_is_a_400(bad):
    async with running_sim(scheduling_policy="priority") as sim, \
            aiohttp.ClientSession() as http:
        status, text = await _post(http, sim, _body(bad))
    assert status == 400
    assert "`priority` must be an integer." in text.decode()
