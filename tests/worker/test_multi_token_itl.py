"""Per-token ITL when chunks carry several tokens and the server sends no per-chunk usage:
the final usage split over the chunks by their text, against the exact-timing simulator
(whose true per-token gap is exact_itl_ms however it groups tokens), with no usage at all,
and against a llama.cpp-like server that puts its cumulative usage on its last text chunk
only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import numpy as np
import pytest
from aiohttp import web
from support import serving

from loadgen.model import hdr
from loadgen.sim import start_sim
from loadgen.sim.model import SimConfig
from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.stream_measure import split_tokens

MODEL = "tokentop-sim"
TTFT_MS, ITL_MS = 30.0, 8.0
STREAMS, TOKENS = 4, 100


def body(max_tokens: int, model: str = MODEL, *, usage: bool = True) -> bytes:
    return json.dumps({
        "model": model, "messages": [{"role": "user", "content": "tell me more"}],
        "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": usage},  # usage at the end only, or none
    }).encode()


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The value below which a share q of the weight lies (numpy over the raw samples)."""
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1])])


def weighted_p50(values: np.ndarray, weights: np.ndarray) -> float:
    return weighted_quantile(values, weights, 0.5)


async def drive(
    url: str, n: int, max_tokens: int, model: str = MODEL, *, warm: bool = False,
    usage: bool = True,
) -> IntervalRecorder:
    """n streams at once through the real client; `warm`: over connections opened and
    used once before (so no connection setup is in what is measured)."""
    rec = IntervalRecorder()
    client = StreamingClient(url, rec, timeout=20.0)
    try:
        if warm:
            await asyncio.gather(*(client.request(body(2, model), 3) for _ in range(n)))
            rec.take()
        await asyncio.gather(*(client.request(body(max_tokens, model, usage=usage), 3)
                               for _ in range(n)))
    finally:
        client.close()
    return rec


@pytest.fixture
async def chunky_sim():
    """Exact timing, 1-4 tokens a chunk (the first alone), usage only at the end."""
    sim = await start_sim(SimConfig(exact_ttft_ms=TTFT_MS, exact_itl_ms=ITL_MS,
                                    exact_chunk_tokens_max=4), port=0)
    try:
        yield sim
    finally:
        await sim.close()


async def test_itl_is_per_token_when_chunks_carry_several_tokens(chunky_sim):
    rec = await drive(chunky_sim.url + "/chat/completions", STREAMS, TOKENS)
    v, w = np.frombuffer(rec.itl_v), np.frombuffer(rec.itl_w)
    icl = np.frombuffer(rec.icl)
    counters, hists, _ = rec.take()
    assert counters.requests_ok == STREAMS and counters.output_tokens == STREAMS * TOKENS
    # the chunks really carry several tokens: their gap is ~2.5 token gaps
    assert np.median(icl) > 1.8 * ITL_MS * 1000, np.median(icl)
    p50 = weighted_p50(v, w)
    assert abs(p50 - ITL_MS * 1000) <= 0.25 * ITL_MS * 1000, p50
    dense = hdr.dense_from_sparse([hists["itl"].arrays()])
    assert abs(hdr.summarize(dense)["p50"] - ITL_MS * 1000) <= 0.25 * ITL_MS * 1000
    # every token but the first is a gap: the weights add up to Σ(usage − the first
    # chunk's share), which is one token and a fraction of the spread (the first chunk is
    # one token long, so its share is a little over one)
    truth = STREAMS * (TOKENS - 1)
    assert truth - 0.03 * STREAMS * TOKENS <= w.sum() <= truth, (w.sum(), truth)
    # and they were all estimated (rounded per request)
    assert abs(counters.estimated_itl_tokens - w.sum()) <= STREAMS / 2


async def test_e2e_and_tpot_follow_the_exact_schedule(chunky_sim):
    rec = await drive(chunky_sim.url + "/chat/completions", STREAMS, TOKENS, warm=True)
    e2e, tpot = np.frombuffer(rec.e2e), np.frombuffer(rec.tpot)
    assert len(e2e) == len(tpot) == STREAMS
    # the last token is due ttft + itl·(n − 1) after the request arrived; sends land within
    # the loop's timer resolution, the client reads a little later still, and on a shared
    # 2-core machine one scheduling hiccup of a few ms can delay them all (the margin)
    truth_e2e = (TTFT_MS + ITL_MS * (TOKENS - 1)) * 1000
    assert np.all(e2e >= truth_e2e) and np.median(e2e) <= truth_e2e + 15_000, e2e
    assert np.all(np.abs(tpot - ITL_MS * 1000) <= 0.05 * ITL_MS * 1000), tpot


# ---- the split's bias: p50 and p99 against the true per-token gap

SPLIT_ITL_MS, SPLIT_STREAMS, SPLIT_TOKENS = 20.0, 6, 150


@pytest.fixture
async def varied_sim():
    """Exact timing, 1-4 tokens a chunk drawn per chunk (seeded), a 20 ms per-token gap:
    a tick of scheduling noise on this shared machine is a small share of it."""
    sim = await start_sim(SimConfig(exact_ttft_ms=TTFT_MS, exact_itl_ms=SPLIT_ITL_MS,
                                    exact_chunk_tokens_max=4), port=0)
    try:
        yield sim
    finally:
        await sim.close()


async def test_the_final_count_split_by_text_gives_the_true_gap_at_p50_and_p99(varied_sim):
    """Without per-chunk usage the final count is split over the chunks in proportion to
    their text; every true per-token gap is SPLIT_ITL_MS, so p50 and p99 must both be near
    it. Spreading the count evenly, or pulling each chunk toward the mean, leaves p50 near
    it but puts p99 tens of percent off (a 4-token chunk read as 2.5 tokens)."""
    rec = await drive(varied_sim.url + "/chat/completions", SPLIT_STREAMS, SPLIT_TOKENS,
                      warm=True)
    v, w = np.frombuffer(rec.itl_v), np.frombuffer(rec.itl_w)
    counters, hists, _ = rec.take()
    assert counters.output_tokens == SPLIT_STREAMS * SPLIT_TOKENS
    truth = SPLIT_ITL_MS * 1000
    p50, p99 = weighted_quantile(v, w, 0.5), weighted_quantile(v, w, 0.99)
    assert abs(p50 - truth) <= 0.05 * truth, p50
    assert abs(p99 - truth) <= 0.15 * truth, p99
    # whole tokens a chunk: the histogram rounds no fraction of a weight away, and reads
    # the same quantiles as the raw samples
    assert np.array_equal(w, np.round(w))
    summary = hdr.summarize(hdr.dense_from_sparse([hists["itl"].arrays()]))
    assert abs(summary["p50"] - truth) <= 0.05 * truth, summary
    assert abs(summary["p99"] - truth) <= 0.15 * truth, summary
    # every token after each stream's first is a gap, and all of them estimated
    assert w.sum() == SPLIT_STREAMS * (SPLIT_TOKENS - 1) == counters.estimated_itl_tokens


def test_the_split_is_whole_tokens_that_add_up_to_the_count_and_follow_each_share():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        sizes = rng.integers(1, 12, rng.integers(1, 40)).astype(np.float64)
        n = int(rng.integers(1, 5 * len(sizes)))
        k = split_tokens(n, sizes)
        assert k.sum() == n and np.array_equal(k, np.round(k)) and k[0] >= 1
        if n >= len(sizes):
            assert k.min() >= 1  # every text chunk carried a token
        quota = n * sizes / sizes.sum()  # the chunk's share of the count by its text
        if quota.min() >= 1:  # no minimum to meet: each within a token of its share
            assert np.abs(k - quota).max() < 1, (sizes, n, k)


async def test_with_no_usage_at_all_itl_is_the_chunk_gap_marked_estimated(varied_sim):
    rec = await drive(varied_sim.url + "/chat/completions", SPLIT_STREAMS, SPLIT_TOKENS,
                      warm=True, usage=False)
    v, w, icl = np.frombuffer(rec.itl_v), np.frombuffer(rec.itl_w), np.frombuffer(rec.icl)
    counters, _, _ = rec.take()
    assert counters.requests_ok == SPLIT_STREAMS
    # nothing says how many tokens a chunk carried: one each, so ITL is the chunk gap
    assert np.all(w == 1.0) and np.array_equal(np.sort(v), np.sort(icl))
    assert np.median(v) > 1.8 * SPLIT_ITL_MS * 1000  # which is far from the per-token gap
    # and said so: every gap estimated, as every output token
    assert counters.estimated_itl_tokens == len(icl)
    assert counters.estimated_output_tokens == counters.output_tokens > 0


# ---- a server whose cumulative usage rides on its last text chunk

# tokens as llama.cpp's tiny model sent them (../shared/captures/llamacpp/sse-chat.txt)
LLAMA_TOKENS = (" 2882", "w", "ore", "Station", " ocean", " 728", "18", " the")
LLAMA_GAP_S = 0.004


def _llama_chunk(choices: list, **extra) -> bytes:
    event = {"choices": choices, "created": 1795997815, "id": "chatcmpl-Fkmmy",
             "model": "tiny-llama", "system_fingerprint": "b0-unknown",
             "object": "chat.completion.chunk", **extra}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def _llama_stream(request: web.Request) -> web.StreamResponse:
    n = json.loads(await request.read())["max_tokens"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_llama_chunk([{"finish_reason": None, "index": 0,
                                    "delta": {"role": "assistant", "content": None}}]))
    for i in range(n):
        await asyncio.sleep(LLAMA_GAP_S)
        extra = {}
        if i == n - 1:  # the cumulative count, on the last text chunk only
            extra["usage"] = {"completion_tokens": n, "prompt_tokens": 17, "total_tokens": n + 17}
        token = LLAMA_TOKENS[i % len(LLAMA_TOKENS)]
        await resp.write(_llama_chunk([{"finish_reason": None, "index": 0,
                                        "delta": {"content": token}}], **extra))
    await resp.write(_llama_chunk([{"finish_reason": "length", "index": 0, "delta": {}}]))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture
async def llama_url() -> AsyncIterator[str]:
    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", _llama_stream)])
    async with serving(app) as base:
        yield f"{base}/v1/chat/completions"


async def test_usage_on_the_last_text_chunk_is_the_final_count_not_that_chunks(llama_url):
    n = 24
    rec = await drive(llama_url, 2, n, model="tiny-llama")
    v, w = np.frombuffer(rec.itl_v), np.frombuffer(rec.itl_w)
    counters, _, _ = rec.take()
    assert counters.requests_ok == 2
    assert counters.output_tokens == counters.completed_output_tokens == 2 * n
    assert counters.estimated_output_tokens == 0  # the usage came
    # one token a chunk, as the count confirms: n − 1 gaps each, none split into n pieces
    assert w.sum() == 2 * (n - 1) and np.all(w == 1.0)
    assert counters.estimated_itl_tokens == 0
    assert v.min() >= 0.5 * LLAMA_GAP_S * 1e6, v.min()
    assert counters.input_tokens == 2 * 17


def test_a_chunk_texts_pieces_are_the_patterns_count_whether_kept_or_not(monkeypatch):
    """pieces() keeps short texts' counts (perf): each kept count is the one the pattern
    gives, asked once or again; long texts are not kept, and the store stays bounded."""
    import re

    from loadgen.worker import stream_measure as sm

    # the truth: GPT-2's pre-split pattern, written out here, not the module's compiled one
    truth = re.compile(r" ?(?:[^\W\d_]+|\d{1,3}|[^\w\s]+|_+)|\s+")
    monkeypatch.setattr(sm, "_PIECES", {})
    monkeypatch.setattr(sm, "PIECES_KEPT", 50)
    texts = [" minim", "minim", ",", " 123", "12345", "don't", " ½", "é", " naïve", "\n\n",
             "__init__", "a b c", " ", "日本語", "x" * 40, " hello world, 2024!", ""]
    rng = np.random.default_rng(7)
    alphabet = list(" abcXYZ019_,.!?'é½\n\t日")
    texts += ["".join(rng.choice(alphabet, rng.integers(1, 12))) for _ in range(300)]
    for _ in range(2):  # asked again: the kept count
        for text in texts:
            assert sm.pieces(text) == (len(truth.findall(text)) or 1), repr(text)
            assert len(sm._PIECES) <= 50
    assert "x" * 40 not in sm._PIECES
