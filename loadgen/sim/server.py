"""The simulator's HTTP face: an aiohttp server speaking the OpenAI wire format.

Endpoints: POST /v1/chat/completions and /v1/completions (stream and whole; what a
request may say is request.py's, the chunks' bytes chunks.py's), GET /v1/models, /health,
/metrics (vLLM names, or another engine's with `--metrics-dialect`: dialects.py),
/sim/gpu (the simulated GPU), and GET/POST /sim/faults (fault settings and injected
counts; POST from loopback peers only, see faults.py), GET /sim/arrivals (each completion
request's arrival time) and GET /sim/requests (what each carried and when its first token
went out), loopback peers only, and, with a tokenizer
(`SimConfig.tokenizer`), POST /tokenize in vLLM's and llama.cpp's shapes. What a request
may ask beyond its lengths (stop, n, seed, logprobs, response_format, tools), and the
features `SimConfig.broken` makes it lack, are features.py's.

A completion is served one of two ways: through the engine model's scheduler (model.py),
or, in exact-timing mode, by deadline with every chunk stamped (exact.py). Starting,
announcing and stopping a server is program.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import time
import uuid
from collections import deque
from typing import Any

from aiohttp import web

import loadgen
from loadgen.sim import dialects, features
from loadgen.sim.chunks import SSE_HEADERS, ChunkWriter, completion_text
from loadgen.sim.exact import respond_exact
from loadgen.sim.faults import Faults
from loadgen.sim.gpu import SimGpu
from loadgen.sim.model import BatchModel, ContextLengthError, Sequence, SimConfig
from loadgen.sim.prefix_cache import PrefixCache, prompt_units
from loadgen.sim.request import (
    CompletionRequest,
    RequestError,
    error_response,
    flag,
    parse_request,
)
from loadgen.sim.words import PLAIN_WORDS, SimTokenizer

log = logging.getLogger("loadgen.sim")


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


ARRIVALS_KEPT = 100_000  # arrival times kept for GET /sim/arrivals (a deque of floats: 3.2 MB full)
REQUESTS_KEPT = 20_000  # requests kept for GET /sim/requests (tuples of six: ~3 MB full)
SERVED_FIELDS = ("arrived_s", "priority", "prompt_tokens", "max_tokens", "first_token_s",
                 "status")


class SimServer:
    """The aiohttp application around one BatchModel, its SimGpu and its Faults."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        # counts prompts and picks the words written (None: a token a word)
        self.tokens = SimTokenizer(cfg.tokenizer) if cfg.tokenizer else None
        self.words = self.tokens.table if self.tokens else PLAIN_WORDS
        self.faults = Faults(cfg.faults)
        self.engine = BatchModel(cfg, self.faults)
        self.engine.table = self.words  # its stops are matched in the words it writes
        self.broken = frozenset(cfg.broken)
        size = cfg.kv_tokens if cfg.prefix_cache_tokens is None else cfg.prefix_cache_tokens
        self.prefix_cache = PrefixCache(size, cfg.prefix_block_tokens) if size else None
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
        # the newest REQUESTS_KEPT parsed requests, as SERVED_FIELDS (GET /sim/requests)
        self.served: deque[tuple] = deque(maxlen=REQUESTS_KEPT)
        self.scrapes: dict[str, Any] = {}  # what the last /metrics saw, for per-scrape gauges
        self.app = self._app()

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._authenticate])
        # a broken feature's route is not served: 404, as on a server without it
        gone = {features.ROUTES[name] for name in self.broken if name in features.ROUTES}
        routes = [
            web.post("/v1/chat/completions", self._chat),
            web.post("/v1/completions", self._completions),
            web.get("/v1/models", self._models),
            web.get("/health", self._health),
            web.get("/metrics", self._metrics),
            web.get("/sim/gpu", self._gpu),
            web.get("/sim/faults", self.get_faults),
            web.post("/sim/faults", self.post_faults),
            web.get("/sim/arrivals", self._arrivals),
            web.get("/sim/requests", self._requests),
        ]
        if self.tokens is not None:  # a server without a tokenizer has no such endpoint
            routes.append(web.post("/tokenize", self._tokenize))
        app.add_routes([r for r in routes if r.path not in gone])
        version = dialects.version_answer(self.cfg.metrics_dialect, loadgen.__version__,
                                          self.cfg.model_name, n_ctx=self.cfg.kv_tokens,
                                          slots=self.cfg.slots)
        if version is not None:  # the engine's own route for its version
            path, body = version

            async def answer(_request: web.Request) -> web.Response:
                return web.json_response(body)

            app.add_routes([web.get(path, answer)])
        return app

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
        req = await self._parse(request, chat=chat)
        if isinstance(req, web.Response):
            return req
        # drawn as soon as the request is read, before any wait: the seeded sequence of
        # faults follows the order in which requests came
        fault = self.faults.draw(stream=req.stream)
        self.inflight += 1
        resp: web.StreamResponse | None = None
        try:
            resp = await self._answer(request, req, fault, arrived, chat=chat)
            return resp
        finally:
            self.inflight -= 1
            self._record(req, arrived, resp)

    async def _answer(self, request: web.Request, req: CompletionRequest, fault: str | None,
                      arrived: float, *, chat: bool) -> web.StreamResponse:
        refused = await self._before_first_byte(fault)
        if refused is not None:
            return refused
        if self.cfg.exact:
            return await respond_exact(self, request, req, arrived, chat=chat)
        return await self._scheduled(request, req, fault, chat=chat)

    def _record(self, req: CompletionRequest, arrived: float,
                resp: web.StreamResponse | None) -> None:
        """One served request as GET /sim/requests tells it (status None: the client left
        before an answer; first_token_s None: not streamed through the scheduler)."""
        first = None if req.first_token_t is None else req.first_token_t - arrived
        status = None if resp is None else resp.status
        self.served.append((arrived, req.priority, req.prompt_tokens, req.max_tokens, first,
                            status))

    def refuse(self, status: int, message: str, kind: str) -> web.Response:
        """A refusal in OpenAI's shape; a 4xx is a 500 when "errors" is broken."""
        if "errors" in self.broken and 400 <= status < 500:
            return error_response(500, f"Internal server error ({message})", "InternalServerError")
        return error_response(status, message, kind)

    async def _parse(self, request: web.Request, *, chat: bool) -> CompletionRequest | web.Response:
        """The request read, checked and looked up in the prefix cache, or the error to send."""
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            return self.refuse(400, f"The request body is not valid JSON: {exc}",
                               "BadRequestError")
        if isinstance(body, dict) and self.broken:
            body = features.strip_broken(body, self.broken)
        try:
            req = parse_request(body, chat=chat, template_tokens=self.cfg.chat_template_tokens,
                                tokens=self.tokens)
        except RequestError as exc:
            return self.refuse(exc.status, str(exc), exc.kind)
        if req.model != self.cfg.model_name:
            return self.refuse(404, f"The model `{req.model}` does not exist.", "NotFoundError")
        if req.priority != 0 and self.cfg.scheduling_policy != "priority":
            return self.refuse(400, f"Got priority {req.priority} but Priority scheduling is "
                               "not enabled.", "BadRequestError")
        if req.asked.n > 1 and self.cfg.exact:
            return self.refuse(400, "`n` > 1 is not served in exact-timing mode.",
                               "BadRequestError")
        if self.prefix_cache is not None:
            req.cached_tokens = self.prefix_cache.lookup(prompt_units(body, chat, self._units))
        return req

    async def _before_first_byte(self, fault: str | None) -> web.Response | None:
        """The faults that strike before anything is sent: a slow first byte (every
        request), then a 500 or a 429 in place of the answer (None: answer it)."""
        faults = self.faults
        settings = faults.cfg  # as they were when the request came, whatever the sleep sees
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
            resp = error_response(429, "Simulated rate limit (injected fault).", "RateLimitError")
            resp.headers["Retry-After"] = str(math.ceil(settings.retry_after_s))
            resp.headers["retry-after-ms"] = str(round(settings.retry_after_s * 1000))
            return resp
        return None

    async def _scheduled(self, request: web.Request, req: CompletionRequest, fault: str | None,
                         *, chat: bool) -> web.StreamResponse:
        """The request through the engine model's scheduler, streamed or whole."""
        seqs: list[Sequence] = []
        try:
            for i in range(req.asked.n):  # n choices: n sequences in the engine
                seqs.append(self.engine.submit(
                    req.prompt_tokens, req.max_tokens, req.ignore_eos, stream=req.stream,
                    cached=req.cached_tokens or 0, asked=req.asked, choice=i,
                    priority=req.priority,
                ))
        except ContextLengthError as exc:
            return self.refuse(400, str(exc), "BadRequestError")
        try:
            if req.stream:
                return await self._stream(request, req, seqs[0], fault, chat=chat)
            return await self.whole(req, *seqs, chat=chat)
        finally:
            # The client went away (CancelledError, ConnectionResetError) or the stream
            # ended: either way the slot and the KV go back now. A no-op when finished.
            for seq in seqs:
                self.engine.abort(seq)

    def writer(self, req: CompletionRequest, seq: Sequence, *, chat: bool) -> ChunkWriter:
        """A ChunkWriter for one request, set up as this server streams."""
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
        writer = self.writer(req, seq, chat=chat)
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
                    if req.first_token_t is None:
                        req.first_token_t = engine.now()
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

    def _units(self, text: str) -> list:
        """A prompt text's units for the prefix cache: its tokens as the simulator counts
        them (the tokenizer's ids, else its words)."""
        return text.split() if self.tokens is None else self.tokens.ids(text, False)

    async def whole(self, req: CompletionRequest, *seqs: Sequence, chat: bool) -> web.Response:
        """The whole (non-streamed) answer, once every one of `seqs` (its n choices) is done."""
        for seq in seqs:
            while not seq.done:
                await self.engine.wait(seq)
        if any(seq.finish_reason == "abort" for seq in seqs):
            return error_response(503, "The server is shutting down.", "ServiceUnavailableError")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        obj = "chat.completion" if chat else "text_completion"
        seq = seqs[0]
        generated = sum(s.generated for s in seqs)
        return web.json_response(
            {
                "id": rid,
                "object": obj,
                "created": int(time.time()),
                "model": self.cfg.model_name,
                "choices": [self._choice(req, s, i, rid, chat=chat) for i, s in enumerate(seqs)],
                "usage": {
                    "prompt_tokens": seq.prompt_tokens,
                    "completion_tokens": generated,
                    "total_tokens": seq.prompt_tokens + generated,
                    **({} if req.cached_tokens is None else
                       {"prompt_tokens_details": {"cached_tokens": req.cached_tokens}}),
                },
            }
        )

    def _choice(self, req: CompletionRequest, seq: Sequence, index: int, rid: str, *,
                chat: bool) -> dict[str, Any]:
        """One choice of a whole answer: its text (or JSON, or a tool call), its logprobs."""
        a = req.asked
        text = completion_text(seq, self.words)
        reason = seq.finish_reason
        choice: dict[str, Any] = {"index": index}
        if chat and a.tool is not None:
            call = features.tool_call(a.tool, text, f"{rid}{index}")
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
            reason = "tool_calls"
        elif chat:
            choice["message"] = {"role": "assistant", "content": features.content(text, a)}
        else:
            choice["text"] = features.content(text, a)
        choice["logprobs"] = None if a.logprobs is None else features.logprobs(
            seq.offset, seq.generated, a.logprobs, self.words, chat=chat)
        choice["finish_reason"] = reason
        return choice

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
        if self.cfg.metrics_dialect == "llamacpp":
            # as llama.cpp's server: `content` only, any other body the empty text (200, no
            # tokens; a real one answers vLLM's shape so), the model never asked
            text = body.get("content")
            body = {"content": text if isinstance(text, str) else "",
                    "add_special": body.get("add_special")}
        model = body.get("model")
        if model is not None and model != self.cfg.model_name:
            return error_response(404, f"The model `{model}` does not exist.", "NotFoundError")
        try:
            if isinstance(body.get("prompt"), str):
                special = flag(body, "add_special_tokens", default=True)
                ids = self.tokens.ids(body["prompt"], special)
                return web.json_response({"count": len(ids), "max_model_len": self.cfg.kv_tokens,
                                          "tokens": ids})
            if isinstance(body.get("content"), str):
                ids = self.tokens.ids(body["content"], flag(body, "add_special"))
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
        return web.json_response({"object": "list",
                                  "data": [dialects.model_entry(self.cfg, model)]})

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, _request: web.Request) -> web.Response:
        page = dialects.render(self.cfg.metrics_dialect, self.engine,
                               prefix_cache=self.prefix_cache, scrapes=self.scrapes)
        return web.Response(body=page.encode(), headers={"Content-Type": dialects.CONTENT_TYPE})

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

    async def _requests(self, request: web.Request) -> web.Response:
        """The latest requests served, each as SERVED_FIELDS (arrived_s on CLOCK_MONOTONIC,
        first_token_s after it): what the load carried, as this server read it. Loopback
        peers only."""
        if not is_loopback(request.remote):
            return error_response(
                403, "Served requests are only shown to loopback.", "PermissionDeniedError"
            )
        return web.json_response([dict(zip(SERVED_FIELDS, r, strict=True)) for r in self.served])

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

    def listening(self, runner: web.AppRunner, host: str, port: int) -> None:
        """Told once it listens: the engine starts, and an outage asked for at start is
        scheduled (outage_after_s from now) and cleared from the standing settings."""
        self.engine.start()
        self.gpu.sample()  # anchor the GPU's clock: energy counts from here
        self.runner, self.host, self.port = runner, host, port
        outage = self.faults.cfg
        if outage.outage_s > 0:
            self.schedule_outage(outage.outage_s, outage.outage_after_s)
            self.faults.apply(outage.updated({"outage_s": 0.0, "outage_after_s": 0.0}))

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
