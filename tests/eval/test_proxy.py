"""The fault proxy (loadgen.eval.proxy) between tokentop and a real simulator, judged each
time against a truth that is not the thing measured:

* no fault: tokentop's requests all succeed, and the proxy's byte counters equal what a
  raw socket client sent and received itself;
* latency: the median TTFT tokentop measures rises by the configured 200 ms;
* resets: tokentop counts each reset as one failed request, of a connection kind, and
  their number is the proxy's own count of the resets it made; a raw client sees each as
  ECONNRESET (an RST, not a clean close), a response cut after its first chunk; a target
  that refuses, or resets, reaches the client as a reset too;
* a 3 s blackhole: what tokentop makes of it (by loadgen.model.outage's one definition)
  against the proxy's recorded start and end; a 6 s one, which is an outage live;
* a bandwidth cap: the bytes a raw client receives per second are the cap;
* the schedule: entries applied and cleared at their times, bad entries refused.

Loopback only; every wait is bounded; the simulator runs in exact-timing mode where a
latency is compared, so its own TTFT and ITL are constants.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from support import WAIT_S, chat_body, running_sim

from loadgen.eval.proxy import FaultProxy, FaultSchedule, ScheduleError, fault_spans
from loadgen.model import hdr
from loadgen.model.kinds import UNREACHABLE_ERRORS
from loadgen.model.outage import STALL_AFTER_S, OutageTracker, Tick
from loadgen.model.snapshot import Counters, Snapshot
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.sim import RunningSim

TICK = 0.25
# the simulator's own timing in exact mode: every request the same TTFT and ITL
EXACT = {"exact_ttft_ms": 20.0, "exact_itl_ms": 10.0}
LONG = "100"  # output tokens: a stream of 1 s at EXACT's ITL
MAX_TICKS = 200  # bound on every Snapshot loop (50 s at TICK)
MAX_READS = 100_000  # bound on every socket read loop (time bounds them too)


@contextlib.asynccontextmanager
async def proxied(**sim: float) -> AsyncIterator[tuple[RunningSim, FaultProxy]]:
    """A simulator and the proxy in front of it."""
    async with running_sim(**sim) as running:
        proxy = FaultProxy("127.0.0.1", running.port)
        await proxy.start()
        try:
            yield running, proxy
        finally:
            await proxy.close()


def run_config(url: str, **overrides: object) -> RunConfig:
    """Closed loop, one worker, no tokenizer look-up (its /tokenize calls are not load)."""
    settings: dict[str, object] = {
        "url": url, "concurrency": 4, "input_tokens": "8", "output_tokens": "30",
        "workers": 1, "tick": TICK, "drain_grace": 5.0, "tokenizer": "none", **overrides}
    return RunConfig(**settings)  # type: ignore[arg-type]


@dataclass
class LiveRun:
    """A Coordinator and the Snapshots it has given so far."""

    coord: Coordinator
    snaps: list[Snapshot] = field(default_factory=list)
    it: AsyncIterator[Snapshot] | None = None

    async def until(self, cond: Callable[[Snapshot], bool], what: str) -> Snapshot:
        """The next Snapshots until `cond` holds for one (bounded in ticks and time)."""
        assert self.it is not None
        async with asyncio.timeout(MAX_TICKS * TICK + WAIT_S):
            for _ in range(MAX_TICKS):
                snap = await anext(self.it)
                self.snaps.append(snap)
                if cond(snap):
                    return snap
        raise AssertionError(f"{what}: not within {MAX_TICKS} ticks")

    async def for_s(self, seconds: float) -> None:
        """Snapshots for `seconds` more of the run's own clock."""
        end = (self.snaps[-1].elapsed if self.snaps else 0.0) + seconds
        await self.until(lambda s: s.elapsed >= end, f"{seconds:g} s of load")

    async def finish(self) -> Snapshot:
        """Stop, drain, and return the last Snapshot."""
        self.coord.request_stop("test over")
        return await self.until(lambda s: s.load.state == "stopped", "the drain")


@contextlib.asynccontextmanager
async def live(cfg: RunConfig) -> AsyncIterator[LiveRun]:
    coord = Coordinator(cfg)
    await coord.start()
    run = LiveRun(coord)
    run.it = coord.snapshots()
    try:
        yield run
    finally:
        await coord.close()


@contextlib.asynccontextmanager
async def loaded(**overrides: object) -> AsyncIterator[tuple[FaultProxy, LiveRun]]:
    """The exact-timing simulator, the proxy in front, tokentop's load through the proxy."""
    async with proxied(**EXACT) as (sim, proxy), \
            live(run_config(proxy.url_for(sim.url), **overrides)) as run:
        yield proxy, run


async def raw_stream(port: int, max_tokens: int) -> tuple[int, int, list[tuple[float, int]]]:
    """One streamed request over a plain socket (Connection: close), read to EOF: the bytes
    sent, the bytes received and (time, bytes) for each read, by this client's own count."""
    body = chat_body(max_tokens)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    reads: list[tuple[float, int]] = []
    try:
        writer.write(head + body)
        await writer.drain()
        async with asyncio.timeout(WAIT_S):
            for _ in range(MAX_READS):
                if not (data := await reader.read(65536)):
                    break
                reads.append((time.monotonic(), len(data)))
    finally:
        writer.close()
    return len(head + body), sum(n for _, n in reads), reads


def dense_between(snaps: list[Snapshot], metric: str, t0: float, t1: float) -> np.ndarray:
    """The metric's histogram over the Snapshots that lie wholly inside [t0, t1]."""
    out = np.zeros(hdr.COUNTS_LEN, dtype=np.int64)
    for s in snaps:
        if s.t - s.interval >= t0 and s.t <= t1 and metric in s.hist:
            out += hdr.decode(s.hist[metric])
    return out


async def until(cond: Callable[[], bool], what: str) -> None:
    """Poll `cond` (every 10 ms, at most WAIT_S)."""
    for _ in range(int(WAIT_S / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what}: not within {WAIT_S:g} s")


def span_of(proxy: FaultProxy, fault: str) -> tuple[float, float]:
    (span,) = [s for s in fault_spans(proxy.events) if s.fault == fault]
    assert span.end is not None
    return span.start, span.end


# ---- no fault ---------------------------------------------------------------------------------

async def test_without_faults_everything_passes_and_every_byte_is_counted():
    async with proxied(**EXACT) as (sim, proxy):
        # bytes first, while nothing else (tokentop's /metrics probes) uses the proxy: its
        # counters against a client that counts its own
        sent = got = 0
        for _ in range(3):
            s, g, _ = await raw_stream(proxy.port, 40)
            sent, got = sent + s, got + g
        counted = (proxy.counters.bytes_to_server, proxy.counters.bytes_to_client)
        async with live(run_config(proxy.url_for(sim.url), max_requests=24)) as run:
            last = await run.until(lambda s: s.load.state == "stopped", "24 requests")
    assert got > 40 * 100  # a real stream came back, not an error page
    assert counted == (sent, got)
    c = last.counters
    assert (c.requests_ok, c.requests_failed, c.errors) == (24, 0, {})
    assert c.completed_output_tokens == 24 * 30  # every stream whole, through the proxy
    assert proxy.counters.reset == 0 and proxy.counters.accepted >= 3 + 4


# ---- latency ----------------------------------------------------------------------------------

async def test_added_latency_shows_in_tokentops_ttft():
    """TTFT from the exact-timing simulator is 20 ms plus the path; 200 ± 50 ms more on every
    chunk from the server must move tokentop's median TTFT by 200 ms (uniform jitter: the
    median is the configured latency), and keep the streams' pace (a delay line, not a pause
    per chunk)."""
    async with loaded() as (proxy, run):
        await run.for_s(3.0)
        t_on = time.time()
        proxy.latency(200.0, 50.0)
        await run.for_s(4.0)
        t_end = time.time()
        await run.finish()
    # before: the ticks from 1 s in (warm connections); after: from 0.5 s after the switch
    # (a response begun before it has its first chunk undelayed)
    first = run.snaps[0].t - run.snaps[0].interval
    before = hdr.summarize(dense_between(run.snaps, "ttft", first + 1.0, t_on))
    after = hdr.summarize(dense_between(run.snaps, "ttft", t_on + 0.5, t_end))
    assert before["count"] >= 20 and after["count"] >= 10, (before, after)
    added_ms = (after["p50"] - before["p50"]) / 1000.0
    assert added_ms == pytest.approx(200.0, abs=25.0), (before, after)
    itl_before = hdr.summarize(dense_between(run.snaps, "itl", first + 1.0, t_on))
    itl_after = hdr.summarize(dense_between(run.snaps, "itl", t_on + 0.5, t_end))
    # jitter bunches chunks (in order, each one no earlier than the one before), so only
    # the mean gap is kept: at most (max − mean delay) / 29 gaps ≈ 1.7 ms more per stream
    assert abs(itl_after["mean"] - itl_before["mean"]) < 2_000, (itl_before, itl_after)


# ---- resets -----------------------------------------------------------------------------------

async def test_each_reset_is_one_connection_error_in_tokentop():
    """Streams of 0.3 s, a third of the connections reset as they are accepted and a third of
    the responses cut within 0.25 s: tokentop's failed requests, by kind, against the proxy's
    own count of resets (only connection kinds: nothing else went wrong). A reset at the
    accept is mostly stream_broken (the request went out, the RST came back), connect when
    the RST came before the request could be written."""
    async with loaded() as (proxy, run):
        await run.for_s(1.0)
        proxy.reset(1 / 3, within_s=0.25)
        await run.until(lambda s: proxy.counters.reset_at_connect >= 3
                        and proxy.counters.reset_mid_response >= 3, "resets of both sorts")
        proxy.clear("reset")
        last = await run.finish()
    errors = last.counters.errors
    assert set(errors) <= set(UNREACHABLE_ERRORS) - {"timeout"}, errors
    assert sum(errors.values()) == last.counters.requests_failed == proxy.counters.reset
    assert last.counters.requests_ok > 0


def post(body: bytes) -> bytes:
    """A keep-alive streamed request, as bytes on the wire."""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body)


async def read_response(reader: asyncio.StreamReader, got: bytearray) -> None:
    """Read one chunked response into `got`, to its last chunk (bounded in time)."""
    async with asyncio.timeout(WAIT_S):
        for _ in range(MAX_READS):
            if got.endswith(b"\r\n0\r\n\r\n"):
                return
            if not (data := await reader.read(65536)):
                raise AssertionError(f"closed after {len(got)} bytes")
            got += data
    raise AssertionError(f"no end of the response in {MAX_READS} reads")


async def test_a_reset_is_an_rst_that_the_client_reads_as_econnreset():
    """Not a clean close (which a client reads as the end of a stream): an RST. At the
    connection's start, the request gets nothing; on an established connection, the
    response is cut after its first chunk at the earliest (within_s 0: at once), so the
    client has part of it: a failure no HTTP client retries."""
    async with proxied(**EXACT) as (_, proxy):
        proxy.reset(1.0)
        with pytest.raises(ConnectionResetError):
            await raw_stream(proxy.port, 30)
        assert proxy.counters.reset_at_connect == 1
        proxy.clear()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            first, second = bytearray(), bytearray()
            writer.write(post(chat_body(30)))
            await read_response(reader, first)  # no fault yet: whole
            proxy.reset(1.0, within_s=0.0)
            writer.write(post(chat_body(30)))
            with pytest.raises(ConnectionResetError):
                await read_response(reader, second)
        finally:
            writer.close()
    assert b"data: [DONE]" in first
    assert second.startswith(b"HTTP/1.1 200") and b"data: [DONE]" not in second
    assert (proxy.counters.reset_at_connect, proxy.counters.reset_mid_response) == (1, 1)


async def test_a_target_that_refuses_is_a_reset_not_counted_as_the_faults():
    """Nothing listens behind the proxy (a server down for a restart): the client, whose
    connect the proxy accepted, is reset; the proxy counts it apart from its fault's resets."""
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proxy = FaultProxy("127.0.0.1", port)
    await proxy.start()
    try:
        with pytest.raises(ConnectionResetError):
            await raw_stream(proxy.port, 4)
    finally:
        await proxy.close()
    assert (proxy.counters.upstream_failed, proxy.counters.reset) == (1, 0)


async def test_a_reset_from_the_server_reaches_the_client_as_one():
    """A server that sends part of an answer and resets: the client sees the part, then
    ECONNRESET (not a clean end of the stream); the proxy made no reset of its own."""
    async def answer_and_reset(reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(answer_and_reset, "127.0.0.1", 0)
    proxy = FaultProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await proxy.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    got = bytearray()
    try:
        writer.write(post(chat_body(4)))
        with pytest.raises(ConnectionResetError):
            await read_response(reader, got)
    finally:
        writer.close()
        await proxy.close()
        server.close()
    assert got.startswith(b"HTTP/1.1 200 OK")
    assert proxy.counters.reset == 0


# ---- blackhole --------------------------------------------------------------------------------

def quiet_spans(snaps: list[Snapshot]) -> list[tuple[float, float]]:
    """The quiet spans (nothing succeeds and no token arrives, with requests in flight) as
    the product's OutageTracker dates them, fed the Snapshots as the soak analysis feeds it:
    (start, end) in unix seconds."""
    tracker = OutageTracker()
    prev = Counters()
    out: list[tuple[float, float]] = []
    since: float | None = None
    for snap in snaps:
        tracker.observe(Tick.between(prev, snap))
        prev = snap.counters
        if since is not None and tracker.quiet_since is None:
            out.append((since, snap.t - snap.interval))  # ended by this tick's token
        since = tracker.quiet_since
    return out


async def test_a_3s_blackhole_is_a_quiet_span_of_3s_but_no_outage():
    """What tokentop makes of 3 s of silence with streams open: by the product's definition
    no outage (OUTAGE_MIN_S of quiet needs evidence, and a silent stream is evidence only as
    a stall, after STALL_AFTER_S = 5 s) and no stall; but the quiet span its tracker dates
    starts and ends within 0.5 s of the blackhole the proxy recorded. Streams of 1 s, so
    a blackhole that let the streams in flight finish would start the span late."""
    assert STALL_AFTER_S > 3.0  # the premise: a 3 s silence is not yet a stall
    async with loaded(output_tokens=LONG) as (proxy, run):
        await run.for_s(1.5)
        # 0.1 s in: mid-tick, so the tick's quantisation is in the measured error
        plan = FaultSchedule.parse([{"at": 0.1, "fault": "blackhole", "seconds": 3}])
        # the Snapshots go on meanwhile (the tick loop runs as they are taken)
        schedule = asyncio.create_task(proxy.run_schedule(plan))
        await run.until(lambda s: schedule.done(), "the schedule's end")
        await schedule
        await run.for_s(1.5)
        await run.finish()
    start, end = span_of(proxy, "blackhole")
    assert end - start == pytest.approx(3.0, abs=0.05)
    assert run.snaps[-1].counters.requests_failed == 0  # held, not dropped: streams go on
    assert not [e for s in run.snaps for e in s.events if e.kind in ("outage", "stall")]
    assert all(s.load.health == "up" and s.load.stalled == 0 for s in run.snaps)
    spans = quiet_spans(run.snaps)
    assert len(spans) == 1, spans
    q_start, q_end = spans[0]
    assert abs(q_start - start) < 0.5 and abs(q_end - end) < 0.5, (q_start - start, q_end - end)


async def test_a_6s_blackhole_is_an_outage_dated_from_its_start():
    """Silence past STALL_AFTER_S: the streams stall, which is the evidence, and the outage is
    announced backdated to the start of the quiet span; it ends with the first token after
    the blackhole. Both within 0.5 s of the proxy's recorded start and end (streams of 1 s,
    as above)."""
    async with loaded(output_tokens=LONG) as (proxy, run):
        await run.for_s(1.5)
        asyncio.get_running_loop().call_later(0.1, proxy.blackhole, 6.0)  # mid-tick
        out = await run.until(lambda s: s.load.health == "outage", "the outage")
        back = await run.until(lambda s: s.load.health != "outage", "the recovery")
        await run.finish()
    start, end = span_of(proxy, "blackhole")
    assert out.load.outage_since is not None
    outage_end = back.t - back.interval  # the start of the tick with the first token
    assert abs(out.load.outage_since - start) < 0.5, out.load.outage_since - start
    assert abs(outage_end - end) < 0.5, outage_end - end
    kinds = [e.kind for s in run.snaps for e in s.events]
    assert kinds.count("outage") == 1 and kinds.count("recovery") == 1 and "stall" in kinds
    assert run.snaps[-1].counters.requests_failed == 0  # silence, not errors


# ---- bandwidth --------------------------------------------------------------------------------

async def test_a_bandwidth_cap_is_the_rate_clients_receive():
    """Two long streams at once (the simulator sends far faster than the cap): the bytes the
    clients receive per second, together, by their own clocks, are the cap (15 %)."""
    cap = 40_000.0
    async with proxied() as (_, proxy):
        proxy.bandwidth(cap)
        results = await asyncio.gather(*(raw_stream(proxy.port, 250) for _ in range(2)))
    reads = sorted(r for _, _, rs in results for r in rs)
    total = sum(n for _, n in reads)
    # from the first read to the last: what came after the first read, over that time
    rate = sum(n for _, n in reads[1:]) / (reads[-1][0] - reads[0][0])
    assert total > 3 * cap  # long enough to measure (several seconds at the cap)
    assert rate == pytest.approx(cap, rel=0.15), rate


# ---- the schedule -----------------------------------------------------------------------------

async def test_a_schedule_applies_and_clears_each_entry_at_its_time():
    """Entries in any order; a `for` ends its own setting only (the latency set again at 0.3
    stays past the first one's end at 0.5); a blackhole ends by itself; `clear` ends the rest."""
    async with proxied() as (_, proxy):
        plan = FaultSchedule.parse([
            {"at": 0.4, "fault": "blackhole", "seconds": 0.3},
            {"at": 0.1, "fault": "latency", "ms": 50, "jitter_ms": 10, "for": 0.4},
            {"at": 0.3, "fault": "latency", "ms": 80},
            {"at": 0.2, "fault": "bandwidth", "bytes_per_s": 1e6, "for": 0.5},
            {"at": 0.9, "fault": "clear"},
        ])
        assert plan.span_s == pytest.approx(0.9)
        t0 = time.time()
        await asyncio.wait_for(proxy.run_schedule(plan), 1.0 + WAIT_S)
    spans = fault_spans(proxy.events)
    assert [s.fault for s in spans] == ["latency", "bandwidth", "latency", "blackhole"]
    got = [t - t0 for s in spans for t in (s.start, s.end or math.inf)]  # start, end, …
    # a timer's lateness on a busy host: tens of ms, never a step's worth (0.1 s)
    assert got == pytest.approx([0.1, 0.3, 0.2, 0.7, 0.3, 0.9, 0.4, 0.7], abs=0.06)
    assert [s.params for s in spans if s.fault == "latency"] == [
        {"ms": 50.0, "jitter_ms": 10.0}, {"ms": 80.0, "jitter_ms": 0.0}]


@pytest.mark.parametrize(("entry", "says"), [
    ({"at": 1, "fault": "flood"}, "'fault' must be one of"),
    ({"fault": "blackhole", "seconds": 3}, "'at'"),
    ({"at": 1, "fault": "latency"}, "'ms' is required"),
    ({"at": 1, "fault": "latency", "ms": "200"}, "must be a number"),
    ({"at": 1, "fault": "reset", "probability": 1.5}, "at most 1"),
    ({"at": 1, "fault": "blackhole", "seconds": 3, "for": 2}, "'for' does not apply"),
    ({"at": 1, "fault": "bandwidth", "bytes_per_s": 0}, "above 0"),
    ({"at": -1, "fault": "clear"}, "negative"),
    ({"at": 1, "fault": "latency", "ms": 5, "jiter_ms": 1}, "unknown setting 'jiter_ms'"),
])
def test_a_bad_schedule_entry_is_one_sentence_naming_it(entry, says):
    with pytest.raises(ScheduleError, match="fault entry 2") as e:
        FaultSchedule.parse([{"at": 0, "fault": "clear"}, entry])
    assert says in str(e.value)


async def test_url_for_rewrites_only_the_address():
    async with proxied() as (sim, proxy):
        assert proxy.url_for(sim.url) == f"http://127.0.0.1:{proxy.port}/v1"
        with pytest.raises(ValueError, match="plain HTTP"):
            proxy.url_for("https://example.com/v1")


# ---- on_change --------------------------------------------------------------------------------

async def test_on_change_hears_each_fault_as_it_is_applied_and_cleared():
    """The listener gets every FaultEvent the moment the proxy records it (before the next
    one: the faults phase dates its run's events by it), and one that raises is logged
    without stopping the faults."""
    heard: list[tuple[int, object]] = []
    async with running_sim() as sim:
        proxy = FaultProxy("127.0.0.1", sim.port,
                           on_change=lambda ev: heard.append((len(proxy.events), ev)))
        await proxy.start()
        try:
            plan = FaultSchedule.parse([
                {"at": 0.05, "fault": "bandwidth", "bytes_per_s": 1e6, "for": 0.1},
                {"at": 0.1, "fault": "blackhole", "seconds": 0.1}])
            await asyncio.wait_for(proxy.run_schedule(plan), 1.0 + WAIT_S)
            assert [ev for _, ev in heard] == proxy.events
            assert [n for n, _ in heard] == [1, 2, 3, 4]  # each as it was recorded

            def broken(ev: object) -> None:
                raise RuntimeError("a listener's bug")

            proxy.on_change = broken
            proxy.latency(50.0)
            proxy.clear()
        finally:
            await proxy.close()
    assert [(e.fault, e.action) for e in proxy.events[-2:]] == [
        ("latency", "apply"), ("latency", "clear")]
