"""The raw client's clock: TTFT from the request's start (connection setup included),
connection setup on its own as `connect`, and a stale kept-alive retry counted once.

The simulator sits behind a small reverse proxy written here, so that the server side can
close connections the way real servers do (Connection: close, an idle keep-alive timeout
that fires as the next request arrives), and can count the connections it was given: the
truth the client's `connect` samples are held against.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from time import perf_counter

import aiohttp
import pytest
from aiohttp import web
from support import chat_body, running_sim

from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder


class Proxy:
    """A reverse proxy to the simulator that counts the connections it is given.

    close_each: every answer says Connection: close (a server without keep-alive).
    drop_reused: a second request on one connection is met by closing it unanswered, as a
    server whose idle keep-alive timeout fires just as the next request arrives."""

    def __init__(self, target: str, *, close_each: bool = False, drop_reused: bool = False):
        self.target = target.removesuffix("/v1")
        self.close_each = close_each
        self.drop_reused = drop_reused
        self.requests = 0
        self.served: dict[int, int] = {}  # connection (transport id) -> requests answered
        self.port = 0

    @property
    def connections(self) -> int:
        return len(self.served)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        conn = id(request.transport)
        if self.drop_reused and self.served.get(conn, 0) >= 1:
            assert request.transport is not None
            request.transport.abort()  # no byte of an answer: the client must retry
            return web.Response()
        self.served[conn] = self.served.get(conn, 0) + 1
        payload = await request.read()
        async with self.session.post(self.target + request.path, data=payload,
                                     headers={"Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(status=up.status,
                                      headers={"Content-Type": up.headers["Content-Type"]})
            if self.close_each:
                resp.force_close()  # Connection: close, and the socket closes after it
            await resp.prepare(request)
            async for data in up.content.iter_any():
                await resp.write(data)
            await resp.write_eof()
        return resp

    @contextlib.asynccontextmanager
    async def running(self, tls: ssl.SSLContext | None = None) -> AsyncIterator[Proxy]:
        app = web.Application()
        app.router.add_post("/v1/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self.session = aiohttp.ClientSession()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
            self.port = runner.addresses[0][1]
            yield self
        finally:
            await self.session.close()
            await runner.cleanup()


@contextlib.asynccontextmanager
async def slow_accept(port: int, delay: float) -> AsyncIterator[int]:
    """A TCP relay to `port` that waits `delay` before passing on any byte: TCP connects at
    once (the kernel answers), but a TLS handshake through it takes at least `delay`."""

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        w.close()

    async def relay(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(delay)
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(r, w2), pipe(r2, w))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) TLS contexts for 127.0.0.1, from a self-signed certificate."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    try:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True, timeout=20,
        )  # fmt: skip
    except FileNotFoundError:
        pytest.skip("needs the openssl command to make a test certificate")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


async def sequential(client: StreamingClient, n: int, **kw) -> None:
    for _ in range(n):
        assert await client.request(chat_body(), 2, **kw) is True


async def test_every_new_connection_records_its_setup_and_reuse_records_nothing() -> None:
    n = 6
    async with running_sim() as sim:
        async with Proxy(sim.url, close_each=True).running() as proxy:
            rec = IntervalRecorder()
            client = StreamingClient(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", rec)
            await sequential(client, n)
            client.close()
            assert proxy.connections == n  # the server closed every one after its answer
            assert rec.counters.requests_ok == n
            assert len(rec.connect) == n and len(rec.ttft) == n
            # one request at a time: the i-th connect and the i-th TTFT are the same request
            for connect, ttft in zip(rec.connect, rec.ttft, strict=True):
                assert 0 < connect <= ttft
        async with Proxy(sim.url).running() as proxy:
            rec = IntervalRecorder()
            client = StreamingClient(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", rec)
            await sequential(client, n)
            # three users at once: about one connection each, whatever the server saw
            await asyncio.gather(*(sequential(client, 3) for _ in range(3)))
            client.close()
            assert rec.counters.requests_ok == n + 9
            assert 1 <= proxy.connections <= 3
            assert len(rec.connect) == proxy.connections


async def test_ttft_includes_a_slow_connection_setup(tls) -> None:
    # TLS through a relay that holds every byte for 80 ms: each new connection takes at
    # least that long to set up, and the exact-timing simulator writes the first token 30 ms
    # after the request reached it, so the truth is TTFT >= connect + 30 ms, and little more
    delay, ttft_ms, n = 0.08, 30.0, 3
    server_tls, client_tls = tls
    async with (
        running_sim(exact_ttft_ms=ttft_ms, exact_itl_ms=5.0) as sim,
        Proxy(sim.url, close_each=True).running(server_tls) as proxy,
        slow_accept(proxy.port, delay) as port,
    ):
        rec = IntervalRecorder()
        client = StreamingClient(f"https://127.0.0.1:{port}/v1/chat/completions", rec,
                                 calibrate=True)
        client.endpoint.ssl = client_tls  # trust the test's own certificate
        await sequential(client, n)
        client.close()
    assert rec.counters.requests_ok == n and len(rec.connect) == n and len(rec.ttft) == n
    for connect, ttft in zip(rec.connect, rec.ttft, strict=True):
        assert connect >= delay * 1e6
        assert ttft_ms * 1e3 - 500 <= ttft - connect <= ttft_ms * 1e3 + 20_000, (connect, ttft)
    # calibration compares with the server's wall-clock send stamps: its own send stamp is
    # taken beside the clock's start, so the connection is on both sides of the comparison
    assert len(rec.ttft_err) == n and max(rec.ttft_err) < 20_000, list(rec.ttft_err)


async def test_a_stale_kept_alive_connection_is_retried_and_counted_once() -> None:
    async with running_sim() as sim, Proxy(sim.url, drop_reused=True).running() as proxy:
        rec = IntervalRecorder()
        client = StreamingClient(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", rec)
        await sequential(client, 2, t_intended=perf_counter())
        client.close()
    # the second request went out on the kept-alive connection, which the server closed
    # unanswered; it was sent again on a new one and answered: three sends, two requests
    assert proxy.requests == 3 and proxy.connections == 2
    assert rec.counters.requests_ok == 2 and rec.counters.errors == {}
    assert len(rec.lag) == 2  # one intended→actual send lag per request
    assert len(rec.connect) == 2 and len(rec.ttft) == 2
    # the retried request's clock started on its first try, before its new connection
    assert rec.ttft[1] >= rec.connect[1]


async def test_the_retry_of_a_stale_connection_is_on_a_new_one_not_another_kept_one() -> None:
    """A server that answers once per connection and closes it unsaid on the next request (as
    llama.cpp's llama-server does after every streamed answer): with several connections
    kept, each stale, the retry must open a new one, or it meets another stale one."""
    streams, after = 4, 3
    async with running_sim() as sim, Proxy(sim.url, drop_reused=True).running() as proxy:
        rec = IntervalRecorder()
        client = StreamingClient(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", rec)
        # `streams` at once leave as many connections kept, each answered once: stale
        await asyncio.gather(*(sequential(client, 1) for _ in range(streams)))
        await sequential(client, after)
        client.close()
    assert rec.counters.requests_ok == streams + after and rec.counters.errors == {}
    # each later request: one send on a stale connection, then one on a new connection
    assert proxy.connections == streams + after
    assert proxy.requests == streams + 2 * after
