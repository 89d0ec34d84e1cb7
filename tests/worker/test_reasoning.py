"""Reasoning models: TTFT (first text of any kind), TTFA (first answer text after the
reasoning) and the reasoning / answer token split, against the exact-timing simulator's
reasoning mode. The truth is the simulator's send stamps (`tokentop_sent_ns`) and its
schedule: the first token T after arrival, each next one I later, the first R reasoning."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from time import perf_counter

import aiohttp
import msgspec
import numpy as np
import pytest
import support
from aiohttp import web
from support import running_sim, serving, start_sim_process, tokentop
from tokenizer_families import build

from loadgen.sim.words import WORDS
from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.stream_measure import StreamMeasure
from loadgen.worker.tokenizer import ChunkTokens

T_MS, I_MS = 30.0, 5.0  # the simulator's exact TTFT and ITL
R, N = 6, 16  # reasoning tokens, output tokens a request
SLACK_MS = 3.0  # the client's error against a stamp: one shared 2-core machine
# against the schedule, the server's own lateness on that machine (its connection setup,
# its loop waking after a deadline) comes on top: the stamps are the tight truth. A fresh
# CI machine's first request of the module came 12.5 ms late on the schedule (its stamps
# within SLACK_MS all the same)
LATE_MS = 20.0


def body(*, usage: bool, continuous: bool) -> bytes:
    options = {"include_usage": usage, "continuous_usage_stats": continuous}
    return json.dumps({
        "model": "tokentop-sim", "messages": [{"role": "user", "content": "think first"}],
        "max_tokens": N, "stream": True, "ignore_eos": True, "stream_options": options,
    }).encode()


async def measured_stream(url: str, data: bytes) -> tuple[StreamMeasure, list[dict], int]:
    """One stream fed to a StreamMeasure as it arrives, and its chunks decoded here for the
    truth: (the measure, the chunks as JSON, the wall-clock send time in ns)."""
    async with aiohttp.ClientSession() as http:
        t0_ns = time.time_ns()
        measure = StreamMeasure(IntervalRecorder(), perf_counter(), 2, t0_wall_ns=t0_ns)
        _, chunks = await support.measured_stream(http, url + "/chat/completions", data,
                                                  measure)
    return measure, chunks, t0_ns


def delta(chunk: dict) -> dict:
    return chunk["choices"][0]["delta"] if chunk["choices"] else {}


def first_stamp(chunks: list[dict], key: str) -> int:
    return next(c["tokentop_sent_ns"] for c in chunks if delta(c).get(key))


async def test_the_simulators_reasoning_mode_streams_r_reasoning_tokens_then_the_answer():
    async with running_sim(exact_ttft_ms=T_MS, exact_itl_ms=I_MS, reasoning_tokens=R) as sim:
        _, chunks, t0_ns = await measured_stream(sim.url, body(usage=True, continuous=False))
    texts = [delta(c) for c in chunks if delta(c).get("content") or
             delta(c).get("reasoning_content")]
    assert [("reasoning_content" in d) for d in texts] == [True] * R + [False] * (N - R)
    # by the stamps: reasoning starts at T, the answer at T + R·I
    ttft = (first_stamp(chunks, "reasoning_content") - t0_ns) / 1e6
    ttfa = (first_stamp(chunks, "content") - t0_ns) / 1e6
    assert T_MS <= ttft <= T_MS + LATE_MS, ttft
    assert T_MS + R * I_MS <= ttfa <= T_MS + R * I_MS + LATE_MS, ttfa
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == N
    assert usage["completion_tokens_details"] == {"reasoning_tokens": R}


@pytest.mark.parametrize(("usage", "continuous"), [(True, True), (True, False), (False, False)])
async def test_ttft_and_ttfa_against_the_send_stamps(usage: bool, continuous: bool):
    async with running_sim(exact_ttft_ms=T_MS, exact_itl_ms=I_MS, reasoning_tokens=R) as sim:
        measure, chunks, t0_ns = await measured_stream(sim.url, body(usage=usage,
                                                                     continuous=continuous))
    rec = measure.rec
    assert len(rec.ttft) == 1 and len(rec.ttfa) == 1
    ttft, ttfa = rec.ttft[0] / 1e3, rec.ttfa[0] / 1e3  # ms
    # each against the stamp of the chunk it is defined by
    assert abs(ttft - (first_stamp(chunks, "reasoning_content") - t0_ns) / 1e6) < SLACK_MS
    assert abs(ttfa - (first_stamp(chunks, "content") - t0_ns) / 1e6) < SLACK_MS
    # and on the simulator's schedule
    assert T_MS <= ttft <= T_MS + LATE_MS, ttft
    assert T_MS + R * I_MS <= ttfa <= T_MS + R * I_MS + LATE_MS, ttfa
    # ITL spans both phases: every gap after the first token, reasoning and answer alike
    assert sum(rec.itl_w) == N - 1
    assert abs(float(np.median(np.frombuffer(rec.itl_v, np.float64))) / 1e3 - I_MS) < 1.0
    c = rec.counters
    assert (c.requests_ok, c.reasoning_requests) == (1, 1)
    assert (c.reasoning_tokens, c.answer_tokens) == (R, N - R)
    # from the usage's completion_tokens_details where it came, else counted from chunks
    assert c.estimated_reasoning_tokens == (0 if usage else R)


async def test_a_stream_without_reasoning_records_no_ttfa_and_no_split():
    async with running_sim(exact_ttft_ms=T_MS, exact_itl_ms=I_MS) as sim:
        measure, chunks, _ = await measured_stream(sim.url, body(usage=True, continuous=True))
    assert "completion_tokens_details" not in chunks[-1]["usage"]
    rec = measure.rec
    assert len(rec.ttft) == 1 and len(rec.ttfa) == 0
    counters, hists, _ = rec.take()
    assert "ttfa" not in hists and "ttft" in hists
    assert (counters.reasoning_requests, counters.reasoning_tokens, counters.answer_tokens) == (
        0, 0, 0)


def headless(port: int, out: Path) -> dict:
    done = tokentop("run", "--headless", f"--url=http://127.0.0.1:{port}/v1", "--workers=1",
                    "--concurrency=2", f"--output-tokens={N}", "--input-tokens=8",
                    "--tick=0.25", "--duration=1.5", "--json", str(out), "--no-record",
                    timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("reasoning", [R, 0])
async def test_the_command_line_summary_has_ttfa_and_the_split(tmp_path, reasoning: int):
    flags = ["--exact-ttft-ms", str(T_MS), "--exact-itl-ms", str(I_MS)]
    if reasoning:
        flags += ["--reasoning-tokens", str(reasoning)]
    sim, port = start_sim_process(*flags)
    try:
        summary = await asyncio.to_thread(headless, port, tmp_path / "summary.json")
    finally:
        sim.kill()
        sim.wait(timeout=10)
    latency = summary["latency_ms"]
    assert T_MS <= latency["ttft"]["p50"] <= T_MS + LATE_MS, latency["ttft"]
    if not reasoning:
        assert "ttfa" not in latency and "reasoning" not in summary
        return
    ok = summary["requests"]["ok"]
    assert ok > 10
    assert T_MS + R * I_MS <= latency["ttfa"]["p50"] <= T_MS + R * I_MS + LATE_MS, latency
    assert summary["reasoning"] == {
        "requests": ok, "reasoning_tokens": R * ok, "answer_tokens": (N - R) * ok,
        "reasoning_per_request": float(R), "answer_per_request": float(N - R),
        "counted_by": "server"}


def test_old_counters_without_the_reasoning_fields_still_decode():
    from loadgen.model.snapshot import Counters

    old = msgspec.json.decode(b'{"requests_ok": 3, "output_tokens": 9}', type=Counters)
    assert (old.requests_ok, old.reasoning_tokens, old.answer_tokens) == (3, 0, 0)


def test_a_negative_reasoning_count_is_refused_in_words():
    done = tokentop("sim", "--reasoning-tokens", "-1", "--port", "0", timeout=30)
    assert done.returncode != 0
    assert "reasoning_tokens must not be negative" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_latency_panel_shows_a_ttfa_row_only_when_the_window_has_ttfa_samples():
    from loadgen.model import hdr
    from loadgen.model.windows import WindowStats
    from tui.widgets.latency_panel import COLS, table

    def stats(ttfa_samples: int) -> WindowStats:
        dense = np.zeros(hdr.COUNTS_LEN, np.int64)
        dense[100] = ttfa_samples
        return WindowStats(name="10s", seconds=10.0, latency={"ttfa": hdr.summarize(dense)},
                           output_tok_s=None, input_tok_s=None, req_s=None, err_s=None,
                           requests_ok=0, requests_failed=0)

    def labels(lines: list[str]) -> list[str]:
        return [line.removeprefix("[b]")[:4] for line in lines[1:]]

    assert labels(table(stats(0), COLS, False)) == ["TTFT", "ITL ", "TPOT", "E2E "]
    assert labels(table(stats(5), COLS, False)) == ["TTFT", "TTFA", "ITL ", "TPOT", "E2E "]


# ---- a server that keeps the old `reasoning` field as an alias of `reasoning_content`

ALIAS_R = ALIAS_A = 32  # reasoning tokens, then answer tokens
ALIAS_GAP_S = 0.002


def _alias_event(choices: list, **extra) -> bytes:
    return b"data: " + json.dumps({"object": "chat.completion.chunk", "model": "m",
                                   "choices": choices, **extra}).encode() + b"\n\n"


def _alias_chunks() -> list[dict]:
    """The deltas: ALIAS_R reasoning tokens, each chunk's text sent in both fields, then
    ALIAS_A answer tokens; 1 and 2 tokens a chunk in turn (so the final count is split over
    the chunks by their text); the simulator's words, one token each."""
    out, k, size = [], 0, 1
    for start, end, answer in ((0, ALIAS_R, False), (ALIAS_R, ALIAS_R + ALIAS_A, True)):
        k = start
        while k < end:
            n = min(size, end - k)
            text = "".join(WORDS[(k + i) % len(WORDS)] for i in range(n))
            out.append({"content": text} if answer else
                       {"reasoning_content": text, "reasoning": text})
            k += n
            size = 3 - size
    return out


async def _alias_stream(request: web.Request) -> web.StreamResponse:
    """The deltas of _alias_chunks, and the final usage if asked, without the reasoning
    details (so the split is tokentop's to count)."""
    body = json.loads(await request.read())
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_alias_event([{"index": 0, "delta": {"role": "assistant"}}]))
    for delta in _alias_chunks():
        await asyncio.sleep(ALIAS_GAP_S)
        await resp.write(_alias_event([{"index": 0, "delta": delta}]))
    await resp.write(_alias_event([{"index": 0, "delta": {}, "finish_reason": "length"}]))
    if (body.get("stream_options") or {}).get("include_usage"):
        n = ALIAS_R + ALIAS_A
        await resp.write(_alias_event([], usage={"prompt_tokens": 3, "completion_tokens": n,
                                                 "total_tokens": n + 3}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture
async def alias_url():
    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", _alias_stream)])
    async with serving(app) as base:
        yield f"{base}/v1/chat/completions"


@pytest.mark.parametrize(("usage", "counted"), [(True, False), (True, True), (False, True)])
async def test_reasoning_sent_in_both_fields_is_counted_once(alias_url, usage, counted):
    """The final count split over the chunks by their text, or each chunk counted by a
    tokenizer: the reasoning's text is one field's, not both (without either, nothing
    counts the tokens of a chunk, so it is not asked here)."""
    chunk_tokens = ChunkTokens(build("byte_level")) if counted else None
    rec = IntervalRecorder()
    client = StreamingClient(alias_url, rec, timeout=20.0, chunk_tokens=chunk_tokens)
    data = json.dumps({"model": "m", "messages": [{"role": "user", "content": "think"}],
                       "max_tokens": ALIAS_R + ALIAS_A, "stream": True,
                       "stream_options": {"include_usage": usage}}).encode()
    try:
        await asyncio.gather(*(client.request(data, 1) for _ in range(2)))
    finally:
        client.close()
    c, _, _ = rec.take()
    assert c.requests_ok == c.reasoning_requests == 2
    assert (c.reasoning_tokens, c.answer_tokens) == (2 * ALIAS_R, 2 * ALIAS_A)
    assert c.output_tokens == 2 * (ALIAS_R + ALIAS_A)
