"""The chaos restart's MTTR, apart from a whole eval: the probe against a simulator that
starts listening while it probes (the truth: the moment the simulator listened, and its own
arrival log), and the outages' MTTR with the kill's outage left to the restart's row."""

from __future__ import annotations

import asyncio
import socket
import time

import msgspec
import pytest
from support import FAST, server_arrivals

from loadgen.analysis.soak_result import Mttr, OutageRecord
from loadgen.eval.chaos import PROBE_EVERY_S, Chaos, first_token, mttr_apart_from_kill, probe_body
from loadgen.eval.results import ChaosFigures
from loadgen.sim import SimConfig, start_sim

DOWN_S = 1.1  # the server is away this long after the probes start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_the_first_token_after_the_server_listens_within_one_probe_interval():
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    loop = asyncio.get_running_loop()
    started = loop.time()
    probing = asyncio.create_task(first_token(url, probe_body("chat", "tokentop-sim"), {}))
    # nothing listens: every probe is refused, and the prober keeps on
    await asyncio.sleep(DOWN_S)
    assert not probing.done()
    before = time.time()
    sim = await start_sim(SimConfig(**FAST), port=port)
    listening = time.time()
    try:
        async with asyncio.timeout(5.0):
            back = await probing
        arrivals = await server_arrivals(sim)
    finally:
        await sim.close()
    # no sooner than the server could answer, and at most one interval (and a one-token
    # answer of a fast simulator) after it listened: the resolution the row states
    assert before <= back <= listening + PROBE_EVERY_S + 0.1, (back - listening)
    # the probes came at the interval: the first to arrive at the simulator (its loop clock,
    # this process's) is within an interval of its start, and on the interval's grid
    first = arrivals[0]
    assert 0.0 <= first - (started + DOWN_S) <= PROBE_EVERY_S + 0.05
    grid = (first - started) / PROBE_EVERY_S
    assert abs(grid - round(grid)) * PROBE_EVERY_S < 0.05, grid


def _outage(kind: str, start: float, end: float, event: int) -> OutageRecord:
    return OutageRecord(kind=kind, start=start, end=end, start_rel=start - 1000.0,
                        ongoing=False, failed=3, errors={}, reason=None,
                        duration_s=end - start, event=event)


def test_the_outages_mttr_leaves_the_kills_outage_to_the_restarts_row():
    killed_at = 1100.0
    outages = [
        _outage("client", 1010.0, 1013.5, event=1),  # the resets, before the kill
        _outage("server", 1100.2, 1104.2, event=2),  # the kill, as /metrics saw it
        _outage("client", 1100.5, 1104.0, event=2),  # the kill, as the load saw it
        _outage("client", 1150.0, 1152.0, event=3),  # something later, after the restart
    ]
    everything = Mttr(client=3.0, server=4.0, any=3.17)
    chaos = ChaosFigures(killed=True, pid=1, killed_at=killed_at, mttr_s=3.9, why="")
    assert mttr_apart_from_kill(outages, everything, chaos) == Mttr(
        client=2.75, server=None, any=2.75)
    # no kill, or none that happened: the outages' MTTR as the report gave it
    assert mttr_apart_from_kill(outages, everything, None) == everything
    missed = ChaosFigures(killed=False, why="nothing to kill")
    assert mttr_apart_from_kill(outages, everything, missed) == everything
    # a kill the server never came back from: every outage from the kill on is the kill's
    lost = ChaosFigures(killed=True, pid=1, killed_at=killed_at, mttr_s=None, why="no token")
    assert mttr_apart_from_kill(outages, everything, lost) == Mttr(
        client=3.5, server=None, any=3.5)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_probe_asks_for_one_streamed_token(api):
    import json

    body = json.loads(probe_body(api, "m"))
    assert body["max_tokens"] == 1 and body["stream"] is True and body["model"] == "m"
    assert ("messages" in body) == (api == "chat") and ("prompt" in body) == (api != "chat")


async def test_the_restarts_probe_asks_a_gateway_with_the_runs_headers():
    """A target behind a gateway that wants its key and the run's Authorization: the probe
    learns the model from /models with them (the server's record of what it was sent)."""
    from aiohttp import web
    from support import serving

    wanted = {"Authorization": "Bearer sk-gw", "X-Gateway-Key": "gk-123"}
    seen: list[dict[str, str]] = []

    async def models(request: web.Request) -> web.Response:
        seen.append({k: request.headers.get(k, "") for k in wanted})
        if any(request.headers.get(k) != v for k, v in wanted.items()):
            return web.Response(status=401, text="no key")
        return web.json_response({"data": [{"id": "gated-model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with serving(app) as url:
        chaos = Chaos(None, 0, url=url + "/v1", authorization=wanted["Authorization"],
                      headers=[("X-Gateway-Key", wanted["X-Gateway-Key"])])
        body = await chaos._probe_body()
    assert seen == [wanted]
    assert msgspec.json.decode(body)["model"] == "gated-model"
