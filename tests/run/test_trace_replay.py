"""Trace replay through the real run path, judged at the server: the simulator's arrival
stamps (GET /sim/arrivals) against the trace's schedule, and its own token counters against
the trace's lengths."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess

import aiohttp
import numpy as np
import pytest
from support import (
    FAST,
    WAIT_S,
    headless_argv,
    root,
    run_flags,
    running_sim,
    scrape,
    server_arrivals,
    start_sim_process,
    tokentop,
)

from loadgen.model.snapshot import Control
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator

RATE, SECONDS = 50.0, 3.0


def write_trace(path, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """~50 req/s for ~3 s, Poisson gaps, Mooncake form (ms), short lengths."""
    rng = np.random.default_rng(seed)
    n = int(RATE * SECONDS)
    t = np.round(np.cumsum(rng.exponential(1 / RATE, n)) * 1000.0, 3)
    ins = rng.integers(5, 40, n)
    outs = rng.integers(1, 5, n)
    path.write_text("".join(json.dumps({"timestamp": float(a), "input_length": int(b),
                                        "output_length": int(c), "hash_ids": [1, 2]}) + "\n"
                            for a, b, c in zip(t, ins, outs, strict=True)))
    return (t - t[0]) / 1000.0, ins, outs


async def arrivals_at(base: str) -> np.ndarray:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/sim/arrivals") as r:
        assert r.status == 200
        return np.array(sorted(await r.json()))


def stop(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.close()  # --exit-with-parent: it leaves at EOF
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def replay(cfg: RunConfig) -> tuple[str | None, list]:
    """Drive the run until it stops by itself (bounded): the reason it gave, and the
    workers' worst event-loop lag each tick (a starved host shows there, for the message)."""
    lags = []
    coord = Coordinator(cfg)
    await coord.start()
    try:
        async with asyncio.timeout(SECONDS / cfg.trace_speed + WAIT_S):
            async for snap in coord.snapshots():
                lags.append(snap.client.loop_lag_ms)
    finally:
        await coord.close()
    return coord._stop_reason, lags


@pytest.mark.parametrize("speed", [1.0, 2.0])
async def test_trace_arrives_on_schedule_with_its_lengths(tmp_path, speed):
    path = tmp_path / "trace.jsonl"
    offsets, ins, outs = write_trace(path)
    # the simulator in its own process: its arrival stamps then wait on nobody's CPU but
    # its own (in this process they would wait on the coordinator's ticks as well)
    proc, port = start_sim_process(*run_flags(**FAST))
    base = f"http://127.0.0.1:{port}"
    try:
        # the process by pid (not by a scan of ports) and a slow tick: the coordinator
        # shares this host's CPUs with the workers and the simulator
        cfg = RunConfig(url=f"{base}/v1", trace=str(path), trace_speed=speed, workers=2,
                        tick=0.5, drain_grace=2.0, server_pid=proc.pid)
        reason, lags = await replay(cfg)
        arrivals = await arrivals_at(base)
        metrics = await scrape(f"{base}/metrics")
    finally:
        stop(proc)
    assert reason == "trace done"  # it stopped by itself, with nothing left in flight
    assert len(arrivals) == len(offsets)
    # the server's loop clock has its own zero: compare gaps, aligned on the median offset
    want = offsets / speed
    err = (arrivals - arrivals[0]) - want
    err -= np.median(err)  # the first arrival's own jitter is not the schedule's
    late = np.flatnonzero(np.abs(err) > 0.002)
    # On schedule: the typical request within 2 ms, none off by a gap's worth (20 ms at
    # 50 req/s). The 5 ms p99 the issue asks for is a figure of a quiet machine (quoted
    # from runs here in the closing note), not a timed assertion a shared CI host must meet.
    assert np.median(np.abs(err)) < 0.002, (late, err[late], "worker lag ms", lags)
    assert np.abs(err).max() < 0.02, (late, err[late], "worker lag ms", lags)
    assert arrivals[-1] - arrivals[0] == pytest.approx(want[-1], abs=0.01)
    # each request as its entry says, by the server's own counters
    assert metrics["vllm:prompt_tokens_total"] == int(ins.sum())
    assert metrics["vllm:generation_tokens_total"] == int(outs.sum())


async def test_bad_trace_exits_2_naming_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t": 0, "input_tokens": 5, "output_tokens": 5}\n{"t": 1, "input_tokens"\n')
    done = await asyncio.to_thread(tokentop, "run", "--headless", "--no-record",
                                   f"--trace={path}", "--workers=1", timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}, line 2" in lines[0], done.stderr


async def test_trace_refuses_a_rate(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path)
    done = await asyncio.to_thread(tokentop, "run", "--headless", "--no-record",
                                   f"--trace={path}", "--rate=5", timeout=30)
    assert done.returncode == 2 and "--trace sets the arrivals" in done.stderr, done.stderr


async def test_a_pause_freezes_the_trace_and_resume_goes_on(tmp_path):
    """Paused for 1 s in the middle: nothing arrives meanwhile, and after the resume the
    trace goes on where it stood (every entry once, none replayed from the start)."""
    path = tmp_path / "trace.jsonl"
    offsets, ins, _ = write_trace(path)
    loop = asyncio.get_running_loop()
    async with running_sim() as sim:
        coord = Coordinator(RunConfig(url=sim.url, trace=str(path), workers=2, tick=0.25,
                                      drain_grace=2.0))
        await coord.start()
        it = coord.snapshots()
        try:
            async with asyncio.timeout(SECONDS + 1.0 + WAIT_S):
                while (await anext(it)).elapsed < 1.0:
                    pass
                t_pause = loop.time()
                await coord.control(Control(op="pause"))
                while (await anext(it)).elapsed < 2.0:
                    pass
                t_resume = loop.time()
                await coord.control(Control(op="resume"))
                async for _ in it:  # to the end: it stops by itself
                    pass
        finally:
            await coord.close()
        arrivals = await server_arrivals(sim)
        metrics = await scrape(f"{root(sim)}/metrics")
    assert coord._stop_reason == "trace done"
    assert len(arrivals) == len(offsets)
    assert metrics["vllm:prompt_tokens_total"] == int(ins.sum())
    assert not ((arrivals > t_pause + 0.05) & (arrivals < t_resume)).any()
    # the pause's length added to the trace's span, no more (a tick's slack either side)
    paused = t_resume - t_pause
    assert arrivals[-1] - arrivals[0] == pytest.approx(offsets[-1] + paused, abs=0.1)


TRACE_LINE = re.compile(r"^\[\s*\d+s\] (\S+)\s+trace (\d+)/(\d+) ([\d.]+) s/([\d.]+) s "
                        r"rate=([\d.]+)/s ")


async def test_the_run_window_ends_with_the_trace_and_the_line_says_where_it_is(tmp_path):
    """A 4 s trace at 20 req/s played at speed 2, answers of about 0.9 s: the run's window is
    the trace's 2 s (the simulator's arrival log: first to last arrival), not until the last
    answer; what was still in flight then finishes in the drain, every request counted once;
    the progress line says how far the trace is and the rate it sends at (never the unused
    --rate default), against the trace file and the arrival log."""
    n, gap, speed = 81, 0.05, 2.0
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"t": round(i * gap, 3), "input_tokens": 16,
                                        "output_tokens": 64}) + "\n" for i in range(n)))
    span = (n - 1) * gap / speed  # wall seconds from the first request to the last
    proc, port = start_sim_process()  # its default timing: 64 tokens take about 0.9 s
    base = f"http://127.0.0.1:{port}"
    out = tmp_path / "summary.json"
    try:
        done = await asyncio.to_thread(
            subprocess.run, headless_argv("--no-record", url=f"{base}/v1", trace=path,
                                          trace_speed=speed, workers=1, json=out),
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        arrivals = await arrivals_at(base)
    finally:
        stop(proc)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert len(arrivals) == n
    assert arrivals[-1] - arrivals[0] == pytest.approx(span, abs=0.05)
    # the window is the trace's span / speed (a tick's collection late at most)
    assert summary["duration_s"] == pytest.approx(span, abs=0.2), summary["duration_s"]
    drain = summary["drain"]
    assert summary["requests"]["ok"] + drain["requests_ok"] == n
    assert drain["requests_ok"] > 0  # answers still streaming when the trace ended
    assert summary["throughput"]["req_s"] == pytest.approx(
        summary["requests"]["ok"] / span, rel=0.1)
    lines = [m.groups() for line in done.stderr.splitlines() if (m := TRACE_LINE.match(line))]
    assert lines, done.stderr
    sent = [int(i) for _, i, *_ in lines]
    assert sent == sorted(sent) and sent[-1] == n
    assert {int(total) for _, _, total, *_ in lines} == {n}
    assert {float(s) for *_, s, _ in lines} == {round((n - 1) * gap, 1)}
    truth = (n - 1) / (arrivals[-1] - arrivals[0])  # 40 req/s at the server
    running = [(int(i), float(at), float(rate)) for state, i, _, at, _, rate in lines
               if state == "running"]
    assert running, done.stderr
    for i, at, rate in running:
        assert rate == pytest.approx(truth, rel=0.2), (rate, truth)
        # the request it is at and the trace's clock agree with the trace's own schedule
        assert i == pytest.approx(at / gap + 1, abs=0.15 / gap * speed)
    assert "rate=1/s" not in done.stderr


async def test_each_snapshot_says_how_far_the_trace_is_as_the_server_saw_it(tmp_path):
    """Tick by tick, the trace's position in the Snapshot (entries sent of all) against the
    simulator's arrival log up to that tick, and the console's load panel showing it."""
    from tui.widgets.load_panel import target_line

    path = tmp_path / "trace.jsonl"
    offsets, _, _ = write_trace(path)
    loop = asyncio.get_running_loop()
    seen = []  # (loop time the Snapshot came, its load)
    async with running_sim() as sim:
        coord = Coordinator(RunConfig(url=sim.url, trace=str(path), workers=2, tick=0.25,
                                      drain_grace=2.0))
        await coord.start()
        try:
            async with asyncio.timeout(SECONDS + WAIT_S):
                async for snap in coord.snapshots():
                    seen.append((loop.time(), snap.load))
                    if snap.load.state == "running" and snap.load.trace_sent:
                        line = target_line(snap)
                        assert f"{snap.load.trace_sent}[/]/{len(offsets)}" in line, line
        finally:
            await coord.close()
        arrivals = await server_arrivals(sim)
    running = [(t, ld) for t, ld in seen if ld.state == "running"]
    assert len(running) >= 8
    for t, ld in running:
        assert ld.trace_total == len(offsets) and ld.trace_span == pytest.approx(offsets[-1])
        # what had arrived by the time the Snapshot came, give or take what was on the wire
        arrived = int((arrivals <= t).sum())
        assert arrived - 3 <= ld.trace_sent <= arrived + 3, (ld.trace_sent, arrived)
    assert seen[-1][1].trace_sent == len(offsets) == len(arrivals)
