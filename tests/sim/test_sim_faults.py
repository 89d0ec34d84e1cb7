"""Faults on demand: what the simulator injects is exactly what the real client classifies."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import make_mocked_request
from support import WAIT_S, root, running_sim

from loadgen.model.snapshot import Counters
from loadgen.sim import RunningSim, start_sim
from loadgen.sim.faults import FaultConfig
from loadgen.sim.server import is_loopback
from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder

MODEL = "tokentop-sim"

# the simulator's counter -> the client's error kind
CLIENT_KIND = {
    "http_500": "http_5xx",
    "http_429": "http_429",
    "drop": "stream_broken",
    "malformed": "malformed_chunk",
    "empty_choices": "empty_response",
}


def body(max_tokens: int = 16, **extra: Any) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi there"}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "ignore_eos": True,
            **extra,
        }
    ).encode()


@pytest.fixture
def sim(fast_sim: RunningSim) -> RunningSim:
    return fast_sim


async def set_faults(http: aiohttp.ClientSession, sim: RunningSim, **changes: Any) -> dict:
    async with http.post(root(sim) + "/sim/faults", json=changes) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def get_faults(http: aiohttp.ClientSession, sim: RunningSim) -> dict:
    async with http.get(root(sim) + "/sim/faults") as resp:
        assert resp.status == 200
        return await resp.json()


async def drive(
    sim: RunningSim, n: int, *, payload: bytes | None = None, concurrency: int = 8
) -> tuple[Counters, dict[str, Any], dict[str, str]]:
    """n requests through the real StreamingClient; (counters, hists, last errors)."""
    rec = IntervalRecorder()
    async with aiohttp.ClientSession() as session:
        client = make_client(session, sim.url + "/chat/completions", rec, timeout=20.0)
        gate = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with gate:
                await client.request(payload or body(), 2)

        await asyncio.gather(*(one() for _ in range(n)))
        close_client(client)
    return rec.take()


def make_client(
    session: aiohttp.ClientSession, url: str, rec: IntervalRecorder, **kw: Any
) -> StreamingClient:
    """The real client, whichever constructor it has (with or without an aiohttp session)."""
    if "session" in inspect.signature(StreamingClient).parameters:
        return StreamingClient(session, url, rec, **kw)  # type: ignore[call-arg]
    return StreamingClient(url, rec, **kw)  # type: ignore[call-arg]


def close_client(client: StreamingClient) -> None:
    close = getattr(client, "close", None)
    if close is not None:
        close()


def expected_errors(injected: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for counter, kind in CLIENT_KIND.items():
        if injected[counter]:
            out[kind] = out.get(kind, 0) + injected[counter]
    return out


# ---- per-request faults


async def test_every_request_fault_is_classified_exactly(
    http: aiohttp.ClientSession, sim: RunningSim
) -> None:
    state = await set_faults(
        http, sim, error_rate=0.15, rate_limit_rate=0.15, drop_rate=0.1, malformed_rate=0.1,
        empty_choices_rate=0.1, stall_rate=0.1, stall_s=0.05, seed=3,
    )  # fmt: skip
    assert state["settings"]["error_rate"] == 0.15
    n = 80
    counters, _, last = await drive(sim, n)
    injected = (await get_faults(http, sim))["injected"]
    for counter in (*CLIENT_KIND, "stall"):
        assert injected[counter] > 0, counter  # the seed gives every kind at least once
    assert counters.errors == expected_errors(injected)
    assert counters.requests_failed == sum(injected[c] for c in CLIENT_KIND)
    assert counters.requests_ok == n - counters.requests_failed  # stalls are not errors
    assert "Retry-After 1" in last["http_429"]
    # /metrics: what the engine generated for the streams that completed is what arrived
    assert sim.model.metrics.success["length"] >= counters.requests_ok - injected["empty_choices"]


async def test_same_seed_same_faults(http: aiohttp.ClientSession) -> None:
    seen = []
    for _ in range(2):
        async with running_sim() as sim:
            await set_faults(http, sim, error_rate=0.3, rate_limit_rate=0.3, seed=11)
            await drive(sim, 20, concurrency=1)
            seen.append((await get_faults(http, sim))["injected"])
    assert seen[0] == seen[1]
    assert seen[0]["http_500"] > 0 and seen[0]["http_429"] > 0


@pytest.mark.parametrize("kind", ["bad_json", "split_utf8"])
async def test_malformed_chunk_kinds(
    http: aiohttp.ClientSession, sim: RunningSim, kind: str
) -> None:
    await set_faults(http, sim, malformed_rate=1.0, malformed_kind=kind)
    counters, _, last = await drive(sim, 5)
    injected = (await get_faults(http, sim))["injected"]
    assert injected["malformed"] == 5
    assert counters.errors == {"malformed_chunk": 5}
    assert "malformed_chunk" in last


async def test_malformed_missing_data_is_a_malformed_chunk(
    http: aiohttp.ClientSession, sim: RunningSim
) -> None:
    """A chunk's JSON on a line without `data:`: the SSE spec would ignore it as an unknown
    field, but no inference server sends unknown fields, so the client calls it malformed
    rather than silently losing a token."""
    await set_faults(http, sim, malformed_rate=1.0, malformed_kind="missing_data")
    counters, _, _ = await drive(sim, 5, payload=body(16))
    injected = (await get_faults(http, sim))["injected"]
    assert injected["malformed"] == 5
    assert counters.errors == {"malformed_chunk": 5}
    assert counters.requests_ok == 0


async def test_empty_choices_stream_is_empty_response(
    http: aiohttp.ClientSession, sim: RunningSim
) -> None:
    await set_faults(http, sim, empty_choices_rate=1.0)
    texts = []
    async with http.post(sim.url + "/chat/completions", data=body(4)) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {"):
                texts.append(json.loads(line[6:])["choices"])
    assert texts and all(choices == [] for choices in texts)
    counters, _, _ = await drive(sim, 3)
    assert counters.errors == {"empty_response": 3}
    assert (await get_faults(http, sim))["injected"]["empty_choices"] == 4


async def test_stall_is_a_long_gap_not_an_error(
    http: aiohttp.ClientSession, sim: RunningSim
) -> None:
    await set_faults(http, sim, stall_rate=1.0, stall_s=0.3)
    loop = asyncio.get_running_loop()
    stamps = []
    async with http.post(sim.url + "/chat/completions", data=body(8)) as resp:
        async for line in resp.content:
            if b'"content":" ' in line:
                stamps.append(loop.time())
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert len(stamps) == 8
    assert max(gaps) >= 0.29
    counters, _, _ = await drive(sim, 4)
    assert counters.errors == {}
    assert counters.requests_ok == 4
    assert (await get_faults(http, sim))["injected"]["stall"] == 5


async def test_rate_limit_has_retry_after_for_the_sdk(
    http: aiohttp.ClientSession, sim: RunningSim
) -> None:
    await set_faults(http, sim, rate_limit_rate=1.0, retry_after_s=2)
    async with openai.AsyncOpenAI(base_url=sim.url, api_key="x", max_retries=0) as client:
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
    assert info.value.response.headers["Retry-After"] == "2"
    await set_faults(http, sim, rate_limit_rate=0.0, error_rate=1.0)
    async with openai.AsyncOpenAI(base_url=sim.url, api_key="x", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError):
            await client.completions.create(model=MODEL, prompt="x", max_tokens=2, stream=True)
    injected = (await get_faults(http, sim))["injected"]
    assert (injected["http_429"], injected["http_500"]) == (1, 1)


async def test_whole_responses_get_only_http_faults(
    http: aiohttp.ClientSession, sim: RunningSim
) -> None:
    await set_faults(http, sim, drop_rate=0.5, malformed_rate=0.5)
    async with openai.AsyncOpenAI(base_url=sim.url, api_key="x", max_retries=0) as client:
        for _ in range(4):
            whole = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert whole.choices[0].message.content
    injected = (await get_faults(http, sim))["injected"]
    assert injected["drop"] == injected["malformed"] == 0


# ---- global faults


async def test_slow_first_byte(http: aiohttp.ClientSession, sim: RunningSim) -> None:
    await set_faults(http, sim, slow_first_byte_ms=150)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with http.post(sim.url + "/chat/completions", data=body(2)) as resp:
        assert resp.status == 200
        first = loop.time() - t0
        await resp.read()
    assert first >= 0.15
    assert (await get_faults(http, sim))["injected"]["slow_first_byte"] == 1


async def test_latency_spikes_hit_every_stream_at_once(http: aiohttp.ClientSession) -> None:
    async with running_sim(step_overhead_ms=5.0) as sim:
        await set_faults(http, sim, spike_every_s=0.15, spike_ms=80)
        loop = asyncio.get_running_loop()

        async def gaps() -> list[float]:
            stamps = []
            async with http.post(sim.url + "/chat/completions", data=body(80)) as resp:
                async for line in resp.content:
                    if b'"content":" ' in line:
                        stamps.append(loop.time())
            return [b - a for a, b in itertools.pairwise(stamps)]

        a, b = await asyncio.gather(gaps(), gaps())
        spikes = (await get_faults(http, sim))["injected"]["spike"]
    assert spikes >= 2
    for g in (a, b):
        long = [x for x in g if x >= 0.075]
        assert spikes - 1 <= len(long) <= spikes  # the last may fall after a stream ended
        assert sorted(g)[len(g) // 2] < 0.03  # otherwise steps stay short


async def test_outage_refuses_drops_and_recovers_like_a_restart(
    http: aiohttp.ClientSession,
) -> None:
    async with running_sim() as sim:
        port = sim.port
        rec = IntervalRecorder()
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True)
        ) as session:
            client = make_client(session, sim.url + "/chat/completions", rec, timeout=20.0)
            streams = [asyncio.create_task(client.request(body(100_000 // 8), 2))
                       for _ in range(3)]  # fmt: skip
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while not (sim.model.num_running == 3 and sim.model.metrics.generation_tokens > 30):
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            before = sim.model.metrics.generation_tokens

            state = await set_faults(http, sim, outage_s=0.8)
            assert state["outage_active"] is True
            assert state["settings"]["outage_s"] == 0  # an action, not a standing setting
            # listening stopped before the answer: these two are refused
            await asyncio.gather(client.request(body(), 2), client.request(body(), 2))
            await asyncio.wait_for(asyncio.gather(*streams), WAIT_S)
            during, _, _ = rec.take()
            assert during.errors == {"connect": 2, "stream_broken": 3}

            # back on the same port, counters from zero like a new process
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while True:
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with session.get(root(sim) + "/health") as resp:
                        if resp.status == 200:
                            break
                assert asyncio.get_running_loop().time() < deadline, "no recovery"
                await asyncio.sleep(0.05)
            await client.request(body(16), 2)
            close_client(client)
            after, _, _ = rec.take()
        assert after.requests_ok == 1 and after.errors == {}
        assert sim.port == port
        faults = await get_faults(http, sim)
        assert faults["outage_active"] is False
        assert faults["injected"]["outage"] == 1
        assert faults["injected"]["outage_dropped"] == 3
        assert 0 < sim.model.metrics.generation_tokens == 16 < before


async def test_outage_from_the_command_line(http: aiohttp.ClientSession) -> None:
    from tui.commands.args import sim_config
    from tui.commands.sim import sim_parser

    args = sim_parser().parse_args(
        ["--fault-outage-s", "0.3", "--fault-outage-after-s", "0.2", "--fault-error-rate", "1"]
    )
    cfg = sim_config(args)
    assert cfg.faults.error_rate == 1.0 and cfg.faults.outage_s == 0.3
    sim = await start_sim(cfg, port=0)
    try:
        counters, _, _ = await drive(sim, 2)
        assert counters.errors == {"http_5xx": 2}
        for _ in range(200):  # the outage starts 0.2 s in: wait for it, 2 s at most
            if sim.server.outage_active:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the outage never began")
        with pytest.raises(aiohttp.ClientConnectorError):
            async with http.get(root(sim) + "/health"):
                pass
        # a 0.3 s outage: the port answers again within 2 s, said by the server itself
        for _ in range(200):
            if not sim.server.outage_active:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the outage never ended")
        async with http.get(root(sim) + "/health") as resp:
            assert resp.status == 200
    finally:
        await sim.close()


# ---- the control endpoint


async def test_fault_settings_are_validated(http: aiohttp.ClientSession, sim: RunningSim) -> None:
    for bad in ({"error_rate": 2}, {"nope": 1}, {"error_rate": 0.6, "drop_rate": 0.6},
                {"malformed_kind": "weird"}, {"stall_s": -1}, {"seed": "x"}, [1]):  # fmt: skip
        async with http.post(root(sim) + "/sim/faults", json=bad) as resp:
            assert resp.status == 400, bad
            assert (await resp.json())["error"]["message"]
    state = await get_faults(http, sim)
    assert state["settings"] == {**vars(FaultConfig())}
    assert set(state["injected"]) >= {"http_500", "http_429", "stall", "drop", "malformed",
                                      "empty_choices", "outage", "spike"}  # fmt: skip
    assert not any(state["injected"].values())


async def test_fault_control_is_loopback_only(sim: RunningSim) -> None:
    assert sim.host == "127.0.0.1"  # the default bind
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.2")
    assert not is_loopback("10.1.2.3") and not is_loopback(None) and not is_loopback("garbage")

    class Transport:
        def __init__(self, peer: str) -> None:
            self.peer = peer

        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return (self.peer, 40000) if name == "peername" else default

        def is_closing(self) -> bool:
            return False

    handler = sim.server.post_faults
    for peer in ("192.168.1.20", "10.0.0.1", "2001:db8::1"):
        request = make_mocked_request("POST", "/sim/faults", transport=Transport(peer))
        assert request.remote == peer
        resp = await handler(request)
        assert resp.status == 403, peer
    assert sim.server.faults.cfg.seed == FaultConfig().seed  # nothing got through
    async with aiohttp.ClientSession() as http:  # a real loopback peer does get through
        await set_faults(http, sim, seed=5)
    assert sim.server.faults.cfg.seed == 5


# ---- in words


def test_active_names_every_setting_that_differs_from_no_faults_but_the_seed() -> None:
    assert FaultConfig().active() == []
    assert FaultConfig(seed=7).active() == []  # a seed alone injects nothing
    cfg = FaultConfig(error_rate=0.25, stall_s=5, malformed_rate=0.1,
                      malformed_kind="split_utf8")
    assert cfg.active() == ["error_rate=0.25", "stall_s=5", "malformed_rate=0.1",
                            "malformed_kind=split_utf8"]


def test_the_simulator_described_in_words() -> None:
    from loadgen.sim.model import SimConfig
    from loadgen.sim.presets import describe

    assert describe(SimConfig(), None) == "default profile: 32 slots, KV 65,536 tokens, no faults"
    cfg = SimConfig(slots=8, kv_tokens=4096, faults=FaultConfig(error_rate=0.05))
    assert describe(cfg, "tiny") == ("tiny profile: 8 slots, KV 4,096 tokens, "
                                     "faults error_rate=0.05")
