"""Every /metrics dialect, scraped live and read by tokentop's own scraper."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import FIXTURES

from loadgen.sim import SimConfig, start_sim
from loadgen.sim.model import DIALECTS
from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder
from probes.server_metrics import parse_metrics

FAST = {"step_overhead_ms": 1.0, "decode_ms_per_seq": 0.05, "prefill_ms_per_token": 0.001}
# the scrapers' engine name for each dialect
ENGINE = {d: d for d in DIALECTS}
# what each engine's /metrics has no name for (left n/a by the scraper)
NO_PROMPT = {"triton"}
NO_GENERATION = {"triton"}
NO_KV = {"tgi", "llamacpp"}


def body(words: int, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": "tokentop-sim",
            "messages": [{"role": "user", "content": " ".join(["w"] * words)}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "ignore_eos": True,
        }
    ).encode()


def make_client(session: aiohttp.ClientSession, url: str, rec: IntervalRecorder):
    if "session" in inspect.signature(StreamingClient).parameters:
        return StreamingClient(session, url, rec)  # type: ignore[call-arg]
    return StreamingClient(url, rec)  # type: ignore[call-arg]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_dialect_is_detected_and_counts_what_the_client_got(dialect: str) -> None:
    sim = await start_sim(SimConfig(slots=2, metrics_dialect=dialect, **FAST), port=0)
    metrics_url = sim.url.removesuffix("/v1") + "/metrics"
    try:
        async with aiohttp.ClientSession() as session:

            async def scrape() -> str:
                async with session.get(metrics_url) as resp:
                    assert resp.status == 200
                    assert resp.headers["Content-Type"].startswith("text/plain")
                    return await resp.text()

            idle = parse_metrics(await scrape(), metrics_url)
            assert idle.ok and idle.engine == ENGINE[dialect]
            assert (idle.running, idle.waiting) == (0, 0)

            # under load: 2 running (the slot limit), 2 waiting
            rec = IntervalRecorder()
            client = make_client(session, sim.url + "/chat/completions", rec)
            long = [asyncio.create_task(client.request(body(3, 100_000 // 8), 3))
                    for _ in range(4)]  # fmt: skip
            try:
                for _ in range(500):  # 5 s at most
                    loaded = parse_metrics(await scrape(), metrics_url)
                    if (loaded.running, loaded.waiting) == (2, 2):
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError(f"never 2 running, 2 waiting: {loaded}")
                if dialect not in NO_KV:
                    assert loaded.kv_cache_usage is not None and 0 < loaded.kv_cache_usage < 1
            finally:
                for task in long:
                    task.cancel()
                await asyncio.gather(*long, return_exceptions=True)
                with contextlib.suppress(AttributeError):
                    client.close()
            for _ in range(500):
                if sim.model.num_running == sim.model.num_waiting == 0:
                    break
                await asyncio.sleep(0.01)

            # counters against what the client counted, from a fresh engine
            sim.model.restart()
            rec.take()
            await asyncio.gather(*(client.request(body(i + 1, 10 + i), i + 1) for i in range(6)))
            counters, _, _ = rec.take()
            with contextlib.suppress(AttributeError):
                client.close()
            assert counters.requests_ok == 6 and counters.errors == {}
            page = await scrape()
    finally:
        await sim.close()
    list(text_string_to_metric_families(page))  # valid Prometheus text
    m = parse_metrics(page, metrics_url)
    assert m.ok and m.engine == ENGINE[dialect]
    assert (m.running, m.waiting) == (0, 0)
    assert counters.output_tokens == sum(10 + i for i in range(6))
    assert counters.input_tokens == sum(i + 1 for i in range(6))
    if dialect in NO_GENERATION:
        assert m.generation_tokens_total is None
    else:
        assert m.generation_tokens_total == counters.output_tokens
    if dialect in NO_PROMPT:
        assert m.prompt_tokens_total is None
    else:
        assert m.prompt_tokens_total == counters.input_tokens


def test_llamacpp_dialect_looks_like_the_capture() -> None:
    """Same names, types and no labels as a real llama-server's /metrics."""

    from loadgen.sim.dialects import render
    from loadgen.sim.model import BatchModel

    # the real llama-server capture (a copy of ../shared/captures/llamacpp/metrics.txt)
    capture = FIXTURES / "metrics" / "llamacpp.txt"
    ours = render("llamacpp", _started(BatchModel(SimConfig())))

    def shape(text: str) -> dict[str, str]:
        return {f.name: f.type for f in text_string_to_metric_families(text)}

    real = shape(capture.read_text())
    for name, kind in shape(ours).items():
        assert real.get(name) == kind, name
    for family in text_string_to_metric_families(ours):
        assert all(not s.labels for s in family.samples)


def _started(engine):
    engine.now = lambda: 0.0
    return engine


def test_every_dialect_the_config_accepts_has_a_renderer():
    from loadgen.sim import dialects

    assert tuple(dialects._RENDERERS) == DIALECTS
