"""Server /metrics: engine detection and mapping from fixtures, and real scrapes over loopback."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from support import FIXTURES

from probes import server_metrics
from probes.server_metrics import (
    MetricsTracker,
    ServerMetricsProbe,
    bucket_delta,
    histogram_quantile,
    metrics_url_for,
    parse_metrics,
)

METRICS_DIR = FIXTURES / "metrics"
URL = "http://127.0.0.1:8000/metrics"


def fixture(name: str) -> str:
    return (METRICS_DIR / f"{name}.txt").read_text()


# engine, waiting, running, kv, prompt, generation, preemptions (None = not exposed)
EXPECTED = {
    "vllm": ("vllm", 7.0, 22.0, 0.375, 123456.0, 54321.0, 3.0),
    "vllm_old": ("vllm", 0.0, 5.0, 0.8125, 7777.0, 3333.0, 0.0),
    "sglang": ("sglang", 9.0, 32.0, 0.42, 204800.0, 65536.0, None),
    "tgi": ("tgi", 6.0, 14.0, None, 98000.0, 61234.0, None),
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


# -- rates and server-side latency from two pages 10 s apart -----------------------------

# Every *_next.txt page adds, over 10 s: 10000 prompt and 5000 generated tokens (where the
# engine counts them), and to each latency histogram 50 observations in (0.02 s, 0.1 s] and
# 50 in (0.1 s, 0.5 s]. So, as Prometheus' histogram_quantile interpolates:
#   p50 = 0.02 + 0.08 * 50/50 = 0.1 s;  p90 = 0.1 + 0.4 * 40/50 = 0.42 s;  p99 = 0.1 + 0.4 * 49/50
QUANTILES_MS = {"p50": 100.0, "p90": 420.0, "p99": 492.0}

# engine fixture -> (prompt tok/s, generation tok/s, latency keys)
RATES = {
    "vllm": (1000.0, 500.0, {"ttft", "itl", "e2e", "queue"}),
    "vllm_old": (1000.0, 500.0, {"ttft", "itl", "e2e"}),  # itl from time_per_output_token
    "sglang": (1000.0, 500.0, {"ttft", "itl", "e2e", "queue"}),
    "tgi": (1000.0, 500.0, {"itl", "e2e", "queue"}),  # TGI has no TTFT histogram
    "trtllm": (None, 500.0, {"ttft", "itl", "e2e", "queue"}),
    "triton": (None, None, {"ttft"}),  # Triton's histogram is in ms
    "llamacpp": (1000.0, 500.0, set()),
}


@pytest.mark.parametrize("name", sorted(RATES))
def test_rates_and_server_latency_between_two_pages(name: str) -> None:
    prompt, generation, keys = RATES[name]
    tracker = MetricsTracker()
    first = tracker.feed(fixture(name), URL, t=100.0)
    assert first.prompt_tok_s is None and first.generation_tok_s is None  # nothing to compare
    assert first.latency_ms == {}
    m = tracker.feed(fixture(f"{name}_next"), URL, t=110.0)
    assert m.ok and m.engine == EXPECTED[name][0]
    assert m.prompt_tok_s == (None if prompt is None else pytest.approx(prompt))
    assert m.generation_tok_s == (None if generation is None else pytest.approx(generation))
    assert set(m.latency_ms) == keys
    for key in keys:
        assert m.latency_ms[key] == pytest.approx(QUANTILES_MS), key
    assert m.restarts == 0


def test_counter_reset_is_a_restart_never_a_negative_rate() -> None:
    tracker = MetricsTracker()
    tracker.feed(fixture("vllm"), URL, t=0.0)
    after_restart = tracker.feed(fixture("vllm_restart"), URL, t=10.0)
    assert after_restart.ok
    assert after_restart.restarts == 1
    assert after_restart.prompt_tok_s is None
    assert after_restart.generation_tok_s is None
    assert after_restart.latency_ms == {}  # the interval straddles the restart
    assert after_restart.running == 22.0  # gauges are still shown

    # From the restarted server's counters onwards, rates are rates again.
    again = tracker.feed(fixture("vllm"), URL, t=20.0)
    assert again.restarts == 1
    assert again.prompt_tok_s is not None and again.prompt_tok_s > 0
    m = tracker.feed(fixture("vllm_next"), URL, t=30.0)
    assert m.restarts == 1
    assert m.prompt_tok_s == pytest.approx(1000.0)
    assert m.latency_ms["ttft"] == pytest.approx(QUANTILES_MS)


def test_histogram_reset_alone_counts_as_restart() -> None:
    page = fixture("vllm_next")
    # Only engine 0's histograms went back; the token counters did not (as on an engine
    # that exposes no token counters): still a restart.
    tracker = MetricsTracker()
    tracker.feed(page, URL, t=0.0)
    lower = page.replace(
        '_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 593.0',
        '_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0',
    )
    lower = lower.replace('le="+Inf"} 593.0', 'le="+Inf"} 1.0')
    m = tracker.feed(lower, URL, t=10.0)
    assert m.restarts == 1
    assert m.latency_ms == {} and m.prompt_tok_s is None


def test_no_observations_leaves_latency_out_and_rates_zero() -> None:
    tracker = MetricsTracker()
    tracker.feed(fixture("vllm"), URL, t=0.0)
    m = tracker.feed(fixture("vllm"), URL, t=1.0)
    assert m.latency_ms == {}
    assert m.prompt_tok_s == 0.0 and m.generation_tok_s == 0.0
    assert m.restarts == 0


def test_failed_scrape_in_between_compares_with_last_good_page() -> None:
    tracker = MetricsTracker()
    tracker.feed(fixture("vllm"), URL, t=0.0)
    tracker.feed(fixture("vllm_restart"), URL, t=5.0)
    failed = tracker.feed("<html>oops</html>", URL, t=10.0)
    assert not failed.ok
    assert failed.restarts == 1  # carried on failed scrapes too
    m = tracker.feed(fixture("vllm"), URL, t=15.0)
    assert m.restarts == 1
    # (123456 - 1234) prompt tokens over the 10 s since the last good page
    assert m.prompt_tok_s == pytest.approx((123456.0 - 1234.0) / 10.0)


def test_unknown_engine_shows_gauges_generically() -> None:
    m = parse_metrics(fixture("unknown"), URL)
    assert m.engine == "unknown"
    assert m.generic == {"queue_length": 4.0}  # counters are not gauges
    many = "\n".join(f"# TYPE g{i} gauge\ng{i} {i}" for i in range(30)) + "\n"
    many = "# TYPE process_open_fds gauge\nprocess_open_fds 9\n" + many
    m = parse_metrics(many, URL)
    assert len(m.generic) == 20
    assert "process_open_fds" not in m.generic  # the engine's own gauges come first
    assert m.generic["g0"] == 0.0
    labelled = '# TYPE q gauge\nq{pool="a"} 1\nq{pool="b"} 2\n'
    assert parse_metrics(labelled, URL).generic == {'q{pool="a"}': 1.0, 'q{pool="b"}': 2.0}


def test_known_engines_have_no_generic() -> None:
    assert parse_metrics(fixture("vllm"), URL).generic == {}


INF = float("inf")


def test_histogram_quantile_as_prometheus() -> None:
    buckets = [(20.0, 0.0), (100.0, 50.0), (500.0, 100.0), (INF, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(100.0)
    assert histogram_quantile(0.9, buckets) == pytest.approx(420.0)
    # the lowest bucket starts at 0
    assert histogram_quantile(0.5, [(10.0, 4.0), (INF, 4.0)]) == pytest.approx(5.0)
    # a rank in the +Inf bucket: the highest finite bound
    assert histogram_quantile(0.99, [(10.0, 1.0), (50.0, 2.0), (INF, 10.0)]) == 50.0
    # no observations, no answer
    assert histogram_quantile(0.5, [(10.0, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(10.0, 3.0)]) is None  # not a whole histogram
    # counts that wobble downwards are made monotonic, as Prometheus does
    assert histogram_quantile(0.5, [(10.0, 6.0), (20.0, 5.9), (INF, 10.0)]) == pytest.approx(
        10.0 * 5.0 / 6.0
    )


def test_bucket_delta() -> None:
    a = [(1.0, 1.0), (INF, 2.0)]
    b = [(1.0, 4.0), (INF, 7.0)]
    assert bucket_delta(a, b) == [(1.0, 3.0), (INF, 5.0)]
    assert bucket_delta(b, a) is None  # went down: a reset
    assert bucket_delta(a, [(2.0, 4.0), (INF, 7.0)]) is None  # different layout


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


async def test_probe_keeps_previous_scrape_for_rates_and_latency(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    probe = ServerMetricsProbe(server.base + "/metrics", session)
    server.body = fixture("vllm")
    first = await probe.sample()
    assert first.ok and first.prompt_tok_s is None
    await asyncio.sleep(0.05)
    server.body = fixture("vllm_next")
    m = await probe.sample()
    assert m.ok
    assert m.prompt_tok_s is not None and m.prompt_tok_s > 0
    assert m.generation_tok_s is not None and m.generation_tok_s > 0
    assert m.latency_ms["ttft"] == pytest.approx(QUANTILES_MS)

    server.body = fixture("vllm_restart")
    m = await probe.sample()
    assert m.restarts == 1 and m.prompt_tok_s is None

    server.status = 503
    m = await probe.sample()
    assert not m.ok and m.restarts == 1


async def test_bearer_token_is_sent_and_not_leaked(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    server.status = 404
    probe = ServerMetricsProbe(server.base + "/metrics", session, authorization="Bearer s3cret")
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


def test_server_quantiles_cover_the_last_ten_seconds_not_one_scrape() -> None:
    """A 1 s scrape interval often holds no finished request; the quantiles still come from
    the observations of the last ~10 s, and age out after that."""
    tracker = MetricsTracker()
    tracker.feed(fixture("vllm"), URL, t=0.0)
    assert tracker.feed(fixture("vllm_next"), URL, t=1.0).latency_ms["ttft"] == \
        pytest.approx(QUANTILES_MS)
    quiet = tracker.feed(fixture("vllm_next"), URL, t=2.0)  # nothing new finished
    assert quiet.latency_ms["ttft"] == pytest.approx(QUANTILES_MS)
    assert quiet.generation_tok_s == 0.0  # the rate is the last interval's
    later = tracker.feed(fixture("vllm_next"), URL, t=12.5)
    assert later.latency_ms == {}  # the window no longer holds those observations


# ---- the KV pool's size (loadgen.eval.efficiency's KV per request)

CAPTURED_VLLM = (METRICS_DIR / "vllm_cpu_c8.txt").read_text()  # real vLLM 0.32 (CPU), 8 streams


def _label(text: str, key: str) -> str:
    """A label of vLLM's cache_config_info, read from the raw line (not through the parser)."""
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
    match = re.search(rf'[{{,]{key}="([^"]*)"', line)
    assert match is not None, key
    return match[1]


def test_vllm_pool_from_a_real_cache_config_info() -> None:
    m = parse_metrics(CAPTURED_VLLM, URL)
    blocks, block = int(_label(CAPTURED_VLLM, "num_gpu_blocks")), int(_label(CAPTURED_VLLM,
                                                                             "block_size"))
    assert m.kv_pool_tokens == blocks * block == 8192 * 128
    assert m.kv_pool_bytes == int(_label(CAPTURED_VLLM, "kv_cache_memory_bytes")) == 2 * 2**30
    assert m.gpu_memory_utilization == 0.92
    # under load: KV in use is usage × pool, 25 blocks of 128 tokens for 8 streams (vLLM V1
    # counts usage over the blocks less its null block: 25 / 8191, so 1/8192 off)
    assert m.kv_cache_usage is not None and m.running == 8.0
    assert m.kv_cache_usage == pytest.approx(25 / (blocks - 1), rel=1e-12)
    assert m.kv_cache_usage * m.kv_pool_tokens == pytest.approx(25 * block, rel=1e-3)


def _cache_info(engine: int, blocks: int, memory: str) -> str:
    return (f'vllm:cache_config_info{{block_size="16",engine="{engine}",'
            f'gpu_memory_utilization="0.9",kv_cache_memory_bytes="{memory}",'
            f'num_gpu_blocks="{blocks}"}} 1.0\n')


def test_vllm_pool_adds_up_over_engines_and_none_is_no_bytes() -> None:
    head = "# TYPE vllm:cache_config_info gauge\n"
    both = parse_metrics(head + _cache_info(0, 100, "None") + _cache_info(1, 50, "None"), URL)
    assert both.kv_pool_tokens == 150 * 16 and both.kv_pool_bytes is None
    assert both.gpu_memory_utilization == 0.9
    # bytes only when every engine states them: half a figure is no figure
    half = parse_metrics(head + _cache_info(0, 100, "4096") + _cache_info(1, 50, "None"), URL)
    assert half.kv_pool_bytes is None
    whole = parse_metrics(head + _cache_info(0, 100, "4096") + _cache_info(1, 50, "2048"), URL)
    assert whole.kv_pool_bytes == 6144
    # junk in a label is no figure, never an error
    junk = parse_metrics(head + _cache_info(0, 100, "lots").replace('"16"', '"x"'), URL)
    assert junk.ok and junk.kv_pool_tokens is None and junk.kv_pool_bytes is None


def test_pool_of_sglang_and_triton_and_none_where_the_engine_states_none() -> None:
    sglang = parse_metrics('sglang:token_usage{model_name="m"} 0.5\n'
                           'sglang:max_total_num_tokens{model_name="m"} 161721.0\n', URL)
    assert sglang.kv_pool_tokens == 161721
    triton = parse_metrics((METRICS_DIR / "triton.txt").read_text(), URL)
    assert triton.kv_pool_tokens == 8000 * 64  # max blocks × tokens per block, in the fixture
    # llama.cpp's real page (its KV gauges were removed upstream), and vLLM without the info
    for name in ("llamacpp.txt", "vllm.txt", "tgi.txt", "trtllm.txt"):
        m = parse_metrics((METRICS_DIR / name).read_text(), URL)
        assert (m.kv_pool_tokens, m.kv_pool_bytes, m.gpu_memory_utilization) == (None,) * 3, name
