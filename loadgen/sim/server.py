"""The simulator's HTTP face: an aiohttp server speaking the OpenAI wire format.

Endpoints: POST /v1/chat/completions and /v1/completions (stream and whole),
GET /v1/models, /health, /metrics (vLLM names) and /sim/gpu (the simulated GPU).

Requests, as the simulator reads them:

* prompt tokens = whitespace-separated words of the prompt (completions; a
  list of token ids counts its length) or of every message's text (chat), at
  least 1;
* `max_tokens` (chat also `max_completion_tokens`), default 256, capped so
  that prompt + completion fits the KV budget; asking for more than fits is a
  400, as vLLM answers past max_model_len;
* `ignore_eos`: true generates exactly max_tokens; false draws a natural
  length (seeded), finish_reason "stop" when it ends first, else "length";
* `stream_options.include_usage` adds a last chunk with `"choices": []` and
  usage; `continuous_usage_stats` (with include_usage, as in vLLM) puts usage
  on every chunk;
* one choice only (`n` must be 1). Every generated token is one word, sent as
  one SSE chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from aiohttp import web

from loadgen.sim.gpu import SimGpu
from loadgen.sim.metrics import CONTENT_TYPE
from loadgen.sim.model import ContextLengthError, Engine, Sequence, SimConfig

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
_WORD_MASK = len(WORDS) - 1
assert len(WORDS) & _WORD_MASK == 0, "word count must be a power of two"
_WORD_BYTES = tuple(w.encode() for w in WORDS)

# Everything of a content chunk after the token text, per API. A chunk is then
# head (per request) + tail (per word): one concatenation, no JSON encoding per token.
_CHAT_REST = b'"},"logprobs":null,"finish_reason":null}]'
_TEXT_REST = b'","logprobs":null,"finish_reason":null}]'
_CHAT_TAILS = tuple(w + _CHAT_REST + b"}\n\n" for w in _WORD_BYTES)
_TEXT_TAILS = tuple(w + _TEXT_REST + b"}\n\n" for w in _WORD_BYTES)
_DONE = b"data: [DONE]\n\n"


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


def parse_request(body: Any, *, chat: bool) -> CompletionRequest:
    """Validate a completion body; raises RequestError(400) with a readable message."""
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str):
        raise RequestError(400, "`model` is required and must be a string.")
    prompt_tokens = _count_messages(body.get("messages")) if chat else _count_prompt(body)
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


def _flag(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(400, f"`{key}` must be a boolean.")
    return value


def _count_messages(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "`messages` is required and must be a non-empty list.")
    words = 0
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise RequestError(400, "Each message must be an object with a `role`.")
        content = message.get("content")
        if isinstance(content, str):
            words += len(content.split())
        elif isinstance(content, list):  # content parts: count the text ones
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words += len(part["text"].split())
        elif content is not None:
            raise RequestError(400, "A message's `content` must be a string or a list of parts.")
    return words


def _count_prompt(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt.split())
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):  # token ids
            return len(prompt)
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return len(prompt[0].split())
        one = prompt[0] if len(prompt) == 1 else None
        if isinstance(one, list) and all(isinstance(t, int) for t in one):  # [[token ids]]
            return len(one)
        if len(prompt) > 1:
            raise RequestError(400, "The simulator serves one prompt per request.")
    raise RequestError(400, "`prompt` is required: a string or a list of token ids.")


class ChunkWriter:
    """Builds one request's SSE bytes from precomputed pieces."""

    def __init__(self, req: CompletionRequest, seq: Sequence, *, chat: bool, model: str) -> None:
        self.chat = chat
        self.req = req
        self.seq = seq
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.prefix = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{int(time.time())},'
            f'"model":{json.dumps(model)},"choices":['
        ).encode()
        open_text = b'{"index":0,"delta":{"content":"' if chat else b'{"index":0,"text":"'
        self.head = self.prefix + open_text
        self.tails = _CHAT_TAILS if chat else _TEXT_TAILS

    def role(self) -> bytes:
        return self._with_usage(
            b'{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]',
            0,
        )

    def tokens(self, start: int, end: int) -> bytes:
        """Chunks for tokens start..end-1, one token each."""
        seq = self.seq
        if self.req.continuous_usage:
            return b"".join(self._usage_token(k) for k in range(start, end))
        head, tails, offset = self.head, self.tails, seq.offset
        if end - start == 1:
            return head + tails[(offset + start) & _WORD_MASK]
        return b"".join(head + tails[(offset + k) & _WORD_MASK] for k in range(start, end))

    def _usage_token(self, k: int) -> bytes:
        word = _WORD_BYTES[(self.seq.offset + k) & _WORD_MASK]
        if self.chat:
            choice = b'{"index":0,"delta":{"content":"' + word + _CHAT_REST
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
            out += self.prefix + b"]" + self._usage(seq.generated) + b"}\n\n"
        return out + _DONE

    def _with_usage(self, choices_rest: bytes, completion: int) -> bytes:
        usage = self._usage(completion) if self.req.continuous_usage else b""
        return self.prefix + choices_rest + usage + b"}\n\n"

    def _usage(self, completion: int) -> bytes:
        prompt = self.seq.prompt_tokens
        return b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
            prompt,
            completion,
            prompt + completion,
        )


def completion_text(seq: Sequence) -> str:
    return "".join(WORDS[(seq.offset + k) & _WORD_MASK] for k in range(seq.generated))


class SimServer:
    """The aiohttp application around one Engine and its SimGpu."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.engine = Engine(cfg)
        self.gpu = SimGpu(self.engine)
        self.created = int(time.time())
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._chat),
                web.post("/v1/completions", self._completions),
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.get("/metrics", self._metrics),
                web.get("/sim/gpu", self._gpu),
            ]
        )
        self.app = app

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            message = f"The request body is not valid JSON: {exc}"
            return error_response(400, message, "BadRequestError")
        try:
            req = parse_request(body, chat=chat)
        except RequestError as exc:
            return exc.response()
        if req.model != self.cfg.model_name:
            return error_response(404, f"The model `{req.model}` does not exist.", "NotFoundError")
        try:
            seq = self.engine.submit(
                req.prompt_tokens, req.max_tokens, req.ignore_eos, stream=req.stream
            )
        except ContextLengthError as exc:
            return error_response(400, str(exc), "BadRequestError")
        try:
            if req.stream:
                return await self._stream(request, req, seq, chat=chat)
            return await self._whole(req, seq, chat=chat)
        finally:
            # The client went away (CancelledError, ConnectionResetError) or the stream ended:
            # either way the slot and the KV go back now. A no-op for a finished request.
            self.engine.abort(seq)

    async def _stream(
        self, request: web.Request, req: CompletionRequest, seq: Sequence, *, chat: bool
    ) -> web.StreamResponse:
        engine = self.engine
        writer = ChunkWriter(req, seq, chat=chat, model=self.cfg.model_name)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await resp.prepare(request)
            if chat:
                await resp.write(writer.role())
            sent = 0
            while True:
                if seq.generated == sent and not seq.done:
                    await engine.wait(seq)
                generated = seq.generated
                if generated > sent:
                    data = writer.tokens(sent, generated)
                    sent = generated
                    await resp.write(data)
                elif seq.done:
                    break
            if seq.finish_reason == "abort":
                # Shut down under us: end the stream without [DONE], as a dying server would.
                resp.force_close()
                return resp
            await resp.write(writer.ending())
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client left; the finally in _complete frees the slot
        return resp

    async def _whole(self, req: CompletionRequest, seq: Sequence, *, chat: bool) -> web.Response:
        while not seq.done:
            await self.engine.wait(seq)
        if seq.finish_reason == "abort":
            return error_response(503, "The server is shutting down.", "ServiceUnavailableError")
        text = completion_text(seq)
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
                },
            }
        )

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
    def model(self) -> Engine:
        """The engine model (queues, counters), for tests and the console."""
        return self.server.engine

    @property
    def gpu(self) -> SimGpu:
        return self.server.gpu

    async def close(self) -> None:
        # Stop the engine first: every open request ends ("abort"), so handlers return
        # at once and the runner does not wait out its shutdown timeout.
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
    return RunningSim(host=host, port=bound, server=server, _runner=runner)


# ---- command line


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options (defaults from SimConfig) to a parser."""
    d = SimConfig()
    g = parser.add_argument_group("simulator")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    g.add_argument(
        "--port", type=int, default=8000, help="port, 0 for a free one (default %(default)s)"
    )
    g.add_argument("--model", default=d.model_name, help="served model name (default %(default)s)")
    g.add_argument(
        "--slots", type=int, default=d.slots, help="max running sequences (default %(default)s)"
    )
    g.add_argument(
        "--kv-tokens",
        type=int,
        default=d.kv_tokens,
        help="KV-cache budget in tokens (default %(default)s)",
    )
    g.add_argument(
        "--step-overhead-ms",
        type=float,
        default=d.step_overhead_ms,
        help="fixed cost of every engine step, ms",
    )
    g.add_argument(
        "--decode-ms-per-seq",
        type=float,
        default=d.decode_ms_per_seq,
        help="step cost per decoding sequence, ms",
    )
    g.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=d.prefill_ms_per_token,
        help="step cost per prompt token prefilled, ms",
    )
    g.add_argument(
        "--prefill-chunk-tokens",
        type=int,
        default=d.prefill_chunk_tokens,
        help="prefill tokens per step (chunked prefill)",
    )
    g.add_argument(
        "--default-max-tokens",
        type=int,
        default=d.default_max_tokens,
        help="max_tokens when a request names none",
    )
    g.add_argument("--mean-output-tokens", type=float, default=d.mean_output_tokens,
                   help="mean natural output length when ignore_eos is false")  # fmt: skip
    g.add_argument("--seed", type=int, default=d.seed, help="seed for the natural output lengths")
    g.add_argument("--announce", action="store_true",
                   help=f"print '{ANNOUNCE} <port>' on stdout once listening")  # fmt: skip
    g.add_argument("--exit-with-parent", action="store_true",
                   help="exit when stdin reaches EOF (the parent has gone)")  # fmt: skip


# argparse dest -> SimConfig field, where the names differ
_ARG_FIELDS = {"model": "model_name"}


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """A SimConfig from parsed arguments; options the namespace lacks keep their defaults."""
    known = {f.name for f in fields(SimConfig)}
    values: dict[str, Any] = {}
    for dest, value in vars(args).items():
        name = _ARG_FIELDS.get(dest, dest)
        if name in known and value is not None:
            values[name] = value
    return SimConfig(**values)


def run_sim_forever(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (or stdin EOF with exit_with_parent); the exit code."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_serve(args))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"tokentop sim: {exc}", file=sys.stderr)
        return 2
    host = getattr(args, "host", "127.0.0.1")
    port = getattr(args, "port", 8000)
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
    if getattr(args, "exit_with_parent", False):
        _watch_stdin(loop, stop)
    log.info("simulator listening on %s (model %s, %d slots)", sim.url, cfg.model_name, cfg.slots)
    if getattr(args, "announce", False):
        print(f"{ANNOUNCE} {sim.port}", flush=True)
    try:
        await stop.wait()
    finally:
        await sim.close()
    return 0


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
