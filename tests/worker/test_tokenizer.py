"""`--tokenizer`: exact prompt lengths and tokens per chunk, with tokenizers this test builds
itself (byte-level BPE on a few sentences, and the layouts of tokenizer_families; nothing
downloaded), given to tokentop and to the simulator alike. The truths: the simulator's own
prompt counters, its exact-timing schedule, and the tokenizer library's count of the text
actually sent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web
from support import running_sim, scrape, tokentop
from tokenizer_families import save
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from loadgen.run.preflight import find_tokenize, resolve_lengths
from loadgen.sim import SimConfig, start_sim
from loadgen.sim.words import WORDS
from loadgen.worker.distributions import LengthDist
from loadgen.worker.tokenizer import path_lengths
from loadgen.worker.workload import PROMPT_WORDS, RequestFactory, Workload

ASKED = 100
PREFIX = 10


def train(path: Path, *, across_spaces: bool = False) -> Path:
    """A tiny byte-level BPE on sentences holding the prompt vocabulary and the simulator's
    words, each alone, at a start and after a space (so each is one token in every place).
    `across_spaces`: no pre-tokenizer, so merges span words (their counts do not add up)."""
    words = [*PROMPT_WORDS, *(w.strip() for w in WORDS)]
    sentences = [" ".join(words), " " + " ".join(words), *(f"{w} {w}" for w in words)]
    tok = Tokenizer(models.BPE())
    if across_spaces:
        sentences = [" ".join(words[i:i + 3]) for i in range(len(words))] * 4
        tok.decoder = decoders.Fuse()  # the tokens' text as it is, spaces and all
        trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sentences * 2, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("tok") / "model")  # a model folder, as on the hub


async def _run(url: str, tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "summary.json"
    done = await asyncio.to_thread(
        tokentop, "run", "--headless", f"--url={url}", "--workers=1", "--tick=0.25",
        "--json", str(out), "--no-record", *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


async def _prompt_counts(sim) -> tuple[float, float]:
    """(prompt tokens, requests) as the simulator counted them, every request included."""
    m = await scrape(sim.url.removesuffix("/v1") + "/metrics")
    return m["vllm:prompt_tokens_total"], m["vllm:request_success_total"]


@pytest.mark.parametrize(("api", "template"), [("chat", 0), ("completions", 0), ("chat", 7)])
async def test_asked_prompt_length_is_what_the_server_counts(tokenizer, tmp_path, api, template):
    async with running_sim(tokenizer=str(tokenizer), chat_template_tokens=template) as sim:
        summary = await _run(sim.url, tmp_path, f"--tokenizer={tokenizer}", f"--api={api}",
                             "--concurrency=2", "--duration=1.5", f"--input-tokens={ASKED}",
                             f"--shared-prefix={PREFIX}", "--output-tokens=8")
        prompt_tokens, requests = await _prompt_counts(sim)
    assert requests > 0
    # every request the server saw had exactly the asked length (its template's beside)
    assert prompt_tokens == requests * (ASKED + template)
    prompt = summary["tokens"]["input_per_request"]
    assert prompt["asked"] == ASKED and prompt["server"] == ASKED + template
    assert prompt["differs"] is (template > 0)  # 7 template tokens on 100: past 5 %


@pytest.mark.parametrize("choice", ["server", "auto"])
async def test_the_servers_tokenize_endpoint_builds_exact_prompts(tokenizer, tmp_path, choice):
    async with running_sim(tokenizer=str(tokenizer)) as sim:
        summary = await _run(sim.url, tmp_path, f"--tokenizer={choice}", "--api=completions",
                             "--concurrency=2", "--duration=1.5", f"--input-tokens={ASKED}",
                             "--output-tokens=8")
        prompt_tokens, requests = await _prompt_counts(sim)
    assert requests > 0 and prompt_tokens == requests * ASKED
    prompt = summary["tokens"]["input_per_request"]
    assert prompt["server"] == prompt["asked"] == ASKED and not prompt["differs"]


ITL_MS = 10.0


@pytest.mark.parametrize("family", ["byte_level", "llama2", "wordpiece"])
async def test_tokens_per_chunk_without_usage_give_the_true_per_token_itl(tmp_path, family):
    """Chunks of 1-4 tokens, usage at the end only: with the tokenizer each chunk's tokens are
    counted as it arrives, so ITL is the schedule's per-token gap, and not estimated; in
    each family's layout (tokenizer_families), Llama 2's SentencePiece one included, where
    a chunk counted alone is a token too many."""
    path = save(family, tmp_path / family)
    # the simulator counts with it too, where its words are one token alone in it (in the
    # Llama 2 layout " lorem" alone is two: the simulator writes its own words, a token each)
    sim = await start_sim(SimConfig(exact_ttft_ms=20.0, exact_itl_ms=ITL_MS,
                                    exact_chunk_tokens_max=4,
                                    tokenizer=None if family == "llama2" else str(path)),
                          host="127.0.0.1", port=0)
    try:
        summary = await _run(sim.url, tmp_path, f"--tokenizer={path}",
                             "--no-continuous-usage", "--concurrency=4", "--duration=2",
                             "--output-tokens=60")
    finally:
        await sim.close()
    lat = summary["latency_ms"]
    assert lat["icl"]["p50"] > 1.8 * ITL_MS  # the chunks really carry several tokens
    assert lat["itl"]["p50"] == pytest.approx(ITL_MS, rel=0.03), lat["itl"]
    assert summary["itl_estimated"] is False and summary["tokens"]["output_estimated"] is False


async def test_a_tokenizer_that_merges_across_spaces_cuts_prompts_to_length(tmp_path):
    path = train(tmp_path / "merging", across_spaces=True)
    lengths = await path_lengths(str(path), PROMPT_WORDS)
    assert lengths.words == () and "encode-and-trim" in lengths.note
    factory = RequestFactory(Workload(model="m", api="completions", tokenizer=lengths.tokenizer,
                                      input_tokens=LengthDist.parse("40")))
    truth = Tokenizer.from_file(str(path / "tokenizer.json"))
    for _ in range(20):
        body, asked, *_ = factory.next()
        prompt = msgspec.json.decode(body)["prompt"]
        # the length said is the count of what is sent, and that is the asked 40 (a cut
        # that merges anew may leave it a token or two short, never over)
        assert asked == len(truth.encode(prompt, add_special_tokens=False).ids)
        assert 38 <= asked <= 40


def test_output_length_is_held_with_min_tokens():
    body, *_ = RequestFactory(Workload(model="m", output_tokens=LengthDist.parse("37"))).next()
    sent = msgspec.json.decode(body)
    assert sent["ignore_eos"] is True and sent["min_tokens"] == sent["max_tokens"] == 37


# ---- a llama.cpp-shaped /tokenize: {"content"} → {"tokens"}, {"tokens": []} for any other body


async def test_a_llamacpp_tokenize_endpoint_is_found_and_used(tokenizer):
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    asked: list[dict] = []

    async def tokenize(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        asked.append(body)
        text = body.get("content")
        ids = tok.encode(text, add_special_tokens=False).ids if isinstance(text, str) else []
        return web.json_response({"tokens": ids})

    app = web.Application()
    app.add_routes([web.post("/tokenize", tokenize)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        async with aiohttp.ClientSession() as s:
            endpoint = await find_tokenize(s, base, "m", None)
            assert endpoint is not None and endpoint.shape == "llama.cpp"
            lengths = await resolve_lengths(s, base, "m", "server", None)
    finally:
        await runner.cleanup()
    assert lengths.source == "server" and len(lengths.words) == len(set(PROMPT_WORDS))
    assert len(asked) < 300  # a few hundred calls at most
    factory = RequestFactory(Workload(model="m", api="completions", one_token_words=lengths.words,
                                      input_tokens=LengthDist.parse("uniform:10:300")))
    for _ in range(20):
        body, n, *_ = factory.next()
        assert len(tok.encode(msgspec.json.decode(body)["prompt"],
                              add_special_tokens=False).ids) == n


# ---- what cannot be used: one line, exit 2


@pytest.mark.parametrize("kind", ["missing", "not_json", "folder"])
def test_a_tokenizer_that_does_not_load_is_one_line_and_exit_2(tmp_path, kind):
    path = tmp_path / "tok"
    if kind == "not_json":
        path.write_text("{not a tokenizer")
    elif kind == "folder":
        path.mkdir()
    done = tokentop("run", "--headless", f"--tokenizer={path}", "--duration=1", "--no-record",
                    timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in done.stderr


async def test_tokenizer_server_without_an_endpoint_is_exit_2():
    async with running_sim() as sim:
        done = await asyncio.to_thread(tokentop, "run", "--headless", f"--url={sim.url}",
                                       "--tokenizer=server", "--duration=1", "--no-record")
    assert done.returncode == 2
    assert "no tokenize endpoint" in done.stderr.strip().splitlines()[-1]


async def test_a_tokenize_on_a_connection_the_server_closed_is_sent_again() -> None:
    """A server that answers once per connection and drops the next request on it unanswered
    (as llama.cpp's closes its connections, unsaid): counting is idempotent, so the count is
    asked again on a new connection, not failed (CI saw `--tokenizer server` fail so)."""
    served: dict[int, int] = {}

    async def tokenize(request: web.Request) -> web.Response:
        conn = id(request.transport)
        served[conn] = served.get(conn, 0) + 1
        if served[conn] > 1:
            assert request.transport is not None
            request.transport.abort()
        return web.json_response({"tokens": [1, 2]})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        async with aiohttp.ClientSession() as http:
            endpoint = await find_tokenize(http, base, "m", None)
            assert endpoint is not None
            assert [await endpoint.one("hello world") for _ in range(3)] == [2, 2, 2]
    finally:
        await runner.cleanup()
    assert len(served) == 4  # the probe's connection, then a new one after each drop
