"""A fault-injecting TCP proxy: `tokentop eval` runs it between itself and the server to see
how a framework holds up under network faults (issue 15, "Stability under faults").

`FaultProxy` forwards the bytes of every connection it accepts to the target and back, and
injects faults, switched at run time (`latency`, `reset`, `blackhole`, `bandwidth`,
`clear`) or on a `FaultSchedule` (`run_schedule`). What each one models:

* latency: every chunk from the server reaches the client `ms` ± `jitter_ms` later (the
  jitter uniform, never reordering: TCP delivers in order). It is a delay line, not a
  pause per chunk, so a stream arrives as fast as it was sent, only later. A new
  connection also waits it once before its first byte goes on to the server (the
  handshake's share of a slow path).
* reset: with `probability`, a new connection is reset at once, and each response that
  begins on an established one while the fault is on is doomed: a moment within `within_s`
  of its request is drawn, and the response is reset at its first chunk after that moment
  and after its first chunk (the headers) has reached the client; one that finishes first
  escapes, and is not counted. A reset is a close with SO_LINGER 0: the
  kernel sends RST and the client's read fails with ECONNRESET. The proxy had accepted the
  connection, so the client's TCP connect succeeded: it sees its request fail, not its
  connect. Idle keep-alive connections and responses not yet begun are never reset: a
  client cannot tell the first (it opens a fresh connection) and every HTTP client
  retries the second on a fresh one, silently, so neither is a failure anyone could count
  against the proxy's own counter. A reset from the server is passed on as one (not
  counted: the proxy did not make it).
* blackhole: for `seconds`, nothing flows either way on any connection, and new ones are
  accepted (a listening socket's kernel completes the handshake: a userspace proxy cannot
  drop a SYN) but go nowhere. Bytes are held, not dropped: a network blackhole drops
  packets and TCP retransmits them, so after a blackhole shorter than TCP gives up on
  (minutes) the streams resume intact. The client sees silence, no byte and no error,
  until its own timeout. The retransmission back-off that delays a real resume by up to
  one RTO is not modelled: the bytes flow the moment it ends, so its recorded end is the
  truth a measured outage is judged against.
* bandwidth: bytes from the server to the client, all connections together (one link),
  pass a token bucket of `bytes_per_s` (a tenth of a second's worth of burst).

Every fault applied and cleared is a `FaultEvent` in `events` (unix time, as Snapshots
are dated), so the eval can shade faults on its plots and judge each one's success rate
(`fault_spans`), and `on_change` is told of each as it happens (the faults phase notes it
in its run: a "fault" event in events.jsonl, loadgen.eval.under_fault.FaultNotes);
`counters` says what the proxy did (connections, resets, bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast, get_args
from urllib.parse import urlsplit, urlunsplit

from loadgen.model import units

FaultName = Literal["latency", "reset", "blackhole", "bandwidth"]
FAULTS: tuple[FaultName, ...] = get_args(FaultName)
Action = Literal["apply", "clear"]

READ_SIZE = 65536
BURST_S = 0.1  # the bandwidth bucket holds this many seconds' worth of bytes
DELAY_LINE_CHUNKS = 256  # chunks a connection holds in its delay line before it reads on
RESET_WITHIN_S = 1.0  # a doomed response is reset within this long of its request
_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST

log = logging.getLogger("tokentop.proxy")


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """A fault applied or cleared."""

    t: float  # unix seconds
    elapsed: float  # seconds since the proxy started
    fault: FaultName
    action: Action
    params: dict[str, float]


@dataclass(frozen=True, slots=True)
class FaultSpan:
    """A fault from its application to its clearing (end None: still on)."""

    fault: FaultName
    start: float  # unix seconds
    end: float | None
    params: dict[str, float]


def fault_words(fault: FaultName, params: Mapping[str, float]) -> str:
    """A fault and its settings as a person reads them: "bandwidth cap 19.5 KiB/s"."""
    p = params
    if fault == "latency":
        jitter = f" ± {units.ms(p['jitter_ms'] * 1e3)}" if p.get("jitter_ms") else ""
        return f"latency +{units.ms(p['ms'] * 1e3)}{jitter} per chunk"
    if fault == "reset":
        return (f"reset {units.pct(p['probability'])} of connections (within "
                f"{units.duration(p['within_s'])} of a request)")
    if fault == "blackhole":
        return f"blackhole for {units.duration(p['seconds'])}"
    return f"bandwidth cap {units.bytes_(p['bytes_per_s'])}/s"


def fault_spans(events: Sequence[FaultEvent]) -> list[FaultSpan]:
    """The spans of `events`, in order of start. A fault applied again while on (new
    settings) ends its span and starts another."""
    spans = Spans()
    out = [ended for ev in events if (ended := spans.see(ev)) is not None]
    out += spans.still_on()
    return sorted(out, key=lambda s: s.start)


class Spans:
    """Pairs FaultEvents into spans as they come: the one definition of where a fault's
    span ends (its clearing, or its being applied again with new settings)."""

    def __init__(self) -> None:
        self.on: dict[FaultName, FaultEvent] = {}  # the apply of each fault now on

    def see(self, ev: FaultEvent) -> FaultSpan | None:
        """Take `ev`; the span it ended, if it ended one."""
        began = self.on.pop(ev.fault, None)
        if ev.action == "apply":
            self.on[ev.fault] = ev
        return None if began is None else FaultSpan(ev.fault, began.t, ev.t, began.params)

    def still_on(self) -> list[FaultSpan]:
        return [FaultSpan(ev.fault, ev.t, None, ev.params) for ev in self.on.values()]


@dataclass(slots=True)
class ProxyCounters:
    accepted: int = 0  # connections accepted
    reset_at_connect: int = 0  # reset by the reset fault as they were accepted
    reset_mid_response: int = 0  # reset by it with a response part delivered
    upstream_failed: int = 0  # the target refused or timed out: the client was reset
    bytes_to_server: int = 0
    bytes_to_client: int = 0  # handed to the client's socket

    @property
    def reset(self) -> int:
        """Connections the reset fault reset (not those the target failed)."""
        return self.reset_at_connect + self.reset_mid_response


@dataclass(frozen=True, slots=True)
class Latency:
    ms: float
    jitter_ms: float

    def draw(self, rng: random.Random) -> float:
        """One chunk's delay in seconds."""
        jitter = rng.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0.0
        return max(0.0, self.ms + jitter) / 1000.0


@dataclass(frozen=True, slots=True)
class Reset:
    probability: float
    within_s: float


class TokenBucket:
    """A shared link of `rate` bytes/s. Takers go into debt and wait it off, so concurrent
    takers queue behind each other and the total never passes the rate."""

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate * BURST_S)
        self.tokens = self.burst
        self.t = now

    def delay(self, n: int, now: float) -> float:
        """Take `n` bytes now: the seconds to wait before sending them."""
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        self.tokens -= n
        return max(0.0, -self.tokens / self.rate)

    @property
    def piece(self) -> int:
        """The largest write that keeps the cap smooth (one burst)."""
        return max(1, int(self.burst))


class _Reset(Exception):
    """Close the client's side with RST (the reset fault chose it, or the server reset or
    refused its side)."""


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's side and the server's."""

    client_r: asyncio.StreamReader
    client_w: asyncio.StreamWriter
    server_r: asyncio.StreamReader | None = None
    server_w: asyncio.StreamWriter | None = None
    # the current exchange (HTTP/1.1: one request at a time): chunks of its response
    # written to the client (None: no request yet), and when it is to be reset (doomed)
    answered: int | None = None
    doom_at: float | None = None
    due: float = 0.0  # when the last chunk in the delay line is due (keeps them in order)

    def request_bytes(self, fault: Reset | None, rng: random.Random, now: float) -> None:
        """Bytes from the client: a new request if the last one was answered."""
        if self.answered == 0:
            return  # more of the same request
        self.answered = 0
        self.doom_at = None
        if fault is not None and rng.random() < fault.probability:
            self.doom_at = now + rng.uniform(0.0, fault.within_s)

    def reset_due(self, now: float) -> bool:
        return bool(self.answered) and self.doom_at is not None and now >= self.doom_at

    def reset(self) -> None:
        """RST to the client (SO_LINGER 0, then close); the server's side is just dropped."""
        sock = self.client_w.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
        self.client_w.transport.abort()
        if self.server_w is not None:
            self.server_w.transport.abort()

    def close(self) -> None:
        for w in (self.client_w, self.server_w):
            if w is not None:
                w.close()


class FaultProxy:
    """Forwards 127.0.0.1:`port` (or `listen_host`) to the target, with faults on demand."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, *, seed: int = 0,
                 connect_timeout_s: float = 10.0,
                 on_change: Callable[[FaultEvent], None] | None = None) -> None:
        self.target = (target_host, target_port)
        # told of each FaultEvent as it happens (the faults phase notes it in its run)
        self.on_change = on_change
        self.listen = (listen_host, listen_port)
        self.connect_timeout_s = connect_timeout_s
        self.counters = ProxyCounters()
        self.events: list[FaultEvent] = []
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._latency: Latency | None = None
        self._reset: Reset | None = None
        self._bucket: TokenBucket | None = None
        self._flowing = asyncio.Event()  # clear while a blackhole is on
        self._flowing.set()
        self._blackhole_end: asyncio.TimerHandle | None = None
        self._t0 = 0.0

    # ---- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._t0 = loop.time()
        self._server = await asyncio.start_server(self._accept, *self.listen)

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._server.sockets[0].getsockname()[1]

    def url_for(self, base_url: str) -> str:
        """`base_url` (the target's, e.g. http://10.0.0.5:8000/v1) through the proxy. Plain
        HTTP only: TLS through a proxy on another host name would fail its certificate check."""
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError(f"the fault proxy forwards plain HTTP, not {parts.scheme}://")
        host = self.listen[0]
        netloc = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    async def close(self) -> None:
        """Stop listening and drop every connection (the client sees them closed)."""
        self.clear()  # faults still on end here, so every span in `events` has an end
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for link in list(self._links):
            link.close()
        if self._server is not None:
            await self._server.wait_closed()

    # ---- the faults ------------------------------------------------------------------------

    def latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        self._latency = Latency(ms, jitter_ms)
        self._record("latency", "apply", {"ms": ms, "jitter_ms": jitter_ms})

    def reset(self, probability: float, within_s: float = RESET_WITHIN_S) -> None:
        self._reset = Reset(probability, within_s)
        self._record("reset", "apply", {"probability": probability, "within_s": within_s})

    def bandwidth(self, bytes_per_s: float) -> None:
        self._bucket = TokenBucket(bytes_per_s, asyncio.get_running_loop().time())
        self._record("bandwidth", "apply", {"bytes_per_s": bytes_per_s})

    def blackhole(self, seconds: float) -> None:
        """Nothing flows for `seconds` from now (one already on is extended, never cut)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        if self._blackhole_end is not None:
            end = max(end, self._blackhole_end.when())
            self._blackhole_end.cancel()
        self._flowing.clear()
        self._blackhole_end = loop.call_at(end, self._blackhole_over)
        self._record("blackhole", "apply", {"seconds": seconds})

    def clear(self, fault: FaultName | None = None) -> None:
        """Clear one fault, or every one that is on."""
        for name in FAULTS if fault is None else (fault,):
            if self._is_on(name):
                self._clear(name)

    def _is_on(self, fault: FaultName) -> bool:
        return self._setting(fault) is not None

    def _setting(self, fault: FaultName) -> object | None:
        """The object that is the fault's current setting (None: off)."""
        return {"latency": self._latency, "reset": self._reset, "bandwidth": self._bucket,
                "blackhole": self._blackhole_end}[fault]

    def _clear(self, fault: FaultName) -> None:
        if fault == "blackhole":
            assert self._blackhole_end is not None
            self._blackhole_end.cancel()
            self._blackhole_over()
            return
        if fault == "latency":
            self._latency = None
        elif fault == "reset":
            self._reset = None
        else:
            self._bucket = None
        self._record(fault, "clear", {})

    def _blackhole_over(self) -> None:
        self._blackhole_end = None
        self._flowing.set()
        self._record("blackhole", "clear", {})

    def _record(self, fault: FaultName, action: Action, params: dict[str, float]) -> None:
        elapsed = asyncio.get_running_loop().time() - self._t0
        event = FaultEvent(time.time(), elapsed, fault, action, dict(params))
        self.events.append(event)
        if self.on_change is not None:
            try:
                self.on_change(event)
            except Exception:  # a listener's bug must not stop the faults (it is logged)
                log.exception("the fault proxy's on_change failed")

    # ---- the schedule ----------------------------------------------------------------------

    async def run_schedule(self, schedule: FaultSchedule) -> None:
        """Apply the schedule's entries at their times from now; returns when the last is
        applied and cleared (a blackhole ended). An entry's `for` clears its fault then,
        unless a later entry has changed it meanwhile."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for at, act in self._timeline(schedule):
            await asyncio.sleep(max(0.0, t0 + at - loop.time()))
            act()
        await self._flowing.wait()

    def _timeline(self, schedule: FaultSchedule) -> list[tuple[float, Callable[[], None]]]:
        steps: list[tuple[float, int, Callable[[], None]]] = []
        applied: dict[int, object | None] = {}  # entry index → the setting it made

        def apply(i: int, entry: ScheduledFault) -> Callable[[], None]:
            def act() -> None:
                self._apply(entry)
                if entry.fault != "clear":
                    applied[i] = self._setting(entry.fault)
            return act

        def clear_if_same(i: int, fault: FaultName) -> Callable[[], None]:
            def act() -> None:
                if applied.get(i) is not None and self._setting(fault) is applied[i]:
                    self._clear(fault)
            return act

        for i, entry in enumerate(schedule.entries):
            steps.append((entry.at, 2 * i, apply(i, entry)))
            if entry.for_s is not None and entry.fault != "clear":
                steps.append((entry.at + entry.for_s, 2 * i + 1, clear_if_same(i, entry.fault)))
        steps.sort(key=lambda s: (s[0], s[1]))
        return [(at, act) for at, _, act in steps]

    def _apply(self, entry: ScheduledFault) -> None:
        p = entry.params
        if entry.fault == "clear":
            self.clear()
        elif entry.fault == "latency":
            self.latency(p["ms"], p["jitter_ms"])
        elif entry.fault == "reset":
            self.reset(p["probability"], p["within_s"])
        elif entry.fault == "blackhole":
            self.blackhole(p["seconds"])
        else:
            self.bandwidth(p["bytes_per_s"])

    # ---- forwarding ------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        link = _Link(reader, writer)
        self._links.add(link)
        self.counters.accepted += 1
        try:
            await self._serve(link)
        except _Reset:
            link.reset()
        except (OSError, asyncio.IncompleteReadError):
            link.close()  # either side went away: the other one sees it closed
        except asyncio.CancelledError:
            # only close() cancels a link, and asyncio's stream server reports a callback
            # task that ends cancelled as an error: end it quietly
            link.close()
        finally:
            self._links.discard(link)
            self._tasks.discard(task)
            link.close()

    async def _serve(self, link: _Link) -> None:
        await self._flowing.wait()  # a blackhole lets no new connection through either
        if self._reset is not None and self._rng.random() < self._reset.probability:
            self.counters.reset_at_connect += 1
            raise _Reset
        if self._latency is not None:
            await asyncio.sleep(self._latency.draw(self._rng))
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                link.server_r, link.server_w = await asyncio.open_connection(*self.target)
        except (OSError, TimeoutError):
            self.counters.upstream_failed += 1
            raise _Reset from None  # as a refused connect looks through a proxy
        up = asyncio.create_task(self._pump_up(link))
        down = asyncio.create_task(self._pump_down(link))
        try:
            # the link ends with its response side; the client's side ending first is a
            # half-close (wait on) or an error (the end)
            done, _ = await asyncio.wait((up, down), return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
            await down
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _pump_up(self, link: _Link) -> None:
        """Client → server, as it comes (the faults act on the way back)."""
        assert link.server_w is not None
        loop = asyncio.get_running_loop()
        while data := await link.client_r.read(READ_SIZE):
            await self._flowing.wait()
            link.request_bytes(self._reset, self._rng, loop.time())
            link.server_w.write(data)
            self.counters.bytes_to_server += len(data)
            await link.server_w.drain()
        if link.server_w.can_write_eof():
            link.server_w.write_eof()  # the client is done sending: the server may finish

    async def _pump_down(self, link: _Link) -> None:
        """Server → client through the delay line: a reader stamps each chunk with the time
        it is due, the writer sends it then."""
        line: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(DELAY_LINE_CHUNKS)
        reader = asyncio.create_task(self._read_down(link, line))
        try:
            await self._write_down(link, line)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read_down(self, link: _Link,
                         line: asyncio.Queue[tuple[float, bytes] | None]) -> None:
        assert link.server_r is not None
        loop = asyncio.get_running_loop()
        try:
            while data := await link.server_r.read(READ_SIZE):
                now = loop.time()
                delay = self._latency.draw(self._rng) if self._latency is not None else 0.0
                link.due = max(link.due, now + delay)
                await line.put((link.due, data))
        except OSError:
            await line.put((loop.time(), b""))  # the server reset it: so does the client's side
            return
        await line.put(None)

    async def _write_down(self, link: _Link,
                          line: asyncio.Queue[tuple[float, bytes] | None]) -> None:
        loop = asyncio.get_running_loop()
        while (item := await line.get()) is not None:
            due, data = item
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not data:
                raise _Reset
            for piece in self._pieces(data):
                await self._send(link, piece)
        await link.client_w.drain()
        if link.client_w.can_write_eof():
            link.client_w.write_eof()

    def _pieces(self, data: bytes) -> list[bytes]:
        size = self._bucket.piece if self._bucket is not None else len(data)
        return [data[i:i + size] for i in range(0, len(data), size)]

    async def _send(self, link: _Link, piece: bytes) -> None:
        loop = asyncio.get_running_loop()
        bucket = self._bucket
        if bucket is not None:
            await asyncio.sleep(bucket.delay(len(piece), loop.time()))
        await self._flowing.wait()  # held through a blackhole, then sent
        if self._reset is not None and link.reset_due(loop.time()):
            self.counters.reset_mid_response += 1
            raise _Reset
        link.client_w.write(piece)
        self.counters.bytes_to_client += len(piece)
        if link.answered is not None:
            link.answered += 1
        await link.client_w.drain()


# ---- the schedule ----------------------------------------------------------------------------

ScheduleFault = FaultName | Literal["clear"]
_REQUIRED = math.nan  # a parameter with no default
PARAMS: dict[str, dict[str, float]] = {
    "latency": {"ms": _REQUIRED, "jitter_ms": 0.0},
    "reset": {"probability": _REQUIRED, "within_s": RESET_WITHIN_S},
    "blackhole": {"seconds": _REQUIRED},
    "bandwidth": {"bytes_per_s": _REQUIRED},
    "clear": {},
}


class ScheduleError(ValueError):
    """A schedule entry that cannot be used; str(e) is the message for the user."""


@dataclass(frozen=True, slots=True)
class ScheduledFault:
    at: float  # seconds from the schedule's start
    fault: ScheduleFault
    params: dict[str, float]
    for_s: float | None = None  # cleared this long after `at` (None: stays on)


@dataclass(frozen=True)
class FaultSchedule:
    entries: tuple[ScheduledFault, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, entries: Sequence[Mapping[str, object]]) -> FaultSchedule:
        """From a plan's list, e.g. [{"at": 5, "fault": "blackhole", "seconds": 3},
        {"at": 10, "fault": "latency", "ms": 200, "jitter_ms": 50, "for": 5}]."""
        parsed = [_entry(i + 1, e) for i, e in enumerate(entries)]
        return cls(tuple(sorted(parsed, key=lambda e: e.at)))

    @property
    def span_s(self) -> float:
        """Seconds from the start to the last entry's end."""
        return max((_ends(e) for e in self.entries), default=0.0)


def _ends(e: ScheduledFault) -> float:
    if e.fault == "blackhole":
        return e.at + e.params["seconds"]
    return e.at + (e.for_s or 0.0)


def _entry(n: int, raw: Mapping[str, object]) -> ScheduledFault:
    if not isinstance(raw, Mapping):
        raise ScheduleError(f"fault entry {n}: a table of settings, not {raw!r}")
    fault = raw.get("fault")
    if not isinstance(fault, str) or fault not in PARAMS:
        raise ScheduleError(f"fault entry {n}: 'fault' must be one of {', '.join(PARAMS)}, "
                            f"not {fault!r}")
    where = f"fault entry {n} ({fault})"
    known = {"at", "fault", "for", *PARAMS[fault]}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ScheduleError(f"{where}: unknown setting {', '.join(map(repr, unknown))}")
    if "at" not in raw:
        raise ScheduleError(f"{where}: 'at' (seconds from the start) is required")
    for_s = _number(where, "for", raw["for"]) if "for" in raw else None
    if for_s is not None and fault in ("blackhole", "clear"):
        raise ScheduleError(f"{where}: 'for' does not apply (a blackhole lasts its seconds)")
    params = {name: _param(where, name, raw, default)
              for name, default in PARAMS[fault].items()}
    _check_ranges(where, params)
    return ScheduledFault(_number(where, "at", raw["at"]), cast(ScheduleFault, fault), params,
                          for_s)


def _param(where: str, name: str, raw: Mapping[str, object], default: float) -> float:
    if name in raw:
        return _number(where, name, raw[name])
    if math.isnan(default):
        raise ScheduleError(f"{where}: '{name}' is required")
    return default


def _number(where: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScheduleError(f"{where}: '{name}' must be a number, not {value!r}")
    if value < 0:
        raise ScheduleError(f"{where}: '{name}' must not be negative ({value!r})")
    return float(value)


def _check_ranges(where: str, params: Mapping[str, float]) -> None:
    if params.get("probability", 0.0) > 1.0:
        raise ScheduleError(f"{where}: 'probability' is at most 1")
    for name in ("seconds", "bytes_per_s"):
        if params.get(name, 1.0) <= 0.0:
            raise ScheduleError(f"{where}: '{name}' must be above 0")
