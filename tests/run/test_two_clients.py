"""`--client openai` (the official SDK) and the default raw client measure the same: every
count a summary holds, the usage details included (cached prompt tokens, reasoning tokens,
llama.cpp's `timings`), and timings within a stated tolerance. The truths: a real llama.cpp
stream's own usage (replayed from its capture), and the exact-timing simulator's schedule
and prefix cache."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from support import FIXTURES, running_sim, serving, tokentop

from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.openai_client import OpenAIClient

CAPTURE = FIXTURES / "captures" / "llamacpp" / "sse-chat.txt"
OLDER = b',"prompt_tokens_details":{"cached_tokens":4}'  # an older llama.cpp: timings only


def _capture_server(raw: bytes) -> web.Application:
    async def replay(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in raw.split(b"\n\n"):
            if event.strip():
                await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", replay)])
    return app


async def _through(client_type, raw: bytes):
    """The capture served over 127.0.0.1 and read by one client: its counters."""
    rec = IntervalRecorder()
    body = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 4, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    async with serving(_capture_server(raw)) as base:
        client = client_type(f"{base}/v1/chat/completions", rec, timeout=20.0)
        try:
            await client.request(body, 13)
        finally:
            client.close()
    return rec.take()[0]


@pytest.mark.parametrize("older", [False, True])
async def test_both_clients_take_a_real_llamacpp_streams_usage_details(older: bool):
    raw = CAPTURE.read_bytes()
    final = json.loads(raw.split(b"\n\n")[-3].removeprefix(b"data: "))
    if older:
        raw = raw.replace(OLDER, b"")
        assert OLDER not in raw
    counted = [await _through(kind, raw) for kind in (StreamingClient, OpenAIClient)]
    for c in counted:
        assert c.requests_ok == 1 and c.errors == {}
        assert c.output_tokens == final["usage"]["completion_tokens"]
        assert c.input_tokens == final["usage"]["prompt_tokens"]
        # the capture's own figure: in the usage's details, or (older) in its timings only
        assert c.cached_tokens == final["timings"]["cache_n"] == 4
        assert c.cache_reported_input_tokens == final["usage"]["prompt_tokens"]
    assert counted[0] == counted[1]


# ---- one workload through both clients, from the command line

TTFT_MS, ITL_MS, REASONING, OUT, IN, TURNS = 30.0, 5.0, 4, 16, 32, 3
# between the clients: a request's first token (and so TTFA, E2E) comes 2-4 ms later through
# the SDK, which builds and sends the request inside the clock (its own cost, what an SDK
# application sees); a token's gap within a fraction of a millisecond
REQUEST_TOLERANCE_MS, TOKEN_TOLERANCE_MS = 6.0, 0.5
# against the schedule, the server's own lateness on this shared machine comes on top (its
# loop waking after a deadline; the first requests' connection setup)
LATE_MS = 10.0


async def _summary(tmp_path, client: str) -> dict:
    """One workload (conversations of TURNS turns, a reasoning model, its prefix cache) on a
    fresh exact-timing simulator, through `client`."""
    out = tmp_path / f"{client}.json"
    async with running_sim(exact_ttft_ms=TTFT_MS, exact_itl_ms=ITL_MS,
                           reasoning_tokens=REASONING) as sim:
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", f"--client={client}",
            "--workers=1", "--tick=0.25", "--concurrency=2", f"--requests={4 * TURNS}",
            f"--turns={TURNS}", f"--input-tokens={IN}", f"--output-tokens={OUT}",
            "--tokenizer=none", "--json", str(out), "--no-record")
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def _facts(summary: dict) -> dict:
    """Every field of a summary that is not a timing (nor the run's identity: its id, its
    URL, the client asked for), and not the server's /metrics (scraped on the run's clock,
    not measured by the client): the counts of every latency, not of connection setups
    (the SDK opens its connections out of sight: the openai client records none)."""
    facts = {k: v for k, v in summary.items() if k not in (
        "run_id", "finished_at", "duration_s", "config", "throughput", "server", "exit")}
    facts["target"] = {k: v for k, v in summary["target"].items() if k != "url"}
    facts["latency_ms"] = {k: v["count"] for k, v in summary["latency_ms"].items()
                           if k != "connect"}
    facts["prefix_cache"] = {k: v for k, v in summary["prefix_cache"].items()
                             if not k.startswith("server_")}
    facts["drain"] = {k: v for k, v in summary["drain"].items() if k != "seconds"}
    facts["turns"] = [{k: v for k, v in row.items() if k != "ttft_ms_mean"}
                      for row in summary["turns"]]
    facts["exit"] = summary["exit"]["code"]
    return facts


async def test_one_workload_through_both_clients_measures_the_same(tmp_path):
    raw = await _summary(tmp_path, "raw")
    sdk = await _summary(tmp_path, "openai")
    assert raw["config"]["client"] == "raw" and sdk["config"]["client"] == "openai"
    # what the comparison rests on: the server's details came through
    assert raw["prefix_cache"]["cached_tokens"] > 0
    assert raw["reasoning"]["counted_by"] == "server"
    assert raw["reasoning"]["reasoning_tokens"] == REASONING * raw["requests"]["ok"]
    assert _facts(sdk) == _facts(raw)
    # timings: each client on the simulator's schedule, and the two within the tolerance
    truth = {"ttft": TTFT_MS, "itl": ITL_MS, "tpot": ITL_MS,
             "ttfa": TTFT_MS + REASONING * ITL_MS, "e2e": TTFT_MS + (OUT - 1) * ITL_MS}
    for name, due in truth.items():
        a, b = raw["latency_ms"][name]["p50"], sdk["latency_ms"][name]["p50"]
        tolerance = TOKEN_TOLERANCE_MS if name in ("itl", "tpot") else REQUEST_TOLERANCE_MS
        assert abs(a - b) <= tolerance, (name, a, b)
        for got in (a, b):
            assert due - 0.5 <= got <= due + LATE_MS, (name, got, due)
