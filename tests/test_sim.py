"""The embedded simulator, as a real aiohttp server over loopback: no mocks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.sim import (
    RunningSim,
    SimConfig,
    add_sim_arguments,
    config_from_args,
    start_sim,
)

MODEL = "tokentop-sim"
# Short steps keep the suite fast; the model is the same.
FAST = {"step_overhead_ms": 1.0, "decode_ms_per_seq": 0.05, "prefill_ms_per_token": 0.001}
WAIT_S = 10.0  # upper bound on every poll loop


@contextlib.asynccontextmanager
async def running_sim(**overrides: Any) -> AsyncIterator[RunningSim]:
    sim = await start_sim(SimConfig(**{**FAST, **overrides}), host="127.0.0.1", port=0)
    try:
        yield sim
    finally:
        await sim.close()


@pytest.fixture
async def sim() -> AsyncIterator[RunningSim]:
    async with running_sim() as s:
        yield s


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def root(sim: RunningSim) -> str:
    return sim.url.removesuffix("/v1")


async def scrape(http: aiohttp.ClientSession, sim: RunningSim) -> dict[str, float]:
    """/metrics as {sample name (+ finished_reason): value}, parsed by prometheus_client."""
    async with http.get(root(sim) + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.labels["model_name"] == sim.model.cfg.model_name
            key = sample.name
            if "finished_reason" in sample.labels:
                key += ":" + sample.labels["finished_reason"]
            if "le" in sample.labels:
                key += ":" + sample.labels["le"]
            values[key] = sample.value
    return values


async def poll(check: Callable[[], Awaitable[bool]], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def stream_raw(
    http: aiohttp.ClientSession, sim: RunningSim, path: str, body: dict[str, Any]
) -> tuple[list[str], dict[str, Any] | None, str | None]:
    """One streamed request: (token texts, the usage chunk's usage, finish_reason)."""
    texts: list[str] = []
    usage = finish = None
    done = False
    async with http.post(sim.url + path, json={"stream": True, **body}) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Cache-Control"] == "no-cache"
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line:
                continue
            assert line.startswith("data: ")
            assert not done, "nothing may follow [DONE]"
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line.removeprefix("data: "))  # every chunk is valid JSON
            if not chunk["choices"]:
                usage = chunk["usage"]
                continue
            choice = chunk["choices"][0]
            text = choice["delta"].get("content") if "delta" in choice else choice["text"]
            if text:
                texts.append(text)
            finish = choice["finish_reason"] or finish
    assert done
    return texts, usage, finish


def openai_client(sim: RunningSim) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.url, api_key="x", max_retries=0)


# ---- the OpenAI SDK


async def test_openai_chat_stream_and_whole(sim: RunningSim) -> None:
    async with openai_client(sim) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "tell me a story please"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        roles, contents, finishes, usages = [], [], [], []
        async for chunk in stream:
            if chunk.usage is not None:
                usages.append(chunk.usage)
            for choice in chunk.choices:
                if choice.delta.role:
                    roles.append(choice.delta.role)
                if choice.delta.content:
                    contents.append(choice.delta.content)
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
        assert roles == ["assistant"]
        assert len(contents) == 12
        assert finishes == ["length"]
        assert len(usages) == 1
        assert usages[0].completion_tokens == len(contents)
        assert usages[0].prompt_tokens == 5  # five words
        assert usages[0].total_tokens == 17

        whole = await client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
            ],
            max_completion_tokens=7,
            extra_body={"ignore_eos": True},
        )
        assert whole.object == "chat.completion"
        assert whole.choices[0].finish_reason == "length"
        assert whole.choices[0].message.role == "assistant"
        assert len(whole.choices[0].message.content.split()) == 7
        assert whole.usage.completion_tokens == 7
        assert whole.usage.prompt_tokens == 4


async def test_openai_completions_stream_and_whole(sim: RunningSim) -> None:
    async with openai_client(sim) as client:
        stream = await client.completions.create(
            model=MODEL,
            prompt="one two three",
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        texts, usage = [], None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            texts.extend(c.text for c in chunk.choices if c.text)
        assert len(texts) == 9
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (3, 9)

        whole = await client.completions.create(
            model=MODEL, prompt="a b", max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert whole.object == "text_completion"
        assert whole.usage.completion_tokens == 4
        assert len(whole.choices[0].text.split()) == 4


async def test_natural_length_stops_before_max_tokens(http: aiohttp.ClientSession) -> None:
    async with running_sim(mean_output_tokens=8.0, seed=7) as sim:
        results = await asyncio.gather(
            *(
                stream_raw(
                    http,
                    sim,
                    "/completions",
                    {
                        "model": MODEL,
                        "prompt": "go",
                        "max_tokens": 200,
                        "stream_options": {"include_usage": True},
                    },
                )
                for _ in range(8)
            )
        )
    for texts, usage, finish in results:
        assert usage is not None and usage["completion_tokens"] == len(texts)
        assert finish == ("stop" if len(texts) < 200 else "length")
    assert any(finish == "stop" for _, _, finish in results)


async def test_continuous_usage_stats(http: aiohttp.ClientSession, sim: RunningSim) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    seen = []
    async with http.post(sim.url + "/chat/completions", json=body) as resp:
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                seen.append(chunk["usage"]["completion_tokens"])
    # role chunk (0), five tokens, finish chunk, usage chunk
    assert seen == [0, 1, 2, 3, 4, 5, 5, 5]


# ---- errors


async def test_wrong_model_is_not_found(sim: RunningSim) -> None:
    async with openai_client(sim) as client:
        with pytest.raises(openai.NotFoundError) as info:
            await client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "hi"}]
            )
    assert info.value.status_code == 404
    assert info.value.body["message"] == "The model `nope` does not exist."


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/chat/completions", b"{not json"),
        ("/chat/completions", b'{"model": "tokentop-sim"}'),
        ("/chat/completions", b'{"model": "tokentop-sim", "messages": "hi"}'),
        ("/completions", b'{"model": "tokentop-sim"}'),
        ("/completions", b'{"model": "tokentop-sim", "prompt": "x", "max_tokens": 0}'),
        ("/completions", b'{"model": "tokentop-sim", "prompt": "x", "max_tokens": 99999999}'),
        ("/completions", b"[1, 2]"),
    ],
)
async def test_malformed_body_is_400(
    http: aiohttp.ClientSession, sim: RunningSim, path: str, payload: bytes
) -> None:
    headers = {"Content-Type": "application/json"}
    async with http.post(sim.url + path, data=payload, headers=headers) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["code"] == 400
    assert error["type"] == "BadRequestError"
    assert error["message"]
    assert sim.model.num_waiting == sim.model.num_running == 0


async def test_models_and_health(http: aiohttp.ClientSession, sim: RunningSim) -> None:
    async with http.get(root(sim) + "/health") as resp:
        assert resp.status == 200
    async with openai_client(sim) as client:
        models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]


# ---- /metrics


async def test_metrics_count_what_clients_received(
    http: aiohttp.ClientSession, sim: RunningSim
) -> None:
    before = await scrape(http, sim)
    assert before["vllm:generation_tokens_total"] == 0
    assert before["vllm:num_requests_running"] == 0
    jobs = []
    for i in range(6):
        path = "/chat/completions" if i % 2 else "/completions"
        words = " ".join(["w"] * (i + 1))
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 20 + i,
                                "stream_options": {"include_usage": True}}  # fmt: skip
        if path == "/completions":
            body["prompt"] = words
        else:
            body["messages"] = [{"role": "user", "content": words}]
        jobs.append(stream_raw(http, sim, path, body))
    results = await asyncio.gather(*jobs)
    received = sum(len(texts) for texts, _, _ in results)
    prompts = sum(usage["prompt_tokens"] for _, usage, _ in results if usage)
    assert prompts == sum(range(1, 7))
    for texts, usage, _ in results:
        assert usage is not None and usage["completion_tokens"] == len(texts)

    after = await scrape(http, sim)
    assert after["vllm:generation_tokens_total"] == received
    assert after["vllm:prompt_tokens_total"] == prompts
    ok = after["vllm:request_success_total:stop"] + after["vllm:request_success_total:length"]
    assert ok == 6
    assert after["vllm:time_to_first_token_seconds_count"] == 6
    assert after["vllm:e2e_request_latency_seconds_count"] == 6
    assert after["vllm:request_queue_time_seconds_count"] == 6
    assert after["vllm:inter_token_latency_seconds_count"] == received - 6
    assert after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:num_preemptions_total"] == 0


async def _long_stream(sim: RunningSim, started: asyncio.Event | None = None) -> int:
    """Stream a long completion until cancelled; returns the chunks read."""
    body = {"model": MODEL, "prompt": "p q r", "max_tokens": 5000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    chunks = 0
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/completions", json=body) as resp,
    ):
        async for _ in resp.content:
            chunks += 1
            if started is not None and chunks >= 3:
                started.set()
    return chunks


async def test_slot_limit_queues_the_rest_and_disconnects_free_slots(
    http: aiohttp.ClientSession,
) -> None:
    async with running_sim(slots=4) as sim:
        tasks = [asyncio.create_task(_long_stream(sim)) for _ in range(12)]
        try:

            async def four_running_eight_waiting() -> bool:
                m = await scrape(http, sim)
                return (m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]) == (4, 8)

            await poll(four_running_eight_waiting, "running == 4 and waiting == 8")
            m = await scrape(http, sim)
            assert 0 < m["vllm:kv_cache_usage_perc"] < 1
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        async def drained() -> bool:
            m = await scrape(http, sim)
            return m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0

        await poll(drained, "the disconnected clients' slots to free")
        assert sim.model.kv_used == 0


async def test_client_disconnect_mid_stream_frees_slot(http: aiohttp.ClientSession) -> None:
    async with running_sim() as sim:
        started = asyncio.Event()
        task = asyncio.create_task(_long_stream(sim, started))
        await asyncio.wait_for(started.wait(), WAIT_S)
        assert sim.model.num_running == 1
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

        async def freed() -> bool:
            return sim.model.num_running == 0 and sim.model.kv_used == 0

        await poll(freed, "the slot to free")
        m = await scrape(http, sim)
        assert m["vllm:num_requests_running"] == 0
        assert m["vllm:generation_tokens_total"] >= 2  # what was generated still counts
        assert m["vllm:request_success_total:length"] == 0


async def test_tiny_kv_budget_preempts_and_still_completes(http: aiohttp.ClientSession) -> None:
    # 8 requests of 10 + 40 tokens need 400 KV tokens; the budget is 120.
    async with running_sim(slots=8, kv_tokens=120) as sim:
        body = {"model": MODEL, "prompt": " ".join(["w"] * 10), "max_tokens": 40,
                "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
        results = await asyncio.gather(
            *(stream_raw(http, sim, "/completions", body) for _ in range(8))
        )
        for texts, usage, finish in results:
            assert len(texts) == 40
            assert usage is not None and usage["completion_tokens"] == 40
            assert finish == "length"
        m = await scrape(http, sim)
        assert m["vllm:num_preemptions_total"] > 0
        assert m["vllm:generation_tokens_total"] == 8 * 40
        assert m["vllm:prompt_tokens_total"] == 8 * 10
        assert m["vllm:request_success_total:length"] == 8
        assert sim.model.kv_used == 0


# ---- the simulated GPU


GPU_FIELDS = {
    "index": int,
    "name": str,
    "simulated": bool,
    "memory_used_bytes": int,
    "memory_total_bytes": int,
    "utilization_pct": float,
    "power_w": float,
    "power_limit_w": float,
    "temperature_c": float,
    "energy_j": float,
}


async def test_sim_gpu_rises_under_load(http: aiohttp.ClientSession) -> None:
    async def gpu() -> dict[str, Any]:
        async with http.get(root(sim) + "/sim/gpu") as resp:
            assert resp.status == 200
            return await resp.json()

    async with running_sim() as sim:
        idle = await gpu()
        assert set(idle) == set(GPU_FIELDS)
        for name, kind in GPU_FIELDS.items():
            assert isinstance(idle[name], kind), name
        assert idle["simulated"] is True
        assert idle["name"] == "Simulated H100 80GB HBM3"
        assert 0 < idle["memory_used_bytes"] < idle["memory_total_bytes"]
        assert idle["utilization_pct"] < 5

        tasks = [asyncio.create_task(_long_stream(sim)) for _ in range(4)]
        try:
            loaded: dict[str, Any] = {}

            async def busy() -> bool:
                loaded.update(await gpu())
                return loaded["utilization_pct"] > 30 and loaded["power_w"] > idle["power_w"]

            await poll(busy, "utilisation to rise")
            assert loaded["memory_used_bytes"] > idle["memory_used_bytes"]
            assert loaded["energy_j"] > idle["energy_j"]
            assert loaded["power_w"] <= loaded["power_limit_w"]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# ---- the command line


def test_config_from_args() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    args = parser.parse_args(["--port", "0", "--model", "m", "--slots", "3", "--kv-tokens", "99"])
    cfg = config_from_args(args)
    assert (cfg.model_name, cfg.slots, cfg.kv_tokens) == ("m", 3, 99)
    assert cfg.step_overhead_ms == SimConfig().step_overhead_ms
    assert (args.host, args.port) == ("127.0.0.1", 0)
    assert config_from_args(argparse.Namespace()) == SimConfig()


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadgen.sim", *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def test_subprocess_announces_serves_and_exits_with_parent(
    http: aiohttp.ClientSession,
) -> None:
    proc = await _spawn("--port", "0", "--announce", "--exit-with-parent")
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), WAIT_S)).decode()
        word, port = line.split()
        assert word == "TOKENTOP_SIM_LISTENING"
        async with http.get(f"http://127.0.0.1:{int(port)}/health") as resp:
            assert resp.status == 200
        proc.stdin.close()  # the parent "dies"
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0
        assert await proc.stdout.read() == b""  # exactly one line on stdout
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_subprocess_port_taken_is_one_line_and_exit_2(sim: RunningSim) -> None:
    proc = await _spawn("--port", str(sim.port), "--exit-with-parent")
    try:
        _, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2
    text = err.decode()
    assert "Traceback" not in text
    assert text.count("\n") == 1 and f":{sim.port}" in text
