"""--chaos-restart-cmd: the server process killed in the middle of the faults phase and
started again by the user's command; MTTR from the kill to the first token the server
streams again, probed every PROBE_EVERY_S."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import aiohttp
import msgspec
import psutil

from loadgen.analysis.soak_result import Mttr, OutageRecord
from loadgen.eval.results import ChaosFigures
from loadgen.run.preflight import TargetError, resolve_model
from loadgen.worker.sse import Chunk, SseParser
from probes.process import find_listener

# A probe starts this often from the kill on, whether the last one has answered or not: the
# server is back at most this long before the first token that says so (the MTTR's
# resolution, stated in the matrix's row)
PROBE_EVERY_S = 0.25
PROBE_TIMEOUT_S = 30.0  # a probe the restarted server holds this long gives up
PROBES_OPEN_MAX = 8  # probes in flight at once (a server that accepts and never answers)


class Chaos:
    """--chaos-restart-cmd: the server process (the one listening on the target's port) is
    killed (SIGKILL) and CMD is run, in a shell of its own, to start it again. MTTR is from
    the kill to the first token of the first request that streams one after it: from the
    kill on, a one-token streamed request goes straight to the target (not through the
    fault proxy, and apart from the phase's load, whose back-off would be in the figure)
    every PROBE_EVERY_S. The command's text is not kept: it may hold credentials."""

    def __init__(self, cmd: str | None, port: int, *, url: str, api: str = "chat",
                 model: str | None = None, authorization: str | None = None,
                 headers: list[tuple[str, str]] | None = None) -> None:
        self.cmd = cmd
        self.port = port
        self.url = url.rstrip("/")  # the target's OpenAI base URL (…/v1)
        self.api = api
        self.model = model
        self.authorization = authorization
        self.headers = headers or []  # --header's others (Secrets.other_headers())
        self.killed_at: float | None = None
        self.back_at: float | None = None  # unix time of the first token after the kill
        self.pid: int | None = None
        self.why = ""
        self.restart: asyncio.subprocess.Process | None = None

    async def run(self, at: float) -> None:
        await asyncio.sleep(at)
        pid = listener_pid(self.port)
        if pid is None or pid in _own_family():
            self.why = (f"nothing to kill: no process of ours may be killed, and none other "
                        f"listens on port {self.port}")
            return
        # the probe's request names a model: asked of the server while it still answers
        body = await self._probe_body()
        self.pid = pid
        self.killed_at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.restart = await asyncio.create_subprocess_shell(
            self.cmd or "", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
        self.back_at = await first_token(self.endpoint, body, self._headers())

    @property
    def endpoint(self) -> str:
        return self.url + ("/chat/completions" if self.api == "chat" else "/completions")

    def _headers(self) -> dict[str, str]:
        auth = {"Authorization": self.authorization} if self.authorization else {}
        return {**auth, **dict(self.headers)}

    async def _probe_body(self) -> bytes:
        model = self.model
        with contextlib.suppress(TargetError, aiohttp.ClientError, TimeoutError):
            async with aiohttp.ClientSession() as http:
                model = await resolve_model(http, self.url, self.model, self.authorization,
                                            self.headers)
        return probe_body(self.api, model or "")

    def result(self) -> ChaosFigures:
        if self.killed_at is None:
            return ChaosFigures(killed=False, why=self.why or "the run ended before the kill")
        rc = self.restart.returncode if self.restart is not None else None
        back = self.back_at
        return ChaosFigures(
            killed=True, pid=self.pid, killed_at=self.killed_at,
            mttr_s=None if back is None else round(back - self.killed_at, 3),
            restart_exit=rc, why="" if back is not None else "no token after the kill")


def probe_body(api: str, model: str) -> bytes:
    """The smallest streamed request: one token of answer to a one-word prompt."""
    ask: dict = ({"messages": [{"role": "user", "content": "hi"}]} if api == "chat"
                 else {"prompt": "hi"})
    return msgspec.json.encode({"model": model, **ask, "max_tokens": 1, "stream": True})


async def first_token(url: str, body: bytes, headers: dict[str, str],
                      every: float = PROBE_EVERY_S) -> float:
    """The unix time the first text chunk arrives of probes sent to `url` every `every`
    seconds from now on (each on a fresh connection: a kept one is the killed server's).
    Runs until one arrives; its caller's cancel ends it."""
    got: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    probes: set[asyncio.Task] = set()
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        try:
            while not got.done():
                if len(probes) < PROBES_OPEN_MAX:
                    task = asyncio.create_task(_probe(http, url, body, headers, got))
                    probes.add(task)
                    task.add_done_callback(probes.discard)
                # the next probe after `every`, or at once when this one's answer came
                await asyncio.wait([got], timeout=every)
            return got.result()
        finally:
            for task in list(probes):
                task.cancel()
            await asyncio.gather(*probes, return_exceptions=True)


async def _probe(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
                 got: asyncio.Future[float]) -> None:
    """One probe: stamps `got` at its first chunk of text; any failure is just no answer."""
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
        async with http.post(url, data=body, timeout=timeout,
                             headers={"Content-Type": "application/json", **headers}) as r:
            if r.status != 200:
                return
            sse = SseParser()
            async for data in r.content.iter_any():
                for payload in sse.feed(data):
                    if _has_text(payload):
                        if not got.done():
                            got.set_result(time.time())
                        return


def _has_text(payload: bytes) -> bool:
    if payload.strip() == b"[DONE]":
        return False
    try:
        return msgspec.json.decode(payload, type=Chunk).has_text()
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False


def mttr_apart_from_kill(outages: list[OutageRecord], mttr: Mttr,
                         chaos: ChaosFigures | None) -> Mttr:
    """The outages' MTTR without the kill's outage (the restart has its own MTTR, kill →
    first token, on a row of its own: the same failure is not given two). The kill's
    outage: every record of the event (the client's and /metrics' views of one failure)
    that overlaps the kill to the server's first token after it."""
    if chaos is None or not chaos.killed or not isinstance(chaos.killed_at, float):
        return mttr
    back = chaos.mttr_s
    until = chaos.killed_at + back if isinstance(back, float) else float("inf")
    kill_events = {o.event for o in outages if o.start <= until and o.end >= chaos.killed_at}
    rest = [o for o in outages if o.event not in kill_events and not o.ongoing]
    return Mttr(client=_mean(o.duration_s for o in rest if o.kind == "client"),
                server=_mean(o.duration_s for o in rest if o.kind == "server"),
                any=_mean(_event_spans(rest)))


def _event_spans(records: list[OutageRecord]) -> list[float]:
    """Each event's length: its views' union, less the recording gaps in it."""
    spans: dict[int, tuple[float, float, float]] = {}
    for o in records:
        s, e, gap = spans.get(o.event, (o.start, o.end, 0.0))
        spans[o.event] = (min(s, o.start), max(e, o.end), max(gap, o.gap_s))
    return [e - s - gap for s, e, gap in spans.values()]


def _mean(values) -> float | None:
    xs = list(values)
    return round(sum(xs) / len(xs), 3) if xs else None


def listener_pid(port: int) -> int | None:
    proc = find_listener(port)
    return proc.pid if proc is not None else None


def _own_family() -> set[int]:
    """This process and its ancestors: never the one to kill."""
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}
