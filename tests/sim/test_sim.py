"""The embedded simulator, as a real aiohttp server over loopback: no mocks."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import statistics
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import FAST, WAIT_S, root, running_sim

from loadgen.sim import RunningSim, SimConfig, start_sim
from loadgen.sim.launch import SimLaunch, encode_launch
from tui.commands.args import embedded_sim_config, sim_config
from tui.commands.sim import sim_parser

MODEL = "tokentop-sim"
# Short steps keep the suite fast; the model is the same.
@pytest.fixture
def sim(fast_sim: RunningSim) -> RunningSim:
    return fast_sim


async def scrape(http: aiohttp.ClientSession, sim: RunningSim) -> dict[str, float]:
    """/metrics as {sample name (+ finished_reason): value}, parsed by prometheus_client."""
    async with http.get(root(sim) + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                continue  # its labels are the cache's config: vLLM writes no model_name there
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
            # preallocated at start, as vLLM does: the load does not move it
            assert loaded["memory_used_bytes"] == idle["memory_used_bytes"]
            assert loaded["energy_j"] > idle["energy_j"]
            assert loaded["power_w"] <= loaded["power_limit_w"]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _cache_config(http: aiohttp.ClientSession, sim: RunningSim) -> tuple[dict, float]:
    """vLLM's cache_config_info labels and kv_cache_usage_perc, from the raw page."""
    async with http.get(root(sim) + "/metrics") as resp:
        text = await resp.text()
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    return samples["vllm:cache_config_info"].labels, samples["vllm:kv_cache_usage_perc"].value


async def test_sim_preallocates_and_a_kv_leak_moves_only_the_engines_figure(
        http: aiohttp.ClientSession) -> None:
    """GPU memory is gpu_memory_utilization × total from the start, flat under load and
    through a leak; the pool vLLM's cache_config_info states is the engine's KV budget, and
    its usage × that pool is what the engine holds: here, after every request has ended,
    exactly what leaked, a quarter of each request's prompt + output (its own usage)."""
    async with running_sim(kv_tokens=4096, kv_leak_fraction=0.25) as sim:
        async with http.get(root(sim) + "/sim/gpu") as resp:
            idle = await resp.json()
        assert idle["memory_used_bytes"] == int(0.9 * 80 * 2**30)
        labels, usage = await _cache_config(http, sim)
        assert int(labels["num_gpu_blocks"]) * int(labels["block_size"]) == 4096
        assert labels["gpu_memory_utilization"] == "0.9" and usage == 0.0
        assert labels["kv_cache_memory_bytes"] == "None"  # vLLM's default: no bytes stated

        async def one(words: int) -> dict[str, int]:
            body = {"model": "tokentop-sim", "prompt": "hi " * words, "max_tokens": 30,
                    "ignore_eos": True}
            async with http.post(sim.url + "/completions", json=body) as resp:
                assert resp.status == 200
                return (await resp.json())["usage"]

        used = await asyncio.gather(*(one(n) for n in (5, 40, 77, 120)))
        leaked = sum(int((u["prompt_tokens"] + u["completion_tokens"]) * 0.25) for u in used)
        assert leaked > 0 and sim.model.num_running == 0
        labels, usage = await _cache_config(http, sim)
        assert usage * 4096 == pytest.approx(leaked, abs=1e-9)
        async with http.get(root(sim) + "/sim/gpu") as resp:
            assert (await resp.json())["memory_used_bytes"] == idle["memory_used_bytes"]
        # a restart is a new process: what leaked is free again
        sim.model.restart()
        assert (await _cache_config(http, sim))[1] == 0.0


def test_sim_config_refuses_a_preallocation_the_weights_do_not_fit() -> None:
    with pytest.raises(ValueError, match="weights do not fit"):
        SimConfig(gpu_memory_utilization=0.1)  # 16 GiB of weights > 8 GiB
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            SimConfig(gpu_memory_utilization=bad)
    with pytest.raises(ValueError, match="kv_leak_fraction"):
        SimConfig(kv_leak_fraction=-0.1)


# ---- the command line


def test_sim_config_from_flags() -> None:
    args = sim_parser().parse_args(
        ["--port", "0", "--model", "m", "--slots", "3", "--kv-tokens", "99"])
    cfg = sim_config(args)
    assert (cfg.model_name, cfg.slots, cfg.kv_tokens) == ("m", 3, 99)
    assert cfg.step_overhead_ms == SimConfig().step_overhead_ms
    assert (args.host, args.port) == ("127.0.0.1", 0)
    assert sim_config(sim_parser().parse_args([])) == SimConfig()


def test_embedded_sim_flags_are_read_by_the_same_parser() -> None:
    cfg = embedded_sim_config(["--profile", "tiny", "--slots=16", "--fault-error-rate", "0.5"])
    assert (cfg.slots, cfg.kv_tokens, cfg.faults.error_rate) == (16, 4096, 0.5)
    assert embedded_sim_config([]) == SimConfig()
    for bad, words in ((["--slots", "x"], "invalid int value"),
                       (["--port", "1"], "unrecognized arguments"),  # it picks its own address
                       (["--slots", "0"], "slots must be at least 1")):
        with pytest.raises(ValueError, match=words):
            embedded_sim_config(bad)


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    """`tokentop sim …` as its own process."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tui.cli", "sim", *args,
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


async def _child(launch: bytes) -> asyncio.subprocess.Process:
    """`python -m loadgen.sim`, the embedded simulator: its settings as one line on stdin."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadgen.sim",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(launch)
    await proc.stdin.drain()
    return proc


async def test_child_reads_its_typed_config_on_stdin_and_exits_with_parent(
    http: aiohttp.ClientSession,
) -> None:
    proc = await _child(encode_launch(SimLaunch(config=SimConfig(slots=3, model_name="m"))))
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), WAIT_S)).decode()
        word, port = line.split()
        assert word == "TOKENTOP_SIM_LISTENING"
        async with http.get(f"http://127.0.0.1:{int(port)}/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "m"
        proc.stdin.close()  # the parent "dies"
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("line", [b"", b"--port 0\n", b'{"config": {"slots": 0}}\n'])
async def test_child_with_a_bad_launch_line_is_one_line_and_exit_2(line: bytes) -> None:
    proc = await _child(line)
    assert proc.stdin is not None
    proc.stdin.close()
    _, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode == 2
    text = err.decode()
    assert "Traceback" not in text
    assert text.count("\n") == 1 and text.startswith("tokentop sim: ")


# ---- presets: a concurrency sweep shows the knee where it should


async def _sweep_level(
    sim: RunningSim, concurrency: int, *, prompt_words: int, max_tokens: int, per_client: int
) -> dict[str, float]:
    """Closed loop at one concurrency: mean client TTFT, output tok/s, max waiting seen."""
    loop = asyncio.get_running_loop()
    body = {"model": MODEL, "prompt": " ".join(["w"] * prompt_words), "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}  # fmt: skip
    ttfts: list[float] = []
    tokens = 0
    waiting = 0
    running = True

    async def watch() -> None:
        nonlocal waiting
        while running:
            waiting = max(waiting, sim.model.num_waiting)
            await asyncio.sleep(0.001)

    async def user(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        for _ in range(per_client):
            t0 = loop.time()
            first = True
            async with session.post(sim.url + "/completions", json=body) as resp:
                async for line in resp.content:
                    if line.startswith(b'data: {"id"') and b'"text":" ' in line:
                        if first:
                            ttfts.append(loop.time() - t0)
                            first = False
                        tokens += 1

    watcher = asyncio.create_task(watch())
    start = loop.time()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(user(session) for _ in range(concurrency)))
    elapsed = loop.time() - start
    running = False
    await watcher
    assert tokens == concurrency * per_client * max_tokens
    return {"ttft": sum(ttfts) / len(ttfts), "tok_s": tokens / elapsed, "waiting": waiting}


async def test_concurrency_sweep_has_the_knee_at_the_slot_limit() -> None:
    from loadgen.sim.presets import profile

    cfg = SimConfig(**profile("tiny"))
    slots = cfg.slots
    levels = [1, 2, 4, slots, slots + slots // 2, 2 * slots]
    sim = await start_sim(cfg, port=0)
    try:
        r = {}
        for c in levels:
            r[c] = await _sweep_level(sim, c, prompt_words=50, max_tokens=24, per_client=2)
        preempted_in_budget = sim.model.metrics.preemptions
        # demand above the KV budget (8 × (450 + 80) > 4096): the newest get preempted
        assert cfg.kv_tokens < 8 * (450 + 80)
        await _sweep_level(sim, 8, prompt_words=450, max_tokens=80, per_client=1)
        preempted_over = sim.model.metrics.preemptions
    finally:
        await sim.close()
    below = [r[c] for c in levels if c <= slots]
    above = [r[c] for c in levels if c > slots]
    # TTFT flat below the slot limit, rising above it (queueing behind whole requests)
    flat = max(x["ttft"] for x in below)
    assert flat < 0.05
    assert r[2 * slots]["ttft"] > 3 * flat
    assert r[2 * slots]["ttft"] > r[slots + slots // 2]["ttft"] > flat
    # output tok/s rises up to the slot limit, then stays flat
    assert r[2]["tok_s"] > 1.4 * r[1]["tok_s"]
    assert r[slots]["tok_s"] > 3 * r[1]["tok_s"]
    for x in above:
        assert 0.75 * r[slots]["tok_s"] < x["tok_s"] < 1.3 * r[slots]["tok_s"]
    # requests wait only above the limit
    assert all(x["waiting"] == 0 for x in below)
    assert all(x["waiting"] > 0 for x in above)
    # preemptions only once the KV budget is exceeded
    assert preempted_in_budget == 0
    assert preempted_over > 0


def test_profiles_and_flags_override_them() -> None:
    from loadgen.sim.presets import PROFILES

    parser = sim_parser()
    for name in PROFILES:
        cfg = sim_config(parser.parse_args(["--profile", name]))
        for key, value in PROFILES[name].items():
            assert getattr(cfg, key) == value, (name, key)
    cfg = sim_config(parser.parse_args(["--profile", "llama3-70b-4xh100", "--slots", "7"]))
    assert cfg.slots == 7 and cfg.gpu_count == 4 and cfg.kv_bytes_per_token == 327_680
    assert sim_config(parser.parse_args([])) == SimConfig()
    with pytest.raises(SystemExit):
        parser.parse_args(["--profile", "nope"])


async def test_tensor_parallel_profile_shows_every_gpu(http: aiohttp.ClientSession) -> None:
    from loadgen.sim.presets import profile
    from probes.sim_gpu import parse_sim_gpus

    async with (
        running_sim(**{**profile("llama3-70b-4xh100"), **FAST}) as sim,
        http.get(root(sim) + "/sim/gpu") as resp,
    ):
        payload = await resp.json()
    gpus = parse_sim_gpus(payload)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert all(g.simulated for g in gpus)
    # a quarter of the 141 GB of weights on each, within the 80 GiB
    assert all(141e9 / 4 <= g.memory_used_bytes < g.memory_total_bytes for g in gpus)


# ---- exact-timing mode and chunk batching


async def test_exact_timing_mode(http: aiohttp.ClientSession) -> None:
    ttft_ms, itl_ms = 40.0, 5.0
    async with running_sim(slots=1, exact_ttft_ms=ttft_ms, exact_itl_ms=itl_ms) as sim:
        loop = asyncio.get_running_loop()

        async def one() -> tuple[float, list[int], list[int]]:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 12, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            content: list[int] = []
            every: list[int] = []
            t0 = loop.time()
            ttft = 0.0
            async with http.post(sim.url + "/chat/completions", json=body) as resp:
                async for line in resp.content:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    every.append(chunk["tokentop_sent_ns"])
                    choices = chunk["choices"]
                    if choices and choices[0]["delta"].get("content"):
                        if not content:
                            ttft = loop.time() - t0
                        content.append(chunk["tokentop_sent_ns"])
            return ttft, content, every

        # six at once through one slot: the scheduler is bypassed, nobody queues
        results = await asyncio.gather(*(one() for _ in range(6)))
        m = await scrape(http, sim)
    role_gaps_ms = []
    for ttft, content, every in results:
        assert len(content) == 12
        assert len(every) == 12 + 3  # role, 12 tokens, finish, usage: all stamped
        assert ttft_ms / 1000 <= ttft < (ttft_ms + 15) / 1000
        gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(content)]
        assert sum(gaps_ms) / len(gaps_ms) == pytest.approx(itl_ms, abs=0.3)
        # by deadline: a late write (the machine was busy) is followed by a short gap, and
        # each send lands within the event loop's timer resolution (1 ms) of its deadline
        assert sorted(gaps_ms)[len(gaps_ms) // 2] == pytest.approx(itl_ms, abs=1.0)
        assert all(0 < g < itl_ms + 8.0 for g in gaps_ms)
        # role chunk is written on arrival: first content TTFT after it, each within the
        # busy machine's lateness (either write may be late), typically within the timer's
        role_gaps_ms.append((content[0] - every[0]) / 1e6)
        assert role_gaps_ms[-1] == pytest.approx(ttft_ms, abs=8.0)
    assert statistics.median(role_gaps_ms) == pytest.approx(ttft_ms, abs=2.0)
    assert m["vllm:generation_tokens_total"] == 6 * 12
    assert m["vllm:time_to_first_token_seconds_count"] == 6
    assert m["vllm:num_requests_running"] == 0

    async with running_sim(exact_ttft_ms=30.0, exact_itl_ms=2.0) as sim, openai_client(sim) as c:
        t0 = loop.time()
        whole = await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a b"}], max_tokens=11,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert whole.usage.completion_tokens == 11
        assert loop.time() - t0 >= (30 + 2 * 10) / 1000
        stream = await c.completions.create(
            model=MODEL, prompt="x", max_tokens=5, stream=True, extra_body={"ignore_eos": True}
        )
        texts = [ch.choices[0].text async for ch in stream if ch.choices and ch.choices[0].text]
        assert len(texts) == 5


async def test_tokens_per_chunk(http: aiohttp.ClientSession) -> None:
    async with running_sim(tokens_per_chunk=4) as sim:
        usage = {"include_usage": True, "continuous_usage_stats": True}
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10,
                "ignore_eos": True, "stream": True, "stream_options": usage}  # fmt: skip
        seen = []
        async with http.post(sim.url + "/chat/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    text = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
                    if text:
                        seen.append((len(text.split()), chunk["usage"]["completion_tokens"]))
        # the first token alone, then four at a time; usage counts what each carried
        assert seen == [(1, 1), (4, 5), (4, 9), (1, 10)]
        async with openai_client(sim) as client:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "y"}], max_tokens=9,
                stream=True, extra_body={"ignore_eos": True},
            )  # fmt: skip
            words = 0
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    words += len(chunk.choices[0].delta.content.split())
            assert words == 9
        m = await scrape(http, sim)
        assert m["vllm:generation_tokens_total"] == 19


async def test_gpu_power_follows_batch_occupancy() -> None:
    from loadgen.sim.gpu import SimGpu
    from loadgen.sim.model import BatchModel

    class Clock:
        t = 0.0

    cfg = SimConfig(slots=10)
    one, full = BatchModel(cfg), BatchModel(cfg)
    for engine, running in ((one, 1), (full, 10)):
        engine.now = lambda: Clock.t  # type: ignore[method-assign]
        engine.busy_seconds = lambda now: now  # type: ignore[method-assign]  # always busy
        engine.exact_running = running  # stands for `running` sequences in the batch
    g1, g10 = SimGpu(one), SimGpu(full)
    g1.sample(), g10.sample()
    Clock.t = 20.0
    s1, s10 = g1.sample(), g10.sample()
    assert s1["utilization_pct"] == s10["utilization_pct"] > 99  # NVML's "busy" reads alike
    assert cfg.idle_power_w < s1["power_w"] < s10["power_w"] <= cfg.power_limit_w
    assert s10["power_w"] == pytest.approx(cfg.power_limit_w, rel=0.01)
    assert s1["temperature_c"] < s10["temperature_c"]  # 20 s into a 30 s thermal lag
    assert s10["temperature_c"] < cfg.ambient_c + cfg.c_per_watt * s10["power_w"] - 5
    assert s10["energy_j"] > s1["energy_j"] > 0
