"""Server /metrics: engine detection and mapping from fixtures, and real scrapes over loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from probes import server_metrics
from probes.server_metrics import ServerMetricsProbe, metrics_url_for, parse_metrics

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
URL = "http://127.0.0.1:8000/metrics"


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


# engine, waiting, running, kv, prompt, generation, preemptions (None = not exposed)
EXPECTED = {
    "vllm": ("vllm", 7.0, 22.0, 0.375, 123456.0, 54321.0, 3.0),
    "vllm_old": ("vllm", 0.0, 5.0, 0.8125, 7777.0, 3333.0, 0.0),
    "sglang": ("sglang", 9.0, 32.0, 0.42, 204800.0, 65536.0, None),
    "tgi": ("tgi", 6.0, 14.0, None, None, 61234.0, None),
    "triton": ("triton", 7.0, 24.0, 0.375, None, None, None),
    "trtllm": ("trtllm", 2.0, 16.0, 0.66, None, 98765.0, None),
    "llamacpp": ("llamacpp", 0.0, 0.0, None, 66351.0, 149809.0, None),
    "unknown": ("unknown", None, None, None, None, None, None),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_is_detected_and_mapped(name: str) -> None:
    m = parse_metrics(fixture(name), URL)
    engine, waiting, running, kv, prompt, generation, preemptions = EXPECTED[name]
    assert m.ok and m.error is None
    assert m.url == URL
    assert m.engine == engine
    assert m.waiting == waiting
    assert m.running == running
    assert m.kv_cache_usage == (None if kv is None else pytest.approx(kv))
    assert m.prompt_tokens_total == prompt
    assert m.generation_tokens_total == generation
    assert m.preemptions_total == preemptions


def test_missing_kv_is_none_not_zero() -> None:
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
    m = parse_metrics(text, URL)
    assert m.engine == "vllm"
    assert m.running == 1.0
    assert m.kv_cache_usage is None
    assert m.waiting is None


def test_counter_without_type_line_still_matches() -> None:
    # Untyped samples keep their full name as the family name; matching is on samples.
    m = parse_metrics("sglang:generation_tokens_total 5\n", URL)
    assert m.engine == "sglang"
    assert m.generation_tokens_total == 5.0


def test_garbage_is_not_prometheus_text() -> None:
    m = parse_metrics("<html><body>Not here</body></html>", URL)
    assert not m.ok
    assert m.error is not None and m.error.startswith("not Prometheus text: ")


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://host:8000/v1", "http://host:8000/metrics"),
        ("http://host:8000/v1/", "http://host:8000/metrics"),
        ("http://host:8000", "http://host:8000/metrics"),
        ("http://host:8000/", "http://host:8000/metrics"),
        ("https://gw.example/llm/v1", "https://gw.example/llm/metrics"),
    ],
)
def test_metrics_url_for(base: str, expected: str) -> None:
    assert metrics_url_for(base) == expected


# -- real scrapes over loopback ---------------------------------------------------


class MetricsServer:
    """A real aiohttp server whose /metrics answer the test can change."""

    def __init__(self) -> None:
        self.status = 200
        self.body = ""
        self.seen_auth: list[str | None] = []
        self.base = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.seen_auth.append(request.headers.get("Authorization"))
        return web.Response(status=self.status, text=self.body, content_type="text/plain")


@pytest.fixture
async def server() -> AsyncIterator[MetricsServer]:
    state = MetricsServer()
    app = web.Application()
    app.router.add_get("/metrics", state.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    state.base = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_scrape_fixture_then_404_then_garbage(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    url = metrics_url_for(server.base + "/v1")
    probe = ServerMetricsProbe(url, session)

    server.body = fixture("vllm")
    m = await probe.sample()
    assert m.ok, m.error
    assert m.engine == "vllm"
    assert m.running == 22.0
    assert m.scrape_ms is not None and m.scrape_ms >= 0

    server.status = 404
    m = await probe.sample()
    assert not m.ok
    assert m.error == f"HTTP 404 from {url}"
    assert m.scrape_ms is not None

    server.status = 200
    server.body = "this is not { prometheus"
    m = await probe.sample()
    assert not m.ok
    assert m.error is not None and m.error.startswith("not Prometheus text")


async def test_bearer_token_is_sent_and_not_leaked(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    server.status = 404
    probe = ServerMetricsProbe(server.base + "/metrics", session, bearer_token="s3cret")
    m = await probe.sample()
    assert server.seen_auth == ["Bearer s3cret"]
    assert "s3cret" not in repr(m)


def _closed_port() -> int:
    # Bind then close: nothing listens there right after.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_closed_port_is_connection_refused(session: aiohttp.ClientSession) -> None:
    probe = ServerMetricsProbe(f"http://127.0.0.1:{_closed_port()}/metrics", session)
    m = await probe.sample()
    assert not m.ok
    assert m.error is not None and "connection refused" in m.error
    assert m.scrape_ms is not None


async def test_slow_server_times_out(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        return web.Response(text="")

    # Keep the test short; the error text is built from the same constant.
    monkeypatch.setattr(server_metrics, "TIMEOUT_S", 0.2)
    app = web.Application()
    app.router.add_get("/metrics", slow)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        m = await ServerMetricsProbe(f"http://127.0.0.1:{port}/metrics", session).sample()
    finally:
        await runner.cleanup()
    assert not m.ok
    assert m.error == "timed out after 0.2 s"
