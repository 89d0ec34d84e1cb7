"""The one knee rule (loadgen/model/knee.py): on made-up curves whose bend is known, and on
the real simulator, whose bend is its configured slot count, for the sweep and the auto-ramp
alike."""

from __future__ import annotations

import math

import pytest
from support import FAST, WAIT_S

from loadgen.analysis.sweep import StepResult, SweepPlan, run_sweep
from loadgen.model.knee import (
    KNEE_SCALING,
    find_knee,
    knee_rule,
    lower_bound,
    past_knee,
    scaling,
    still_rising,
)
from loadgen.model.snapshot import Control
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.sim import SimConfig, start_sim

DOUBLING = [1, 2, 4, 8, 16, 32, 64, 128]


def batch_engine(slots: int, overhead_ms: float = 6.0, per_seq_ms: float = 0.35):
    """tok/s of a batch engine by hand: min(n, slots) sequences each get a token a step, a
    step lasting overhead + per-seq × running (the simulator's defaults): it bends smoothly
    before the slots fill and is flat after."""
    def tok_s(n: float) -> float:
        running = min(n, slots)
        return 1000.0 * running / (overhead_ms + per_seq_ms * running)
    return tok_s


def curve(f, loads) -> list[tuple[float, float]]:
    return [(float(x), f(x)) for x in loads]


# ---- the rule on made-up curves ---------------------------------------------------------


def test_a_linear_curve_has_no_knee_and_its_last_step_is_a_lower_bound():
    linear = curve(lambda n: 100.0 * n, DOUBLING)
    assert find_knee(linear) is None
    assert still_rising(linear) and lower_bound(128, linear) and not lower_bound(64, linear)


@pytest.mark.parametrize("slots", [8, 32, 64])
def test_a_saturating_engine_bends_at_its_slot_count(slots):
    points = curve(batch_engine(slots), [*DOUBLING, 256])
    knee = find_knee(points)
    assert knee is not None and knee[0] == slots
    assert not still_rising(points)  # the last steps were flat


def test_the_default_simulator_bends_at_32_not_16():
    # the case, by hand: 16 → 32 streams gives 1,860 / 1,379 = +35 % tok/s,
    # ln 1.349 / ln 2 = 0.43, well above 0.2; 32 → 64 gives nothing
    f = batch_engine(32)
    assert f(32) / f(16) == pytest.approx(1.349, abs=0.01)
    assert scaling(16, f(16), 32, f(32)) == pytest.approx(math.log(1.349) / math.log(2),
                                                          abs=0.01)
    assert past_knee(16, f(16), 32, f(32)) is None
    assert find_knee(curve(f, DOUBLING))[0] == 32
    # the former threshold, 0.5, called 16 the knee: that is what this rule replaced
    assert find_knee(curve(f, DOUBLING), 0.5)[0] == 16


@pytest.mark.parametrize("grid", [[1, 2, 4, 8, 16, 32], [1, 4, 16, 64], [1, 3, 9, 27, 81]])
def test_a_coarse_step_is_judged_like_a_fine_one(grid):
    # tok/s = c × load^k scales by exactly k over any step, 2× or 4×: the verdict is the
    # grid's no matter how coarse
    assert find_knee(curve(lambda n: 50.0 * n ** 0.3, grid)) is None
    assert find_knee(curve(lambda n: 50.0 * n ** 0.1, grid))[0] == grid[0]
    # a sharp bend at 16: every grid holding 16 puts the knee there
    flat_after_16 = curve(lambda n: 100.0 * min(n, 16), grid)
    if 16 in grid and grid[-1] > 16:
        assert find_knee(flat_after_16)[0] == 16


def test_a_falling_curve_is_past_the_knee_and_says_so_in_words():
    falling = [(1, 100.0), (2, 200.0), (4, 150.0), (8, 0.0)]
    assert find_knee(falling)[0] == 2
    assert scaling(4, 150.0, 8, 0.0) == -math.inf
    why = past_knee(2, 200.0, 4, 150.0)
    assert why == ("-25.0% tok/s (200 → 150) for 2× the load (2 → 4 streams): "
                   "scaling -0.42, under 0.2")
    assert "nothing came out" in past_knee(4, 150.0, 8, 0.0, unit="req/s")
    assert not still_rising(falling)


def test_what_cannot_be_read_is_not_a_knee():
    assert scaling(4, 100.0, 4, 90.0) is None  # the same load twice
    assert scaling(4, 0.0, 8, 90.0) is None  # nothing measured below
    assert past_knee(4, 0.0, 8, 90.0) is None
    assert find_knee([(0, 0.0), (1, 100.0), (2, 200.0)]) is None  # a step of no load
    assert not still_rising([(1, 100.0)])  # one step: nothing to compare with


def test_step_results_are_read_like_pairs_and_a_saturated_last_step_is_the_ceiling():
    steps = [StepResult(load=x, output_tok_s=y) for x, y in curve(lambda n: 90.0 * n, [1, 2, 4])]
    assert find_knee(steps) is None and still_rising(steps)
    steps[-1].saturated = True  # the sweep stopped there: that throughput is the ceiling
    assert not still_rising(steps) and not lower_bound(4, steps)


def test_the_rule_in_words_names_its_threshold_and_what_it_means():
    assert KNEE_SCALING == 0.2
    text = knee_rule()
    assert "ln(tok/s ratio) / ln(load ratio)" in text and "below 0.2" in text
    assert "2× the load buys under 1.15× the throughput, 4× under 1.32×" in text
    assert "below 0.5" in knee_rule(0.5) and "4× under 2×" in knee_rule(0.5)


# ---- the real simulator: the knee is its slot count --------------------------------------


# 4 slots: the auto-ramp doubles 1, 2, 4, 8, then bisects 6, 5; its last probe, 4 → 5 streams,
# is 1.25× the load, where the rule needs +4.6 % tok/s to pass. (At 8 slots the last probe is
# 8 → 9, 1.125×, needing +2.4 %: a refilled slot and a tick's jitter read +2.0 % there, too
# close to judge. The exponent amplifies tok/s noise by 1 / ln(load ratio).)
SLOTS = 4
TOKENS = 128  # long requests: a slot refilled between requests costs under 1 % of a step


async def test_the_sweep_and_the_auto_ramp_find_the_same_knee_at_the_slot_count():
    sim = await start_sim(SimConfig(slots=SLOTS), host="127.0.0.1", port=0)
    try:
        cfg = RunConfig(url=sim.url, output_tokens=str(TOKENS), input_tokens="16", workers=1,
                        tick=0.25, drain_grace=1.0, auto_ramp_hold=2.0, auto_ramp_warmup=1.0)
        plan = SweepPlan(steps=[2, 4, 8], step_seconds=2.5, step_warmup=1.5)
        steps = await run_sweep(cfg, plan, echo=lambda _: None, record=False)
        knee = find_knee(steps)
        assert knee is not None and knee.load == SLOTS, [(s.load, s.output_tok_s) for s in steps]
        assert steps[-1].note.startswith("past the knee: ")
        settled, note = await _auto_ramp(cfg)
        assert settled == knee.load == sim.model.cfg.slots, note
        assert note.startswith(f"auto-ramp settled at {SLOTS} streams")
    finally:
        await sim.close()


async def _auto_ramp(cfg: RunConfig) -> tuple[int, str]:
    """Where the auto-ramp (no SLO: the knee rule) settles on cfg's server, and its note."""
    coord = Coordinator(cfg)
    await coord.start()
    try:
        snaps = coord.snapshots()
        await coord.control(Control(op="auto_ramp", source="key"))
        async for snap in snaps:
            if coord.auto is not None and coord.auto.settled:
                break
            assert snap.elapsed < 12 * WAIT_S, "auto-ramp did not settle in time"
        settled, note = coord.auto.load, snap.load.note
        coord.request_stop("test over")
        async for _ in snaps:
            pass
        return settled, note
    finally:
        await coord.close()


async def test_auto_steps_go_past_16_on_the_default_simulator_and_say_why_they_stop():
    # 32 slots (the default): the former rule stopped at 32 and called 16 the knee; this one
    # goes on to 64, finds nothing more there, and says so
    sim = await start_sim(SimConfig(), host="127.0.0.1", port=0)
    try:
        assert sim.model.cfg.slots == 32
        # a request lasts 32 steps (≈ 0.55 s at 32 running): the warm-up outlasts the queue
        # filling up when a step doubles the streams, so no step reads as over-saturated
        cfg = RunConfig(url=sim.url, output_tokens="32", input_tokens="16", workers=1,
                        tick=0.25, drain_grace=1.0)
        lines: list[str] = []
        plan = SweepPlan(steps=None, step_seconds=2.0, step_warmup=1.5)
        steps = await run_sweep(cfg, plan, echo=lines.append, record=False)
        assert [s.load for s in steps] == DOUBLING[:7], [(s.load, s.output_tok_s) for s in steps]
        assert find_knee(steps).load == sim.model.cfg.slots
        assert lines[-1].startswith("stopping: the knee is at 32 streams; past the knee: ")
        assert not still_rising(steps)
    finally:
        await sim.close()


async def test_auto_steps_stop_at_their_limit_still_rising_and_say_so(monkeypatch):
    import loadgen.analysis.sweep as sweep

    monkeypatch.setattr(sweep, "AUTO_MAX_STEPS", 3)  # 64 slots would take 7 doublings
    sim = await start_sim(SimConfig(slots=64, **FAST), host="127.0.0.1", port=0)
    try:
        cfg = RunConfig(url=sim.url, output_tokens="64", input_tokens="16", workers=1,
                        tick=0.25, drain_grace=1.0)
        lines: list[str] = []
        plan = SweepPlan(steps=None, step_seconds=1.5, step_warmup=0.5)
        steps = await run_sweep(cfg, plan, echo=lines.append, record=False)
        assert [s.load for s in steps] == [1, 2, 4]
        assert find_knee(steps) is None and still_rising(steps)
        assert lines[-1] == ("stopping: 3 steps, the most --steps auto takes, and no knee yet: "
                             "still rising at the last step: a lower bound; extend the steps "
                             "(--steps 8,…)")
    finally:
        await sim.close()
