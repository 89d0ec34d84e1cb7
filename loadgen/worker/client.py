"""The streaming client: one request, measured, classified, recorded.

Requests go over `loadgen.worker.http_stream` connections, kept alive and reused;
the body bytes are measured by `loadgen.worker.stream_measure`. Every way a request
can go wrong ends as exactly one error kind in the interval's counters:
connect, timeout, http_3xx, http_4xx, http_429, http_5xx, stream_broken,
malformed_chunk, empty_response, cancelled.

A request's clock (TTFT, E2E) starts when the request starts, before it takes a
connection: a connection it has to open first is time its user waits, as the
other benchmarks (and `--client openai`, whose SDK opens its own) count it. The
setup time of every new connection (TCP, and TLS where used) is also recorded on
its own as `connect`; a kept-alive connection reused costs nothing and records
nothing. A kept-alive connection the server had closed is retried once on a
fresh one, and the request keeps its first clock (its user waited for both).

Streams in flight that look frozen are `stalled()` (loadgen.worker.envelope): a frozen
server (SIGSTOP, a hung engine) keeps its sockets open and sends nothing, which no error
would ever show.

The clock, the limit, the cancel and timeout endings and `stalled()` are the request
envelope's (loadgen.worker.envelope), the same for `--client openai`; this module keeps
what is the raw transport's own: connections, and the HTTP answer's classification.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Sequence
from time import perf_counter

import msgspec

from loadgen.model.slo import Slo
from loadgen.worker.envelope import RequestEnvelope
from loadgen.worker.http_stream import Endpoint, Outcome, StreamConnection, open_connection
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.pacing import RETRY_AFTER_MAX_S, retry_after
from loadgen.worker.stream_measure import StreamMeasure
from loadgen.worker.tokenizer import ChunkTokens

CONNECT_TIMEOUT_S = 10.0


class HeadedEndpoint(Endpoint):
    """http_stream's Endpoint with the run's own headers (--header) in every request's
    head, made once: a header tokentop also writes (User-Agent) is the user's then."""

    def __init__(self, url: str, authorization: str | None,
                 headers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(url, authorization)
        if headers:
            self._head = with_headers(self._head, headers)


def with_headers(head: bytes, headers: Sequence[tuple[str, str]]) -> bytes:
    """A request head (its lines, each ending CRLF) with `headers` added, and any line of
    the same name (case-insensitive) it had dropped."""
    names = {name.lower().encode() for name, _ in headers}
    lines = head.split(b"\r\n")[:-1]
    kept = [lines[0], *(line for line in lines[1:]
                        if line.split(b":", 1)[0].strip().lower() not in names)]
    added = [f"{name}: {value}".encode() for name, value in headers]
    return b"\r\n".join([*kept, *added, b""])


class StreamingClient(RequestEnvelope[bytes]):
    """Sends prepared request bodies to one endpoint and records what comes back: the
    envelope (loadgen.worker.envelope) around each request, connections kept and reused,
    and the HTTP answer classified."""

    def __init__(
        self,
        url: str,
        rec: IntervalRecorder,
        *,
        authorization: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
        timeout: float = 600.0,
        slo: Slo | None = None,
        calibrate: bool = False,
        chunk_tokens: ChunkTokens | None = None,
    ) -> None:
        super().__init__(rec, timeout=timeout, slo=slo, calibrate=calibrate,
                         chunk_tokens=chunk_tokens)
        self.url = url
        self.endpoint = HeadedEndpoint(url, authorization, headers)
        self._idle: list[StreamConnection] = []

    def _prepare(self, body: bytes) -> bytes:
        return self.endpoint.request_bytes(body)

    async def _send(self, payload: bytes, measure: StreamMeasure) -> bool:
        conn: StreamConnection | None = None
        try:
            for attempt in (0, 1):
                # a kept-alive connection is taken without a coroutine: the common case.
                # The retry is on a new one: the other kept connections may be just as
                # stale (llama.cpp's server closes each after a streamed answer, unsaid)
                conn = self._kept() if attempt == 0 else None
                reused = conn is not None
                if conn is None:
                    conn = await self._open(measure.rec)
                outcome = await conn.send(payload, measure)
                # A kept-alive connection the server had just closed: try once more,
                # fresh. No byte came, so the measure is untouched and goes on as is.
                if reused and _closed_before_answer(outcome, conn):
                    continue
                break
        except (asyncio.CancelledError, TimeoutError):
            if conn is not None:
                conn.abort()  # mid-answer: the connection cannot carry another request
            raise
        except OSError as e:
            self._connect_error(e, measure.rec)
            return False
        self._classify(outcome, measure)
        if not conn.closed:
            self._idle.append(conn)
        return True

    def _kept(self) -> StreamConnection | None:
        """A kept-alive connection still open, if any."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _open(self, rec: IntervalRecorder) -> StreamConnection:
        t = perf_counter()
        try:
            conn = await open_connection(self.endpoint, CONNECT_TIMEOUT_S)
        except TimeoutError:
            raise OSError(f"no connection within {CONNECT_TIMEOUT_S:g} s") from None
        rec.connect.append((perf_counter() - t) * 1e6)
        return conn

    def _connect_error(self, e: OSError, rec: IntervalRecorder) -> None:
        if e.errno in (errno.EMFILE, errno.ENFILE):  # our limit, not the server's fault
            rec.error("client_fd_limit", f"no socket for a new stream: {_reason(e)} "
                           "(ulimit -n): lower the load or raise the limit")
        else:
            rec.error("connect", f"cannot connect to {self.url}: {_reason(e)}")

    def _classify(self, out: Outcome, measure: StreamMeasure) -> None:
        if out.kind == "recorded":
            return
        if out.kind is not None:
            measure.rec.error(out.kind, out.message)
        elif out.status == 200:
            measure.finish()
        else:
            measure.retry_after = retry_after(out.status, out.headers)
            measure.rec.error(*http_error(out.status, out.headers, bytes(out.error_body)))

    def close(self) -> None:
        for conn in self._idle:
            conn.abort()
        self._idle.clear()


def _closed_before_answer(out: Outcome, conn: StreamConnection) -> bool:
    return out.kind == "stream_broken" and not conn.got_bytes


def http_error(status: int, headers: dict[bytes, bytes], body: bytes) -> tuple[str, str]:
    """(kind, message) for a non-200 answer, in the server's own words where it gave any
    (the recorder makes the message plain: loadgen.worker.interval)."""
    detail = error_message(body.decode("utf-8", "replace"))
    wait = _retry_after_text(status, headers)
    if status == 429:
        return "http_429", f"HTTP 429 rate limited{wait}: {detail}"
    if 300 <= status < 400:
        # following it would change what is measured (and POST may become GET): say where
        location = headers.get(b"location")
        where = f" to {location.decode(errors='replace')}" if location else " (no Location)"
        return "http_3xx", (f"HTTP {status} redirect{where}: tokentop does not follow "
                            "redirects; give the final URL")
    kind = "http_4xx" if 400 <= status < 500 else "http_5xx"
    return kind, f"HTTP {status}{wait}: {detail}"


def _retry_after_text(status: int, headers: dict[bytes, bytes]) -> str:
    """The wait a 429 or 503 asked for, as the stream honours it (loadgen.worker.pacing)."""
    if not any(h in headers for h in (b"retry-after", b"retry-after-ms")):
        return ""
    seconds = retry_after(status, headers)
    if seconds is None:
        return " (a Retry-After tokentop cannot read)" if status in (429, 503) else ""
    capped = f", {RETRY_AFTER_MAX_S:g} s at most" if seconds >= RETRY_AFTER_MAX_S else ""
    return f" (Retry-After {seconds:g} s{capped})"


class _ErrorEnvelope(msgspec.Struct):
    error: dict | str | None = None
    message: str | None = None
    detail: str | None = None


def error_message(text: str) -> str:
    """The message of an OpenAI-style error body, else the text itself (shortened)."""
    try:
        env = msgspec.json.decode(text, type=_ErrorEnvelope)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return text.strip()[:200] or "(empty body)"
    if isinstance(env.error, dict) and env.error.get("message"):
        return str(env.error["message"])[:200]
    return str(env.error or env.message or env.detail or text)[:200]


def _reason(e: OSError) -> str:
    return (e.strerror or str(e) or type(e).__name__).lower()
