"""`tokentop sweep`: raise the load step by step and find where the server bends.

Each step holds a load (streams in closed loop, or a request rate in open
loop) for a warm-up and a measured period, then records what the measured
period showed. Two headline numbers come out:

* the knee: the last step before throughput stops keeping up with the load, by the one
  rule of loadgen/model/knee.py (the auto-ramp's and the eval's ramp's too): between two
  steps the scaling is ln(throughput ratio) / ln(load ratio), 1 linear, 0 flat; the knee
  is the last step before it falls below `--knee-fraction` (0.2: 2× the load for under
  +15 % tok/s). When the last step still scaled, the max output tok/s (and a max goodput
  there) is a lower bound, and the headline and sweep.json say so: extend the steps;
* the max goodput: the step with the most requests per second meeting every
  per-request SLO (`--slo ttft<500ms,tpot<50ms`), and the load that achieved it.

A sweep stops early when a step shows the server clearly over-saturated
(queue depth and TTFT both rising steadily through the step), or when its
error rate passes `--max-error-rate`. `--steps auto` doubles from 1 until a
step is past the knee, the server is over-saturated, errors pass
`--max-error-rate`, or AUTO_MAX_STEPS steps; it says which.
"""

from __future__ import annotations

import asyncio
import csv
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from loadgen import __version__
from loadgen.analysis import plot_style
from loadgen.model import hdr, units
from loadgen.model.knee import (
    KNEE_SCALING,
    LOWER_BOUND,
    find_knee,
    knee_rule,
    lower_bound,
    past_knee,
    still_rising,
)
from loadgen.model.notice import as_line
from loadgen.model.snapshot import METRICS, Control, Snapshot
from loadgen.run.config import ConfigError, FleetFrom, RunConfig
from loadgen.run.fleet_load import FleetLoad, FleetLoadError, FleetRun, fleet_load
from loadgen.run.secrets import Secrets
from loadgen.run.session import Session, SessionError
from loadgen.run.sinks import RunHandle, Sink

SWEEP_FORMAT = 1
AUTO_MAX_STEPS = 12


@dataclass
class StepResult:
    load: float  # streams (closed) or req/s (open)
    seconds: float = 0.0
    output_tok_s: float = 0.0
    req_s: float = 0.0
    goodput_req_s: float | None = None
    error_rate: float = 0.0
    ttft_ms: dict[str, float | None] = field(default_factory=dict)
    itl_ms: dict[str, float | None] = field(default_factory=dict)
    e2e_ms: dict[str, float | None] = field(default_factory=dict)
    # mean requests waiting: the server's own waiting count, plus in open loop the client's
    # backlog (which stays 0 without an in-flight cap, however far behind the server is)
    queue_depth: float | None = None
    gpu_memory_gb: float | None = None
    gpu_power_w: float | None = None
    tokens_per_joule: float | None = None
    saturated: bool = False
    note: str = ""


@dataclass
class _Accumulator:
    """The measured part of one step, from its Snapshots."""

    snaps: list[Snapshot] = field(default_factory=list)

    def result(self, load: float, slo_given: bool) -> StepResult:
        s = self.snaps
        r = StepResult(load=load)
        if len(s) < 2:
            r.note = "too short to measure"
            return r
        first, last = s[0], s[-1]
        dt = last.t - first.t
        a, b = first.counters, last.counters
        r.seconds = dt
        dense = _sum_hists(s[1:])
        # output tokens are counted as they arrive (not as requests complete, and not one a
        # chunk), so a step shorter than a few request lifetimes still reads true
        r.output_tok_s = (b.output_tokens - a.output_tokens) / dt
        done = (b.requests_ok - a.requests_ok)
        failed = (b.requests_failed - a.requests_failed)
        r.req_s = done / dt
        r.goodput_req_s = (b.requests_good - a.requests_good) / dt if slo_given else None
        r.error_rate = failed / (done + failed) if done + failed else 0.0
        r.ttft_ms, r.itl_ms, r.e2e_ms = (_pcts(dense.get(m)) for m in ("ttft", "itl", "e2e"))
        r.queue_depth = _mean([_queue(x) for x in s])
        r.gpu_memory_gb = _mean([_gpu(x, "memory_used_bytes", 1e9) for x in s])
        r.gpu_power_w = _mean([_gpu(x, "power_w", 1.0) for x in s])
        joules = _energy(first, last)
        if joules:
            r.tokens_per_joule = (b.output_tokens - a.output_tokens) / joules
        r.saturated = _rising(s)
        return r


def _sum_hists(snaps: list[Snapshot]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for snap in snaps:
        for m, blob in snap.hist.items():
            if m in METRICS:
                d = hdr.decode(blob)
                out[m] = out[m] + d if m in out else d
    return out


def _pcts(dense: np.ndarray | None) -> dict[str, float | None]:
    if dense is None:
        return {"p50": None, "p99": None}
    s = hdr.summarize(dense)
    return {k: (None if s[k] is None else s[k] / 1000.0) for k in ("p50", "p99")}


def _queue(s: Snapshot) -> float | None:
    server = s.server.waiting if s.server is not None and s.server.ok else None
    if s.load.mode != "open":
        return server
    return float(s.load.backlog) + (server or 0.0)


def _gpu(s: Snapshot, attr: str, scale: float) -> float | None:
    values = [getattr(g, attr) for g in s.gpu.gpus if getattr(g, attr) is not None]
    return sum(values) / scale if values else None


def _energy(a: Snapshot, b: Snapshot) -> float | None:
    ea = [g.energy_j for g in a.gpu.gpus]
    eb = [g.energy_j for g in b.gpu.gpus]
    if not ea or len(ea) != len(eb) or None in ea or None in eb:
        return None
    used = sum(eb) - sum(ea)  # type: ignore[arg-type]
    return used if used > 0 else None


def _mean(values: list[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else None


def _rising(snaps: list[Snapshot]) -> bool:
    """Queue depth and TTFT both climbing through the step: the server cannot keep up."""
    t = np.array([s.t for s in snaps])
    q = [_queue(s) for s in snaps]
    if len(snaps) < 6 or None in q:
        return False
    slope = np.polyfit(t - t[0], np.array(q, float), 1)[0]
    third = max(1, len(snaps) // 3)
    early, late = _sum_hists(snaps[:third]).get("ttft"), _sum_hists(snaps[-third:]).get("ttft")
    if early is None or late is None:
        return False
    p_early, p_late = hdr.summarize(early)["p50"], hdr.summarize(late)["p50"]
    return bool(slope > 0.5 and p_late > 1.5 * p_early)


def best_goodput(steps: list[StepResult]) -> StepResult | None:
    scored = [s for s in steps if s.goodput_req_s is not None]
    if not scored:
        return None
    best = max(scored, key=lambda s: s.goodput_req_s or 0.0)
    return best if (best.goodput_req_s or 0.0) > 0 else None


# ---- the sweep -----------------------------------------------------------------------------


DEFAULT_STEPS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


@dataclass(frozen=True)
class SweepPlan:
    """How a sweep walks the load: the steps and how long each is held, when to stop early,
    and where the results go. Built (and checked, parse_steps) by the command line."""

    steps: list[float] | None = field(default_factory=lambda: list(DEFAULT_STEPS))  # None: auto
    step_seconds: float = 20.0  # measured seconds per step
    step_warmup: float = 5.0  # unmeasured seconds per step
    knee_fraction: float = KNEE_SCALING  # knee: scaling between steps below this
    # (loadgen/model/knee.py)
    max_error_rate: float = 0.05  # stop after a step with more errors than this
    out: Path | None = None  # write sweep.json, sweep.csv, sweep.png here


def parse_steps(text: str) -> list[float] | None:
    """`--steps` as SweepPlan.steps (None for auto); ConfigError in words, before any load."""
    if text.strip() == "auto":
        return None
    try:
        steps = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"bad --steps {text!r}: e.g. 1,2,4,8 or auto") from None
    if not steps or min(steps) <= 0 or steps != sorted(steps):
        raise ConfigError("--steps must be increasing numbers above 0")
    return steps


async def run_sweep(cfg: RunConfig, plan: SweepPlan, secrets: Secrets | None = None,
                    echo=print, *, record: bool = True, progress=None,
                    sinks: Sequence[Sink] = (), load: FleetRun | None = None
                    ) -> list[StepResult]:
    """Hold each step in turn, in one Session (so a sweep is recorded, and replayable, like
    any run); raises SessionError before any load. `echo` gets the table, `progress` (stderr
    unless given) a line every PROGRESS_EVERY_S within a step; `sinks` watch the session
    (the eval's live view). `load`: a fleet's run to steer in place of a Session here
    (loadgen.run.fleet_load; it raises FleetLoadError)."""
    session = load or Session(msgspec.structs.replace(cfg, concurrency=0, rate=0.0), secrets,
                              record=record, say=lambda notice: _to_stderr(as_line(notice)),
                              sinks=sinks)
    await session.start()
    snaps = session.snapshots()
    echo(HEADER)
    try:
        return await _run(session, snaps, cfg, plan, echo, progress or _to_stderr)
    finally:
        session.request_stop("sweep done")
        async for _ in snaps:
            pass
        await session.finish()


def _to_stderr(line: str) -> None:
    """The session's own lines (where the sweep is recorded) stay off the table on stdout."""
    print(line, file=sys.stderr, flush=True)


def fleet_sweep(fleet: FleetLoad, cfg: RunConfig, plan: SweepPlan, say) -> FleetRun:
    """The one run on a fleet's agents that a sweep steers step by step: long enough for
    every step (a job always ends), stopped when the sweep is done. `say`: its lines."""
    steps = len(plan.steps) if plan.steps is not None else AUTO_MAX_STEPS
    longest = steps * (plan.step_warmup + plan.step_seconds) * 1.2 + 30.0
    job = msgspec.structs.replace(cfg, concurrency=0, rate=0.0, duration=longest)
    return fleet.live(job, "sweep", lambda notice: say(notice.text), steered=True)


async def sweep_main(cfg: RunConfig, plan: SweepPlan, secrets: Secrets | None, *,
                     record: bool = True, fleet: FleetFrom | None = None) -> int:
    """`tokentop sweep`; with `fleet` (--broker) the load comes from its agents."""
    seen = TargetSeen()
    loaded = None
    try:
        if fleet is not None:
            loaded = fleet_load(fleet, secrets)
            await loaded.open()
        load = fleet_sweep(loaded, cfg, plan, _to_stderr) if loaded is not None else None
        results = await run_sweep(cfg, plan, secrets, echo=lambda s: print(s, flush=True),
                                  record=record, sinks=[seen], load=load)
    except (SessionError, FleetLoadError) as e:
        print(f"tokentop sweep: {e}", file=sys.stderr)
        return 2
    finally:
        if loaded is not None:
            await loaded.close()
    knee = find_knee(results, plan.knee_fraction)
    best = best_goodput(results)
    unit = "streams" if cfg.mode == "closed" else "req/s"
    for line in headline(results, unit, cfg.slo, plan.knee_fraction):
        print(line)
    print(terminal_curve(results, knee, unit, color=sys.stdout.isatty()))
    if plan.out is not None:
        write_outputs(plan.out, cfg, results, knee, best, plan.knee_fraction,
                      target=seen.name)
        print(f"wrote {plan.out}/sweep.json, sweep.csv, sweep.png")
    return 0 if results else 1


class TargetSeen:
    """A sink that learns the target's name from the sweep's Snapshots (the model, and the
    engine once /metrics has named it), as sweep.png's legend says it."""

    def __init__(self) -> None:
        self.name: str | None = None

    async def start(self, run: RunHandle) -> None:
        pass

    def take(self, snap: Snapshot, windows) -> None:
        engine = snap.server.engine if snap.server is not None else None
        if self.name is None or engine:
            t = snap.target
            self.name = plot_style.target_name(t.url, t.model, engine, t.simulated)

    def finish(self, summary: dict) -> None:
        pass

    async def close(self) -> None:
        pass


async def _run(session: Session | FleetRun, snaps, cfg: RunConfig, plan: SweepPlan,
               echo, progress) -> list[StepResult]:
    steps = plan.steps
    results: list[StepResult] = []
    op = "set_concurrency" if cfg.mode == "closed" else "set_rate"
    unit = "streams" if cfg.mode == "closed" else "req/s"
    load = 1.0
    i = 0
    while True:
        if steps is not None:
            if i >= len(steps):
                break
            load = steps[i]
        await session.control(Control(op=op, value=load, source="cli"))
        result = await _hold(snaps, load, plan, session.slos.per_request is not None,
                             progress, unit)
        _note_past_knee(results, result, plan.knee_fraction, unit)
        results.append(result)
        echo(row(result))
        i += 1
        if result.saturated or result.error_rate > plan.max_error_rate:
            echo(f"stopping early: {result.note}")
            break
        if steps is None:
            stop = _auto_stop(results, plan.knee_fraction, unit)
            if stop:
                echo(f"stopping: {stop}")
                break
            load *= 2
    return results


def _note_past_knee(below: list[StepResult], step: StepResult, threshold: float,
                    unit: str) -> None:
    """A step past the knee says so in its note (the table's reader, sweep.json), unless
    its note already says something graver (too short, over-saturated, errors)."""
    if not below or step.note:
        return
    why = past_knee(below[-1].load, below[-1].output_tok_s, step.load, step.output_tok_s,
                    threshold, unit)
    if why:
        step.note = f"past the knee: {why}"


def _auto_stop(results: list[StepResult], threshold: float, unit: str) -> str | None:
    """Why `--steps auto` stops after these steps, in words; None to double again."""
    knee = find_knee(results, threshold)
    if knee is not None:
        return f"the knee is at {knee.load:g} {unit}; {results[-1].note}"
    if len(results) >= AUTO_MAX_STEPS:
        return (f"{AUTO_MAX_STEPS} steps, the most --steps auto takes, and no knee yet: "
                f"{LOWER_BOUND} (--steps {results[-1].load * 2:g},…)")
    return None


PROGRESS_EVERY_S = 5.0  # a step is 25 s by default: silence that long reads as a hang


async def _hold(snaps, load: float, plan: SweepPlan, slo_given: bool, progress,
                unit: str) -> StepResult:
    acc = _Accumulator()
    start = None
    due = PROGRESS_EVERY_S
    async for snap in snaps:
        if start is None:
            start = snap.elapsed
        if due <= snap.elapsed - start < plan.step_warmup + plan.step_seconds:
            progress(_progress(load, unit, snap.elapsed - start, plan, acc, slo_given))
            due += PROGRESS_EVERY_S
        if snap.elapsed - start < plan.step_warmup:
            continue
        acc.snaps.append(snap)
        if snap.elapsed - start >= plan.step_warmup + plan.step_seconds:
            break
        await asyncio.sleep(0)
    r = acc.result(load, slo_given)
    if r.saturated:
        r.note = "queue depth and TTFT rising steadily: the server is over-saturated"
    elif r.error_rate > plan.max_error_rate:
        r.note = f"error rate {units.pct(r.error_rate)} passed --max-error-rate"
    return r


def _progress(load: float, unit: str, held: float, plan: SweepPlan, acc: _Accumulator,
              slo_given: bool) -> str:
    """One line within a step: how far through it is and what it measured so far."""
    where = f"  step {load:g} {unit}: {int(held)}/{plan.step_warmup + plan.step_seconds:g} s"
    if held < plan.step_warmup or len(acc.snaps) < 2:
        return f"{where}, warming up"
    r = acc.result(load, slo_given)
    return (f"{where}, {units.rate(r.req_s, 'req/s')}, {units.rate(r.output_tok_s, 'tok/s')}, "
            f"TTFT p99 {_ms(r.ttft_ms.get('p99'))} so far")


HEADER = (f"{'load':>7} {'tok/s':>8} {'req/s':>7} {'goodput':>7} {'err':>6}  "
          f"{'TTFT p50/p99':>17}  {'ITL p50/p99':>17}  {'queue':>6} {'tok/J':>6}")


def _ms(x: float | None) -> str:
    """A step's latency, kept in ms (sweep.json's unit), as tokentop prints latencies."""
    return units.ms(units.us_of_ms(x))


def _f(x: float | None, digits: int = 1) -> str:
    return units.NA if x is None else f"{x:.{digits}f}"


def row(r: StepResult) -> str:
    lat = lambda d: f"{_ms(d.get('p50'))}/{_ms(d.get('p99'))}"  # noqa: E731
    flag = "  saturated" if r.saturated else ""
    return (f"{r.load:>7g} {units.rate(r.output_tok_s):>8} {units.rate(r.req_s):>7} "
            f"{units.rate(r.goodput_req_s):>7} {units.pct(r.error_rate):>6}  "
            f"{lat(r.ttft_ms):>17}  {lat(r.itl_ms):>17}  "
            f"{_f(r.queue_depth):>6} {_f(r.tokens_per_joule, 2):>6}{flag}")


def headline(results: list[StepResult], unit: str, slo: str | None,
             threshold: float = KNEE_SCALING) -> list[str]:
    """The sweep's verdict: the knee and its rule, the max output tok/s, the max goodput;
    a best figure at a last step that still scaled is said to be a lower bound."""
    knee, best, top = find_knee(results, threshold), best_goodput(results), max_tok_s(results)
    lines = []
    if knee is None:
        lines.append("knee: not reached (throughput still scaling at the last step)")
    else:
        tok_s = units.rate(knee.output_tok_s, "output tok/s")
        lines.append(f"knee: {knee.load:g} {unit} ({tok_s})")
    lines.append(f"knee rule: {knee_rule(threshold)}")
    if top is not None:
        lines.append(f"max output tok/s {units.rate(top.output_tok_s)} at {top.load:g} {unit}"
                     + _bound(top, results, threshold))
    if slo:
        if best is None:
            lines.append(f"max goodput under {slo}: no step met the SLO")
        else:
            lines.append(f"max goodput under {slo}: {units.rate(best.goodput_req_s, 'req/s')} "
                         f"at {best.load:g} {unit}" + _bound(best, results, threshold))
    return lines


def max_tok_s(steps: list[StepResult]) -> StepResult | None:
    """The step with the most output tokens per second (None when none produced any)."""
    top = max(steps, key=lambda s: s.output_tok_s, default=None)
    return top if top is not None and top.output_tok_s > 0 else None


def _bound(step: StepResult, steps: list[StepResult], threshold: float) -> str:
    return f" — {LOWER_BOUND}" if lower_bound(step.load, steps, threshold) else ""


def write_outputs(out: Path, cfg: RunConfig, results: list[StepResult],
                  knee: StepResult | None, best: StepResult | None,
                  fraction: float = KNEE_SCALING, *, target: str | None = None,
                  what: str = "Sweep") -> None:
    """sweep.json, sweep.csv and sweep.png in `out`; `target` names the target in the plot
    (None: cfg_label's), `what` the plot's title ("Pressure ramp (eval)")."""
    top = max_tok_s(results)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": SWEEP_FORMAT,
        "tokentop_version": __version__,
        "config": msgspec.to_builtins(cfg),
        "unit": "streams" if cfg.mode == "closed" else "req/s",
        "steps": [asdict(r) for r in results],
        "knee": knee.load if knee else None,
        "knee_rule": knee_rule(fraction),
        "knee_scaling": fraction,
        # the last step still scaled: a best figure found there is a lower bound
        "still_rising": still_rising(results, fraction),
        "max_goodput": {"load": best.load, "req_s": best.goodput_req_s,
                        "lower_bound": lower_bound(best.load, results, fraction)}
        if best else None,
        "max_output_tok_s": {"load": top.load, "tok_s": top.output_tok_s,
                             "lower_bound": lower_bound(top.load, results, fraction)}
        if top else None,
    }
    (out / "sweep.json").write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=2))
    with open(out / "sweep.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["load", "output_tok_s", "req_s", "goodput_req_s", "error_rate",
                    "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "e2e_p99_ms",
                    "queue_depth", "gpu_memory_gb", "gpu_power_w", "tokens_per_joule"])
        for r in results:
            w.writerow([r.load, r.output_tok_s, r.req_s, r.goodput_req_s, r.error_rate,
                        r.ttft_ms.get("p50"), r.ttft_ms.get("p99"), r.itl_ms.get("p50"),
                        r.itl_ms.get("p99"), r.e2e_ms.get("p99"), r.queue_depth,
                        r.gpu_memory_gb, r.gpu_power_w, r.tokens_per_joule])
    unit = "streams" if cfg.mode == "closed" else "req/s"
    name = target or cfg_label(cfg)
    plot_curve(out / "sweep.png", [(name, results)], knee, unit=unit,
               title=curve_title(what, results, unit, cfg.mode, name))


def cfg_label(cfg: RunConfig) -> str:
    """The target as the config alone names it (the URL's host; no model nor engine)."""
    return plot_style.target_name(cfg.url)


def curve_title(what: str, steps: list[StepResult], unit: str, mode: str,
                target: str | None) -> str:
    """"Sweep: throughput against P99 TTFT" over "closed loop, 1 → 64 streams, against the
    embedded simulator"."""
    loads = [s.load for s in steps]
    span = f"{min(loads):g} → {max(loads):g} {unit}" if loads else f"no step ({unit})"
    where = f", {plot_style.against(target)}" if target else ""
    return f"{what}: throughput against P99 TTFT\n{mode} loop, {span}{where}"


def terminal_curve(results: list[StepResult], knee: StepResult | None = None,
                   unit: str = "streams", *, color: bool = False, width: int = 72,
                   height: int = 16) -> str:
    """The throughput-vs-latency curve as text, for the terminal (plotext), the knee a
    dashed line; plain text unless `color` (plotext writes ANSI resets even uncoloured)."""
    import plotext as plt

    points = [(r.output_tok_s, r.ttft_ms.get("p99")) for r in results]
    points = [(x, y) for x, y in points if y is not None]
    if len(points) < 2:
        return ""
    plt.clear_figure()
    plt.plot_size(width, height)
    plt.theme("clear")
    if not color:
        plt.clear_color()
    plt.plot([x for x, _ in points], [y for _, y in points], marker="dot")
    if knee is not None:
        _mark_knee(plt, knee, unit, points)
    plt.xlabel("output tok/s")
    plt.ylabel("P99 TTFT ms")
    text = plt.build()
    return text if color else ANSI.sub("", text)


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _mark_knee(plt, knee: StepResult, unit: str, points: list[tuple[float, float]]) -> None:
    """A vertical line at the knee's throughput, labelled at the top, the label on the side
    with room for it."""
    xs = [x for x, _ in points]
    plt.vline(knee.output_tok_s)
    right_half = knee.output_tok_s > (min(xs) + max(xs)) / 2
    plt.text(f" knee: {knee.load:g} {unit} ", knee.output_tok_s, max(y for _, y in points),
             alignment="right" if right_half else "left")


def plot_curve(path: Path, series: list[tuple[str, list[StepResult]]],
               knee: StepResult | None = None, *, unit: str = "streams",
               title: str = "Throughput against P99 TTFT") -> None:
    """curve_figure's plot, written to `path` (a PNG)."""
    import matplotlib.pyplot as plt

    fig = curve_figure(series, knee, unit=unit, title=title)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)


def curve_figure(series: list[tuple[str, list[StepResult]]],
                 knee: StepResult | None = None, *, unit: str = "streams",
                 title: str = "Throughput against P99 TTFT"):
    """Throughput vs P99 TTFT, one line per series (its label: what it is of), the load
    written at each point, the knee marked; latency on a log scale only when it spans
    decades, its ticks plain numbers (plot_style.latency_y). Close it when done."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    every: list[float] = []
    for label, steps in series:
        xs = [s.output_tok_s for s in steps]
        ys = [s.ttft_ms.get("p99") or float("nan") for s in steps]
        every += ys
        ax.plot(xs, ys, marker="o", label=label)
        for s, x, y in zip(steps, xs, ys, strict=True):
            ax.annotate(f"{s.load:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
    if knee is not None and knee.ttft_ms.get("p99") is not None:
        ax.axvline(knee.output_tok_s, linestyle="--", color="grey")
        ax.annotate("knee", (knee.output_tok_s, knee.ttft_ms["p99"]), xytext=(6, -14),
                    textcoords="offset points", color="grey")
    ax.set_xlabel(f"output tokens / s (each point labelled with its load, {unit})")
    plot_style.latency_y(ax, every, "P99 TTFT, ms")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig
