"""A phase run N times (the plan's `repeat`, --repeat N): each row's value in each run, and
the ramp's sweeps as one curve. The matrix makes the mean and its 95 % interval of them
(loadgen.eval.matrix.interval)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from loadgen.analysis.sweep import StepResult


def repeated_values(figures: list, rows_of: Callable[[Any], list]) -> dict[str, list]:
    """Each row's value in each run, by row id: the matrix's own rows of each run's figures,
    so a repeat is judged by the same definitions as the row it is a repeat of."""
    out: dict[str, list] = {}
    for f in figures:
        for row in rows_of(f):
            out.setdefault(row.id, []).append(row.value)
    return out


def mean_steps(runs: list[list[StepResult]]) -> list[StepResult]:
    """One curve of several sweeps: each load's figures averaged over the runs that held it
    (a repeat that stopped early holds fewer); a step saturated in any run is saturated."""
    by_load: dict[float, list[StepResult]] = {}
    for run in runs:
        for step in run:
            by_load.setdefault(step.load, []).append(step)
    return [_mean_step(held) for _, held in sorted(by_load.items())]


def _mean_step(held: list[StepResult]) -> StepResult:
    if len(held) == 1:
        return held[0]
    out = dataclasses.replace(held[0])
    for f in dataclasses.fields(StepResult):
        values = [getattr(s, f.name) for s in held]
        sample = next((v for v in values if v is not None), None)
        if isinstance(sample, dict):
            setattr(out, f.name, {k: _mean([(v or {}).get(k) for v in values]) for k in sample})
        elif isinstance(sample, float | int) and not isinstance(sample, bool) \
                and f.name != "load":
            setattr(out, f.name, _mean(values))
    out.saturated = any(s.saturated for s in held)
    return out


def _mean(values: list) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def ramp_repeats(runs: list[list[StepResult]], knee: StepResult | None,
                  best: StepResult | None, top: StepResult | None) -> dict[str, list]:
    """Every run's figure at the mean curve's knee, best goodput and top, by row id."""
    def at(load: float | None, run: list[StepResult]) -> StepResult | None:
        return next((s for s in run if s.load == load), None)

    out: dict[str, list] = {}
    for run in runs:
        k, b, t = (at(x.load if x else None, run) for x in (knee, best, top))
        for id_, value in (("ramp.knee.output_tok_s", k and k.output_tok_s),
                           ("ramp.knee.ttft.p99", k and k.ttft_ms.get("p99")),
                           ("ramp.max_goodput", b and b.goodput_req_s),
                           ("ramp.max_output_tok_s", t and t.output_tok_s)):
            out.setdefault(id_, []).append(value)
    return out
