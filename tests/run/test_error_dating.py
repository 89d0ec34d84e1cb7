"""Errors are dated when they happened (the worker's stamp), not when the coordinator's
per-kind batch made their event: no error event is read after the recovery that followed
it, and none is dated after the server stopped failing. The counts are the simulator's own
(GET /sim/faults, what it injected)."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
from support import root, running_sim, server_arrivals

from loadgen.analysis.soak import SoakAnalyzer
from loadgen.model.snapshot import Event, Snapshot
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.sim.faults import FaultConfig

LATE_S = 0.25  # a 500 decided before the switch can reach the worker a little after it


async def faults(sim, **changes) -> dict:
    async with aiohttp.ClientSession() as http:
        if changes:
            async with http.post(root(sim) + "/sim/faults", json=changes) as resp:
                assert resp.status == 200, await resp.text()
        async with http.get(root(sim) + "/sim/faults") as resp:
            return await resp.json()


async def ticks(it, snaps: list[Snapshot], seconds: float, max_ticks: int = 200) -> None:
    end = (snaps[-1].elapsed if snaps else 0.0) + seconds
    for _ in range(max_ticks):
        snaps.append(await anext(it))
        if snaps[-1].elapsed >= end:
            return
    raise AssertionError("the run did not reach its time")


async def test_the_last_errors_are_told_before_the_recovery_and_at_their_time():
    async with running_sim(faults=FaultConfig(error_rate=1.0)) as sim:
        coord = Coordinator(RunConfig(url=sim.url, concurrency=2, workers=1, tick=0.25,
                                      drain_grace=1.0, output_tokens="4", input_tokens="8"))
        await coord.start()
        it = coord.snapshots()
        snaps: list[Snapshot] = []
        try:
            await ticks(it, snaps, 4.5)  # an outage: nothing succeeds for OUTAGE_MIN_S
            await faults(sim, error_rate=0.0)
            loop = asyncio.get_running_loop()
            healed, healed_loop = time.time(), loop.time()
            await ticks(it, snaps, 2.0)  # the next attempts succeed: a recovery
        finally:
            coord.request_stop("test over")
            snaps += [s async for s in it]
            await coord.close()
        injected = (await faults(sim))["injected"]["http_500"]
        arrivals = await server_arrivals(sim)
        wall_of_loop = time.time() - loop.time()
    # the last request the server failed, on the wall clock (its stamps are this loop's)
    last_failed = arrivals[arrivals < healed_loop].max() + wall_of_loop
    events: list[Event] = [e for s in snaps for e in s.events]  # as a reader gets them
    kinds = [e.kind for e in events]
    assert "outage" in kinds and "recovery" in kinds, kinds
    recovered = kinds.index("recovery")
    errors = [e for e in events if e.kind == "error"]
    assert sum(e.count for e in errors) == injected > 0
    assert "error" not in kinds[recovered:], kinds[recovered:]
    # each event is dated at its last error, none after the server stopped failing; the
    # last one when the server failed its last request (an answer's time later)
    last = max(errors, key=lambda e: e.t)
    assert last.t <= healed + LATE_S, (last.t, healed)
    assert abs(last.t - last_failed) <= 0.1, (last.t, last_failed)
    # in a tick, events in the order they happened
    for s in snaps:
        assert [e.t for e in s.events] == sorted(e.t for e in s.events)

    # the soak's long-tail context cites that error at its own second, from the tick it
    # happened in
    soak = SoakAnalyzer()
    for s in snaps:
        soak.add(s)
    tick = next(s for s in snaps if s.t >= last_failed)
    cited = [c for c in soak._context(tick.t) if c.startswith("error at ") and
             c.endswith(last.message)]
    assert cited, soak._context(tick.t)
    offset = float(re.match(r"error at ([-+][\d.]+) s", cited[0]).group(1))
    assert abs(offset - (last_failed - tick.t)) <= 0.15, (cited, last_failed - tick.t)
