"""Auto-ramp, round three: it starts from the load the run has, stops at --auto-ramp-max,
steps the rate in open loop, and a run that auto-ramped is judged from its settle on
(the exploration is its warm-up), with the "done:" line and the exploration said after it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from support import WAIT_S, headless_argv, rate_between, running_sim, server_arrivals

from loadgen.model.slo import parse_slos
from loadgen.model.snapshot import Control, Counters, Snapshot
from loadgen.record.rundir import iter_snapshots
from loadgen.run.auto_ramp import AutoRamp
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator

SLOTS = 8
# past SLOTS streams a request waits a whole request (32 steps ≈ 280 ms) for a slot, so
# a TTFT p99 under 60 ms holds up to SLOTS and breaks above it (tests/run/test_auto_ramp.py)
SLO = "ttft_p99<60ms"


async def _headless(*flags: str, timeout: float, **settings) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *headless_argv(*flags, **settings), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, err.decode()


async def test_a_run_that_auto_ramped_is_judged_at_the_load_it_settled_at(tmp_path: Path):
    out = tmp_path / "summary.json"
    # the embedded simulator with SLOTS slots; from 4 streams: 4 and 8 pass, 16, 12, 10 and
    # 9 break the SLO, so it settles at 8 and holds it for --duration
    code, err = await _headless(
        "--auto-ramp", f"--sim-arg=--slots={SLOTS}", timeout=150, concurrency=4,
        slo=SLO, output_tokens=32, auto_ramp_hold=1.5, duration=4, tick=0.25,
        drain_grace=1, out=tmp_path / "runs", json=out)
    last = err.strip().splitlines()[-1]
    # the exploration broke the SLO four times; the settled load did not: exit 0, "done:"
    assert code == 0, err
    assert last.startswith("tokentop: done: "), last
    summary = json.loads(out.read_text())
    assert summary["thresholds"] and all(t["passed"] for t in summary["thresholds"]), summary
    # both said: the settled judgement first, then what the exploration saw
    note = summary["load_note"]
    assert note.startswith(f"auto-ramp settled at {SLOTS} streams"), note
    assert f"tried 4 ✓ {SLOTS} ✓ 16 ✗" in note and "ttft_p99<60ms broken" in note, note
    assert last.endswith(f" | {note}"), last
    snaps = list(iter_snapshots(summary["run_dir"]))
    events = [e.message for s in snaps for e in s.events]
    assert any(e.startswith("auto-ramp started (cli): from 4 streams (the load now)")
               for e in events), events
    measured = _measured(snaps)
    # the summary covers the settled load alone: --duration of it, not the exploration
    assert abs(summary["duration_s"] - 4) < 0.6, summary["duration_s"]
    assert snaps[-1].elapsed - measured[0].elapsed < 8
    # the simulator's own gauges: the settled load fits its slots (nothing waits, all
    # SLOTS run), and the exploration had gone past them (requests waited in its queue)
    settled = [s for s in measured if s.load.state == "running" and s.server and s.server.ok]
    assert settled and {s.load.target_concurrency for s in settled} == {SLOTS}
    assert max(s.server.running for s in settled) == SLOTS
    assert max(s.server.waiting for s in settled) == 0
    explored = [s for s in snaps if s.load.warmup and s.server and s.server.ok]
    assert max(s.server.waiting for s in explored) > 0


def _measured(snaps: list[Snapshot]) -> list[Snapshot]:
    """The Snapshots after the last one in warm-up (the run's measured part)."""
    last_warm = max(i for i, s in enumerate(snaps) if s.load.warmup)
    return snaps[last_warm + 1:]


async def test_it_starts_from_the_load_now_and_stops_at_the_ceiling():
    async with running_sim(slots=SLOTS) as sim:
        cfg = RunConfig(url=sim.url, concurrency=3, output_tokens="16", workers=1, tick=0.25,
                        drain_grace=1.0, auto_ramp_hold=1.0, auto_ramp_warmup=0.5,
                        auto_ramp_max=5, slo="ttft_p99<10s")
        coord = Coordinator(cfg)
        await coord.start()
        try:
            snaps = coord.snapshots()
            await coord.control(Control(op="auto_ramp", source="key"))
            events, seen = [], []
            async for snap in snaps:
                seen.append(snap)
                events += [e.message for e in snap.events]
                if coord.auto is not None and coord.auto.settled:
                    break
                assert snap.elapsed < 4 * WAIT_S, "auto-ramp did not settle in time"
            started = [e for e in events if e.startswith("auto-ramp started")]
            assert started == ["auto-ramp started (key): from 3 streams (the load now), "
                               "doubling while the SLOs hold (ttft_p99<10s), at most 5 streams "
                               "(--auto-ramp-max); the run's results start again once it "
                               "settles"], events
            # 3 passes, 6 is past the ceiling so 5 is tried, passes, and it settles there
            assert [h[0] for h in coord.auto.history] == [3, 5]
            assert snap.load.note.startswith("auto-ramp settled at 5 streams (the highest step "
                                             "within the SLOs, the --auto-ramp-max ceiling")
            # the simulator's own gauge: at most the ceiling's streams ran at once, ever
            held_until = snap.elapsed + 1.0
            running = [s.server.running for s in seen if s.server and s.server.ok]
            async for snap in snaps:
                if snap.server and snap.server.ok:
                    running.append(snap.server.running)
                if snap.elapsed > held_until:
                    break
            assert max(running) == 5, running
            assert snap.load.target_concurrency == 5
            coord.request_stop("test over")
            async for _ in snaps:
                pass
        finally:
            await coord.close()


async def test_in_open_loop_it_steps_the_rate_and_says_req_s():
    async with running_sim(slots=64) as sim:
        cfg = RunConfig(url=sim.url, mode="open", rate=2.0, arrival="constant",
                        output_tokens="4", workers=1, tick=0.25, drain_grace=1.0,
                        auto_ramp_hold=2.0, auto_ramp_warmup=0.5)
        coord = Coordinator(cfg)
        await coord.start()
        try:
            snaps = coord.snapshots()
            await coord.control(Control(op="auto_ramp", source="key"))
            notes: list[str] = []
            async for snap in snaps:
                notes.append(snap.load.note or "")
                if snap.load.target_rate == 4.0:
                    break
                assert snap.elapsed < WAIT_S, "the rate was not doubled in time"
            assert snap.load.mode == "open"
            assert any(n.startswith("auto-ramp trying 2 req/s: ") for n in notes), notes
            t_double = asyncio.get_running_loop().time()
            async for _ in snaps:
                if asyncio.get_running_loop().time() > t_double + 2.5:
                    break
            # the simulator's own arrival times: the 2 req/s step, then the 4 req/s one
            arrivals = await server_arrivals(sim)
            step2 = rate_between(arrivals, t_double + 0.5, t_double + 2.5)
            assert 3.0 <= step2 <= 5.0, step2
            coord.request_stop("test over")
            async for _ in snaps:
                pass
        finally:
            await coord.close()


def _engine(slots: int):
    """The simulator's default step costs by hand, flat past `slots` (test_auto_ramp.py)."""
    return lambda n: 1000.0 * min(n, slots) / (6.0 + 0.35 * min(n, slots))


def test_without_slo_a_start_past_the_knee_steps_down_to_it():
    # from 16 streams on an 8-slot engine: 16 passes with nothing below it, 32 adds nothing,
    # so 8 is measured: 16 adds nothing over 8 and fails; 4 is measured, 8 scales over it
    ramp = AutoRamp(parse_slos(None), start=16, hold_s=2.0, warmup_s=0.5)
    tok_s, counters, t = _engine(8), Counters(), 0.0
    for _ in range(4000):
        t += 0.25
        counters.requests_ok += 1
        counters.requests_good += 1
        counters.output_tokens += round(tok_s(ramp.load) * 0.25)
        ramp.observe(t, {}, counters)
        if ramp.settled:
            break
    assert ramp.settled and ramp.load == 8, ramp.history
    assert [h[0] for h in ramp.history][:4] == [16, 32, 8, 4], ramp.history
    assert ramp.why[16].startswith("+0.0% tok/s"), ramp.why


async def test_a_failed_threshold_still_ends_with_the_done_line(sim, tmp_path: Path):
    out = tmp_path / "summary.json"
    code, err = await _headless("--no-record", timeout=60, url=sim.url, concurrency=2,
                                output_tokens=8, duration=1.5, slo="ttft_p99<1us", json=out)
    last = err.strip().splitlines()[-1]
    summary = json.loads(out.read_text())
    assert code == 3, err
    ok = summary["requests"]["ok"]
    assert ok > 0
    assert last.startswith("tokentop: threshold failed: ttft_p99<1us: measured "), last
    assert f" | done: {ok} requests ok, 0 failed, " in last, last
