"""`tokentop sweep` against simulator settings whose knee and goodput are known."""

from __future__ import annotations

import json

import pytest

from loadgen.analysis.sweep import (
    StepResult,
    SweepPlan,
    find_knee,
    run_sweep,
    write_outputs,
)
from loadgen.run.config import RunConfig
from loadgen.sim import SimConfig, start_sim

SLOTS = 8
TOKENS = 32


@pytest.fixture
async def slotted_sim():
    cfg = SimConfig(slots=SLOTS)
    sim = await start_sim(cfg, host="127.0.0.1", port=0)
    yield sim
    await sim.close()


async def test_knee_at_the_slot_limit_and_goodput_as_the_model_says(slotted_sim, tmp_path):
    cfg = RunConfig(url=slotted_sim.url, output_tokens=str(TOKENS), input_tokens="32",
                    slo="ttft<200ms", workers=1, tick=0.25, drain_grace=2.0)
    plan = SweepPlan(steps=[2, 4, 8, 16, 32], step_seconds=2.5, step_warmup=1.5)
    lines: list[str] = []
    steps = await run_sweep(cfg, plan, echo=lines.append)
    assert [s.load for s in steps] == [2, 4, 8, 16, 32] or steps[-1].saturated
    knee = find_knee(steps)
    assert knee is not None and knee.load == SLOTS  # the slot limit
    # the model: a full batch of 8 takes step = overhead + per-seq × 8 per token, so a
    # request lasts about TOKENS steps; 8 slots finish 8 requests per request lifetime
    m = slotted_sim.model.cfg
    step_s = (m.step_overhead_ms + m.decode_ms_per_seq * SLOTS) / 1000
    model_goodput = SLOTS / (TOKENS * step_s)
    best = max(steps, key=lambda s: s.goodput_req_s or 0)
    assert best.load == SLOTS  # past the slots TTFT is queueing (~a request long) > 200 ms
    assert best.goodput_req_s == pytest.approx(model_goodput, rel=0.15)
    over = [s for s in steps if s.load > SLOTS]
    assert over and all((s.goodput_req_s or 0) < 0.2 * model_goodput for s in over)
    write_outputs(tmp_path, cfg, steps, knee, best)
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["knee"] == SLOTS and doc["max_goodput"]["load"] == SLOTS
    assert doc["knee_scaling"] == 0.2 and not doc["still_rising"]
    assert not doc["max_goodput"]["lower_bound"] and not doc["max_output_tok_s"]["lower_bound"]
    top = max(steps, key=lambda s: s.output_tok_s)
    assert doc["max_output_tok_s"]["load"] == top.load >= SLOTS
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    assert (tmp_path / "sweep.csv").read_text().count("\n") == len(steps) + 1


def test_knee_rule_on_made_up_curves():
    def steps(points):
        return [StepResult(load=x, output_tok_s=y) for x, y in points]

    linear_then_flat = steps([(1, 100), (2, 200), (4, 400), (8, 800), (16, 820), (32, 830)])
    assert find_knee(linear_then_flat).load == 8
    still_scaling = steps([(1, 100), (2, 195), (4, 380)])
    assert find_knee(still_scaling) is None


def test_the_command_builds_the_plan_and_refuses_bad_steps_in_one_line():
    from pathlib import Path

    from support import tokentop

    from tui.commands.console import console_parser
    from tui.commands.sweep import add_sweep_arguments, sweep_plan

    p = console_parser("tokentop sweep")
    add_sweep_arguments(p)
    plan = sweep_plan(p.parse_args(["--steps", "auto", "--step-seconds", "3", "--sweep-out", "d"]))
    assert plan == SweepPlan(steps=None, step_seconds=3.0, out=Path("d"))
    assert sweep_plan(p.parse_args([])) == SweepPlan()
    proc = tokentop("sweep", "--steps", "4,2", timeout=30)
    assert proc.returncode == 2
    assert proc.stderr == "tokentop sweep: --steps must be increasing numbers above 0\n"


async def test_throughput_counts_tokens_not_chunks(tmp_path):
    """Four tokens a chunk and no per-chunk usage: a step's tok/s is the model's token rate
    (one token per running sequence per decode step), not a quarter of it."""
    sim = await start_sim(SimConfig(slots=SLOTS, tokens_per_chunk=4), host="127.0.0.1", port=0)
    try:
        streams, tokens = 4, 64
        cfg = RunConfig(url=sim.url, output_tokens=str(tokens), input_tokens="8", workers=1,
                        tick=0.25, drain_grace=2.0)
        plan = SweepPlan(steps=[streams], step_seconds=3.0, step_warmup=1.0)
        (step,) = await run_sweep(cfg, plan, echo=lambda _: None, record=False)
        m = sim.model.cfg
        step_s = (m.step_overhead_ms + m.decode_ms_per_seq * streams) / 1000
        assert step.output_tok_s == pytest.approx(streams / step_s, rel=0.15)
    finally:
        await sim.close()


async def test_open_loop_sweep_stops_where_the_server_queue_grows(slotted_sim):
    """Open loop without a cap never has a client backlog: saturation is read from the
    server's own waiting count."""
    cfg = RunConfig(url=slotted_sim.url, mode="open", output_tokens=str(TOKENS),
                    input_tokens="32", workers=1, tick=0.25, drain_grace=1.0)
    plan = SweepPlan(steps=[5, 300, 600], step_seconds=2.5, step_warmup=0.5)
    steps = await run_sweep(cfg, plan, echo=lambda _: None, record=False)
    assert [s.load for s in steps] == [5, 300]
    assert not steps[0].saturated and steps[1].saturated
    assert steps[1].queue_depth is not None and steps[1].queue_depth > 20
