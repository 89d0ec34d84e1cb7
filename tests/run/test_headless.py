"""`tokentop run --headless` end to end, as a real process against the real simulator."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from aiohttp import web
from support import scrape, tokentop, tokentop_env

from loadgen.run.config import RunConfig
from loadgen.run.headless import run_headless


async def test_headless_counts_match_the_servers_own_counters(sim, tmp_path):
    metrics = sim.url.removesuffix("/v1") + "/metrics"
    before = await scrape(metrics)
    out = tmp_path / "result.json"
    proc = await asyncio.to_thread(
        tokentop, "run", "--headless", "--url", sim.url, "--duration", "3",
        "--concurrency", "6", "--output-tokens", "24", "--input-tokens", "32",
        "--json", str(out),
    )
    assert proc.returncode == 0, proc.stderr
    after = await scrape(metrics)
    result = json.loads(out.read_text())
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    prompt = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert result["requests"]["ok"] > 0
    assert result["requests"]["failed"] == 0
    # the load's tokens and the drain's add up to what the server generated and read
    drain = result["drain"] or {"output_tokens": 0, "input_tokens": 0}
    assert result["tokens"]["output"] + drain["output_tokens"] == generated
    assert result["tokens"]["input"] + drain["input_tokens"] == prompt
    assert result["tokens"]["output_completed"] == 24 * result["requests"]["ok"]
    assert result["tokens"]["output_estimated"] is False
    for metric in ("ttft", "itl", "e2e", "tpot"):
        lat = result["latency_ms"][metric]
        assert lat["count"] > 0
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    assert result["throughput"]["output_tok_s"] > 0
    per_user = result["throughput"]["per_user_tok_s"]
    assert per_user["p50"] == pytest.approx(1000.0 / result["latency_ms"]["tpot"]["p50"])
    assert per_user["p10"] <= per_user["p50"]
    # one progress line a second on stderr, not a TUI
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert len(progress) >= 3
    assert "tok/s" in progress[-1]


async def test_unreachable_target_is_one_line_and_exit_2():
    # port 9 (discard) on loopback: nothing listens there. The command line waits for it
    # first (test_wait_for_target.py); without a wait it is this one line
    said = io.StringIO()
    code = await run_headless(RunConfig(url="http://127.0.0.1:9/v1", duration=1.0),
                              record=False, out=said, wait=0.0)
    assert code == 2
    assert said.getvalue().splitlines() == [
        "tokentop: cannot reach http://127.0.0.1:9/v1: connection refused"]


async def test_not_an_openai_server(unused_tcp_port):
    async def hello(_request):
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", unused_tcp_port)
    await site.start()
    try:
        proc = await asyncio.to_thread(
            tokentop, "run", "--headless", "--url", f"http://127.0.0.1:{unused_tcp_port}/v1",
            "--duration", "1",
        )
    finally:
        await runner.cleanup()
    assert proc.returncode == 2
    assert "does not look like an OpenAI-compatible API" in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_wrong_model_names_the_served_ones(sim):
    proc = await asyncio.to_thread(
        tokentop, "run", "--headless", "--url", sim.url, "--model", "nope", "--duration", "1"
    )
    assert proc.returncode == 2
    assert "model 'nope' is not served" in proc.stderr
    assert sim.model.cfg.model_name in proc.stderr


def test_non_number_is_a_clear_error():
    proc = tokentop("run", "--headless", "--concurrency", "lots")
    assert proc.returncode == 2
    assert "expected a whole number, got 'lots'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_url_is_a_clear_error():
    proc = tokentop("run", "--headless", "--url", "localhost:8000", "--duration", "1")
    assert proc.returncode == 2
    assert "not an http(s) URL" in proc.stderr


async def test_every_request_failing_is_exit_1(sim, tmp_path):
    # max_tokens far beyond what the simulator allows → every request is a 400
    proc = await asyncio.to_thread(
        tokentop, "run", "--headless", "--url", sim.url, "--duration", "1.5",
        "--output-tokens", "10000000", "--json", str(tmp_path / "r.json"),
    )
    assert proc.returncode == 1, proc.stderr
    assert "every request failed" in proc.stderr.splitlines()[-1]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["requests"]["ok"] == 0
    assert result["requests"]["errors"].get("http_4xx", 0) == result["requests"]["failed"] > 0


async def test_api_key_never_goes_to_another_host_and_metrics_token_does(sim, tmp_path,
                                                                          unused_tcp_port):
    seen: list[str | None] = []

    async def metrics(request):
        seen.append(request.headers.get("Authorization"))
        return web.Response(text="vllm:num_requests_running 0\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    other = f"http://127.0.0.1:{unused_tcp_port}/metrics"  # another origin than the target
    token = tmp_path / "token"
    token.write_text("metrics-token-123\n")
    env_key = {"OPENAI_API_KEY": "sk-secret-key-456"}
    try:
        for extra in ([], ["--metrics-token-file", str(token)]):
            seen.clear()
            proc = await asyncio.to_thread(
                tokentop_env, env_key, "run", "--headless", "--url", sim.url, "--duration", "1.5",
                "-c", "1", "--output-tokens", "4", "--metrics-url", other, "--no-record", *extra,
            )
            assert proc.returncode == 0, proc.stderr
            assert seen, "the metrics endpoint was scraped"
            if extra:
                assert set(seen) == {"Bearer metrics-token-123"}
            else:
                assert set(seen) == {None}
            assert "sk-secret-key-456" not in proc.stderr + proc.stdout
    finally:
        await runner.cleanup()
