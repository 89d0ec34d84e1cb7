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
    assert math.log(900 / 360) / math.log(16 / 4) > 0.2
    assert math.log(950 / 900) / math.log(48 / 16) < 0.2
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
    lines = headline(_steps(COARSE), "streams", None)
    assert lines[0] == "knee: 16 streams (900 output tok/s)"
    assert lines[1].startswith("knee rule: ") and "ln(tok/s ratio) / ln(load ratio)" in lines[1]
    assert "below 0.2" in lines[1] and "2× the load buys under 1.15× the throughput" in lines[1]
    # 48 streams had the most tok/s, but the curve had bent: not a lower bound
    assert lines[2] == "max output tok/s 950 at 48 streams"


def test_a_best_figure_at_a_last_step_that_still_rose_is_called_a_lower_bound():
    # 16 → 64 streams: 900 → 1,600 tok/s, ln 1.78 / ln 4 = 0.42: still rising where it ended
    rising = {1: (100.0, 12.0), 4: (360.0, 20.0), 16: (900.0, 49.0), 64: (1600.0, 90.0)}
    steps = _steps(rising)
    for s, good in zip(steps, (1.0, 3.0, 8.0, 12.0), strict=True):
        s.goodput_req_s = good
    lines = headline(steps, "streams", "ttft<500ms")
    assert lines[0] == "knee: not reached (throughput still scaling at the last step)"
    assert lines[2] == ("max output tok/s 1,600 at 64 streams — still rising at the last "
                        "step: a lower bound; extend the steps")
    assert lines[3] == ("max goodput under ttft<500ms: 12.0 req/s at 64 streams — still "
                        "rising at the last step: a lower bound; extend the steps")
    steps[-1].goodput_req_s = 5.0  # the best goodput is at 16 now: a true maximum
    assert headline(steps, "streams", "ttft<500ms")[3] == ("max goodput under ttft<500ms: "
                                                          "8.00 req/s at 16 streams")


def test_the_terminal_curve_marks_the_knee_and_is_plain_text_unless_coloured():
    steps = _steps(COARSE)
    text = terminal_curve(steps, find_knee(steps), "streams", color=False)
    assert "knee: 16 streams" in text
    assert "\x1b" not in text
    assert "knee" not in terminal_curve(steps, None, "streams", color=False)
