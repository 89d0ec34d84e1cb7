"""The knee rule on coarse steps, and how the terminal curve marks the knee."""

from __future__ import annotations

import math

from loadgen.analysis.sweep import StepResult, find_knee, headline, terminal_curve

# the user's sweep, --steps 1,4,16,48: 16 gave 2.5× the throughput of 4 at a P99 TTFT of
# 49 ms, and 48 almost nothing more (tok/s, P99 TTFT ms)
COARSE = {1: (100.0, 12.0), 4: (360.0, 20.0), 16: (900.0, 49.0), 48: (950.0, 310.0)}


def _steps(points: dict[float, tuple[float, float]]) -> list[StepResult]:
    return [StepResult(load=load, output_tok_s=tok, ttft_ms={"p50": None, "p99": p99})
            for load, (tok, p99) in points.items()]


def test_coarse_steps_put_the_knee_where_throughput_stops_following_the_load():
    # by hand: 4× the load from 4 to 16 bought 2.5× the throughput, ln 2.5 / ln 4 = 0.66 of
    # linear; from 16 to 48 (3×) it bought 950/900, ln 1.056 / ln 3 = 0.05: the bend is at 16
    assert math.log(900 / 360) / math.log(16 / 4) > 0.5
    assert math.log(950 / 900) / math.log(48 / 16) < 0.5
    # (the gain per added stream from 4 to 16, 540 / 12 = 45, is under half the first
    # step's 100: a per-unit rule punishes the wide step and says 4)
    assert (900 - 360) / 12 < 0.5 * 100 / 1
    knee = find_knee(_steps(COARSE))
    assert knee is not None and knee.load == 16


def test_fine_steps_still_find_a_sharp_bend():
    # 8 slots: linear to 8 streams, flat after; 2× the load buying 1.025× is 0.04 of linear
    flat_after_8 = {1: (100, 10), 2: (200, 10), 4: (400, 10), 8: (800, 11), 16: (820, 90)}
    assert find_knee(_steps(flat_after_8)).load == 8
    still_scaling = {1: (100, 10), 2: (195, 10), 4: (380, 11)}  # 0.96 of linear per step
    assert find_knee(_steps(still_scaling)) is None


def test_the_headline_says_what_rule_judged_the_knee():
    lines = headline(find_knee(_steps(COARSE)), None, "streams", None, 0.5)
    assert lines[0] == "knee: 16 streams (900 output tok/s)"
    assert lines[1].startswith("knee rule: ") and "ln(tok/s ratio) / ln(load ratio)" in lines[1]
    assert "below 0.5" in lines[1] and "4× the load buys under 2× the throughput" in lines[1]


def test_the_terminal_curve_marks_the_knee_and_is_plain_text_unless_coloured():
    steps = _steps(COARSE)
    text = terminal_curve(steps, find_knee(steps), "streams", color=False)
    assert "knee: 16 streams" in text
    assert "\x1b" not in text
    assert "knee" not in terminal_curve(steps, None, "streams", color=False)
