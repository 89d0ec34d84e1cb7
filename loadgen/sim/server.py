"""The simulator's HTTP face: an aiohttp server speaking the OpenAI wire format.

Endpoints: POST /v1/chat/completions and /v1/completions (stream and whole),
GET /v1/models, /health, /metrics (vLLM names, or another engine's with
`--metrics-dialect`), /sim/gpu (the simulated GPU), and GET/POST /sim/faults
(fault settings and injected counts; POST from loopback peers only, see faults.py),
GET /sim/arrivals (each completion request's arrival time, loopback peers only), and,
with a tokenizer (`SimConfig.tokenizer`), POST /tokenize in vLLM's and llama.cpp's shapes.

Requests, as the simulator reads them:

* prompt tokens = whitespace-separated words of the prompt (completions; a
  list of token ids counts its length) or of every message's text (chat, plus
  `chat_template_tokens`), at least 1; with a tokenizer, its count of those texts
  (see SimTokenizer), and the words written are those that are one token each in it;
* `max_tokens` (chat also `max_completion_tokens`), default 256, capped so
  that prompt + completion fits the KV budget; asking for more than fits is a
  400, as vLLM answers past max_model_len;
* `ignore_eos`: true generates exactly max_tokens; false draws a natural
  length (seeded), finish_reason "stop" when it ends first, else "length";
* `stream_options.include_usage` adds a last chunk with `"choices": []` and
  usage; `continuous_usage_stats` (with include_usage, as in vLLM) puts usage
  on every chunk;
* one choice only (`n` must be 1). Every generated token is one word, sent as
  one SSE chunk (or k words per chunk with `tokens_per_chunk` k > 1);
* exact-timing mode (`exact_ttft_ms` + `exact_itl_ms`): the scheduler is
  bypassed (and with it the mid-stream faults: only 500, 429 and slow first
  byte apply), every request's first token is due exactly `exact_ttft_ms`
  after it arrived and each next one `exact_itl_ms` later (by deadline, never
  by accumulated sleeps), and every chunk carries `"tokentop_sent_ns"`, the
  wall clock (time.time_ns) just before its write. The first token goes alone;
  later chunks carry `tokens_per_chunk` tokens, or 1..`exact_chunk_tokens_max`
  drawn per chunk (seeded), and each is written when the last token it carries
  is due, so the true per-token gap is `exact_itl_ms` however tokens are grouped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from loadgen.sim.faults import REQUEST_FAULTS, FaultConfig, Faults
from loadgen.sim.gpu import SimGpu
from loadgen.sim.metrics import CONTENT_TYPE
from loadgen.sim.model import DONE, BatchModel, ContextLengthError, Sequence, SimConfig
from loadgen.sim.prefix_cache import PrefixCache, prompt_units

log = logging.getLogger("loadgen.sim")

ANNOUNCE = "TOKENTOP_SIM_LISTENING"

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

# The text the simulated model "writes": one word per token, cycled.
WORDS = (
    " lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit",
    " sed", " do", " eiusmod", " tempor", " incididunt", " ut", " labore", " et",
    " dolore", " magna", " aliqua", " enim", " ad", " minim", " veniam", " quis",
    " nostrud", " exercitation", " ullamco", " laboris", " nisi", " aliquip", " ex", " ea",
)  # fmt: skip

# Everything of a content chunk after the token text, per API. A chunk is then
# head (per request) + tail (per word): one concatenation, no JSON encoding per token.
_CHAT_REST = b'"},"logprobs":null,"finish_reason":null}]'
_TEXT_REST = b'","logprobs":null,"finish_reason":null}]'


@dataclass(frozen=True)
class WordTable:
    """The words the simulated model writes, one token each, cycled: a power of two of them
    (the cycle is a mask), with their bytes and chunk tails precomputed."""

    words: tuple[str, ...]
    mask: int
    bytes: tuple[bytes, ...]
    chat_tails: tuple[bytes, ...]
    text_tails: tuple[bytes, ...]

    @classmethod
    def of(cls, words: tuple[str, ...]) -> WordTable:
        n = 1 << (len(words).bit_length() - 1)  # the most that are a power of two
        words = words[:n]
        raw = tuple(w.encode() for w in words)
        return cls(words, n - 1, raw, tuple(w + _CHAT_REST + b"}\n\n" for w in raw),
                   tuple(w + _TEXT_REST + b"}\n\n" for w in raw))

    def text(self, offset: int, n: int) -> str:
        return "".join(self.words[(offset + k) & self.mask] for k in range(n))


PLAIN_WORDS = WordTable.of(WORDS)


def _words(text: str) -> int:
    return len(text.split())


class SimTokenizer:
    """A local tokenizer the simulator counts with (`SimConfig.tokenizer`, a tokenizer.json
    or a folder holding one; read offline). Prompt tokens are its count of the prompt's
    text (a completion prompt with the special tokens it adds, as a server counts a BOS;
    chat message contents without, the template's tokens being `chat_template_tokens`);
    the words the model writes are those of WORDS that are one token each in it, alone (a
    chunk's text) and in a row; POST /tokenize answers with it. Raises ValueError in words
    when it cannot be loaded or none of WORDS fits."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        p = Path(path).expanduser()
        file = p / "tokenizer.json" if p.is_dir() else p
        try:
            self.tok = Tokenizer.from_str(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"tokenizer {path}: cannot read {file}: "
                             f"{getattr(e, 'strerror', None) or e}") from None
        except Exception as e:  # the library's own error, serde's message in it
            reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            raise ValueError(f"tokenizer {path}: {file.name} is not a tokenizer the "
                             f"`tokenizers` library can load ({reason})") from None
        fit = tuple(w for w in WORDS if self._one_token(w))
        if not fit:
            raise ValueError(f"tokenizer {path}: none of the simulator's words "
                             f"({WORDS[0].strip()}, {WORDS[1].strip()} …) is one token in it")
        self.table = WordTable.of(fit)
        cycle = "".join(self.table.words * 2)  # in a row, and across the cycle's wrap
        if self.content(cycle) != 2 * len(self.table.words):
            raise ValueError(f"tokenizer {path}: its counts of the simulator's words do not "
                             "add up in a row (it merges across spaces)")

    def _one_token(self, word: str) -> bool:
        """One token that is the word itself (an unknown word is one token too: [UNK])."""
        ids = self.tok.encode(word, add_special_tokens=False).ids
        return len(ids) == 1 and self.tok.decode(ids).strip() == word.strip()

    def ids(self, text: str, special: bool) -> list[int]:
        return self.tok.encode(text, add_special_tokens=special).ids

    def content(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def prompt(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=True).ids)
_DONE = b"data: [DONE]\n\n"
_SPLIT_CHAR = "é".encode()  # two bytes: a malformed_kind "split_utf8" splits it


class RequestError(Exception):
    """A request the server refuses, with the OpenAI-style error it answers."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind

    def response(self) -> web.Response:
        return error_response(self.status, str(self), self.kind)


def error_response(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


@dataclass
class CompletionRequest:
    model: str
    prompt_tokens: int
    max_tokens: int | None
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    cached_tokens: int | None = None  # served from the prefix cache (None: no cache)


def parse_request(body: Any, *, chat: bool, template_tokens: int = 0,
                  tokens: SimTokenizer | None = None) -> CompletionRequest:
    """Validate a completion body; raises RequestError(400) with a readable message.
    `template_tokens`: what a chat template adds to every chat prompt's count; `tokens`:
    the tokenizer that counts prompts (None: a token a word)."""
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str):
        raise RequestError(400, "`model` is required and must be a string.")
    count = _words if tokens is None else (tokens.content if chat else tokens.prompt)
    prompt_tokens = (_count_messages(body.get("messages"), count) + template_tokens if chat
                     else _count_prompt(body, count))
    max_tokens = body.get("max_tokens")
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = body["max_completion_tokens"]
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise RequestError(400, "`max_tokens` must be an integer of at least 1.")
    if body.get("n") not in (None, 1):
        raise RequestError(400, "The simulator serves one choice per request (`n` must be 1).")
    stream = _flag(body, "stream")
    ignore_eos = _flag(body, "ignore_eos")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError(400, "`stream_options` must be an object.")
    include_usage = stream and _flag(options, "include_usage")
    return CompletionRequest(
        model=model,
        prompt_tokens=max(1, prompt_tokens),
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and _flag(options, "continuous_usage_stats"),
    )


def _flag(obj: dict[str, Any], key: str, *, default: bool = False) -> bool:
    value = obj.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(400, f"`{key}` must be a boolean.")
    return value


def _count_messages(messages: Any, count: Callable[[str], int]) -> int:
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "`messages` is required and must be a non-empty list.")
    words = 0
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise RequestError(400, "Each message must be an object with a `role`.")
        content = message.get("content")
        if isinstance(content, str):
            words += count(content)
        elif isinstance(content, list):  # content parts: count the text ones
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words += count(part["text"])
        elif content is not None:
            raise RequestError(400, "A message's `content` must be a string or a list of parts.")
    return words


def _count_prompt(body: dict[str, Any], count: Callable[[str], int]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return count(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):  # token ids
            return len(prompt)
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return count(prompt[0])
        one = prompt[0] if len(prompt) == 1 else None
        if isinstance(one, list) and all(isinstance(t, int) for t in one):  # [[token ids]]
            return len(one)
        if len(prompt) > 1:
            raise RequestError(400, "The simulator serves one prompt per request.")
    raise RequestError(400, "`prompt` is required: a string or a list of token ids.")


class ChunkWriter:
    """Builds one request's SSE bytes from precomputed pieces."""

    def __init__(self, req: CompletionRequest, seq: Sequence, *, chat: bool, model: str,
                 table: WordTable = PLAIN_WORDS) -> None:
        self.chat = chat
        self.words, self.mask = table.bytes, table.mask
        self.req = req
        self.seq = seq
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.prefix = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{int(time.time())},'
            f'"model":{json.dumps(model)},"choices":['
        ).encode()
        self.open_text = b'{"index":0,"delta":{"content":"' if chat else b'{"index":0,"text":"'
        self.head = self.prefix + self.open_text
        self.tails = table.chat_tails if chat else table.text_tails
        self.rest = _CHAT_REST if chat else _TEXT_REST
        self.multi = False  # k tokens in one chunk (tokens_per_chunk > 1)
        # a reasoning model (chat only): tokens 0..reasoning-1 go as delta.reasoning_content
        self.reasoning = 0
        self.think_open = b'{"index":0,"delta":{"reasoning_content":"'
        self.think_head = self.prefix + self.think_open

    def role(self) -> bytes:
        return self._with_usage(
            b'{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]',
            0,
        )

    def tokens(self, start: int, end: int) -> bytes:
        """Chunks for tokens start..end-1: one token each, or all in one chunk if multi.
        Reasoning tokens and answer tokens never share a chunk (as a reasoning parser
        splits them)."""
        r = self.reasoning
        if start < r < end:
            return self._tokens(start, r, True) + self._tokens(r, end, False)
        return self._tokens(start, end, start < r)

    def _tokens(self, start: int, end: int, think: bool) -> bytes:
        seq = self.seq
        if self.multi and end - start > 1:
            return self.one_chunk(start, end)
        if self.req.continuous_usage:
            return b"".join(self._usage_token(k) for k in range(start, end))
        head = self.think_head if think else self.head
        tails, offset, mask = self.tails, seq.offset, self.mask
        if end - start == 1:
            return head + tails[(offset + start) & mask]
        return b"".join(head + tails[(offset + k) & mask] for k in range(start, end))

    def one_chunk(self, start: int, end: int) -> bytes:
        """One chunk carrying tokens start..end-1."""
        offset, words, mask = self.seq.offset, self.words, self.mask
        text = b"".join(words[(offset + k) & mask] for k in range(start, end))
        opening = self.think_open if start < self.reasoning else self.open_text
        return self._with_usage(opening + text + self.rest, end)

    def empty(self, completion: int) -> bytes:
        """A chunk with no choices at all (the empty_choices fault)."""
        return self._with_usage(b"]", completion)

    def malformed(self, kind: str, k: int) -> bytes:
        """One broken chunk in place of token k (the malformed fault)."""
        word = self.words[(self.seq.offset + k) & self.mask]
        if kind == "bad_json":  # the JSON is cut short
            return self.head + word + b'"}\n\n'
        if kind == "missing_data":  # a whole chunk without the `data:` field name
            return self.tokens(k, k + 1).removeprefix(b"data: ")
        # split_utf8: one two-byte character split across two events
        first, second = _SPLIT_CHAR[:1], _SPLIT_CHAR[1:]
        return self.head + first + self.rest + b"}\n\n" + self.head + second + self.rest + b"}\n\n"

    def empty_ending(self) -> bytes:
        """The end of an empty_choices stream: the usage chunk if asked for, and [DONE]."""
        out = b""
        if self.req.include_usage:
            out = self.prefix + b"]" + self._usage(self.seq.generated, True) + b"}\n\n"
        return out + _DONE

    def _usage_token(self, k: int) -> bytes:
        word = self.words[(self.seq.offset + k) & self.mask]
        if self.chat:
            choice = (self.think_open if k < self.reasoning else
                      b'{"index":0,"delta":{"content":"') + word + _CHAT_REST
        else:
            choice = b'{"index":0,"text":"' + word + _TEXT_REST
        return self._with_usage(choice, k + 1)

    def ending(self) -> bytes:
        """The finish_reason chunk, the usage chunk if asked for, and [DONE]."""
        seq = self.seq
        reason = json.dumps(seq.finish_reason).encode()
        if self.chat:
            choice = b'{"index":0,"delta":{},"logprobs":null,"finish_reason":' + reason + b"}]"
        else:
            choice = b'{"index":0,"text":"","logprobs":null,"finish_reason":' + reason + b"}]"
        out = self._with_usage(choice, seq.generated)
        if self.req.include_usage:
            out += self.prefix + b"]" + self._usage(seq.generated, True) + b"}\n\n"
        return out + _DONE

    def _with_usage(self, choices_rest: bytes, completion: int) -> bytes:
        usage = self._usage(completion) if self.req.continuous_usage else b""
        return self.prefix + choices_rest + usage + b"}\n\n"

    def _usage(self, completion: int, final: bool = False) -> bytes:
        """The usage object; the final one also says the prompt's tokens the prefix cache
        served (not every chunk's: the per-chunk bytes stay what they were)."""
        prompt = self.seq.prompt_tokens
        usage = b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d' % (
            prompt,
            completion,
            prompt + completion,
        )
        if final and self.req.cached_tokens is not None:
            usage += b',"prompt_tokens_details":{"cached_tokens":%d}' % self.req.cached_tokens
        if self.reasoning:  # as OpenAI reports a reasoning model's share of the completion
            usage += b',"completion_tokens_details":{"reasoning_tokens":%d}' % min(
                completion, self.reasoning)
        return usage + b"}"


def completion_text(seq: Sequence, table: WordTable = PLAIN_WORDS) -> str:
    return table.text(seq.offset, seq.generated)


def stamp(data: bytes, ns: int) -> bytes:
    """Every JSON event of `data` with "tokentop_sent_ns" added (exact-timing mode)."""
    return data.replace(b"}\n\n", b',"tokentop_sent_ns":%d}\n\n' % ns)


def is_loopback(remote: str | None) -> bool:
    """True for a loopback peer address (127.0.0.0/8, ::1, ::ffff:127.x)."""
    if not remote:
        return False
    try:
        addr = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


ARRIVALS_KEPT = 100_000  # arrival times kept for GET /sim/arrivals (about 1 MB)


class SimServer:
    """The aiohttp application around one BatchModel, its SimGpu and its Faults."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        # counts prompts and picks the words written (None: a token a word)
        self.tokens = SimTokenizer(cfg.tokenizer) if cfg.tokenizer else None
        self.words = self.tokens.table if self.tokens else PLAIN_WORDS
        self.faults = Faults(cfg.faults)
        self.engine = BatchModel(cfg, self.faults)
        size = cfg.kv_tokens if cfg.prefix_cache_tokens is None else cfg.prefix_cache_tokens
        self.prefix_cache = PrefixCache(size, cfg.prefix_block_tokens) if size else None
        self.engine.prefix_cache = self.prefix_cache  # its counters go into /metrics
        self.gpu = SimGpu(self.engine)
        self.created = int(time.time())
        self.inflight = 0  # completion requests being answered right now
        self.outage_active = False
        self.runner: web.AppRunner | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self._outage_task: asyncio.Task[None] | None = None
        self.unauthorized = 0  # /v1 requests refused for a missing or wrong Authorization
        # loop.time() (CLOCK_MONOTONIC) of each completion request's arrival, the newest
        # ARRIVALS_KEPT: the arrival process as the server saw it (GET /sim/arrivals)
        self.arrivals: deque[float] = deque(maxlen=ARRIVALS_KEPT)
        app = web.Application(middlewares=[self._authenticate])
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._chat),
                web.post("/v1/completions", self._completions),
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.get("/metrics", self._metrics),
                web.get("/sim/gpu", self._gpu),
                web.get("/sim/faults", self.get_faults),
                web.post("/sim/faults", self.post_faults),
                web.get("/sim/arrivals", self._arrivals),
            ]
        )
        if self.tokens is not None:  # a server without a tokenizer has no such endpoint
            app.add_routes([web.post("/tokenize", self._tokenize)])
        self.app = app

    @web.middleware
    async def _authenticate(self, request: web.Request, handler):
        """With `require_authorization`, /v1/* wants exactly that Authorization header."""
        want = self.cfg.require_authorization
        if want is None or not request.path.startswith("/v1/"):
            return await handler(request)
        if request.headers.get("Authorization") != want:
            self.unauthorized += 1
            return web.json_response(
                {"error": {"message": "invalid or missing credentials", "type": "auth_error",
                           "code": 401}}, status=401)
        return await handler(request)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        arrived = asyncio.get_running_loop().time()
        self.arrivals.append(arrived)
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            message = f"The request body is not valid JSON: {exc}"
            return error_response(400, message, "BadRequestError")
        try:
            req = parse_request(body, chat=chat, template_tokens=self.cfg.chat_template_tokens,
                                tokens=self.tokens)
        except RequestError as exc:
            return exc.response()
        if req.model != self.cfg.model_name:
            return error_response(404, f"The model `{req.model}` does not exist.", "NotFoundError")
        if self.prefix_cache is not None:
            req.cached_tokens = self.prefix_cache.lookup(prompt_units(body, chat, self._units))
        faults = self.faults
        settings = faults.cfg
        fault = faults.draw(stream=req.stream)
        self.inflight += 1
        try:
            if settings.slow_first_byte_ms > 0:
                faults.count("slow_first_byte")
                await asyncio.sleep(settings.slow_first_byte_ms / 1000.0)
            if fault == "http_500":
                faults.count("http_500")
                return error_response(
                    500, "Simulated internal server error (injected fault).", "InternalServerError"
                )
            if fault == "http_429":
                faults.count("http_429")
                resp = error_response(
                    429, "Simulated rate limit (injected fault).", "RateLimitError"
                )
                resp.headers["Retry-After"] = str(math.ceil(settings.retry_after_s))
                resp.headers["retry-after-ms"] = str(round(settings.retry_after_s * 1000))
                return resp
            if self.cfg.exact:
                return await self._exact(request, req, arrived, chat=chat)
            try:
                seq = self.engine.submit(
                    req.prompt_tokens, req.max_tokens, req.ignore_eos, stream=req.stream,
                    cached=req.cached_tokens or 0,
                )
            except ContextLengthError as exc:
                return error_response(400, str(exc), "BadRequestError")
            try:
                if req.stream:
                    return await self._stream(request, req, seq, fault, chat=chat)
                return await self._whole(req, seq, chat=chat)
            finally:
                # The client went away (CancelledError, ConnectionResetError) or the stream
                # ended: either way the slot and the KV go back now. A no-op when finished.
                self.engine.abort(seq)
        finally:
            self.inflight -= 1

    def _writer(self, req: CompletionRequest, seq: Sequence, *, chat: bool) -> ChunkWriter:
        writer = ChunkWriter(req, seq, chat=chat, model=self.cfg.model_name, table=self.words)
        writer.multi = self.cfg.tokens_per_chunk > 1
        writer.reasoning = self.cfg.reasoning_tokens if chat else 0
        return writer

    async def _stream(
        self,
        request: web.Request,
        req: CompletionRequest,
        seq: Sequence,
        fault: str | None,
        *,
        chat: bool,
    ) -> web.StreamResponse:
        engine = self.engine
        writer = self._writer(req, seq, chat=chat)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        # a mid-stream fault strikes once this many tokens were sent (0: none)
        empty = fault == "empty_choices"  # the whole stream is the fault
        fault_at = max(1, seq.target // 2) if fault is not None and not empty else 0
        try:
            await resp.prepare(request)
            if chat and not empty:
                await resp.write(writer.role())
            sent = 0
            while True:
                if seq.generated == sent and not seq.done:
                    await engine.wait(seq)
                generated = seq.generated
                if generated > sent:
                    if fault_at and generated >= fault_at:
                        after = await self._strike(request, resp, writer, fault, sent, fault_at)
                        if after is None:
                            return resp
                        sent, fault_at = after, 0
                        continue  # a stall let more tokens come: write them all now
                    data = writer.empty(generated) if empty else writer.tokens(sent, generated)
                    sent = generated
                    await resp.write(data)
                elif seq.done:
                    break
            if seq.finish_reason == "abort":
                # Shut down under us: end the stream without [DONE], as a dying server would.
                resp.force_close()
                return resp
            await resp.write(writer.empty_ending() if empty else writer.ending())
            await resp.write_eof()
            if empty:
                self.faults.count("empty_choices")
        except ConnectionResetError:
            pass  # the client left; the finally in _complete frees the slot
        return resp

    async def _strike(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        writer: ChunkWriter,
        fault: str | None,
        sent: int,
        fault_at: int,
    ) -> int | None:
        """Tokens up to the fault point, then the fault: the tokens now sent, None if the end."""
        faults = self.faults
        if fault == "malformed":
            # token fault_at - 1 goes out malformed
            if fault_at - 1 > sent:
                await resp.write(writer.tokens(sent, fault_at - 1))
            faults.count("malformed")
            await resp.write(writer.malformed(faults.cfg.malformed_kind, fault_at - 1))
            return fault_at
        if fault_at > sent:
            await resp.write(writer.tokens(sent, fault_at))
        if fault == "stall":
            faults.count("stall")
            await asyncio.sleep(faults.cfg.stall_s)
            return fault_at
        if fault == "drop":
            faults.count("drop")
            # Close the connection with no terminating chunk: what a crashing server does.
            resp.force_close()
            if request.transport is not None:
                request.transport.close()
            return None
        return fault_at

    async def _exact(
        self, request: web.Request, req: CompletionRequest, arrived: float, *, chat: bool
    ) -> web.StreamResponse:
        """Exact-timing mode: fixed TTFT and ITL by deadline, every chunk stamped."""
        engine = self.engine
        cfg = self.cfg
        try:
            target, reason = engine.plan_length(req.prompt_tokens, req.max_tokens, req.ignore_eos)
        except ContextLengthError as exc:
            return error_response(400, str(exc), "BadRequestError")
        loop = asyncio.get_running_loop()
        ttft = (cfg.exact_ttft_ms or 0.0) / 1000.0
        itl = (cfg.exact_itl_ms or 0.0) / 1000.0
        seq = Sequence(req.prompt_tokens, target, reason, arrived)
        seq.offset = engine.rng_offset()
        metrics = engine.metrics
        metrics.arrived += 1
        engine.exact_running += 1
        try:
            if not req.stream:
                await _sleep_until(loop, arrived + ttft + itl * (target - 1))
                seq.generated = target
                seq.state = DONE
                seq.finish_reason = reason
                self._exact_account(seq, arrived, ttft, itl, loop.time())
                return await self._whole(req, seq, chat=chat)
            writer = self._writer(req, seq, chat=chat)
            resp = web.StreamResponse(headers=SSE_HEADERS)
            with contextlib.suppress(ConnectionResetError):  # the client left
                await self._exact_stream(request, resp, writer, arrived, ttft, itl)
            return resp
        finally:
            engine.exact_running -= 1

    async def _exact_stream(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        writer: ChunkWriter,
        arrived: float,
        ttft: float,
        itl: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        seq = writer.seq
        metrics = self.engine.metrics
        await resp.prepare(request)
        if writer.chat:
            await resp.write(stamp(writer.role(), time.time_ns()))
        target = seq.target
        writer.multi = True  # a chunk of several tokens is one chunk, as with the scheduler
        sizes = self._exact_chunk_sizes(seq)
        k = 0
        while k < target:
            end = min(target, k + next(sizes))
            # a chunk goes out when its last token is due: the per-token truth stays exact
            await _sleep_until(loop, arrived + ttft + itl * (end - 1))
            data = writer.tokens(k, end)
            seq.generated = end
            await resp.write(stamp(data, time.time_ns()))
            now = loop.time()
            if k == 0:  # the first token goes alone
                metrics.ttft.observe(now - arrived)
                metrics.prompt_tokens += seq.prompt_tokens
            else:
                metrics.itl.observe((now - seq.last_token_t) / (end - k), end - k)
            seq.last_token_t = now
            metrics.generation_tokens += end - k
            k = end
        seq.state = DONE
        seq.finish_reason = seq.target_reason
        metrics.finished(seq.target_reason, seq.prompt_tokens, target)
        metrics.e2e.observe(seq.last_token_t - arrived)
        metrics.queue.observe(0.0)
        await resp.write(stamp(writer.ending(), time.time_ns()))
        await resp.write_eof()

    def _exact_chunk_sizes(self, seq: Sequence) -> Iterator[int]:
        """Tokens per chunk in exact-timing mode: the first alone (as vLLM sends it), then
        tokens_per_chunk, or 1..exact_chunk_tokens_max drawn per chunk (seeded: the
        request's text offset comes from the engine's seeded generator)."""
        yield 1
        top = self.cfg.exact_chunk_tokens_max
        if top <= 1:
            yield from itertools.repeat(self.cfg.tokens_per_chunk)
            return
        rng = random.Random(seq.offset)
        while True:
            yield rng.randint(1, top)

    def _exact_account(
        self, seq: Sequence, arrived: float, ttft: float, itl: float, now: float
    ) -> None:
        """/metrics for a whole (non-streamed) exact-timing response."""
        metrics = self.engine.metrics
        metrics.ttft.observe(ttft)
        if seq.generated > 1:
            metrics.itl.observe(itl, seq.generated - 1)
        metrics.prompt_tokens += seq.prompt_tokens
        metrics.generation_tokens += seq.generated
        metrics.finished(seq.finish_reason or "length", seq.prompt_tokens, seq.generated)
        metrics.e2e.observe(now - arrived)
        metrics.queue.observe(0.0)

    def _units(self, text: str) -> list:
        """A prompt text's units for the prefix cache: its tokens as the simulator counts
        them (the tokenizer's ids, else its words)."""
        return text.split() if self.tokens is None else self.tokens.ids(text, False)

    async def _whole(self, req: CompletionRequest, seq: Sequence, *, chat: bool) -> web.Response:
        while not seq.done:
            await self.engine.wait(seq)
        if seq.finish_reason == "abort":
            return error_response(503, "The server is shutting down.", "ServiceUnavailableError")
        text = completion_text(seq, self.words)
        if chat:
            rid, obj = f"chatcmpl-{uuid.uuid4().hex}", "chat.completion"
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
            }
        else:
            rid, obj = f"cmpl-{uuid.uuid4().hex}", "text_completion"
            choice = {"index": 0, "text": text}
        choice["logprobs"] = None
        choice["finish_reason"] = seq.finish_reason
        return web.json_response(
            {
                "id": rid,
                "object": obj,
                "created": int(time.time()),
                "model": self.cfg.model_name,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": seq.prompt_tokens,
                    "completion_tokens": seq.generated,
                    "total_tokens": seq.prompt_tokens + seq.generated,
                    **({} if req.cached_tokens is None else
                       {"prompt_tokens_details": {"cached_tokens": req.cached_tokens}}),
                },
            }
        )

    async def _tokenize(self, request: web.Request) -> web.Response:
        """POST /tokenize: vLLM's and SGLang's shape ({"prompt", "add_special_tokens"
        (default true)} → {"count", "max_model_len", "tokens"}) or llama.cpp's ({"content",
        "add_special" (default false)} → {"tokens"}), by the simulator's tokenizer."""
        assert self.tokens is not None
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            return error_response(400, f"The body is not valid JSON: {exc}", "BadRequestError")
        if not isinstance(body, dict):
            return error_response(400, "The body must be a JSON object.", "BadRequestError")
        model = body.get("model")
        if model is not None and model != self.cfg.model_name:
            return error_response(404, f"The model `{model}` does not exist.", "NotFoundError")
        try:
            if isinstance(body.get("prompt"), str):
                special = _flag(body, "add_special_tokens", default=True)
                ids = self.tokens.ids(body["prompt"], special)
                return web.json_response({"count": len(ids), "max_model_len": self.cfg.kv_tokens,
                                          "tokens": ids})
            if isinstance(body.get("content"), str):
                ids = self.tokens.ids(body["content"], _flag(body, "add_special"))
                return web.json_response({"tokens": ids})
        except RequestError as exc:
            return exc.response()
        return error_response(400, "`prompt` (vLLM) or `content` (llama.cpp) is required: "
                              "a string.", "BadRequestError")

    async def _models(self, _request: web.Request) -> web.Response:
        name = self.cfg.model_name
        model = {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "tokentop",
            "root": name,
            "parent": None,
            "max_model_len": self.cfg.kv_tokens,
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = self.engine.render_metrics().encode()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _gpu(self, _request: web.Request) -> web.Response:
        return web.json_response(self.gpu.sample())

    async def _arrivals(self, request: web.Request) -> web.Response:
        """The arrival times (seconds, CLOCK_MONOTONIC) of the latest completion requests:
        what a load generator's arrival process looked like here. Loopback peers only."""
        if not is_loopback(request.remote):
            return error_response(
                403, "Arrival times are only served to loopback.", "PermissionDeniedError"
            )
        return web.json_response(list(self.arrivals))

    # ---- faults

    async def get_faults(self, _request: web.Request) -> web.Response:
        return web.json_response(self.faults.snapshot(outage_active=self.outage_active))

    async def post_faults(self, request: web.Request) -> web.Response:
        """Change fault settings mid-run: loopback peers only (anything else: 403)."""
        if not is_loopback(request.remote):
            return error_response(
                403, "Fault control is only accepted from loopback.", "PermissionDeniedError"
            )
        try:
            changes = json.loads(await request.read())
        except ValueError as exc:
            return error_response(400, f"The body is not valid JSON: {exc}", "BadRequestError")
        if not isinstance(changes, dict):
            return error_response(400, "The body must be a JSON object.", "BadRequestError")
        try:
            cfg = self.faults.cfg.updated(changes)
        except (TypeError, ValueError) as exc:
            return error_response(400, str(exc), "BadRequestError")
        if cfg.outage_s > 0 and self.outage_active:
            return error_response(409, "An outage is already under way.", "ConflictError")
        # The outage is an action, not a standing setting: do it, and keep 0 in the settings.
        outage_s, after_s = cfg.outage_s, cfg.outage_after_s
        if outage_s > 0:
            cfg = cfg.updated({"outage_s": 0.0, "outage_after_s": 0.0})
        self.faults.apply(cfg)
        if outage_s > 0:
            if after_s > 0:
                self.schedule_outage(outage_s, after_s)
            else:
                await self.begin_outage(outage_s)  # listening stops before we answer
        return web.json_response(self.faults.snapshot(outage_active=self.outage_active))

    def schedule_outage(self, seconds: float, after_s: float) -> None:
        async def later() -> None:
            await asyncio.sleep(after_s)
            await self.begin_outage(seconds)

        self._outage_task = asyncio.get_running_loop().create_task(later())

    async def begin_outage(self, seconds: float) -> None:
        """A restart: stop listening now, drop every connection, listen again after `seconds`."""
        runner = self.runner
        if runner is None or self.outage_active:
            return
        self.outage_active = True
        self.faults.count("outage")
        for site in list(runner.sites):
            await site.stop()  # closes the listening socket: new connects are refused
        log.info("simulated outage: not listening for %g s", seconds)
        self._outage_task = asyncio.get_running_loop().create_task(self._outage(seconds))

    async def _outage(self, seconds: float) -> None:
        runner = self.runner
        assert runner is not None
        try:
            # Let the answer to whoever asked for this go out first.
            await asyncio.sleep(0.02)
            self.faults.count("outage_dropped", self.inflight)
            if runner.server is not None:
                for conn in runner.server.connections:
                    conn.force_close()
            self.engine.restart()  # a new process: every request gone, counters from zero
            await asyncio.sleep(max(0.0, seconds - 0.02))
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            log.info("simulated outage over: listening again on port %d", self.port)
        finally:
            self.outage_active = False

    async def close(self) -> None:
        task, self._outage_task = self._outage_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    """Sleep until the loop clock reads `deadline` (by deadline, so errors never accumulate).

    No busy-wait for the last millisecond: on a small machine the spin steals the very
    CPU the client under test needs, and the truth is in each chunk's send stamp anyway
    (`tokentop_sent_ns`), which is what calibration compares against. Sends land within
    the event loop's timer resolution (~1 ms) of the deadline.
    """
    delay = deadline - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


@dataclass
class RunningSim:
    """A simulator listening on a port; `close()` stops it."""

    host: str
    port: int
    server: SimServer
    _runner: web.AppRunner

    @property
    def url(self) -> str:
        """The OpenAI base URL, e.g. http://127.0.0.1:8000/v1."""
        return f"http://{_connect_host(self.host)}:{self.port}/v1"

    @property
    def model(self) -> BatchModel:
        """The engine model (queues, counters), for tests and the console."""
        return self.server.engine

    @property
    def gpu(self) -> SimGpu:
        return self.server.gpu

    async def close(self) -> None:
        # Stop the engine first: every open request ends ("abort"), so handlers return
        # at once and the runner does not wait out its shutdown timeout.
        await self.server.close()
        await self.server.engine.stop()
        await self._runner.cleanup()


def _connect_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


async def start_sim(
    cfg: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> RunningSim:
    """Start a simulator in the running loop; port 0 picks a free port. Raises OSError."""
    server = SimServer(cfg or SimConfig())
    # handler_cancellation: a client that disconnects while its request waits in the
    # queue (no write to fail yet) still frees its place at once.
    runner = web.AppRunner(
        server.app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    server.engine.start()
    server.gpu.sample()  # anchor the GPU's clock: energy counts from here
    bound = runner.addresses[0][1]
    server.runner, server.host, server.port = runner, host, bound
    outage = server.faults.cfg
    if outage.outage_s > 0:  # asked for at start: one outage, outage_after_s from now
        server.schedule_outage(outage.outage_s, outage.outage_after_s)
        server.faults.apply(outage.updated({"outage_s": 0.0, "outage_after_s": 0.0}))
    return RunningSim(host=host, port=bound, server=server, _runner=runner)


# ---- serving until told to stop


def serve_forever(
    cfg: SimConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    announce: bool = False,
    exit_with_parent: bool = False,
    profile: str | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM (or stdin EOF with `exit_with_parent`); the exit code.

    Once listening it says where, in one line (listening_line): on stdout for a person,
    on stderr with `announce`, which prints `TOKENTOP_SIM_LISTENING <port>` on stdout
    instead, the one line a parent that asked for port 0 waits for. A port that cannot be
    had is one line on stderr and exit code 2.
    """
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_serve(cfg, host, port, announce=announce,
                                 exit_with_parent=exit_with_parent, profile=profile))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve(cfg: SimConfig, host: str, port: int, *, announce: bool,
                 exit_with_parent: bool, profile: str | None = None) -> int:
    try:
        sim = await start_sim(cfg, host=host, port=port)
    except OSError as exc:
        reason = exc.strerror or exc
        print(f"tokentop sim: cannot listen on {host}:{port}: {reason}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Not in the main thread (or not on POSIX): the caller handles signals itself.
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if exit_with_parent:
        _watch_stdin(loop, stop)
    if announce:
        print(f"{ANNOUNCE} {sim.port}", flush=True)
    # the real port (asked for 0, the kernel chose), and what is being simulated
    print(listening_line(sim.url, cfg, profile), file=sys.stderr if announce else sys.stdout,
          flush=True)
    try:
        await stop.wait()
    finally:
        await sim.close()
    return 0


def listening_line(url: str, cfg: SimConfig, profile: str | None) -> str:
    """`tokentop sim: listening on URL (profile, model, slots[; faults])`."""
    what = [f"profile {profile}" if profile else "no profile", f"model {cfg.model_name}",
            f"{cfg.slots} slots"]
    faults = active_faults(cfg.faults)
    tail = f"; faults: {', '.join(faults)}" if faults else ""
    return f"tokentop sim: listening on {url} ({', '.join(what)}{tail})"


# the fault settings that inject something when not 0; the rest only shape a fault
INJECTING = (*(name for name, _ in REQUEST_FAULTS), "slow_first_byte_ms", "outage_s",
             "spike_every_s")


def active_faults(fc: FaultConfig) -> list[str]:
    """`name=value` for each fault that is on, with the settings that shape it."""
    on = [name for name in INJECTING if getattr(fc, name)]
    shaping = {"stall_rate": "stall_s", "rate_limit_rate": "retry_after_s",
               "malformed_rate": "malformed_kind", "outage_s": "outage_after_s",
               "spike_every_s": "spike_ms"}
    names = [n for name in on for n in (name, shaping.get(name)) if n]
    return [f"{n}={getattr(fc, n):g}" if n != "malformed_kind" else f"{n}={fc.malformed_kind}"
            for n in names]


def _watch_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Set `stop` when stdin reaches EOF, so a simulator whose parent died never lingers."""

    def watch() -> None:
        # os.read on the raw fd: sys.stdin's buffered reader holds a lock that would
        # trouble interpreter shutdown while this daemon thread sits in read().
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        with contextlib.suppress(RuntimeError):  # the loop already closed
            loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch, name="tokentop-sim-stdin", daemon=True).start()
