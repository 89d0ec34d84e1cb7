"""Prefix caching: the simulator's cache (its hits in usage and /metrics, a shorter prefill),
the worker's count of cached tokens from real llama.cpp bytes, and the probe's hit rate
from a server's counters."""

from __future__ import annotations

import json

import aiohttp
import pytest
from support import FIXTURES, root, running_sim, scrape

from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.stream_measure import StreamMeasure
from probes.server_metrics import ServerMetricsProbe

CAPTURE = FIXTURES / "captures" / "llamacpp" / "sse-chat.txt"


def _measure(raw: bytes) -> IntervalRecorder:
    rec = IntervalRecorder()
    m = StreamMeasure(rec, 0.0, 13)
    for i, line in enumerate(raw.split(b"\n\n")):
        if line.strip():
            assert m.feed(line + b"\n\n", 0.01 * (i + 1))
    m.finish()
    return rec


def test_cached_tokens_from_a_real_llamacpp_stream():
    raw = CAPTURE.read_bytes()
    usage = json.loads(raw.split(b"\n\n")[-3].removeprefix(b"data: "))
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] == 4  # the capture's own
    c = _measure(raw).counters
    assert (c.cached_tokens, c.cache_reported_input_tokens) == (4, usage["usage"]["prompt_tokens"])
    # an older llama.cpp says it in its timings only
    older = raw.replace(b',"prompt_tokens_details":{"cached_tokens":4}', b"")
    assert b"prompt_tokens_details" not in older
    assert _measure(older).counters.cached_tokens == usage["timings"]["cache_n"]


def test_no_cache_figure_counts_nothing():
    raw = CAPTURE.read_bytes().replace(b',"prompt_tokens_details":{"cached_tokens":4}', b"")
    raw = raw.replace(b'"timings":{"cache_n":4,', b'"timings":{')
    c = _measure(raw).counters
    assert (c.cached_tokens, c.cache_reported_input_tokens) == (0, 0)


async def _ask(session: aiohttp.ClientSession, url: str, text: str) -> dict:
    body = {"model": "tokentop-sim", "max_tokens": 2, "stream": False,
            "messages": [{"role": "user", "content": text}]}
    async with session.post(url + "/chat/completions", json=body) as r:
        assert r.status == 200
        return await r.json()


async def test_a_repeated_prompt_is_served_from_the_cache_and_prefills_faster():
    words = " ".join(f"w{i}" for i in range(2000))  # 2001 units with the role, 125 blocks
    # a slow prefill (1 ms a token) makes the saving plain beside the step overhead
    async with running_sim(prefill_ms_per_token=1.0, prefill_chunk_tokens=4096) as sim, \
            aiohttp.ClientSession() as s:
        first = await _ask(s, sim.url, words)
        t_first = (await scrape(root(sim) + "/metrics"))["vllm:time_to_first_token_seconds_sum"]
        second = await _ask(s, sim.url, words)
        metrics = await scrape(root(sim) + "/metrics")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # 125 whole blocks of 16 were cached by the first; the last token is always computed
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 2000
    assert metrics["vllm:prefix_cache_hits_total"] == 2000
    assert metrics["vllm:prefix_cache_queries_total"] == 2 * 2001
    t_second = metrics["vllm:time_to_first_token_seconds_sum"] - t_first
    assert t_first > 2.0 * 0.9 - 0.1 and t_second < t_first / 5  # 2 s of prefill vs 1 token


async def test_probe_hit_rate_from_the_servers_counters():
    prefix = " ".join(f"p{i}" for i in range(64))
    async with running_sim() as sim, aiohttp.ClientSession() as s:
        probe = ServerMetricsProbe(root(sim) + "/metrics", s)
        await probe.sample()
        before = await scrape(root(sim) + "/metrics")
        for i in range(5):
            await _ask(s, sim.url, f"{prefix} question {i} " + "x " * 10)
        after = await scrape(root(sim) + "/metrics")
        got = await probe.sample()
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    assert hits > 0
    assert got.prefix_cache_hit_rate == pytest.approx(hits / queries)
