"""The streaming client: one request, measured, classified, recorded.

Timestamps are taken the moment bytes arrive, before any parsing. Metric
definitions are DESIGN.md's: TTFT is the first chunk that carries text;
a chunk that carried k tokens counts as k inter-token gaps of gap/k (k known
from `continuous_usage_stats` when the server sends usage on every chunk);
the raw chunk gap is ICL; E2E ends at the last text-bearing chunk.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

import aiohttp
import msgspec

from loadgen.interval import IntervalRecorder
from loadgen.sse import DONE, SseParser, chunk_decoder

US = 1e6


class StreamingClient:
    """Sends prepared request bodies to one endpoint and records what comes back."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        rec: IntervalRecorder,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.session = session
        self.url = url
        self.rec = rec
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10.0)
        self.in_flight = 0

    async def request(self, body: bytes, prompt_words: int) -> None:
        """One streamed request; never raises except CancelledError (counted first)."""
        rec = self.rec
        self.in_flight += 1
        t0 = perf_counter()
        try:
            async with self.session.post(
                self.url, data=body, headers=self.headers, timeout=self.timeout
            ) as resp:
                if resp.status != 200:
                    await _http_error(rec, resp)
                    return
                await _read_stream(rec, resp, t0, prompt_words)
        except asyncio.CancelledError:
            rec.error("cancelled", "request cancelled before it finished")
            raise
        except TimeoutError:
            rec.error("timeout", f"no complete answer within {self.timeout.total:g} s")
        except aiohttp.ClientConnectorError as e:
            rec.error("connect", f"cannot connect to {self.url}: {_reason(e)}")
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
            rec.error("stream_broken", f"stream broken: {_reason(e)}")
        except aiohttp.ClientError as e:
            rec.error("connect", f"{type(e).__name__}: {_reason(e)}")
        finally:
            self.in_flight -= 1


async def _read_stream(
    rec: IntervalRecorder, resp: aiohttp.ClientResponse, t0: float, prompt_words: int
) -> None:
    parser = SseParser()
    first = last = 0.0
    tokens = 0  # tokens seen so far, from continuous usage when given, else one per chunk
    chunks = 0
    usage_out: int | None = None
    usage_in: int | None = None
    done = False
    ttft, itl_v, itl_w, icl = rec.ttft, rec.itl_v, rec.itl_w, rec.icl
    async for data in resp.content.iter_any():
        now = perf_counter()
        try:
            payloads = parser.feed(data)
        except ValueError as e:
            rec.error("malformed_chunk", str(e))
            return
        for payload in payloads:
            if payload == DONE:
                done = True
                continue
            try:
                chunk = chunk_decoder.decode(payload)
            except msgspec.DecodeError as e:
                rec.error("malformed_chunk", f"bad JSON in chunk ({e}): {payload[:80]!r}")
                return
            if chunk.error is not None:
                rec.error("stream_broken", f"server error in stream: {chunk.error.message}")
                return
            usage = chunk.usage
            k = 1
            if usage is not None:
                if usage.completion_tokens is not None:
                    # continuous usage: this chunk carried the difference
                    k = usage.completion_tokens - (usage_out or 0)
                    usage_out = usage.completion_tokens
                if usage.prompt_tokens is not None:
                    usage_in = usage.prompt_tokens
            if not chunk.has_text():
                continue
            chunks += 1
            if k < 1:
                k = 1
            if tokens == 0:
                first = now
                ttft.append((now - t0) * US)
            else:
                gap = (now - last) * US
                icl.append(gap)
                itl_v.append(gap / k)
                itl_w.append(k)
            tokens += k
            last = now
    if not done:
        tail = parser.pending[:80]
        rec.error("stream_broken", f"stream ended without [DONE] (pending {tail!r})")
        return
    if chunks == 0:
        rec.error("empty_response", "stream finished without any generated text")
        return
    c = rec.counters
    c.requests_ok += 1
    c.chunks += chunks
    if usage_out is not None:
        c.output_tokens += usage_out
        out = usage_out
    else:
        c.output_tokens += tokens
        c.estimated_output_tokens += tokens
        out = tokens
    # without usage the prompt's word count stands in (synthetic prompts are ~1 token a word)
    c.input_tokens += usage_in if usage_in is not None else prompt_words
    rec.e2e.append((last - t0) * US)
    if out > 1:
        rec.tpot.append((last - first) * US / (out - 1))


async def _http_error(rec: IntervalRecorder, resp: aiohttp.ClientResponse) -> None:
    try:
        text = (await resp.content.read(2000)).decode("utf-8", "replace")
    except (aiohttp.ClientError, TimeoutError):
        text = ""
    detail = _error_message(text)
    status = resp.status
    if status == 429:
        after = resp.headers.get("Retry-After")
        kind = "http_429"
        detail = f"rate limited (Retry-After {after})" if after else "rate limited"
    elif 400 <= status < 500:
        kind = "http_4xx"
    else:
        kind = "http_5xx"
    rec.error(kind, f"HTTP {status}: {detail}")


class _ErrorEnvelope(msgspec.Struct):
    error: dict | str | None = None
    message: str | None = None
    detail: str | None = None


def _error_message(text: str) -> str:
    """The server's own words from an OpenAI-style error body, else the text itself."""
    try:
        env = msgspec.json.decode(text, type=_ErrorEnvelope)
    except msgspec.DecodeError:
        return text.strip()[:200] or "(empty body)"
    if isinstance(env.error, dict) and env.error.get("message"):
        return str(env.error["message"])[:200]
    return str(env.error or env.message or env.detail or text)[:200]


def _reason(e: BaseException) -> str:
    inner = getattr(e, "os_error", None) or e.__cause__
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror.lower()
    return str(e) or type(e).__name__
