"""Static batching (the eval's `batch` phase): N requests submitted at once, their total
tok/s and time to the last token, beside the dynamic baseline; and the latency fluctuation
under dynamic batching (ITL / TPOT P99 ÷ P50, interquartile range) at each ramp step.

The static batch is one run of its own (OUT/runs/batch): N closed-loop streams started
together (no stagger, no warm-up), each sending one request, bounded by the plan's
timeout. Every request leaves at the start, so the batch ends with the longest request's
last token: the time to the last token is that request's E2E as the recording has it,
never a clock around the session (which would add the run's start and drain).

The fluctuation has no load of its own: it is read from the ramp's recording, each step's
ticks found by the target load they ran at, past the step's warm-up as the sweep measured it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from loadgen.analysis.report import soak_report
from loadgen.eval.phase_run import Eval, phase_cfg, run_session
from loadgen.eval.results import (
    BatchFigures,
    PhaseResult,
    RampFigures,
    Spread,
    StepSpread,
    done,
    skipped,
)
from loadgen.model import hdr
from loadgen.model.snapshot import Snapshot
from loadgen.record.rundir import iter_snapshots

SPREAD_PERCENTILES = (25.0, 50.0, 75.0, 99.0)


async def run(ev: Eval) -> PhaseResult:
    """The batch phase's result."""
    p = ev.phases.batch
    if not p.enabled:
        return skipped("disabled in the plan")
    n, timeout = p.requests, float(p.timeout)
    # one request a stream, all sent at once: max_requests = streams, stagger 0; the
    # timeout bounds the run and each request alike
    cfg = msgspec.structs.replace(
        phase_cfg(ev, "batch", mode="closed", concurrency=n, duration=timeout, warmup=0.0),
        max_requests=n, stagger=0.0, request_timeout=min(ev.cfg.request_timeout, timeout))
    run_dir = await run_session(ev, "batch", cfg)
    figures = _static(run_dir, n, timeout)
    _beside_baseline(ev, figures)
    _fluctuation(ev, figures)
    return done(figures, str(run_dir))


def _static(run_dir: Path, n: int, timeout: float) -> BatchFigures:
    """The batch's figures from its recording."""
    r, _ = soak_report(run_dir, warnings=[])
    ok = r.requests.ok
    ttft, e2e = r.latency_ms.get("ttft") or {}, r.latency_ms.get("e2e") or {}
    last = _ms(e2e.get("max"))
    why = ""
    if ok < n:  # the batch is not over before its last request is
        why = (f"{n - ok} of {n} requests did not finish (failed, or still running at the "
               f"{timeout:g} s timeout)")
        last = None
    elif last is None or last <= 0:
        why, last = "no request's E2E was recorded", None
    tokens = r.requests.output_tokens
    return BatchFigures(
        requests=n, requests_ok=ok, requests_failed=n - ok, output_tokens=tokens,
        time_to_last_token_ms=last,
        output_tok_s=tokens / (last / 1000.0) if last else None, why=why,
        ttft_ms={"p50": _ms(ttft.get("p50")), "p99": _ms(ttft.get("p99"))},
        e2e_ms={"p50": _ms(e2e.get("p50")), "max": _ms(e2e.get("max"))},
        timeout_s=timeout, dynamic_output_tok_s=None, dynamic_load="", dynamic_why="",
        steps=[], steps_unit="streams", steps_why="")


def _ms(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _beside_baseline(ev: Eval, f: BatchFigures) -> None:
    """The dynamic baseline's output tok/s, as the eval found it, or why there is none."""
    base = ev.results.baseline
    if base is None or base.status != "done" or base.figures is None:
        f.dynamic_why = ("the baseline did not run" if base is None
                         else f"the baseline {base.status}: {base.why}")
        return
    f.dynamic_output_tok_s, f.dynamic_load = base.figures.output_tok_s, base.figures.load
    if f.dynamic_output_tok_s is None:
        f.dynamic_why = "the baseline measured no output tok/s"


def _fluctuation(ev: Eval, f: BatchFigures) -> None:
    """Each ramp step's ITL and TPOT spread, from the ramp's recording (its first run's,
    with repeats: the loads are the same in each), or why there are none."""
    ramp = ev.results.ramp
    figures: RampFigures | None = ramp.figures if ramp is not None else None
    if ramp is None or ramp.status != "done" or figures is None:
        f.steps_why = ("the ramp did not run" if ramp is None
                       else f"the ramp {ramp.status}: {ramp.why}")
        return
    if not ramp.run_dir or not Path(ramp.run_dir).is_dir():
        f.steps_why = f"the ramp's recording is not there ({ramp.run_dir or 'none kept'})"
        return
    r = ev.phases.ramp
    f.steps_unit = figures.unit
    f.steps = step_spreads(Path(ramp.run_dir), [s.load for s in figures.steps],
                           open_loop=figures.unit != "streams",
                           warmup_s=float(r.step_warmup), seconds=float(r.step_duration))
    if not f.steps:
        f.steps_why = "the ramp had no step"


def step_spreads(run_dir: Path, loads: list[float], *, open_loop: bool, warmup_s: float,
                 seconds: float) -> list[StepSpread]:
    """The ITL and TPOT spread of each step of a sweep's recording. A step's ticks are those
    at its target load (streams, or req/s in open loop); its measured ones begin a warm-up
    after the first of them and hold for its seconds; a tick counts when its middle lies in
    that span (a tick covers the interval before its time: the first one at a new load is
    partly the previous step's, and is in no span)."""
    steps = {load: _Step() for load in loads}
    for snap in iter_snapshots(run_dir, warn=lambda _m: None):
        load = _target(snap, open_loop)
        step = next((s for k, s in steps.items() if load is not None
                     and math.isclose(k, load, rel_tol=1e-9)), None)
        if step is not None:
            step.see(snap, warmup_s, seconds)
    return [s.spread(load) for load, s in steps.items()]


def _target(snap: Snapshot, open_loop: bool) -> float | None:
    if snap.load.state != "running":  # a drain's ticks are no step's
        return None
    return snap.load.target_rate if open_loop else float(snap.load.target_concurrency)


@dataclass
class _Step:
    """The measured ticks of one step, their ITL and TPOT histograms summed."""

    start: float | None = None  # the elapsed time of its first tick
    ticks: int = 0
    dense: dict[str, np.ndarray] = field(default_factory=dict)

    def see(self, snap: Snapshot, warmup_s: float, seconds: float) -> None:
        if self.start is None:
            self.start = snap.elapsed
        # by the tick's middle: ticks jitter by milliseconds about their period, so their
        # ends fall either side of the span's ends by chance
        middle = snap.elapsed - snap.interval / 2 - self.start
        if not warmup_s <= middle <= warmup_s + seconds:
            return
        self.ticks += 1
        for m in ("itl", "tpot"):
            if m in snap.hist:
                d = hdr.decode(snap.hist[m])
                self.dense[m] = self.dense[m] + d if m in self.dense else d

    def spread(self, load: float) -> StepSpread:
        return StepSpread(load=load, ticks=self.ticks, itl=_spread(self.dense.get("itl")),
                          tpot=_spread(self.dense.get("tpot")))


def _spread(dense: np.ndarray | None) -> Spread:
    if dense is None:
        return Spread(count=0, p25_ms=None, p50_ms=None, p75_ms=None, p99_ms=None)
    s = hdr.summarize(dense, SPREAD_PERCENTILES)

    def ms(key: str) -> float | None:
        us = s.get(key)
        return None if us is None else us / 1000.0

    return Spread(count=int(s["count"] or 0), p25_ms=ms("p25"), p50_ms=ms("p50"),
                  p75_ms=ms("p75"), p99_ms=ms("p99"))
