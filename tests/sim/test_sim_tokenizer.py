"""The simulator with a tokenizer (`SimConfig.tokenizer`): it counts prompts with it, writes
words that are one token each in it, and answers POST /tokenize in vLLM's and llama.cpp's
shapes. The truth is the tokenizer library's own encoding of the same text, in the test.
The tokenizer is trained here (word-level, with a BOS its post-processor adds)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from support import root, running_sim, tokentop
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from loadgen.sim.words import WORDS, SimTokenizer

PROMPT = "the quick fox and the lazy dog"


def train(path: Path, words: list[str]) -> Path:
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(words)] * 2, trainers.WordLevelTrainer(
        special_tokens=["[UNK]", "[BOS]"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", tok.token_to_id("[BOS]"))])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    # half the simulator's words only: it must pick those (a power of two of them)
    words = [*PROMPT.split(), *(w.strip() for w in WORDS[:20])]
    return train(tmp_path_factory.mktemp("tok") / "tokenizer.json", words)


async def _post(url: str, body: dict) -> tuple[int, dict | None]:
    """(status, the JSON answer; None when the answer is not JSON, e.g. aiohttp's 404)."""
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        text = await r.text()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, None


async def test_prompts_are_counted_with_the_tokenizer(tokenizer):
    truth = Tokenizer.from_file(str(tokenizer))
    with_bos = len(truth.encode(PROMPT).ids)
    assert with_bos == len(PROMPT.split()) + 1  # the BOS: so the counts below tell apart
    async with running_sim(tokenizer=str(tokenizer), chat_template_tokens=5) as sim:
        _, done = await _post(f"{sim.url}/completions", {
            "model": "tokentop-sim", "prompt": PROMPT, "max_tokens": 3})
        _, chat = await _post(f"{sim.url}/chat/completions", {
            "model": "tokentop-sim", "max_tokens": 3,
            "messages": [{"role": "user", "content": PROMPT}]})
    # completions as a server counts them (its BOS in); chat: the contents plus the template
    assert done["usage"]["prompt_tokens"] == with_bos
    assert chat["usage"]["prompt_tokens"] == with_bos - 1 + 5


async def test_every_written_word_is_one_token(tokenizer):
    truth = Tokenizer.from_file(str(tokenizer))
    n = 40
    async with (running_sim(tokenizer=str(tokenizer)) as sim, aiohttp.ClientSession() as s,
                s.post(f"{sim.url}/chat/completions", json={
                    "model": "tokentop-sim", "max_tokens": n, "stream": True,
                    "messages": [{"role": "user", "content": PROMPT}]}) as r):
        body = (await r.read()).decode()
    texts = [json.loads(line[6:])["choices"][0]["delta"].get("content")
             for line in body.split("\n\n") if line.startswith("data: {")]
    texts = [t for t in texts if t]
    assert len(texts) == n
    assert all(len(truth.encode(t, add_special_tokens=False).ids) == 1 for t in texts)
    assert "[UNK]" not in truth.encode("".join(texts), add_special_tokens=False).tokens
    assert len(truth.encode("".join(texts), add_special_tokens=False).ids) == n
    assert len(set(texts)) == 16  # the 20 words that fit, to a power of two


async def test_tokenize_answers_in_vllm_and_llamacpp_shapes(tokenizer):
    truth = Tokenizer.from_file(str(tokenizer))
    async with running_sim(tokenizer=str(tokenizer)) as sim:
        url = f"{root(sim)}/tokenize"
        _, vllm = await _post(url, {"model": "tokentop-sim", "prompt": PROMPT})
        _, bare = await _post(url, {"prompt": PROMPT, "add_special_tokens": False})
        _, llama = await _post(url, {"content": PROMPT})
        wrong, _ = await _post(url, {"model": "other", "prompt": PROMPT})
        empty, _ = await _post(url, {"text": PROMPT})
    assert vllm["tokens"] == truth.encode(PROMPT).ids and vllm["count"] == len(vllm["tokens"])
    assert bare["tokens"] == truth.encode(PROMPT, add_special_tokens=False).ids
    assert llama == {"tokens": bare["tokens"]}  # llama.cpp adds no special token by default
    assert (wrong, empty) == (404, 400)


async def test_no_tokenizer_no_tokenize_endpoint():
    async with running_sim() as sim:
        status, _ = await _post(f"{root(sim)}/tokenize", {"prompt": PROMPT})
    assert status == 404


def test_a_tokenizer_without_any_of_its_words_is_refused_in_words(tmp_path):
    path = train(tmp_path / "other.json", PROMPT.split())
    with pytest.raises(ValueError, match="none of the simulator's words"):
        SimTokenizer(str(path))
    done = tokentop("sim", "--port=0", f"--tokenizer={path}", timeout=30)
    assert done.returncode == 2
    line, = done.stderr.strip().splitlines()
    assert str(path) in line and "one token" in line
