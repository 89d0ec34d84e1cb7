"""A minimal HTTP/1.1 keep-alive connection for streamed POSTs: the client's hot path.

Why not aiohttp here (it is used everywhere else): per streamed chunk,
aiohttp's `iter_any` wakes a coroutine and builds objects, ~18-30 µs on this
machine; an `asyncio.Protocol` fed through httptools' C parser measures each
chunk inside `data_received`, with no coroutine switch at all (README, "How it is
built": the hot path, measured). The arrival time is taken first thing in
`data_received`, before any parsing.

One connection carries one request at a time (a closed-loop user keeps its
own connection, as a real client with keep-alive would).
"""

from __future__ import annotations

import asyncio
import ssl
from time import perf_counter
from urllib.parse import urlsplit

import httptools

from loadgen.worker.stream_measure import StreamMeasure

MAX_ERROR_BODY = 4000


class Endpoint:
    """Where requests go and the bytes every request starts with."""

    def __init__(self, url: str, authorization: str | None = None) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.ssl = ssl.create_default_context() if self.tls else None
        path = parts.path or "/"
        host_header = parts.netloc.rsplit("@", 1)[-1]
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            "User-Agent: tokentop\r\n"
        )
        if authorization:
            head += f"Authorization: {authorization}\r\n"
        self._head = head.encode()

    def request_bytes(self, body: bytes) -> bytes:
        return self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body


class Outcome:
    """How a request ended, for the caller to classify."""

    __slots__ = ("error_body", "headers", "kind", "message", "status")

    def __init__(self) -> None:
        self.status = 0
        self.kind: str | None = None  # None: the body ended cleanly
        self.message = ""
        self.headers: dict[bytes, bytes] = {}
        self.error_body = bytearray()


class StreamConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.measure: StreamMeasure | None = None
        self.outcome: Outcome | None = None
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.got_bytes = False
        self.keep_alive = True

    # ---- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._now = perf_counter()  # arrival time, before anything else
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._end("stream_broken", "the server switched protocols")
        except httptools.HttpParserError as e:
            self._end("malformed_chunk", f"bad HTTP from the server: {e}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            why = f": {exc}" if exc else ""
            self._end("stream_broken", f"the server closed the connection mid-response{why}")

    # ---- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.outcome is not None:
            self.outcome.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        if self.outcome is not None:
            self.outcome.status = self.parser.get_status_code()
            self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        out = self.outcome
        if out is None:
            return
        if out.status == 200:
            m = self.measure
            if m is not None and not m.feed(body, self._now):
                out.kind = "recorded"  # the measure has already recorded what was wrong
                self._finish(close=True)
        elif len(out.error_body) < MAX_ERROR_BODY:
            out.error_body += body

    def on_message_complete(self) -> None:
        self._finish(close=not self.keep_alive)

    # ---- the request ---------------------------------------------------------------------

    async def send(self, payload: bytes, measure: StreamMeasure) -> Outcome:
        assert self.transport is not None
        self.measure = measure
        self.outcome = Outcome()
        self.got_bytes = False
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        try:
            return await self.waiter
        finally:
            self.measure = None
            self.outcome = None
            self.waiter = None

    def _end(self, kind: str, message: str) -> None:
        if self.outcome is not None and self.outcome.kind is None:
            self.outcome.kind = kind
            self.outcome.message = message
        self._finish(close=True)

    def _finish(self, close: bool) -> None:
        self.measure = None  # bytes still in this feed must not be measured
        if close:
            self.abort()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(self.outcome)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


async def open_connection(ep: Endpoint, timeout: float) -> StreamConnection:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        _, conn = await loop.create_connection(
            StreamConnection, ep.host, ep.port, ssl=ep.ssl,
            server_hostname=ep.host if ep.ssl else None,
        )
    return conn
