"""`tokentop calibrate` says what it does at once, how a step goes, when this machine
cannot drive the intended rate, and what limits it when no step keeps within 1 ms."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np
from support import ROOT

from loadgen.analysis.calibrate import EXIT_OVER_BUDGET, CalibratePlan, Step, verdict
from loadgen.model import hdr

PLAN = CalibratePlan(ttft_ms=50.0, itl_ms=20.0, output_tokens=64)
# by hand: a request is 50 + 63 × 20 = 1310 ms for 64 chunks, so 100 streams ask for
# 100 × 64 / 1.31 = 4885.5 chunks/s
INTENDED_100 = 100 * 64 / 1.310


def _step(streams: int, chunks_s: float, err_us: float, lag_ms: float = 0.2) -> Step:
    """A 10 s step that timed every chunk `err_us` late (its p99 is that, to 3 digits)."""
    s = Step(streams, seconds=10.0, chunks=round(chunks_s * 10), worst_lag_ms=lag_ms)
    for dense in (s.ttft_err, s.itl_err):
        np.add.at(dense, hdr.counts_index(np.full(100, err_us)), 1)
    return s


def test_a_fifth_of_the_intended_rate_is_said_to_be_more_than_this_machine_drives():
    fifth = _step(100, INTENDED_100 / 5, err_us=300.0)
    lines, code = verdict([_step(1, 64 / 1.310, err_us=300.0), fifth], PLAN)
    said = [line for line in lines if line.startswith("at 100 streams")]
    assert len(said) == 1
    assert "only 20.0% of the intended 4,885 chunks/s" in said[0]
    assert "this machine cannot drive that rate" in said[0]
    # the one stream that kept up and kept the error within 1 ms is the verdict, exit 0
    assert lines[-1].startswith("highest load with timing error p99 ≤ 1 ms: 1 stream,")
    assert code == 0


def test_when_no_step_keeps_within_1_ms_it_says_what_limits_and_exits_3():
    lagging = [_step(1, 64 / 1.310, err_us=2500.0, lag_ms=6.0),
               _step(100, INTENDED_100, err_us=4000.0, lag_ms=9.0)]
    lines, code = verdict(lagging, PLAN)
    assert code == EXIT_OVER_BUDGET == 3
    assert lines[-1].startswith("no step kept timing error p99 within 1 ms on this machine; "
                                "at 1 stream: ")
    assert "error p99 2.50 ms" in lines[-1] and "event loop late by up to 6.00 ms" in lines[-1]
    on_time = [_step(1, 64 / 1.310, err_us=2500.0, lag_ms=0.3)]
    lines, code = verdict(on_time, PLAN)
    assert code == 3 and "with the event loop on time" in lines[-1]


def test_it_says_what_it_does_at_once_and_how_a_step_goes():
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "calibrate", "--steps", "1", "--step-seconds", "4",
         "--warmup", "0.5", "--ttft-ms", "20", "--itl-ms", "10", "--output-tokens", "16"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        first = proc.stdout.readline()
        first_after = time.monotonic() - started
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert first.startswith("tokentop calibrate: starting the exact-timing simulator"), first
    # the first line comes before the simulator and the workers are up, and the first row
    # (a 4.5 s step later): it cannot be later than the whole run minus that step
    assert first_after < time.monotonic() - started - 4.5
    # 16 chunks in 20 + 15 × 10 = 170 ms: 94 chunks/s intended
    progress = [line for line in err.splitlines() if line.startswith("  step 1 streams: ")]
    assert progress and re.match(r"  step 1 streams: \d/4\.5 s, [\d,]+ chunks/s of 94 "
                                 r"intended$", progress[0]), progress
    last = out.splitlines()[-1]
    # whichever this machine gives, the exit code says the same as the last line
    assert (proc.returncode, last.startswith("highest load")) in ((0, True), (3, False)), last
    assert "\x1b" not in out + err
