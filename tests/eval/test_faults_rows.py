"""The faults phase's rows (issue 29): a run through the fault proxy, as
loadgen.eval.battery.faults runs it (FaultProxy(on_change=FaultNotes.take), the Session
attached), against the real exact-timing simulator, with a bandwidth cap and then a
latency fault. Each figure is judged against a truth that is not the code that made it:

* events.jsonl holds each fault's start and end, dated as the proxy's own FaultEvents
  (its clock of when it applied and cleared them), each recorded with the tick it fell in;
* the E2E P50/P90/P99 and ITL under each fault are the `hdrh` library's own decode and
  percentiles over the raw per-tick histograms of the ticks inside the proxy's span;
* the output tok/s under the cap is numpy over the raw token counters of its ticks, and at
  most the bytes the proxy let through while it was on (its own counter) over the bytes a
  token costs;
* E2E under the cap is far above E2E before any fault, and under the latency fault about
  the fault's 200 ms above it;
* `tokentop report`'s fault table reads the same spans back from events.jsonl.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from support import WAIT_S, running_sim

from loadgen.analysis.report import write_report
from loadgen.eval.proxy import FaultEvent, FaultProxy, FaultSchedule, FaultSpan, fault_spans
from loadgen.eval.under_fault import FaultNotes, under_fault
from loadgen.model.snapshot import Snapshot
from loadgen.record.rundir import iter_snapshots, read_events
from loadgen.run.config import RunConfig
from loadgen.run.session import Session

pytestmark = pytest.mark.timeout(180)

TICK = 0.25
EXACT = {"exact_ttft_ms": 20.0, "exact_itl_ms": 10.0}  # the simulator's own timing, constant
CAP = 20_000.0  # bytes/s: a sixth of what the unfaulted load takes
LATENCY_MS = 200.0
SCHEDULE = [
    {"at": 1.5, "fault": "bandwidth", "bytes_per_s": CAP, "for": 4.0},
    {"at": 7.0, "fault": "latency", "ms": LATENCY_MS, "for": 2.5},
]
RUN_S = 11.0
MAX_TICKS = int((RUN_S + 20) / TICK)  # bound on the Snapshot loop


def run_config(url: str, out: Path, **overrides: object) -> RunConfig:
    settings: dict[str, object] = {
        "url": url, "concurrency": 4, "input_tokens": "8", "output_tokens": "30",
        "workers": 1, "tick": TICK, "drain_grace": 5.0, "tokenizer": "none",
        "duration": RUN_S, "warmup": 0.0, "out": str(out), **overrides}
    return RunConfig(**settings)  # type: ignore[arg-type]


@dataclass
class Faulted:
    run_dir: Path
    proxy: FaultProxy
    # the proxy's own count of bytes handed to clients when each FaultEvent happened
    bytes_at: list[int] = field(default_factory=list)
    # how far the wall clock moved against the monotonic one during the run (a fresh VM's
    # clock is stepped by its time daemon): the proxy dates by the first, ticks by the second
    clock_step_s: float = 0.0


def wall_minus_monotonic() -> float:
    return time.time() - time.monotonic()


async def faults_run(tmp: Path) -> Faulted:
    """The faults phase's run: the proxy's changes noted in the Session as they happen."""
    offset = wall_minus_monotonic()
    async with running_sim(**EXACT) as sim:
        notes = FaultNotes()
        bytes_at: list[int] = []

        def changed(ev: FaultEvent) -> None:
            notes.take(ev)
            bytes_at.append(proxy.counters.bytes_to_client)

        proxy = FaultProxy("127.0.0.1", sim.port, on_change=changed)
        await proxy.start()
        run_dir = tmp / "faults"
        try:
            session = Session(run_config(proxy.url_for(sim.url), run_dir))
            notes.attach(session)
            await session.start()
            schedule = asyncio.create_task(proxy.run_schedule(FaultSchedule.parse(SCHEDULE)))
            try:
                async with asyncio.timeout(RUN_S + 20 + WAIT_S):
                    ticks = 0
                    async for _ in session.snapshots():
                        ticks += 1
                        assert ticks <= MAX_TICKS, "the run did not end"
                await schedule  # done long before the run's end
            finally:
                schedule.cancel()
                await session.finish()
        finally:
            await proxy.close()
    return Faulted(run_dir, proxy, bytes_at, abs(wall_minus_monotonic() - offset))


@pytest.fixture(scope="module")
def faulted(tmp_path_factory) -> Faulted:
    return asyncio.run(faults_run(tmp_path_factory.mktemp("faults")))


def span(proxy: FaultProxy, fault: str) -> FaultSpan:
    (s,) = [s for s in fault_spans(proxy.events) if s.fault == fault]
    assert s.end is not None
    return s


def merged(snaps: list[Snapshot], metric: str, start: float, end: float) -> HdrHistogram:
    """The metric over the ticks wholly inside [start, end] (a tick covers the interval
    before its time), by the hdrh library's own decoder."""
    total = HdrHistogram(1, 3_600_000_000, 3)
    for s in snaps:
        if start <= s.t - s.interval and s.t <= end and metric in s.hist:
            total.add(HdrHistogram.decode(s.hist[metric]))
    return total


def ms_at(h: HdrHistogram, percentile: float) -> float:
    assert h.get_total_count() > 0
    return h.get_value_at_percentile(percentile) / 1000.0


# ---- the events -------------------------------------------------------------------------------

def test_each_fault_start_and_end_is_an_event_dated_by_the_proxy(faulted):
    run_dir, proxy = faulted.run_dir, faulted.proxy
    snaps = {s.seq: s for s in iter_snapshots(run_dir)}
    events = [e for e in read_events(run_dir) if e["kind"] == "fault"]
    truth = [e for e in proxy.events]
    assert [e.action for e in truth] == ["apply", "clear", "apply", "clear"]
    assert len(events) == len(truth)
    for ev, e in zip(truth, events, strict=True):
        assert e["t"] == pytest.approx(ev.t, abs=0.005)
        # noted live: recorded with the tick it fell in, so that tick ends within one tick
        # after the proxy applied or cleared the fault (its collect's latency on top), give
        # or take a step of the wall clock against the ticks' monotonic one
        tick_t, step = snaps[e["seq"]].t, faulted.clock_step_s
        assert ev.t - 0.01 - step <= tick_t <= ev.t + TICK + 0.15 + step, (ev, tick_t, step)
        assert ev.fault in e["message"]
    starts = [e for e in events if e.get("since") is None]
    ends = [e for e in events if e.get("since") is not None]
    assert [e["level"] for e in starts] == ["warn", "warn"]
    assert [e["since"] for e in ends] == [e["t"] for e in starts]  # each end names its start
    for s, e in zip(starts, ends, strict=True):
        assert e["seconds"] == pytest.approx(e["t"] - s["t"], abs=0.002)
    assert "19.5 KiB/s" in starts[0]["message"] and "200 ms" in starts[1]["message"]


def test_a_fault_noted_before_the_run_starts_is_in_its_first_tick(tmp_path):
    """The battery starts the schedule beside the Session's start: a fault applied before
    the first tick is held and recorded with it, dated when the proxy applied it."""

    async def run() -> float:
        async with running_sim(**EXACT) as sim:
            notes = FaultNotes()
            applied = FaultEvent(t=1_700_000_000.0, elapsed=0.0, fault="reset",
                                 action="apply", params={"probability": 0.5, "within_s": 1.0})
            notes.take(applied)  # before the Session exists
            session = Session(run_config(sim.url, tmp_path / "run", duration=0.6))
            notes.attach(session)  # before it starts: held by the Session
            assert await asyncio.wait_for(session.run(), RUN_S + WAIT_S) == 0
            return applied.t

    t = asyncio.run(run())
    (e,) = [e for e in read_events(tmp_path / "run") if e["kind"] == "fault"]
    assert e["seq"] == 0 and e["t"] == t and e["since"] is None
    assert "reset 50.0% of connections" in e["message"]


# ---- the figures under each fault -------------------------------------------------------------

def test_e2e_and_itl_under_each_fault_are_the_ticks_wholly_inside_it(faulted):
    run_dir, proxy = faulted.run_dir, faulted.proxy
    snaps = list(iter_snapshots(run_dir))
    for fault in ("bandwidth", "latency"):
        s = span(proxy, fault)
        got = under_fault(run_dir, s, TICK)
        e2e, itl = merged(snaps, "e2e", s.start, s.end), merged(snaps, "itl", s.start, s.end)
        assert e2e.get_total_count() >= 3, fault  # enough requests ended under it to judge
        # the same HDR buckets: equal to the µs, whichever code reads them
        assert got.e2e_p50_ms == pytest.approx(ms_at(e2e, 50), abs=0.0015), fault
        assert got.e2e_p90_ms == pytest.approx(ms_at(e2e, 90), abs=0.0015), fault
        assert got.e2e_p99_ms == pytest.approx(ms_at(e2e, 99), abs=0.0015), fault
        assert got.itl_p50_ms == pytest.approx(ms_at(itl, 50), abs=0.0015), fault
        assert got.itl_p99_ms == pytest.approx(ms_at(itl, 99), abs=0.0015), fault


def test_e2e_under_the_cap_is_far_above_the_unfaulted_and_latency_adds_its_ms(faulted):
    run_dir, proxy = faulted.run_dir, faulted.proxy
    snaps = list(iter_snapshots(run_dir))
    bw, lat = span(proxy, "bandwidth"), span(proxy, "latency")
    clean = merged(snaps, "e2e", snaps[0].t, bw.start - TICK)  # before any fault
    clean_p50, clean_p90 = ms_at(clean, 50), ms_at(clean, 90)
    # 30 tokens at the simulator's 10 ms: about 0.3 s unfaulted
    assert 250 < clean_p50 < 600, clean_p50
    capped = under_fault(run_dir, bw, TICK)
    assert capped.e2e_p90_ms is not None and capped.e2e_p90_ms > 3 * clean_p90, (
        capped.e2e_p90_ms, clean_p90)
    slowed = under_fault(run_dir, lat, TICK)
    assert slowed.e2e_p50_ms is not None
    assert slowed.e2e_p50_ms - clean_p50 == pytest.approx(LATENCY_MS, abs=60), (
        slowed.e2e_p50_ms, clean_p50)


def test_output_throughput_under_the_cap_against_the_raw_counters_and_the_bytes(faulted):
    """Two truths: numpy over the raw cumulative token counters of the ticks wholly inside
    the cap (dated by the Snapshots' own clocks, not summed intervals), equal within a
    percent; and the bytes the proxy let through while it was on (its own counter) over
    what a token costs (the whole run's bytes over its tokens), an upper bound: the
    client counts somewhat fewer tokens than those bytes hold (about 20 % here: seen, not
    yet explained), and far fewer than before the cap."""
    run_dir, proxy = faulted.run_dir, faulted.proxy
    snaps = list(iter_snapshots(run_dir))
    bw = span(proxy, "bandwidth")
    t = np.array([s.t for s in snaps])
    began = t - np.array([s.interval for s in snaps])
    tokens = np.array([s.counters.output_tokens for s in snaps])
    inside = np.flatnonzero((began >= bw.start) & (t <= bw.end))
    a, b = inside[0] - 1, inside[-1]  # from the end of the tick before to the last inside
    raw = (tokens[b] - tokens[a]) / (t[b] - t[a])
    got = under_fault(run_dir, bw, TICK).output_tok_s
    assert got == pytest.approx(raw, rel=0.01), (got, raw)
    per_token = proxy.counters.bytes_to_client / snaps[-1].counters.output_tokens
    (on, off) = [i for i, ev in enumerate(proxy.events) if ev.fault == "bandwidth"]
    through = faulted.bytes_at[off] - faulted.bytes_at[on]
    seconds = proxy.events[off].t - proxy.events[on].t
    assert through / seconds <= CAP * 1.05  # the cap held
    assert got < 1.1 * through / seconds / per_token, (got, through / seconds / per_token)
    before = np.flatnonzero(t < bw.start)
    unfaulted = (tokens[before[-1]] - tokens[before[1]]) / (t[before[-1]] - t[before[1]])
    assert got < 0.5 * unfaulted, (got, unfaulted)


# ---- the report -------------------------------------------------------------------------------

def test_the_report_has_the_fault_table_from_events_jsonl(faulted, tmp_path):
    run_dir, proxy = faulted.run_dir, faulted.proxy
    code, r = write_report(run_dir, out_dir=tmp_path, plots=False, out=io.StringIO())
    assert code == 0
    rows = r["faults"]
    truth = fault_spans(proxy.events)
    assert [(f["start"], f["end"]) for f in rows] == pytest.approx(
        [(s.start, s.end) for s in truth], abs=0.005)
    first = next(iter(iter_snapshots(run_dir)))
    began = first.t - first.elapsed  # the run's start, by its own clock
    assert [f["start_rel"] for f in rows] == pytest.approx(
        [s.start - began for s in truth], abs=0.01)
    capped = under_fault(run_dir, truth[0], TICK)
    assert rows[0]["during"]["e2e_p90_ms"] == capped.e2e_p90_ms
    md = (tmp_path / "report.md").read_text()
    table = md.split("## Faults", 1)[1].split("\n## ", 1)[0]
    assert "bandwidth cap 19.5 KiB/s" in table and "latency +200 ms" in table
    assert json.loads((tmp_path / "report.json").read_text())["faults"][1]["duration_s"] == (
        pytest.approx(truth[1].end - truth[1].start, abs=0.01))
