"""Closed-loop streams started together start spread out (loadgen.worker.load.Stagger), so a
baseline measures a server under steady load, not the lock-step of streams that started at
one instant and, with requests alike, stay in step (every round the whole batch prefills
together). Truth: the simulator's own arrival stamps, and the same server with varied
lengths (which no lock-step survives)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from support import running_sim, server_arrivals, tokentop

PROFILE = ["--sim-profile", "llama3-70b-4xh100", "--input-tokens", "512", "-c", "16"]


def ttft_p50_ms(out, *flags: str) -> float:
    done = tokentop("run", "--headless", "--no-record", "--workers=1", "--duration=6",
                    "--warmup=5", *PROFILE, *flags, "--json", str(out))
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())["latency_ms"]["ttft"]["p50"]


async def test_fixed_lengths_measure_what_varied_ones_do_once_the_streams_are_staggered(
        tmp_path):
    """16 streams of 512 in / 128 out on the 70B profile: started at once with fixed lengths,
    every request waits for the whole batch's prefill (TTFT P50 ~600 ms); varied lengths
    break the lock-step (~70 ms). Staggered by default, fixed lengths read as varied ones."""
    varied, fixed, in_step = await asyncio.gather(
        asyncio.to_thread(ttft_p50_ms, tmp_path / "varied.json", "--output-tokens=uniform:96:160"),
        asyncio.to_thread(ttft_p50_ms, tmp_path / "fixed.json", "--output-tokens=128"),
        asyncio.to_thread(ttft_p50_ms, tmp_path / "in-step.json", "--output-tokens=128",
                          "--stagger=0"))
    assert fixed < 2 * varied and varied < 2 * fixed, (fixed, varied)
    assert in_step > 4 * varied, (in_step, varied)  # what --stagger 0 (as before) measured


@pytest.mark.parametrize("stagger", ["auto", "0"])
async def test_the_first_requests_arrive_spread_over_one_requests_time(tmp_path, stagger):
    """At the server: by default the first stream's request arrives alone, and the other
    seven arrive spread over about one request's time after it ended; with --stagger 0 all
    eight arrive within a few milliseconds."""
    async with running_sim(decode_ms_per_seq=0.5, step_overhead_ms=4.0) as sim:
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", "--no-record", f"--url={sim.url}", "--workers=1",
            "-c", "8", "--output-tokens=100", "--input-tokens=8", "--tokenizer=none",
            "--duration=3", f"--stagger={stagger}", "--drain-grace=5")
        assert done.returncode == 0, done.stderr
        arrivals = await server_arrivals(sim)
    first = arrivals[:8] - arrivals[0]
    if stagger == "0":
        assert first[-1] < 0.05, first
        return
    request_s = 100 * 0.0045  # 100 tokens, 4 ms a step + 0.5 ms a stream: at least this
    others = first[1:]
    assert others.min() >= request_s * 0.9, first  # they waited for the first to end …
    assert np.ptp(others) > request_s / 4, first  # … and did not then start together


async def test_streams_stay_spread_over_a_round_when_load_makes_requests_longer(tmp_path):
    """Alone a request takes ~0.25 s here; under 32 streams ~2 s (each step costs per
    sequence). The starts spread over the first request's time cover an eighth of a loaded
    round, so without the one re-phase after each stream's first request the arrivals
    bunch into it, round after round. At the server: no window of a fifth of a round holds
    half of a round's arrivals (32 phases uniform on a round put 17 or more in one such
    window 0.2 % of the time; bunched, about 30)."""
    async with running_sim(decode_ms_per_seq=1.0, step_overhead_ms=3.0, slots=64) as sim:
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", "--no-record", f"--url={sim.url}", "--workers=1",
            "-c", "32", "--output-tokens=60", "--input-tokens=8", "--tokenizer=none",
            "--duration=14", "--drain-grace=5")
        assert done.returncode == 0, done.stderr
        arrivals = await server_arrivals(sim)
    gaps = np.diff(arrivals[32:])
    round_s = 32 * float(np.mean(gaps))  # 32 arrivals a round, whatever its length
    steady = arrivals[arrivals > arrivals[0] + 3 * round_s]  # past the start and re-phase
    assert len(steady) >= 64, (len(arrivals), round_s)
    window = round_s / 5
    most = max(int(((steady >= t) & (steady < t + window)).sum()) for t in steady)
    assert most < 17, (most, round_s)
