"""Open loop over several worker processes, judged where it counts: at the server.

The simulator stamps every completion request as it arrives (GET /sim/arrivals, its
loop.time(), the same CLOCK_MONOTONIC as this test's loop); the arrival process, the
rates before and after a change, and the silence of a pause are read from there, never
from the load generator's own counters.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from support import (
    WAIT_S,
    headless_argv,
    rate_between,
    running_sim,
    server_arrivals,
    worker_connections,
)

from loadgen.model.snapshot import Control, Snapshot
from loadgen.model.windows import SnapshotWindows
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator


class Run:
    """A coordinator driven tick by tick, every Snapshot kept (for the windows)."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.snaps: list[Snapshot] = []
        self._it = coord.snapshots()

    @classmethod
    async def start(cls, cfg: RunConfig) -> Run:
        coord = Coordinator(cfg)
        await coord.start()
        return cls(coord)

    async def until(self, cond, max_ticks: int = 80) -> Snapshot:
        for _ in range(max_ticks):
            snap = await anext(self._it)
            self.snaps.append(snap)
            if cond(snap):
                return snap
        raise AssertionError("condition not reached")

    async def for_seconds(self, seconds: float) -> Snapshot:
        end = self.snaps[-1].elapsed + seconds if self.snaps else seconds
        return await self.until(lambda s: s.elapsed >= end)

    async def finish(self) -> SnapshotWindows:
        self.coord.request_stop("test over")
        self.snaps += [s async for s in self._it]
        await self.coord.close()
        windows = SnapshotWindows()
        for s in self.snaps:
            windows.add(s)
        return windows


async def wait_until(cond, seconds: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


# constant at a modest rate, where the event loops' ~1 ms timer jitter stays small beside
# the gap; the random ones faster, so that ~300 gaps pin their mean within a few percent
@pytest.mark.parametrize(("arrival", "shape", "rate", "cv_low", "cv_high"), [
    ("constant", 1.0, 25.0, 0.0, 0.2),
    ("poisson", 1.0, 80.0, 0.8, 1.2),
    ("gamma", 4.0, 80.0, 0.35, 0.65),  # CV of gamma(k) is 1/√k
])
async def test_the_server_sees_the_asked_process_whatever_the_worker_count(
        arrival, shape, rate, cv_low, cv_high):
    async with running_sim() as sim:
        run = await Run.start(RunConfig(
            url=sim.url, mode="open", rate=rate, arrival=arrival, burstiness=shape,
            output_tokens="4", input_tokens="8", workers=3, tick=0.25, drain_grace=1.0))
        try:
            await run.for_seconds(4.0)
            # every worker carries its phase of the schedule: each has its own connections
            assert all(n >= 1 for n in worker_connections(run.coord, sim.port)), \
                worker_connections(run.coord, sim.port)
        finally:
            await run.finish()
        arrivals = await server_arrivals(sim)
    gaps = np.diff(arrivals)
    assert len(gaps) > 3.5 * rate
    cv = gaps.std() / gaps.mean()
    assert cv_low <= cv <= cv_high, f"{arrival}: CV of the gaps at the server {cv:.3f}"
    assert 1.0 / gaps.mean() == pytest.approx(rate, rel=0.1)


async def test_a_change_that_leaves_the_schedule_alone_does_not_restart_it(fast_sim):
    """A concurrency change in open loop reaches every worker but is no new schedule: the
    constant gaps at the server go on unbroken (a restart would leave a longer one)."""
    loop = asyncio.get_running_loop()
    run = await Run.start(RunConfig(
        url=fast_sim.url, mode="open", rate=20.0, arrival="constant", output_tokens="4",
        input_tokens="8", workers=2, tick=0.25, drain_grace=1.0))
    try:
        await run.for_seconds(1.0)
        t0 = loop.time()
        for n in range(2, 7):
            await run.coord.control(Control(op="set_concurrency", value=n))
            await asyncio.sleep(0.13)
        await run.for_seconds(1.0)
        t1 = loop.time()
    finally:
        await run.finish()
    arrivals = await server_arrivals(fast_sim)
    gaps = np.diff(arrivals[(arrivals > t0 - 0.2) & (arrivals < t1)])
    assert len(gaps) > 15
    assert gaps.max() < 1.4 / 20.0 and gaps.min() > 0.6 / 20.0, (gaps.min(), gaps.max())


async def test_the_in_flight_cap_holds_over_every_worker():
    """--max-in-flight 2 with 4 workers at a rate far above what the server serves: the
    server never holds more than 2 requests, and the rest wait in the client's backlog."""
    async with running_sim() as sim:
        run = await Run.start(RunConfig(
            url=sim.url, mode="open", rate=60.0, arrival="constant", max_in_flight=2,
            output_tokens="100", input_tokens="8", workers=4, tick=0.25, drain_grace=1.0))
        seen: list[int] = []
        done = asyncio.Event()

        async def sample() -> None:  # the server's own count of requests it is answering
            while not done.is_set():
                seen.append(sim.server.inflight)
                await asyncio.sleep(0.003)

        sampler = asyncio.create_task(sample())
        try:
            snap = await run.for_seconds(3.0)
        finally:
            done.set()
            await sampler
            await run.finish()
        arrivals = await server_arrivals(sim)
    assert max(seen) == 2, f"the server held up to {max(seen)} requests at once"
    assert snap.load.backlog > 30  # ~60/s due, ~20/s served: the backlog grows
    # the cap, not the schedule, sets the pace: about 2 / (100 steps of ~1 ms)
    assert len(arrivals) < 0.6 * 60.0 * snap.elapsed


@pytest.mark.parametrize("load", [
    {"mode": "open", "rate": 40.0, "max_in_flight": 2},  # the one worker with the schedule
    {"concurrency": 1},  # fewer streams than workers
])
async def test_the_request_limit_is_reached_whichever_workers_carry_the_load(fast_sim, load):
    """--requests 20 over 3 workers ends the run by itself after exactly 20 requests at
    the server, also when only one worker sends (a cap, or one stream)."""
    run = await Run.start(RunConfig(url=fast_sim.url, output_tokens="4", input_tokens="8",
                                    max_requests=20, duration=8.0, workers=3, tick=0.25,
                                    **load))
    try:
        await run.until(lambda s: s.load.state == "stopped", max_ticks=60)
    finally:
        await run.finish()
    arrivals = await server_arrivals(fast_sim)
    assert len(arrivals) == 20
    assert run.snaps[-1].counters.requests_ok == 20
    assert run.snaps[-1].elapsed < 6.0  # the limit ended it, not the --duration guard


async def test_a_pause_sends_nothing_and_a_rate_set_meanwhile_holds_after_it(fast_sim):
    loop = asyncio.get_running_loop()
    run = await Run.start(RunConfig(
        url=fast_sim.url, mode="open", rate=20.0, arrival="constant", output_tokens="4",
        input_tokens="8", workers=2, tick=0.25, drain_grace=1.0))
    try:
        await run.for_seconds(1.5)
        t_pause = loop.time()
        await run.coord.control(Control(op="pause"))
        await run.coord.control(Control(op="set_rate", value=40.0))
        snap = await run.until(lambda s: True)
        assert snap.load.state == "paused" and snap.load.target_rate == 40.0
        await run.for_seconds(1.5)
        t_resume = loop.time()
        await run.coord.control(Control(op="resume"))
        await run.for_seconds(2.0)
        t_end = loop.time()
    finally:
        await run.finish()
    arrivals = await server_arrivals(fast_sim)
    first = arrivals[0]
    assert rate_between(arrivals, first, t_pause) == pytest.approx(20.0, rel=0.1)
    # requests already on their way when the pause was sent may land just after it
    during = arrivals[(arrivals > t_pause + 0.05) & (arrivals < t_resume)]
    assert len(during) == 0, f"{len(during)} requests arrived while paused"
    # the resume starts a fresh schedule: no burst of what would have been due meanwhile
    assert rate_between(arrivals, t_resume, t_resume + 0.5) <= 40.0 * 1.2
    assert rate_between(arrivals, t_resume + 0.1, t_end) == pytest.approx(40.0, rel=0.1)


async def test_a_backlog_kept_over_a_pause_does_not_count_the_pause_as_latency():
    """A cap of 1 the server cannot keep up with builds a backlog; over a 2.5 s pause it
    stays in the client, and on resume it is sent with its intended times moved by the
    pause: the pause is the operator's, so lag and ttft_co stay far below it."""
    pause_s = 2.5
    loop = asyncio.get_running_loop()
    async with running_sim() as sim:
        run = await Run.start(RunConfig(
            url=sim.url, mode="open", rate=20.0, arrival="constant", max_in_flight=1,
            output_tokens="100", input_tokens="8", workers=3, tick=0.25, drain_grace=1.0))
        try:
            await run.until(lambda s: s.load.backlog >= 6, max_ticks=20)
            t_pause = loop.time()
            await run.coord.control(Control(op="pause"))
            await run.coord.control(Control(op="set_rate", value=0.0))  # no new arrivals
            held = await run.until(lambda s: s.load.in_flight == 0, max_ticks=8)
            kept = held.load.backlog
            await run.until(lambda s: s.elapsed >= held.elapsed + pause_s)
            assert run.snaps[-1].load.backlog == kept  # nothing left the backlog meanwhile
            t_resume = loop.time()
            await run.coord.control(Control(op="resume"))
            await run.until(lambda s: s.load.backlog == 0 and s.load.in_flight == 0,
                            max_ticks=40)
        finally:
            windows = await run.finish()
        arrivals = await server_arrivals(sim)
    # (requests ending before the pause reaches the worker may still take one or two)
    assert kept >= 3
    assert len(arrivals[(arrivals > t_pause + 0.05) & (arrivals < t_resume)]) == 0
    assert len(arrivals[arrivals > t_resume]) == kept  # the whole backlog, after the resume
    latency = windows.stats("run").latency
    for metric in ("lag", "ttft_co"):
        assert latency[metric]["max"] < pause_s / 2 * 1e6, (metric, latency[metric])


async def test_a_closed_loop_change_while_paused_sends_nothing(fast_sim):
    loop = asyncio.get_running_loop()
    run = await Run.start(RunConfig(
        url=fast_sim.url, concurrency=2, output_tokens="50", input_tokens="8", workers=2,
        tick=0.25, drain_grace=1.0))
    try:
        await run.until(lambda s: s.load.in_flight == 2)
        await run.coord.control(Control(op="pause"))
        await run.coord.control(Control(op="set_concurrency", value=5))
        t_pause = loop.time()
        await run.until(lambda s: s.load.in_flight == 0, max_ticks=8)  # theirs are done
        await run.for_seconds(1.0)
        t_resume = loop.time()
        await run.coord.control(Control(op="resume"))
        await wait_until(lambda: len(fast_sim.model.live()) == 5)
    finally:
        await run.finish()
    arrivals = await server_arrivals(fast_sim)
    # the pause reached the workers in a few ms: the in-flight pair may have sent one more
    assert len(arrivals[(arrivals > t_pause + 0.05) & (arrivals < t_resume)]) == 0


async def test_warm_up_in_open_loop_is_left_out_of_the_results(tmp_path):
    """`run --headless --warmup 1.5 --duration 2` at 40 req/s: the summary counts the
    requests of the 2 s after the warm-up, as the server saw them arrive."""
    out = tmp_path / "result.json"
    warmup, duration, rate = 1.5, 2.0, 40.0
    async with running_sim() as sim:
        argv = headless_argv("--no-record", url=sim.url, mode="open", rate=rate,
                             arrival="constant", workers=3, warmup=warmup, duration=duration,
                             tick=0.25, output_tokens=4, input_tokens=8, json=out)
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()
        arrivals = await server_arrivals(sim)
    result = json.loads(out.read_text())
    ok = result["requests"]["ok"]
    measured = arrivals[(arrivals >= arrivals[0] + warmup)
                        & (arrivals < arrivals[0] + warmup + result["duration_s"])]
    assert len(arrivals) >= rate * (warmup + duration) * 0.9
    assert result["duration_s"] > duration / 2  # the load time: warm-up end to drain start
    # within a tick's worth of the boundaries, never the warm-up's 60 requests
    assert abs(ok - len(measured)) <= 0.1 * len(measured), (ok, len(measured))
    assert result["throughput"]["req_s"] == pytest.approx(rate, rel=0.1)
