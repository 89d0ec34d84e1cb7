"""Outages through the real run path (`tokentop run --headless` against the simulator), live
and in the soak report of the recording, by loadgen.model.outage's one definition:

* long streams with a few isolated 500s and broken streams: errors, never an outage;
* the simulator's outage fault (its port really closed): exactly one outage live and one
  in the report, the same one, each end within a tick of the server's own schedule;
* the soak success rate leaves the warm-up out (the simulator says when its 500s were);
* a frozen simulator (SIGSTOP, a separate process) with streams in flight: a stall within
  STALL_AFTER_S and a couple of ticks, an outage that says the server is frozen, and a
  recovery after SIGCONT.

Loopback only; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
from support import headless_argv, running_sim, start_sim_process

from loadgen.analysis.soak import analyze
from loadgen.model import hdr
from loadgen.model.outage import STALL_AFTER_S
from loadgen.model.windows import SnapshotWindows
from loadgen.record.rundir import iter_snapshots, read_events
from loadgen.sim.faults import FaultConfig

TICK = 0.25


def snapshot_lines(out: Path) -> list[dict]:
    path = out / "snapshots.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_bytes().splitlines()
            if line.endswith(b"}")]


async def wait_until(cond: Callable[[], bool], seconds: float, what: str,
                     poll: float = 0.02) -> float:
    """Poll `cond` until true (returns the wall time it was first seen), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return time.time()
        await asyncio.sleep(poll)
    raise AssertionError(f"{what}: not within {seconds:g} s")


async def start_headless(out: Path, **settings) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *headless_argv(**{"workers": 1, "tick": TICK, "drain_grace": 1.0, "out": out,
                          **settings}),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)


async def finish(proc: asyncio.subprocess.Process) -> str:
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return err.decode()


def client_outages(report: dict) -> list[dict]:
    return [o for o in report["outages"] if o["kind"] == "client"]


async def test_isolated_errors_among_long_streams_are_no_outage(tmp_path):
    """Streams of 2–2.6 s (an engine step of 20 ms, a token a step), 6 of them, with 500s
    and dropped streams now and then: each is an error among streams that go on
    delivering, never an outage."""
    out = tmp_path / "run"
    faults = FaultConfig(error_rate=0.1, drop_rate=0.1, seed=9)
    async with running_sim(step_overhead_ms=20.0, faults=faults) as sim:
        proc = await start_headless(out, url=sim.url, concurrency=6, duration=8.0,
                                    output_tokens="uniform:100:125", input_tokens="8",
                                    drain_grace=3.0)
        err = await finish(proc)
        injected = dict(sim.server.faults.injected)
    snaps = list(iter_snapshots(out))
    errors = snaps[-1].counters.errors
    # the server's own count of what it did wrong: the client saw every one of its 500s
    assert injected["http_500"] >= 2 and injected["drop"] >= 2, injected
    assert errors.get("http_5xx") == injected["http_500"]
    assert errors.get("stream_broken", 0) >= 1
    events = list(read_events(out))
    assert [e for e in events if e["kind"] in ("outage", "recovery")] == []
    assert "outage started" not in err
    assert {s.load.health for s in snaps} <= {"up", "degraded"}
    assert all(s.load.outage_since is None for s in snaps)
    report = analyze(snaps)
    assert report["outages"] == [] and report["availability"] == 1.0


async def test_a_simulator_outage_is_one_outage_live_and_in_the_report(tmp_path):
    """Open loop at 20 req/s (no client backoff: the first request after the port opens
    again succeeds) through a 4 s outage whose ends the test takes from the server."""
    out = tmp_path / "run"
    outage_s = 4.0
    async with running_sim() as sim:
        proc = await start_headless(out, url=sim.url, mode="open", rate=20, arrival="constant",
                                    duration=10.0, output_tokens="8", input_tokens="8",
                                    request_timeout=5.0)
        await wait_until(lambda: len(snapshot_lines(out)) >= 8, 20, "eight ticks recorded")
        began = time.time()
        async with aiohttp.ClientSession() as s, s.post(
                f"{sim.url.removesuffix('/v1')}/sim/faults", json={"outage_s": outage_s}) as r:
            assert r.status == 200, await r.text()  # the port is closed before it answers
        assert sim.server.outage_active
        ended = await wait_until(lambda: not sim.server.outage_active, outage_s + 5,
                                 "the simulator listens again", poll=0.005)
        err = await finish(proc)
    assert err.count("outage started") == 1 and err.count("recovered after") == 1, err
    events = list(read_events(out))
    live = [e for e in events if e["kind"] in ("outage", "recovery")]
    assert [e["kind"] for e in live] == ["outage", "recovery"]
    assert "cannot reach the server" in live[0]["message"]
    snaps = list(iter_snapshots(out))
    report = analyze(snaps)
    (o,) = client_outages(report)
    # each end is known to the tick: the first tick without a success, the first with one
    assert began - 0.05 <= o["start"] <= began + TICK + 0.05, (o, began)
    assert ended - TICK - 0.05 <= o["end"] <= ended + TICK + 0.05, (o, ended)
    assert abs(o["duration_s"] - (ended - began)) <= 2 * TICK
    assert o["errors"].get("connect", 0) > 0 and not o["ongoing"]
    # the report's outage is the live one: same start, same MTTR
    assert {s.load.outage_since for s in snaps} == {None, o["start"]}
    assert any(s.load.health == "outage" for s in snaps)
    # the recovery names its outage by its start and carries its MTTR (not in prose only)
    assert live[0]["since"] == live[1]["since"]
    assert abs(live[0]["since"] - o["start"]) < 0.01
    assert abs(live[1]["seconds"] - o["duration_s"]) < 0.01
    assert report["mttr_s"]["client"] == o["duration_s"]
    assert 0 < report["availability"] < 1


async def test_the_soak_success_rate_leaves_the_warmup_out(tmp_path):
    """Half the requests fail (500) during the first second of a 2 s warm-up, none after:
    the measured success rate is 1, the whole run's is not."""
    out = tmp_path / "run"
    async with running_sim(faults=FaultConfig(error_rate=0.5, seed=5)) as sim:
        proc = await start_headless(out, url=sim.url, concurrency=4, warmup=2.0, duration=1.5,
                                    output_tokens="8", input_tokens="8")
        await wait_until(lambda: any(s["elapsed"] >= 0.75 for s in snapshot_lines(out)), 20,
                         "0.75 s of warm-up recorded")
        async with aiohttp.ClientSession() as s, s.post(
                f"{sim.url.removesuffix('/v1')}/sim/faults", json={"error_rate": 0.0}) as r:
            assert r.status == 200, await r.text()
        # the 500s all went out before the warm-up ended
        assert all(s["load"]["warmup"] for s in snapshot_lines(out))
        five_hundreds = sim.server.faults.injected["http_500"]
        await finish(proc)
    snaps = list(iter_snapshots(out))
    c = snaps[-1].counters
    assert five_hundreds > 0 and c.errors.get("http_5xx") == five_hundreds
    report = analyze(snaps)
    assert report["measured_requests"]["failed"] == 0 and report["measured_requests"]["ok"] > 0
    assert report["success_rate"] == 1.0
    assert c.requests_failed == five_hundreds  # the whole run's count has them all


class Lines:
    """A child's stderr, line by line as it comes, with when each came."""

    def __init__(self, stream) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, pred: Callable[[str], bool], seconds: float, what: str) -> float:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if pred(line):
                    return at
            time.sleep(0.02)
        shown = "\n".join(line for _, line in self.lines[-15:])
        raise AssertionError(f"{what}: not within {seconds:g} s\n--- stderr ---\n{shown}")


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _first_tokens(out) -> int:
    """First tokens the run has received, summed over its recorded ticks' TTFT counts."""
    return sum(int(hdr.decode(s["hist"]["ttft"]).sum()) for s in snapshot_lines(out)
               if "ttft" in s["hist"])


def test_a_frozen_server_is_a_stall_then_an_outage_then_a_recovery(tmp_path):
    out = tmp_path / "run"
    # 3 streams of 2000 tokens 50 ms apart (100 s): in flight all along
    sim, port = start_sim_process("--exact-ttft-ms", "20", "--exact-itl-ms", "50")
    run = None
    try:
        run = subprocess.Popen(
            headless_argv(url=f"http://127.0.0.1:{port}/v1", concurrency=3, workers=1,
                          tick=TICK, duration=60.0, output_tokens="2000", input_tokens="8",
                          request_timeout=120.0, drain_grace=0.5, out=out, stagger=0),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        said = Lines(run.stderr)
        deadline = time.monotonic() + 20
        # every stream streaming (its first token in): one still waiting for it is given
        # more patience before it counts as stalled, and would make the stall "2 of 3"
        while time.monotonic() < deadline and _first_tokens(out) < 3:
            time.sleep(0.05)
        assert _first_tokens(out) == 3, "the three streams were not all streaming within 20 s"
        frozen_at = time.monotonic()
        os.kill(sim.pid, signal.SIGSTOP)
        try:
            stall_at = said.wait(lambda line: "(server frozen?)" in line, STALL_AFTER_S + 5,
                                 "the stall is told")
            outage_at = said.wait(lambda line: "outage started" in line, 3,
                                  "the outage is told")
            # the next progress line says it too, with the stalled streams
            said.wait(lambda line: line.startswith("[") and "OUTAGE for" in line, 2.5,
                      "a progress line says OUTAGE")
        finally:
            os.kill(sim.pid, signal.SIGCONT)
        said.wait(lambda line: "recovered after" in line, 10, "the recovery is told")
        said.wait(lambda line: "stall over" in line, 10, "the stall's end is told")
        run.send_signal(signal.SIGTERM)
        run.wait(30)
    finally:
        if run is not None:
            stop(run)
        stop(sim)
    # the workers call a stream stalled STALL_AFTER_S after its last byte; the run says so
    # within a couple of ticks (and the pipe's delay)
    assert STALL_AFTER_S - TICK <= stall_at - frozen_at <= STALL_AFTER_S + 2 * TICK + 0.5
    assert outage_at - stall_at <= 2 * TICK
    lines = [line for _, line in said.lines]
    (stall_line,) = [line for line in lines if "(server frozen?)" in line]
    assert stall_line == (f"tokentop: warn: 3 of 3 streams in flight have received nothing "
                          f"for ≥{STALL_AFTER_S:g} s (server frozen?)")
    (outage_line,) = [line for line in lines if "outage started" in line]
    assert outage_line.startswith("tokentop: error:") and "the server is frozen" in outage_line
    (shown,) = [line for line in lines if line.startswith("[") and "OUTAGE for" in line][:1]
    assert shown.endswith("| 3 of 3 stalled"), shown
    kinds = [(e["kind"], e["level"]) for e in read_events(out)
             if e["kind"] in ("stall", "outage", "recovery")]
    assert kinds == [("stall", "warn"), ("outage", "error"), ("recovery", "info"),
                     ("stall", "info")]
    report = analyze(iter_snapshots(out))
    (o,) = client_outages(report)
    assert "frozen" in o["reason"] and report["stalls"]["count"] == 1


async def test_a_slow_first_token_at_a_healthy_server_is_no_outage(tmp_path):
    """7000-token prompts at 1 ms a token of prefill: every request waits about 7 s for its
    first token, at 2 streams, while the server is healthy and its /metrics answers. That is
    a busy server: no outage, full availability (nothing was injected, /metrics answered,
    every request the drain did not cut succeeded)."""
    out = tmp_path / "run"
    async with running_sim(prefill_ms_per_token=1.0, prefill_chunk_tokens=8192,
                           kv_tokens=65536) as sim:
        # both streams at once (--stagger 0): both wait for a first token together, the case
        # that read as a frozen server
        proc = await start_headless(out, url=sim.url, concurrency=2, duration=16.0,
                                    input_tokens="7000", output_tokens="16",
                                    tokenizer="none", drain_grace=0.5, stagger=0)
        await finish(proc)
        served = dict(sim.server.faults.injected)
    snaps = list(iter_snapshots(out))
    windows = SnapshotWindows()
    for snap in snaps:
        windows.add(snap)
    ttft_s = windows.stats("run").latency["ttft"]["p50"] / 1e6
    assert ttft_s > 6.0, ttft_s  # the case at hand: first tokens as slow as a long prefill
    c = snaps[-1].counters
    # the streams still waiting at the end are cancelled by the drain: the client's doing
    assert c.requests_ok >= 2 and set(c.errors) <= {"cancelled"}, c
    assert not any(served.values()), served  # nothing was injected: the server was healthy
    assert all(s.server is not None and s.server.ok for s in snaps[2:])  # /metrics answered
    # (a stream that was decoding may wait out the other's prefill: a stall it is, of one
    # stream, not a frozen server)
    events = [e for e in read_events(out) if e["kind"] in ("outage", "recovery")]
    assert events == [], events
    assert all(s.load.health != "outage" for s in snaps)
    report = analyze(snaps)
    assert report["outages"] == [] and report["availability"] == 1.0, report["outages"]


async def test_one_error_at_a_low_rate_then_success_is_an_error_not_an_outage(tmp_path):
    """Open loop at 0.25 req/s: after the first success the simulator answers exactly one
    request with a 500 (its own counter says so), the next ones succeed. Four idle seconds
    follow the error: it is an error, not an outage, and availability stays whole."""
    out = tmp_path / "run"
    async with running_sim() as sim:
        faults = sim.server.faults
        proc = await start_headless(out, url=sim.url, mode="open", rate=0.25,
                                    arrival="constant", duration=13.0, input_tokens="8",
                                    output_tokens="8", tokenizer="none")
        await wait_until(lambda: any(s["counters"]["requests_ok"] >= 1
                                     for s in snapshot_lines(out)), 20, "a first success")
        faults.apply(FaultConfig(error_rate=1.0))
        await wait_until(lambda: faults.injected["http_500"] >= 1, 10, "one 500 injected")
        faults.apply(FaultConfig())
        await finish(proc)
        injected = faults.injected["http_500"]
    assert injected == 1
    snaps = list(iter_snapshots(out))
    assert snaps[-1].counters.errors == {"http_5xx": 1}
    assert snaps[-1].counters.requests_ok >= 2  # succeeded after it, too
    assert [e for e in read_events(out) if e["kind"] in ("outage", "recovery")] == []
    report = analyze(snaps)
    assert report["outages"] == [] and report["availability"] == 1.0


async def test_an_outage_is_in_the_last_line_and_fails_the_stability_slos(tmp_path):
    """A 4 s outage of the simulator (its port really closed; the test times it at the
    server): the last line names it, with its downtime and the availability, the summary
    holds the same, and `--slo outages<1,availability>99.9%` fails the run (exit 3), so a
    CI job can gate on it."""
    out, summary_path = tmp_path / "run", tmp_path / "summary.json"
    async with running_sim() as sim:
        proc = await start_headless(out, url=sim.url, mode="open", rate=20, arrival="constant",
                                    duration=9.0, output_tokens="8", input_tokens="8",
                                    request_timeout=5.0, slo="outages<1,availability>99.9%",
                                    json=summary_path)
        await wait_until(lambda: len(snapshot_lines(out)) >= 8, 20, "eight ticks recorded")
        began = time.time()
        async with aiohttp.ClientSession() as s, s.post(
                f"{sim.url.removesuffix('/v1')}/sim/faults", json={"outage_s": 4.0}) as r:
            assert r.status == 200, await r.text()
        ended = await wait_until(lambda: not sim.server.outage_active, 10,
                                 "the simulator listens again", poll=0.005)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 3, err.decode()
    last = err.decode().strip().splitlines()[-1]
    summary = json.loads(summary_path.read_text())
    stability = summary["stability"]
    assert stability["outages"] == 1 and not stability["ongoing"]
    # the downtime as the server had it, to a couple of ticks
    assert abs(stability["downtime_s"] - (ended - began)) <= 2 * TICK + 0.1, stability
    assert 0 < stability["availability"] < 0.999
    assert last.startswith("tokentop: threshold failed: outages<1: measured 1"), last
    assert "| 1 outage: down " in last and "availability " in last, last
    assert [t["passed"] for t in summary["thresholds"]] == [False, False]
    # the report of the recording says the same of the client's outages
    report = analyze(iter_snapshots(out))
    assert abs(report["availability"] - stability["availability"]) < 1e-6
    (o,) = client_outages(report)
    assert abs(o["duration_s"] - stability["downtime_s"]) < 1e-6
