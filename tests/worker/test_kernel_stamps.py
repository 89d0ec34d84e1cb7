"""Arrival times as the kernel stamped them (loadgen.worker.stamped), and the coalesced
wake-ups they make safe (loadgen.worker.coalesce).

The truth is the exact-timing simulator's own send stamp in every chunk, from its own
process: the client's ITL error is |measured gap − the gap between the server's stamps|.
The client's loop is held busy on purpose (a blocking sleep, as a parse burst or a
collection would hold it) for shorter than the gap, so each chunk waits at most once and
the loop's own clock would stamp it late by what was left of the hold.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time

import numpy as np
import pytest
from support import chat_body

from loadgen.run.embedded_sim import EmbeddedSim
from loadgen.sim import SimConfig
from loadgen.worker import coalesce, stamped
from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder

pytestmark = pytest.mark.skipif(not stamped.AVAILABLE, reason="SO_TIMESTAMPNS: Linux only")

ITL_MS = 20.0
HOLD_S = 0.012  # < the gap: a chunk waits behind one hold at most


@pytest.fixture
async def exact_sim():
    sim = EmbeddedSim(SimConfig(exact_ttft_ms=30.0, exact_itl_ms=ITL_MS))
    await sim.start()
    try:
        yield sim
    finally:
        await sim.stop()


async def _hold_the_loop(until: float) -> None:
    """Block the loop HOLD_S at a time, at seeded random moments, until `until`."""
    rng = random.Random(7)
    while time.perf_counter() < until:
        await asyncio.sleep(rng.uniform(0.005, 0.02))
        time.sleep(HOLD_S)


async def _itl_errors_ms(url: str, kernel_stamps: bool, streams: int = 4) -> np.ndarray:
    rec = IntervalRecorder()
    client = StreamingClient(url + "/chat/completions", rec, calibrate=True)
    client.endpoint.kernel_stamps = kernel_stamps
    try:
        sending = [client.request(chat_body(40), 2) for _ in range(streams)]
        holding = _hold_the_loop(time.perf_counter() + 0.9)
        results = await asyncio.gather(*sending, holding)
    finally:
        client.close()
    assert all(results[:streams]), rec.last_errors
    assert rec.counters.requests_ok == streams, rec.last_errors
    return np.asarray(rec.itl_err) / 1000.0


async def test_a_busy_loop_leaves_kernel_stamped_gaps_true(exact_sim):
    kernel = await _itl_errors_ms(exact_sim.url, kernel_stamps=True)
    loop_clock = await _itl_errors_ms(exact_sim.url, kernel_stamps=False)
    assert len(kernel) == len(loop_clock) == 4 * 39
    # the control: the holds did delay the reads, by up to what was left of a hold
    assert np.percentile(loop_clock, 90) >= 3.0, np.percentile(loop_clock, [50, 90, 99])
    # stamped as they reached the socket, the gaps are the server's own (the tail is this
    # shared machine's scheduling of the simulator's process between its stamp and write)
    assert np.percentile(kernel, 90) <= 1.0, np.percentile(kernel, [50, 90, 99])
    assert np.percentile(kernel, 50) <= 0.3, np.percentile(kernel, [50, 90, 99])


class _SteppedSocket(socket.socket):
    """A real socket whose kernel stamps read `step_s` off, as after a wall-clock step."""

    step_s = 0.0

    def recvmsg(self, *args):
        data, anc, flags, addr = super().recvmsg(*args)
        moved = []
        for level, kind, raw in anc:
            sec, ns = stamped._TIMESPEC.unpack(raw)
            total = sec * 1_000_000_000 + ns + int(self.step_s * 1e9)
            moved.append((level, kind, stamped._TIMESPEC.pack(*divmod(total, 1_000_000_000))))
        return data, moved, flags, addr


class _Arrivals:
    def __init__(self) -> None:
        self.got: list[tuple[bytes, float]] = []
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received_at(self, data: bytes, arrived: float) -> None:
        self.got.append((data, arrived))

    def connection_lost(self, exc) -> None:
        self.lost.set_result(exc)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


async def _read_one(step_s: float, hold_s: float) -> tuple[float, float, float]:
    """Send a few bytes to a StampedTransport over a real socket pair, read after the loop
    was held `hold_s`: (sent, arrived as delivered, read by) on perf_counter."""
    loop = asyncio.get_running_loop()
    a, b = _tcp_pair()
    ours = _SteppedSocket(fileno=a.detach())
    ours.step_s = step_s
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, stamped.SO_TIMESTAMPNS, 1)
    proto = _Arrivals()
    transport = stamped.StampedTransport(loop, ours, proto)
    try:
        sent = time.perf_counter()
        b.send(b"data: {}\n\n")
        time.sleep(hold_s)  # the loop is busy: the bytes wait in the socket
        async with asyncio.timeout(5):
            while not proto.got:
                await asyncio.sleep(0)
        read_by = time.perf_counter()
        b.close()
        async with asyncio.timeout(5):
            assert await proto.lost is None  # the peer's close, heard once
    finally:
        transport.abort()
        b.close()
    assert [d for d, _ in proto.got] == [b"data: {}\n\n"]
    return sent, proto.got[0][1], read_by


async def test_a_read_is_stamped_when_its_bytes_arrived_not_when_read():
    sent, arrived, read_by = await _read_one(0.0, hold_s=0.05)
    assert sent <= arrived <= sent + 0.01, (arrived - sent)
    assert read_by - arrived >= 0.045


@pytest.mark.parametrize("step_s", [3600.0, -3600.0], ids=["clock ahead", "clock behind"])
async def test_a_stamp_across_a_wall_clock_step_falls_back_to_the_read_time(step_s):
    # a stamp an hour off cannot be a wait: the read is stamped when it was read, as
    # without kernel stamps, and never an hour away
    sent, arrived, read_by = await _read_one(step_s, hold_s=0.02)
    assert sent + 0.02 <= arrived <= read_by, (arrived - sent, read_by - sent)


async def _turns(seconds: float) -> int:
    """How many times the loop comes round in `seconds` for a task that yields each turn."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        await asyncio.sleep(0)
        n += 1
    return n


async def test_the_loop_naps_only_while_chunks_come_fast():
    c = coalesce.Coalescer()
    free = await _turns(0.1)
    c.rate(int(coalesce.ON_RATE * 2), 1.0)
    assert c.on
    napping = await _turns(0.1)
    c.rate(int(coalesce.ON_RATE * 0.8), 1.0)  # between the two rates: it stays on
    assert c.on
    c.rate(int(coalesce.OFF_RATE * 0.5), 1.0)
    assert not c.on
    await asyncio.sleep(0.01)  # the nap under way ends
    after = await _turns(0.1)
    # a nap a turn: at most 0.1 s / NAP_S turns (500) where an idle loop turns thousands
    assert napping <= 0.1 / coalesce.NAP_S, (free, napping, after)
    assert free >= 5 * napping and after >= 5 * napping, (free, napping, after)
