"""What a headless run says on stderr: one progress line a second, a final line a script's
log can keep, and a load that would send nothing refused before anything starts."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from support import headless_argv, tokentop

from loadgen.model import units
from loadgen.model.slo import parse_slos
from loadgen.model.units import parse_latency_us

PROGRESS_SECOND = re.compile(r"^\[\s*(\d+)s\] (\S+)")


def shown_seconds(stderr: str) -> list[tuple[int, str]]:
    """(second shown, state) of every progress line."""
    return [(int(m[1]), m[2]) for line in stderr.splitlines()
            if (m := PROGRESS_SECOND.match(line))]


async def run(*flags: str, **settings) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *headless_argv("--no-record", *flags, **settings), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, err.decode()


# the fix is one line in loadgen/run/sinks.py (ProgressLines gates on the second the line
# shows, round(elapsed), not int(elapsed)): not this change's file; strict, so the fix
# landing turns this into a failure that says to drop the mark
async def test_no_second_is_shown_twice_while_the_load_runs(sim):
    code, err = await run(url=sim.url, duration=3, concurrency=2, output_tokens=16,
                          tick=0.5)
    assert code == 0, err
    lines = shown_seconds(err)
    live = [second for second, state in lines if state != "stopped"]
    # a line a second: each second once, in order (the final "stopped" line may share one)
    assert live == sorted(set(live)), err
    assert len(live) >= 3, err


async def test_the_final_line_has_latencies_and_goodput(sim, tmp_path):
    out = tmp_path / "r.json"
    code, err = await run(url=sim.url, duration=2, concurrency=2, output_tokens=16,
                          slo="ttft<10s,e2e<60s", json=out)
    assert code == 0, err
    last = err.strip().splitlines()[-1]
    summary = json.loads(out.read_text())
    assert last.startswith(f"tokentop: {summary['exit']['reason']} | p50/p99 "), last
    for metric in ("ttft", "itl", "e2e"):
        m = re.search(rf"{metric.upper()} ([0-9.]+ m?s) / ([0-9.]+ m?s)", last)
        assert m, last
        stats = summary["latency_ms"][metric]
        # the line rounds to three figures at most: the summary's own values, so rounded
        for shown, q in ((m[1], "p50"), (m[2], "p99")):
            assert parse_latency_us(shown) / 1e3 == pytest.approx(stats[q], rel=0.01,
                                                                  abs=0.01), last
    # every request is well inside these limits: goodput is the request rate
    goodput = summary["throughput"]["goodput_req_s"]
    assert goodput == summary["throughput"]["req_s"] > 0
    assert last.endswith(f"| goodput {units.rate(goodput, 'req/s')} within the --slo"), last


async def test_no_goodput_without_per_request_limits(sim):
    assert parse_slos("ttft_p99<10s").per_request is None
    code, err = await run(url=sim.url, duration=1.5, concurrency=1, output_tokens=8,
                          slo="ttft_p99<10s")
    assert code == 0, err
    last = err.strip().splitlines()[-1]
    assert "| p50/p99 TTFT " in last and "goodput" not in last, last


def test_concurrency_0_is_refused_in_one_line():
    proc = tokentop("run", "--headless", "-c", "0", "--duration", "1", "--no-record")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tokentop: --concurrency 0 would send nothing: give -c 1 or more"]


async def test_concurrency_0_with_a_ramp_still_runs(sim):
    # the ramp raises the load by itself: 0 is where it starts, not a run that idles
    code, err = await run(url=sim.url, duration=2, concurrency=0, ramp="linear:1:2:2",
                          output_tokens=8)
    assert code == 0, err
    assert "requests ok" in err.strip().splitlines()[-1]
