"""Tokens per chunk by a local tokenizer (`--tokenizer PATH`) where the server sends no
per-chunk usage, for each tokenizer layout real models ship (tokenizer_families: built in
the test, nothing downloaded). The truths: the tokenizer's own count of a stream's whole
text, the simulator's words (one token each: a chunk's tokens are its words), and the
exact-timing simulator's per-token gap (every token `exact_itl_ms` after the one before,
however its chunks group them)."""

from __future__ import annotations

import asyncio
import json
import random
from time import perf_counter

import aiohttp
import numpy as np
import pytest
import support
from support import running_sim
from tokenizer_families import FAMILIES, PROSE, build, build_merging, save

from loadgen.sim.words import WORDS
from loadgen.worker.distributions import LengthDist
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.stream_measure import StreamMeasure
from loadgen.worker.tokenizer import ChunkTokens, chunk_check, path_lengths
from loadgen.worker.workload import PROMPT_WORDS, RequestFactory, Workload

ITL_MS, TOKENS, STREAMS = 10.0, 120, 3


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    return {family: build(family) for family in FAMILIES}


def count(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


def cut(text: str, seed: int) -> list[str]:
    """`text` in pieces of 1-12 characters, wherever they fall (in a word, a number, between
    punctuation), as incremental detokenization cuts a stream."""
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        j = i + rng.randint(1, 12)
        out.append(text[i:j])
        i = j
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_a_streams_chunk_counts_add_up_to_the_tokenizers_count_of_its_text(tokenizers, family):
    tok = tokenizers[family]
    # both far longer than the counted window, so it is cut many times
    for text in (PROSE * 4, "".join(WORDS) * 4):
        for seed in range(6):
            counter = ChunkTokens(tok).stream()
            assert sum(counter(piece) for piece in cut(text, seed)) == count(tok, text), seed


@pytest.mark.parametrize("family", FAMILIES)
def test_a_chunk_of_words_after_the_first_counts_its_words(tokenizers, family):
    """The simulator's words are one token each in every family after other text: a chunk
    of k of them is k tokens (in the SentencePiece layout counted alone it is k + 1)."""
    tok = tokenizers[family]
    rng = random.Random(1)
    counter = ChunkTokens(tok).stream()
    counter(WORDS[0])
    for _ in range(200):
        chunk = "".join(rng.choices(WORDS, k=rng.randint(1, 4)))
        assert counter(chunk) == len(chunk.split()), chunk


def test_the_start_check_passes_every_family_and_refuses_one_that_merges_across_spaces(
        tokenizers):
    for family, tok in tokenizers.items():
        assert chunk_check(tok, PROMPT_WORDS) == "", family
    why = chunk_check(build_merging(), PROMPT_WORDS)
    assert "merges tokens across spaces" in why


async def test_a_tokenizer_that_cannot_count_chunks_falls_back_to_the_estimate_in_words(
        tmp_path):
    merging = tmp_path / "merging"
    merging.mkdir()
    build_merging().save(str(merging / "tokenizer.json"))
    lengths = await path_lengths(str(merging), PROMPT_WORDS)
    assert "tokens per chunk estimated (est.)" in lengths.note
    assert "merges tokens across spaces" in lengths.note
    # the workers count no chunk with it: the stream is measured as without a tokenizer
    work = Workload(model="m", tokenizer=lengths.tokenizer, input_tokens=LengthDist.parse("8"))
    assert RequestFactory(work).chunk_tokens is None
    good = await path_lengths(str(save("llama2", tmp_path / "llama2")), PROMPT_WORDS)
    assert "tokens per chunk counted by it" in good.note
    assert RequestFactory(Workload(model="m", tokenizer=good.tokenizer)).chunk_tokens is not None


def _body() -> bytes:
    """No usage at all: the tokenizer's count is the only one."""
    return json.dumps({
        "model": "tokentop-sim", "messages": [{"role": "user", "content": "go on"}],
        "max_tokens": TOKENS, "stream": True, "ignore_eos": True,
    }).encode()


async def _measured(http: aiohttp.ClientSession, url: str, counter: ChunkTokens):
    """One stream fed to its own StreamMeasure as it arrives, and its chunks' texts read here
    from the same bytes, for the truth: (the recorder, the texts)."""
    rec = IntervalRecorder()
    measure = StreamMeasure(rec, perf_counter(), 2, chunk_tokens=counter)
    _, events = await support.measured_stream(http, url + "/chat/completions", _body(), measure)
    texts = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
    return rec, [t for t in texts if t]


@pytest.mark.parametrize("family", FAMILIES)
async def test_chunks_of_1_to_4_tokens_counted_by_each_family_give_the_true_itl(
        tokenizers, family):
    tok = tokenizers[family]
    counter = ChunkTokens(tok)
    async with running_sim(exact_ttft_ms=20.0, exact_itl_ms=ITL_MS,
                           exact_chunk_tokens_max=4) as sim, aiohttp.ClientSession() as http:
        streams = await asyncio.gather(*(_measured(http, sim.url, counter)
                                         for _ in range(STREAMS)))
    values, weights = [], []
    for rec, texts in streams:
        assert len(texts) < TOKENS * 0.6  # the chunks really carry several tokens
        # each chunk after the first is counted its words (the simulator's tokens)
        assert list(rec.itl_w) == [len(t.split()) for t in texts[1:]]
        values.append(np.frombuffer(rec.itl_v))
        weights.append(np.frombuffer(rec.itl_w))
        got, _, _ = rec.take()
        # the stream's tokens are the tokenizer's count of its whole text, and not estimated
        assert got.output_tokens == count(tok, "".join(texts))
        assert got.estimated_output_tokens == 0 and got.estimated_itl_tokens == 0
    v, w = np.concatenate(values), np.concatenate(weights)
    order = np.argsort(v)
    p50 = v[order][np.searchsorted(np.cumsum(w[order]), w.sum() / 2)]
    assert p50 == pytest.approx(ITL_MS * 1000, rel=0.05)
    assert (v * w).sum() / w.sum() == pytest.approx(ITL_MS * 1000, rel=0.05)  # per token
