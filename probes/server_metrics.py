"""Scrape an inference server's Prometheus /metrics and map it to `ServerMetrics`."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadgen.snapshot import ServerMetrics
from probes.engines import detect_engine, map_fields

TIMEOUT_S = 2.0


def server_root(url: str) -> str:
    """The server's root URL from an OpenAI base URL: drop trailing slashes and a /v1."""
    root = url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root.rstrip("/")


def metrics_url_for(base_url: str) -> str:
    """http://host:8000/v1 -> http://host:8000/metrics (engines serve /metrics at the root)."""
    return server_root(base_url) + "/metrics"


def parse_metrics(text: str, url: str) -> ServerMetrics:
    """Map one /metrics page to ServerMetrics; text that is not Prometheus gives ok=False."""
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except Exception as exc:  # the parser raises ValueError and friends on non-metrics text
        return ServerMetrics(url=url, ok=False, error=f"not Prometheus text: {_first_line(exc)}")
    engine = detect_engine(s.name for s in samples)
    if engine is None:
        return ServerMetrics(url=url, ok=True, engine="unknown")
    return ServerMetrics(url=url, ok=True, engine=engine.name, **map_fields(engine, samples))


class ServerMetricsProbe:
    def __init__(
        self, metrics_url: str, session: aiohttp.ClientSession, bearer_token: str | None = None
    ) -> None:
        self.url = metrics_url
        self._session = session
        # Kept only in the header: never in errors, logs or the ServerMetrics.
        self._headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}

    async def sample(self) -> ServerMetrics:
        start = time.perf_counter()
        try:
            text = await self._fetch()
        except _HttpStatus as exc:
            result = ServerMetrics(url=self.url, ok=False, error=str(exc))
        except Exception as exc:
            result = ServerMetrics(url=self.url, ok=False, error=describe_error(exc))
        else:
            # Parsing a large page costs a few ms; still cheap enough per tick.
            result = parse_metrics(text, self.url)
        result.scrape_ms = (time.perf_counter() - start) * 1000.0
        return result

    async def _fetch(self) -> str:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with self._session.get(self.url, headers=self._headers, timeout=timeout) as resp:
            if resp.status != 200:
                raise _HttpStatus(f"HTTP {resp.status} from {self.url}")
            return await resp.text(errors="replace")


class _HttpStatus(Exception):
    pass


def describe_error(exc: BaseException) -> str:
    """A failed scrape in words."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return f"timed out after {TIMEOUT_S} s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionRefusedError):
            return "connection refused"
        if isinstance(os_error, socket.gaierror):
            return f"cannot resolve host {exc.host}"
        return f"cannot connect: {os_error.strerror or os_error}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server closed the connection"
    if isinstance(exc, aiohttp.ClientError):
        return f"request failed: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line[:200]
