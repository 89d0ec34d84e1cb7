"""The whole-run summary covers the load: duration and rates end where the drain begins,
and the requests that finish in the drain are said apart (and kept in the latencies)."""

from __future__ import annotations

import asyncio
import json

import pytest
from support import tokentop

from loadgen.sim import SimConfig, start_sim

ITL_MS = 20.0
TOKENS = 60  # a request lasts ~1.2 s: the drain after a 2 s run is about that long


async def test_duration_and_rates_leave_the_drain_out(tmp_path):
    sim = await start_sim(SimConfig(exact_ttft_ms=50.0, exact_itl_ms=ITL_MS),
                          host="127.0.0.1", port=0)
    try:
        out = tmp_path / "summary.json"
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", "--concurrency=4",
            "--workers=1", "--tick=0.25", "--duration=2", "--drain-grace=5",
            f"--output-tokens={TOKENS}", "--input-tokens=8", "--json", str(out),
            "--no-record")
        assert done.returncode == 0, done.stderr
        summary = json.loads(out.read_text())
    finally:
        await sim.close()
    # the truth: --duration 2 s of load, ticks of 0.25 s
    assert 1.9 <= summary["duration_s"] <= 2.3
    drain = summary["drain"]
    assert drain is not None and drain["requests_ok"] >= 1 and drain["seconds"] > 0.3
    # every request the server finished is in the latencies: the load's and the drain's
    e2e = summary["latency_ms"]["e2e"]["count"]
    assert e2e == summary["requests"]["ok"] + drain["requests_ok"]
    # the rate is the load's own: requests over the load time, not over load + drain
    rate = summary["throughput"]["req_s"]
    assert rate * summary["duration_s"] == pytest.approx(summary["requests"]["ok"], abs=0.01)
    assert "drain: " in done.stderr.splitlines()[-1]


async def test_a_run_of_long_generations_stopped_early_counts_what_streamed(tmp_path):
    """No request finishes within the run, but tokens streamed all along: that is a run
    that measured something (exit 0, tokens and tok/s counted), not "no request
    completed"."""
    sim = await start_sim(SimConfig(exact_ttft_ms=20.0, exact_itl_ms=ITL_MS),
                          host="127.0.0.1", port=0)
    try:
        out = tmp_path / "summary.json"
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", "--concurrency=2",
            "--workers=1", "--tick=0.25", "--duration=1.5", "--drain-grace=0.1",
            "--output-tokens=2000", "--input-tokens=8", "--json", str(out), "--no-record",
            "--stagger=0")  # both streams from the start: the truth below counts on it
        summary = json.loads(out.read_text())
    finally:
        await sim.close()
    assert done.returncode == 0, done.stderr
    assert summary["requests"]["ok"] == 0 and summary["tokens"]["output_completed"] == 0
    # the truth: two streams of one token every ITL_MS for the 1.5 s of load
    expected = 2 * 1.5 / (ITL_MS / 1000)
    assert summary["tokens"]["output"] == pytest.approx(expected, rel=0.2)
    assert summary["throughput"]["output_tok_s"] == pytest.approx(2 / (ITL_MS / 1000), rel=0.2)


async def test_the_load_window_keeps_its_last_tick(tmp_path):
    """The tick in which the stop came still measured load: at a constant 20 req/s the
    summary's request rate is 20, and the drain holds only what was in flight."""
    sim = await start_sim(SimConfig(exact_ttft_ms=20.0, exact_itl_ms=5.0),
                          host="127.0.0.1", port=0)
    try:
        out = tmp_path / "summary.json"
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", "--mode=open", "--rate=20",
            "--arrival=constant", "--workers=1", "--tick=0.5", "--duration=2",
            "--drain-grace=2", "--output-tokens=10", "--input-tokens=8", "--json", str(out),
            "--no-record")
        summary = json.loads(out.read_text())
    finally:
        await sim.close()
    assert done.returncode == 0, done.stderr
    # the truth: the asked schedule (a request lasts ~65 ms, so ~2 are in flight at a time)
    assert summary["duration_s"] == pytest.approx(2.0, abs=0.15)
    assert summary["throughput"]["req_s"] == pytest.approx(20.0, rel=0.08)
    assert (summary["drain"] or {}).get("requests_ok", 0) <= 3
