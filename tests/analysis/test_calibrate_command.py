"""`tokentop calibrate` says what it does at once, how a step goes, when this machine
cannot drive the intended rate, and what limits it when no step keeps within 1 ms."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np
from support import ROOT

from loadgen.analysis.calibrate import (
    EXIT_OVER_BUDGET,
    CalibratePlan,
    Step,
    highest_kept,
    verdict,
)
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


def test_the_verdict_stops_at_the_first_step_that_broke_the_promise():
    """1 and 32 streams within 1 ms, 8 streams not: 32 is no verdict, as the loads between
    8 and 32 were never shown to keep the promise; given in any order of --steps."""
    one, eight, many = (_step(1, 64 / 1.310, err_us=300.0),
                        _step(8, 8 * 64 / 1.310, err_us=2500.0),
                        _step(32, 32 * 64 / 1.310, err_us=300.0))
    for order in ([one, eight, many], [many, one, eight]):
        lines, code = verdict(order, PLAN)
        assert code == 0
        assert lines[-1].startswith("highest load with timing error p99 ≤ 1 ms: 1 stream,")
        assert any(line.startswith("beyond it, at 8 streams: TTFT error p99 2.50 ms")
                   for line in lines), lines
        assert "within 1 ms again at 32 streams, not counted: a lighter load broke it" in lines
        assert highest_kept(order, PLAN) == (one, eight)
    # a step short of its rate breaks the promise as well: the load it meant never ran
    short = _step(8, 8 * 64 / 1.310 / 5, err_us=300.0)
    assert highest_kept([one, short, many], PLAN) == (one, short)
    # the lightest step broken: nothing counts, however well a heavier one did
    lines, code = verdict([eight, many], PLAN)
    assert code == EXIT_OVER_BUDGET and lines[-1].startswith("no step kept")
    assert highest_kept([eight, many], PLAN) == (None, eight)
    # every step within: the heaviest, nothing beyond it
    assert highest_kept([one, many], PLAN) == (many, None)


ROW = re.compile(r"^\s*(\d+)\s+\d+\s+\d+\s")


def test_the_commands_verdict_is_the_highest_step_with_every_lighter_one_kept():
    """Through the real command on the exact-timing simulator at 1, 8 and 32 streams:
    whatever this machine gives at each, the verdict line names the step the table's own
    rows (✗, short of rate) allow, and the exit code agrees with it."""
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", "calibrate", "--steps", "1,8,32", "--step-seconds",
         "1.5", "--warmup", "0.5", "--ttft-ms", "20", "--itl-ms", "10", "--output-tokens",
         "16", "--workers", "1"],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    rows = {int(m.group(1)): line for line in done.stdout.splitlines()
            if (m := ROW.match(line))}
    assert sorted(rows) == [1, 8, 32], done.stdout
    kept = [n for n in sorted(rows) if "✗" not in rows[n] and "short of rate" not in rows[n]]
    expected = None
    for n in sorted(rows):  # the rows in order of load, up to the first one not kept
        if n not in kept:
            break
        expected = n
    last = done.stdout.splitlines()[-1]
    if expected is None:
        assert done.returncode == EXIT_OVER_BUDGET and last.startswith("no step kept"), last
    else:
        assert done.returncode == 0, done.stderr[-2000:]
        word = "stream," if expected == 1 else "streams,"
        assert last.startswith(f"highest load with timing error p99 ≤ 1 ms: {expected} {word}")
