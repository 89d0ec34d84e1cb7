"""The load engine against the real simulator: control, open loop, cancellation, limits."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from support import WAIT_S, rate_between, server_arrivals, worker_connections

from loadgen.model.slo import SloError, parse_slos
from loadgen.model.snapshot import Control
from loadgen.model.windows import SnapshotWindows
from loadgen.run.config import ConfigError, RunConfig
from loadgen.run.coordinator import Coordinator


async def run_until(coord: Coordinator, cond, max_ticks: int = 80):
    """Iterate Snapshots until cond(snapshot) holds; returns it (bounded)."""
    async for snap in coord.snapshots_iter:
        if cond(snap):
            return snap
        max_ticks -= 1
        if max_ticks == 0:
            raise AssertionError("condition not reached")
    raise AssertionError("the run ended first")


async def started(cfg: RunConfig) -> Coordinator:
    coord = Coordinator(cfg)
    await coord.start()
    coord.snapshots_iter = coord.snapshots()
    return coord


async def finish(coord: Coordinator) -> list:
    coord.request_stop("test over")
    rest = [s async for s in coord.snapshots_iter]
    await coord.close()
    return rest


async def test_concurrency_changes_show_in_the_next_snapshot(sim):
    # every stream at once (--stagger 0): what is checked is the tick a change shows in
    coord = await started(RunConfig(url=sim.url, concurrency=2, output_tokens="500",
                                    workers=1, tick=0.25, drain_grace=0.5, stagger=0.0))
    try:
        await run_until(coord, lambda s: s.load.in_flight == 2)
        await coord.control(Control(op="set_concurrency", value=6))
        snap = await run_until(coord, lambda s: True)
        assert snap.load.target_concurrency == 6  # the very next tick
        await run_until(coord, lambda s: s.load.in_flight == 6, max_ticks=8)
        await coord.control(Control(op="add_concurrency", value=-4))
        snap = await run_until(coord, lambda s: True)
        assert snap.load.target_concurrency == 2
        assert any("concurrency" not in e.message or "2 streams" in e.message
                   for e in snap.events)
    finally:
        await finish(coord)


async def test_open_loop_rate_and_mode_switch(sim):
    """Every change shows at the server: 20 req/s, then 40, then closed loop (6 streams
    held), then open loop again at 40; two workers share each schedule."""
    loop = asyncio.get_running_loop()
    coord = await started(RunConfig(url=sim.url, mode="open", rate=20.0, arrival="constant",
                                    concurrency=6, output_tokens="8", workers=2, tick=0.25,
                                    drain_grace=1.0))
    try:
        snap = await run_until(coord, lambda s: s.elapsed >= 2.0)
        assert snap.load.mode == "open" and snap.load.target_rate == 20.0
        t_40 = loop.time()
        await coord.control(Control(op="set_rate", value=40.0))
        snap = await run_until(coord, lambda s: True)
        assert snap.load.target_rate == 40.0
        await run_until(coord, lambda s: s.elapsed >= snap.elapsed + 1.5)
        t_closed = loop.time()
        await coord.control(Control(op="set_mode", note="closed"))
        snap = await run_until(coord, lambda s: True)
        assert snap.load.mode == "closed" and snap.load.target_rate is None
        # the server holds the 6 streams, tick after tick (40 req/s of ~60 ms would not)
        await server_holds(sim, 6)
        t_open = loop.time()
        await coord.control(Control(op="set_mode", note="open"))
        snap = await run_until(coord, lambda s: True)
        assert snap.load.mode == "open" and snap.load.target_rate == 40.0
        await run_until(coord, lambda s: s.elapsed >= snap.elapsed + 1.5)
        t_end = loop.time()
    finally:
        rest = await finish(coord)
    assert rest[-1].counters.requests_failed == 0
    arrivals = await server_arrivals(sim)
    assert rate_between(arrivals, arrivals[0], t_40) == pytest.approx(20.0, rel=0.1)
    assert rate_between(arrivals, t_40 + 0.1, t_closed) == pytest.approx(40.0, rel=0.1)
    assert rate_between(arrivals, t_open + 0.3, t_end) == pytest.approx(40.0, rel=0.1)


async def server_holds(sim, n: int, samples: int = 10) -> None:
    """Until the simulator has exactly `n` requests in its engine for `samples` polls in a
    row (bounded)."""
    in_a_row = 0
    for _ in range(int(WAIT_S / 0.02)):
        in_a_row = in_a_row + 1 if len(sim.model.live()) == n else 0
        if in_a_row >= samples:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the server never held {n} requests (now {len(sim.model.live())})")


async def test_open_loop_latency_from_intended_time_includes_the_backlog(sim):
    """With an in-flight cap the server cannot keep up with, requests wait in the client's
    backlog: measured from the intended send time (coordinated omission corrected) TTFT grows
    with the wait, measured from the actual send it does not."""
    coord = await started(RunConfig(url=sim.url, mode="open", rate=30.0, arrival="constant",
                                    max_in_flight=2, output_tokens="40", workers=1, tick=0.25,
                                    drain_grace=0.5))
    windows = SnapshotWindows()
    try:
        while True:
            snap = await run_until(coord, lambda s: True)
            windows.add(snap)
            if snap.elapsed >= 4.0:
                break
        assert snap.load.backlog > 10
    finally:
        await finish(coord)
    run = windows.stats("run").latency
    assert run["ttft_co"]["p50"] > 5 * run["ttft"]["p50"]
    assert run["lag"]["p50"] > 100_000  # µs: requests sat in the backlog
    assert run["ttft"]["p99"] < 200_000


async def test_request_limit_and_cancellation(sim):
    coord = await started(RunConfig(url=sim.url, concurrency=4, output_tokens="30",
                                    max_requests=40, cancel_rate=0.5, cancel_at="5",
                                    workers=1, tick=0.25))
    snaps = []
    async for s in coord.snapshots_iter:
        snaps.append(s)
    await coord.close()
    c = snaps[-1].counters
    assert c.requests_ok + c.requests_cancelled + c.requests_failed == 40
    assert c.requests_failed == 0
    assert 8 <= c.requests_cancelled <= 32  # half of 40, seeded
    assert c.errors["cancelled"] == c.requests_cancelled
    # the completed requests' tokens are theirs alone; a cancelled stream's five tokens were
    # still delivered, so they count in the delivered total
    assert c.completed_output_tokens == 30 * c.requests_ok
    assert c.output_tokens == 30 * c.requests_ok + 5 * c.requests_cancelled


async def test_goodput_counts_requests_inside_the_slo(sim):
    cfg = RunConfig(url=sim.url, concurrency=2, output_tokens="10", max_requests=20,
                    slo="ttft<10s,e2e<1us", workers=1, tick=0.25)
    coord = await started(cfg)
    last = [s async for s in coord.snapshots_iter][-1]
    await coord.close()
    # nothing finishes inside 1 µs: every request is ok, none is good
    assert last.counters.requests_ok == 20 and last.counters.requests_good == 0
    cfg = RunConfig(url=sim.url, concurrency=2, output_tokens="10", max_requests=20,
                    slo="ttft<10s,e2e<60s", workers=1, tick=0.25)
    coord = await started(cfg)
    last = [s async for s in coord.snapshots_iter][-1]
    await coord.close()
    assert last.counters.requests_good == 20


def test_bad_settings_are_sentences():
    with pytest.raises(ConfigError, match="bad length '0': values must be ≥ 1"):
        RunConfig(input_tokens="0").parsed()  # a 0-token prompt cannot be asked for
    with pytest.raises(ConfigError, match="bad length 'uniform:9'"):
        RunConfig(output_tokens="uniform:9").parsed()
    with pytest.raises(ConfigError, match="--cancel-rate needs --cancel-at"):
        RunConfig(cancel_rate=0.1).parsed()
    with pytest.raises(ConfigError, match="bad ramp"):
        RunConfig(ramp="linear:1:2").parsed()
    with pytest.raises(SloError, match="unknown --slo metric"):
        parse_slos("latency_p99<1s")
    with pytest.raises(ConfigError, match="unknown --slo metric"):
        RunConfig(slo="latency_p99<1s").parsed()
    slos = parse_slos("ttft<500ms,ttft_p99<1s,error_rate<0.1%")
    assert slos.per_request.ttft_us == 500_000
    assert [t.text for t in slos.thresholds] == ["ttft_p99<1s", "error_rate<0.1%"]
    assert slos.thresholds[1].value == pytest.approx(0.001)


async def test_linear_ramp_then_manual_key_takes_over(sim):
    coord = await started(RunConfig(url=sim.url, ramp="linear:1:9:2", output_tokens="500",
                                    workers=1, tick=0.25, drain_grace=0.5))
    try:
        first = await run_until(coord, lambda s: True)
        assert first.load.target_concurrency <= 3 and first.load.note.startswith("ramp")
        snap = await run_until(coord, lambda s: s.load.target_concurrency == 9, max_ticks=16)
        await coord.control(Control(op="set_concurrency", value=3, source="key"))
        snap = await run_until(coord, lambda s: True)
        assert snap.load.target_concurrency == 3 and snap.load.note is None
    finally:
        await finish(coord)


async def test_worker_processes_share_the_load(sim):
    """5 streams over 2 workers: the server holds 5, and each worker carries its share
    (3 and 2), counted by the kernel as each worker process's connections to the server."""
    coord = await started(RunConfig(url=sim.url, concurrency=5, output_tokens="400",
                                    workers=2, tick=0.25, drain_grace=0.5))
    try:
        snap = await run_until(coord, lambda s: s.load.in_flight == 5)
        assert snap.client.workers == 2
        await server_holds(sim, 5)
        assert worker_connections(coord, sim.port) == [3, 2]
    finally:
        await finish(coord)


async def test_an_outage_and_its_recovery_are_seen(sim):

    coord = await started(RunConfig(url=sim.url, concurrency=4, output_tokens="20",
                                    workers=1, tick=0.25, drain_grace=0.5))
    root = sim.url.removesuffix("/v1")
    events = []
    try:
        await run_until(coord, lambda s: s.counters.requests_ok > 4)
        async with aiohttp.ClientSession() as http:
            # longer than OUTAGE_MIN_S: a shorter one is errors, not an outage
            r = await http.post(f"{root}/sim/faults", json={"outage_s": 4})
            assert r.status == 200
        start = await run_until(coord, lambda s: s.load.outage_since is not None)
        events += start.events
        end = await run_until(coord, lambda s: s.load.outage_since is None, max_ticks=40)
        events += end.events
    finally:
        await finish(coord)
    kinds = [e.kind for e in events]
    assert "outage" in kinds and "recovery" in kinds
    # users back off while connections are refused (50 ms doubling to 1 s): a handful of
    # attempts each, not a busy loop of thousands
    connect = end.counters.errors.get("connect", 0)
    assert 1 <= connect <= 4 * 10, end.counters.errors
    recovery = next(e for e in events if e.kind == "recovery")
    lasted = float(recovery.message.split("after ")[1].split(" s")[0])
    assert 3.0 <= lasted <= 8.0


async def test_an_injected_stall_shows_in_the_intended_time_view_only(sim):
    """wrk2's point: while the server stalls, a client with a cap cannot send what is due.
    Measured from the actual send, the requests sent after the stall look fast; measured
    from when they were due (coordinated omission corrected), they carry the stall."""

    from loadgen.model import hdr

    async with aiohttp.ClientSession() as http:
        r = await http.post(sim.url.removesuffix("/v1") + "/sim/faults",
                            json={"spike_every_s": 2.0, "spike_ms": 800})
        assert r.status == 200
    coord = await started(RunConfig(url=sim.url, mode="open", rate=20.0, arrival="constant",
                                    max_in_flight=3, output_tokens="6", input_tokens="8",
                                    workers=1, tick=0.25, drain_grace=1.0))
    windows = SnapshotWindows()
    try:
        while True:
            snap = await run_until(coord, lambda s: True)
            windows.add(snap)
            if snap.elapsed >= 6.5:
                break
    finally:
        await finish(coord)
    dense = windows.dense("run")

    def slow(metric: str) -> int:
        # requests whose TTFT was over 400 ms
        return int(dense[metric][hdr.LOWEST_AT > 400_000].sum())

    # each stall holds the 3 requests in flight (slow in both views); of the ~16 that fell
    # due meanwhile, those due in its first half waited over 400 ms (slow when due only)
    assert slow("ttft_co") >= 2 * slow("ttft") and slow("ttft_co") >= 10
    assert hdr.summarize(dense["ttft_co"])["p99"] >= 500_000
    assert hdr.summarize(dense["ttft"])["p50"] < 100_000
