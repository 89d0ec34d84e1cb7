"""The evaluation battery: `tokentop eval` runs a plan's phases (loadgen.eval.plan), each an
ordinary run through the one Session, recorded in OUT/runs/<phase>/ (replayable, and
`tokentop report`-able like any run), and keeps what each found in OUT/eval.json, written
after every phase, so a killed eval resumes at the phase it was in.

The phases, in order, and what each measures: loadgen.eval.phases. What each finds is a
typed result (loadgen.eval.results); eval.json is its JSON.

A phase that cannot run here says why (no second target, a disabled phase); its rows in
the matrix (loadgen.eval.matrix) say so too, never a silent blank. The embedded simulator
(no --url) is started once, for every phase, so the proxy can stand in front of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from loadgen.analysis.report import Report, soak_report, write_soak_report
from loadgen.analysis.soak_result import Slope
from loadgen.analysis.sweep import (
    StepResult,
    SweepPlan,
    best_goodput,
    find_knee,
    fleet_sweep,
    run_sweep,
)
from loadgen.analysis.sweep import write_outputs as write_sweep
from loadgen.eval import batching, context, interference, matrix, memory, priority
from loadgen.eval.chaos import Chaos, listener_pid, mttr_apart_from_kill
from loadgen.eval.conformance import Target, Unreachable, run_checks
from loadgen.eval.dcgm_watch import DcgmWatch
from loadgen.eval.efficiency import (
    EngineSlope,
    engine_memory_slope,
    gpu_use,
    kv_per_request,
)
from loadgen.eval.header import collect_header
from loadgen.eval.phase_run import (
    Eval,
    EvalError,
    Say,
    baseline_load,
    knee_load,
    load_text,
    phase_cfg,
    run_dir,
    run_session,
    target_of,
)
from loadgen.eval.phases import PHASES, Phase
from loadgen.eval.plan import (
    Leaks,
    plan_from_builtins,
    plan_to_builtins,
    planned_seconds,
)
from loadgen.eval.proxy import FaultProxy, FaultSchedule, fault_spans
from loadgen.eval.repeats import mean_steps, ramp_repeats, repeated_values
from loadgen.eval.results import (
    EVAL_FORMAT,
    BaselineFigures,
    EfficiencyAt,
    EfficiencyFigures,
    EngineLeak,
    EvalState,
    FaultsFigures,
    LeaksFigures,
    LeakSlope,
    LongTailFigures,
    PhaseResult,
    ProxyCounts,
    RampFigures,
    Results,
    ScalingFigures,
    ScalingRow,
    done,
    failed,
    read_state,
    skipped,
)
from loadgen.eval.under_fault import FAULT_TICK_S, FaultNotes, under_fault
from loadgen.eval.validity import span_of
from loadgen.run.config import RunConfig
from loadgen.run.embedded_sim import EmbeddedSim, SimStartError
from loadgen.run.fleet_load import FleetLoadError, fleet_load
from loadgen.run.session import SessionError
from probes.server_metrics import metrics_url_for


def load_state(out: Path) -> EvalState | None:
    """An earlier eval in `out` (to resume), or None."""
    path = out / "eval.json"
    if not path.exists():
        return None
    try:
        raw = path.read_bytes()
        format_ = msgspec.json.decode(raw, type=_Format).format
    except (OSError, msgspec.DecodeError) as e:
        raise EvalError(f"{path}: cannot be read to resume ({e})") from None
    if format_ != EVAL_FORMAT:
        raise EvalError(f"{path} is not a tokentop eval")
    try:
        return read_state(raw)
    except msgspec.ValidationError as e:
        raise EvalError(f"{path}: cannot be read to resume ({e})") from None


class _Format(msgspec.Struct):
    """eval.json's format alone: whether it is an eval at all, before reading it as one."""

    format: str | None = None


def resumed(state: EvalState, cfg: RunConfig, out: Path, say: Say, **kw: Any) -> Eval:
    """The Eval an earlier eval.json describes, its finished phases kept."""
    plan = plan_from_builtins(state.plan, str(out / "eval.json"))
    ev = Eval(cfg=cfg, plan=plan, quick=state.quick, out=out, say=say, **kw)
    ev.started = state.started
    if state.header is not msgspec.UNSET:  # the eval's, as it was found when it began
        ev.header = state.header
    for name, result in state.phases.items():  # a failed phase runs again
        if result.status in ("done", "skipped"):
            ev.results.put(name, result)
    return ev


# ---- running ---------------------------------------------------------------------------------


async def run_eval(ev: Eval) -> None:
    """Every phase not yet done, in order; eval.json after each. Raises EvalError."""
    ev.out.mkdir(parents=True, exist_ok=True)
    sim = await _target(ev)
    try:
        await _fleet(ev)
        if ev.header is None:
            ev.header = await collect_header(
                ev.url, plan=plan_to_builtins(ev.plan), started=ev.started, label=ev.label,
                meta=ev.meta, model=ev.cfg.model, headers=ev.secrets.request_headers())
            if ev.fleet_load is not None:
                ev.header.load_from = load_from_text(ev)
        for i, name in enumerate(PHASES, 1):
            if ev.results.of(name) is not None:
                ev.say(f"eval: phase {i}/{len(PHASES)} {name}: done before, kept")
                continue
            ev.say(f"eval: phase {i}/{len(PHASES)} {name}{_time_left_text(ev, name)}")
            ev.on_phase(i, name)
            t0 = time.monotonic()
            result = await _phase(ev, name)
            result.seconds = round(time.monotonic() - t0, 1)
            ev.results.put(name, result)
            ev.save()
            ev.say(f"eval: {name} {result.status}" + (f": {result.why}" if result.why else ""))
    finally:
        if ev.fleet_load is not None:
            await ev.fleet_load.close()
            ev.fleet_load = None
        if sim is not None:
            await sim.stop()
    ev.save(finished=True)


async def _fleet(ev: Eval) -> None:
    """With --broker: the fleet's agents that take jobs, found before any phase runs."""
    if ev.fleet is None:
        return
    try:
        load = fleet_load(ev.fleet, ev.secrets)
        agents = await load.open()
    except FleetLoadError as e:
        raise EvalError(str(e)) from None
    ev.fleet_load = load
    ev.say(f"eval: the load from fleet {ev.fleet.fleet}: {', '.join(agents)} "
           f"({load.settings.display}); {LOCAL_PHASES} from this machine")
    for line in load.url_mismatches(ev.url):
        ev.say(f"eval: warning: {line}")


# where a fleet's load cannot stand in: the faults' proxy and the interference neighbour are
# on this machine, scaling's targets are several
LOCAL_PHASES = "faults, interference and scaling over targets run"


def load_from_text(ev: Eval) -> str:
    """The header's: where the phases' load came from, with a fleet."""
    assert ev.fleet is not None and ev.fleet_load is not None
    return (f"fleet {ev.fleet.fleet}: {', '.join(ev.fleet_load.agents)} "
            f"({LOCAL_PHASES} from this machine)")


async def _phase(ev: Eval, name: Phase) -> PhaseResult:
    """One phase's result; one that fails unexpectedly is a failed phase, its reason in
    words (the traceback in OUT/eval.log), and the eval goes on with the next."""
    try:
        return await RUNS[name](ev)
    except (EvalError, asyncio.CancelledError):
        raise
    except Exception as e:
        with (ev.out / "eval.log").open("a") as log:
            log.write(f"--- {name} at {time.ctime()}\n{traceback.format_exc()}\n")
        return failed(f"{type(e).__name__}: {e} (details in {ev.out / 'eval.log'})")


async def _target(ev: Eval) -> EmbeddedSim | None:
    """The URL every phase loads: --url, else the embedded simulator, started here once."""
    if ev.cfg.url:
        ev.url = ev.cfg.url
        return None
    p = ev.phases.priority  # its classes' priorities are served as a vLLM started for them
    sim = EmbeddedSim(ev.cfg.embedded_sim([str(c) for c in p.classes] if p.enabled else []))
    try:
        ev.url = await sim.start()
    except SimStartError as e:
        raise EvalError(f"the embedded simulator did not start: {e}") from None
    return sim


def _time_left_text(ev: Eval, name: Phase) -> str:
    """`, about 3:20 of load left`: the plan's load time of this phase and those after."""
    left = time_left(ev, name)
    return f", about {int(left // 60)}:{int(left % 60):02d} of load left" if left else ""


def time_left(ev: Eval, name: Phase) -> float:
    """The plan's load time, in seconds, of this phase and those after it."""
    before = PHASES[:PHASES.index(name)]
    rest = msgspec.structs.replace(
        ev.phases, **{p: _off(getattr(ev.phases, p)) for p in before
                      if p != "faults" and hasattr(getattr(ev.phases, p), "enabled")})
    if "faults" in before:
        rest = msgspec.structs.replace(rest, faults=[])
    targets = max(1, len(_scaling_targets(ev)))
    return planned_seconds(rest, targets, ev.plan.fault_settle)


def _off(table):
    return msgspec.structs.replace(table, enabled=False)


# ---- the phases ------------------------------------------------------------------------------


async def conformance(ev: Eval) -> PhaseResult:
    """What the target supports of the OpenAI API (loadgen.eval.conformance): a few short
    requests, before any load, with the run's headers."""
    p = ev.phases.conformance
    if not p.enabled:
        return skipped("disabled in the plan")
    target = Target(url=ev.url, headers=ev.secrets.request_headers(), model=ev.cfg.model,
                    timeout_s=float(p.timeout), metrics_url=ev.cfg.metrics_url)
    try:
        return done(await run_checks(target))
    except Unreachable as e:
        return failed(str(e))


async def baseline(ev: Eval) -> PhaseResult:
    """The baseline load, the plan's `repeat` times: the first run's figures, and with
    repeats every run's value by row id (the matrix's rows: their mean and interval)."""
    if not ev.phases.baseline.enabled:
        return skipped("disabled in the plan")
    runs = [await _baseline_run(ev, "baseline" if k == 0 else f"baseline.r{k + 1}")
            for k in range(ev.plan.repeat)]
    first, run_dir = runs[0]
    if len(runs) > 1:
        first.repeats = repeated_values([f for f, _ in runs], _baseline_rows)
        first.run_dirs = [d for _, d in runs]
    return done(first, run_dir)


def _baseline_rows(figures: BaselineFigures) -> list:
    return list(matrix.BUILDERS["baseline"](Results(baseline=done(figures))))


async def _baseline_run(ev: Eval, name: str) -> tuple[BaselineFigures, str]:
    b = ev.phases.baseline
    cfg = phase_cfg(ev, name, duration=float(b.duration), warmup=float(b.warmup),
                     **baseline_load(ev))
    dcgm = DcgmWatch(ev.dcgm_url, float(b.warmup))
    watching = asyncio.create_task(dcgm.run())
    try:
        run_dir = await run_session(ev, name, cfg)
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    r, _ = soak_report(run_dir, warnings=[])
    span = span_of(run_dir, r.measured_from, r.measured_to)
    measured = r.measured_requests
    per_request = ev.plan.slos().per_request
    return BaselineFigures(
        load=load_text(b.mode, b.concurrency, b.rate),
        req_s=r.rates.req_s, output_tok_s=r.rates.output_tok_s,
        goodput_req_s=r.rates.goodput_req_s if per_request is not None else None,
        error_rate=r.rates.error_rate,
        latency_ms={m: r.latency_ms.get(m) for m in BASELINE_LATENCIES},
        thresholds=r.thresholds,
        **msgspec.structs.asdict(gpu_use(run_dir, r)),
        dcgm=dcgm.result(run_dir, r),
        requests=measured.ok + measured.failed if measured is not None else msgspec.UNSET,
        input_tok_s=span.input_tok_s, span=span,
        goodput_slo=per_request.text if per_request is not None else None,
        kv_per_request=kv_per_request(run_dir, r),
    ), str(run_dir)


BASELINE_LATENCIES = ("ttft", "itl", "tpot", "e2e")


async def ramp(ev: Eval) -> PhaseResult:
    """The sweep, the plan's `repeat` times (the repeats at the first one's loads, so an
    auto sweep's steps line up): the knee and the best goodput of the mean curve, and with
    repeats every run's figures at those loads (the rows' intervals)."""
    p = ev.phases.ramp
    if not p.enabled:
        return skipped("disabled in the plan")
    slo = str(p.slo) or str(ev.plan.slo) or None
    cfg = msgspec.structs.replace(phase_cfg(ev, "ramp", mode=ev.phases.baseline.mode),
                                  slo=slo, concurrency=0, rate=0.0, duration=None, warmup=0.0)
    plan = SweepPlan(steps=None if p.steps == "auto" else [float(s) for s in p.steps],
                     step_seconds=float(p.step_duration), step_warmup=float(p.step_warmup),
                     knee_fraction=p.knee_fraction, max_error_rate=float(p.max_error_rate),
                     out=ev.out / "ramp")
    runs = [await _sweep(ev, cfg, plan, "ramp")]
    plan = dataclasses.replace(plan, steps=[s.load for s in runs[0]])
    for k in range(2, ev.plan.repeat + 1):
        runs.append(await _sweep(ev, msgspec.structs.replace(
            cfg, out=str(run_dir(ev, f"ramp.r{k}"))), plan, f"ramp {k}/{ev.plan.repeat}"))
    steps = mean_steps(runs)
    knee, best = find_knee(steps, p.knee_fraction), best_goodput(steps)
    write_sweep(ev.out / "ramp", cfg, steps, knee, best, p.knee_fraction,
                target=target_of(ev), what="Pressure ramp (eval)")
    top = max(steps, key=lambda s: s.output_tok_s, default=None)
    figures = RampFigures(
        unit="streams" if cfg.mode == "closed" else "req/s", steps=steps, knee=knee,
        best_goodput=best, max_output_tok_s=top.output_tok_s if top else None,
        plot=str(ev.out / "ramp" / "sweep.png"), knee_scaling=p.knee_fraction)
    if len(runs) > 1:
        figures.repeats = ramp_repeats(runs, knee, best, top)
    return done(figures, cfg.out)


async def _sweep(ev: Eval, cfg: RunConfig, plan: SweepPlan, name: str) -> list[StepResult]:
    def say(line: str) -> None:
        ev.say(f"  {name}: {line}")

    try:
        return await run_sweep(cfg, plan, ev.secrets, echo=say, progress=say,
                               sinks=ev.sinks_for("ramp"), load=_fleet_sweep(ev, cfg, plan, say))
    except (SessionError, FleetLoadError) as e:
        raise EvalError(f"{name}: {e}") from None


def _fleet_sweep(ev: Eval, cfg: RunConfig, plan: SweepPlan, say: Callable[[str], None]):
    """With a fleet, the sweep steers its agents' one run."""
    return None if ev.fleet_load is None else fleet_sweep(ev.fleet_load, cfg, plan, say)


async def long_tail(ev: Eval) -> PhaseResult:
    p = ev.phases.long_tail
    if not p.enabled:
        return skipped("disabled in the plan")
    knee, why = knee_load(ev)
    if knee is None:
        ramp_r = ev.results.ramp
        steps = ramp_r.figures.steps if ramp_r is not None and ramp_r.figures else []
        if not steps:
            return skipped(f"no load to hold: {why}")
        knee = float(steps[-1].load)  # scaled to the end: the last step stands in
    mode = ev.phases.baseline.mode
    load = max(1.0, round(knee * p.fraction)) if mode == "closed" else knee * p.fraction
    cfg = phase_cfg(ev, "long_tail", mode=mode, concurrency=int(load), rate=float(load),
                     duration=float(p.duration), warmup=0.0)
    run_dir = await run_session(ev, "long_tail", cfg)
    r = _report(run_dir, bucket_s=float(p.bucket), tail_k=p.tail_k)
    span = span_of(run_dir, r.measured_from, r.measured_to, r.long_tail.limits_ms)
    return done(LongTailFigures(
        load=load_text(mode, int(load), float(load)), seconds=r.measured_s,
        long_tail=r.long_tail, drift=r.drift, availability=r.availability, outages=r.outages,
        latency_ms=r.latency_ms, plots=r.plots or [], span=span,
        engine_kv=engine_memory_slope(run_dir, r, min_span_s=float(ev.phases.leaks.min_soak)),
    ), str(run_dir))


def _report(run_dir: Path, **kw: Any) -> Report:
    """`tokentop report` of a phase's run directory (report.md, report.json, PNGs written
    there), its printed summary kept out of the eval's lines."""
    _, result = write_soak_report(run_dir, out=io.StringIO(), **kw)
    return result


async def faults(ev: Eval) -> PhaseResult:
    entries = plan_to_builtins(ev.plan)["quick" if ev.quick else "phases"]["faults"]
    if not entries and not ev.chaos_restart_cmd:
        return skipped("the plan has no faults")
    host, port = _host_port(ev.url)
    schedule = FaultSchedule.parse([{k: _plain(v) for k, v in e.items()} for e in entries])
    kill_at = schedule.span_s + CHAOS_AFTER_S if ev.chaos_restart_cmd else None
    seconds = schedule.span_s + ev.plan.fault_settle + (CHAOS_WINDOW_S if kill_at else 0.0)
    notes = FaultNotes()  # each fault's start and end, an event of the run
    proxy = FaultProxy(host, port, on_change=notes.take)
    await proxy.start()
    # the restart's probes go to the target itself, with the run's API and credentials
    chaos = Chaos(ev.chaos_restart_cmd, port, url=ev.url, api=ev.cfg.api, model=ev.cfg.model,
                  authorization=ev.secrets.authorization(),
                  headers=ev.secrets.other_headers()) if kill_at is not None else None
    try:
        # the load goes through the proxy; /metrics and the server process are the target's
        # own (through the proxy the scrape would hang in a blackhole, and the process found
        # by the URL's port would be this one); a finer tick dates each fault's effect
        cfg = phase_cfg(ev, "faults", url=proxy.url_for(ev.url), duration=seconds,
                         warmup=0.0, metrics_url=ev.cfg.metrics_url or metrics_url_for(ev.url),
                         server_pid=ev.cfg.server_pid or listener_pid(port),
                         tick=min(ev.cfg.tick, FAULT_TICK_S), **baseline_load(ev))
        tasks = [asyncio.create_task(proxy.run_schedule(schedule))]
        if chaos is not None and kill_at is not None:
            tasks.append(asyncio.create_task(chaos.run(kill_at)))
        try:
            run_dir = await run_session(ev, "faults", cfg, on_session=notes.attach)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        await proxy.close()  # clears what is still on: every span has its end
    spans, counters = fault_spans(proxy.events), proxy.counters
    r = _report(run_dir)
    killed = chaos.result() if chaos is not None else None
    return done(FaultsFigures(
        faults=[under_fault(run_dir, s, FAULT_TICK_S) for s in spans], chaos=killed,
        # the kill's outage has its own MTTR (kill → first token): not counted twice
        outages=r.outages, mttr_s=mttr_apart_from_kill(r.outages, r.mttr_s, killed),
        availability=r.availability,
        proxy=ProxyCounts(resets=counters.reset, accepted=counters.accepted),
        plots=r.plots or [], span=span_of(run_dir, None, None),
    ), str(run_dir))


CHAOS_AFTER_S = 5.0  # the server is killed this long after the network faults end
CHAOS_WINDOW_S = 20.0  # load after the kill: the restart and the first success after it


def _plain(v: Any) -> Any:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)


async def leaks(ev: Eval) -> PhaseResult:
    p = ev.phases.leaks
    if not p.enabled:
        return skipped("disabled in the plan")
    tail = ev.results.long_tail
    if tail is None or tail.status != "done" or tail.figures is None:
        return skipped("the long tail did not run: its soak is what the slopes come from")
    drift, seconds = tail.figures.drift, tail.figures.seconds
    judged = seconds >= float(p.min_soak)
    engine = tail.figures.engine_kv
    figures = LeaksFigures(
        soak_s=seconds, judged=judged, min_soak_s=float(p.min_soak),
        server_rss=_slope(drift.server_rss, p.max_rss_mb_per_h, judged),
        # shown, never judged: a preallocating engine's GPU memory is flat whatever leaks
        gpu_memory=_slope(drift.gpu_memory, p.max_gpu_mb_per_h, judged=False))
    if engine is not msgspec.UNSET:
        figures.gpu_memory.why = engine.gpu_memory_why
        figures.engine_kv = _engine_leak(engine, p, judged)
    return done(figures)


def _engine_leak(s: EngineSlope, p: Leaks, judged: bool) -> EngineLeak:
    """The engine's KV slope judged by the plan's limit in its unit (MB/h or tokens/h)."""
    limit = p.max_gpu_mb_per_h if s.unit == "MB/h" else p.max_kv_tokens_per_h
    return EngineLeak(slope=s, limit=float(limit),
                      passed=(s.slope <= limit) if judged and s.slope is not None else None)


def _slope(s: Slope, limit: float, judged: bool) -> LeakSlope:
    slope = s.slope_mb_h
    return LeakSlope(slope_mb_h=slope, limit_mb_h=limit, why=s.slope_withheld or "",
                     passed=(slope <= limit) if judged and slope is not None else None)


async def efficiency(ev: Eval) -> PhaseResult:
    p = ev.phases.efficiency
    if not p.enabled:
        return skipped("disabled in the plan")
    out = EfficiencyFigures()
    if "baseline" in p.at:
        out.baseline = _at_baseline(ev.results.baseline)
    if "knee" in p.at:
        ramp_r = ev.results.ramp
        knee = ramp_r.figures.knee if ramp_r is not None and ramp_r.figures else None
        out.knee = (EfficiencyAt(tokens_per_joule=knee.tokens_per_joule,
                                 req_s_per_w=_per(knee.req_s, knee.gpu_power_w))
                    if knee else EfficiencyAt(energy_why=knee_load(ev)[1]))
    return done(out)


def _at_baseline(base: PhaseResult[BaselineFigures] | None) -> EfficiencyAt:
    """The baseline's energy and GPU figures; all None when it has none (it did not run)."""
    f = base.figures if base is not None else None
    if f is None:
        return EfficiencyAt(tokens_per_joule=None, req_s_per_w=None, gpu_util_pct=None,
                            gpu_memory_mb_per_in_flight=None, energy_why=None, dcgm=None,
                            gpu_source=None)
    return EfficiencyAt(tokens_per_joule=f.tokens_per_joule, req_s_per_w=f.req_s_per_w,
                        gpu_util_pct=f.gpu_util_pct,
                        gpu_memory_mb_per_in_flight=f.gpu_memory_mb_per_in_flight,
                        energy_why=f.energy_why,
                        # an eval.json from before --dcgm-url has none: None, as it read
                        dcgm=f.dcgm if f.dcgm is not msgspec.UNSET else None,
                        gpu_source=f.gpu_source)


def _per(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _scaling_targets(ev: Eval) -> list[str]:
    return [str(t) for t in ev.phases.scaling.targets]


async def scaling(ev: Eval) -> PhaseResult:
    p = ev.phases.scaling
    if not p.enabled:
        return skipped("disabled in the plan")
    targets = _scaling_targets(ev)
    agents = ev.fleet_load.agents if ev.fleet_load is not None else []
    if len(targets) < 2 and len(agents) >= 2:
        return await _across_agents(ev, agents)
    if len(targets) < 2:
        return skipped("one target: give [phases.scaling] targets = [URL, URL, …] "
                       "(replicas of the same server) to measure scaling, or load it from "
                       "a fleet of two agents or more (--broker) to scale the offered load")
    load = _scaling_load(ev)
    rows = []
    for n in range(1, len(targets) + 1):
        rows.append(await _on_targets(ev, targets[:n], load))
        ev.save()
    _efficiency(rows)
    return done(ScalingFigures(per_target_load=load, rows=rows,
                               kind="weak (the same load on each target)"))


def _efficiency(rows: list[ScalingRow]) -> None:
    """Each row's throughput against N × the first row's (N targets, or N agents)."""
    one = rows[0].output_tok_s or 0.0
    for row in rows:
        n = row.agents or row.targets
        row.efficiency = row.output_tok_s / (n * one) if one else None


async def _across_agents(ev: Eval, agents: list[str]) -> PhaseResult:
    """The offered load scaled across client machines: the same load from each of the
    first 1, 2, … N agents at once, on the one target; the fleet's merged figures."""
    p, mode = ev.phases.scaling, ev.phases.baseline.mode
    load = _scaling_load(ev)
    rows = []
    for k in range(1, len(agents) + 1):
        cfg = phase_cfg(ev, f"scaling-agents-{k}", mode=mode,
                        concurrency=max(1, int(load)) * k, rate=float(load) * k,
                        duration=float(p.duration), warmup=float(p.warmup))
        run_dir = await run_session(ev, f"scaling {k}/{len(agents)} agents", cfg,
                                    agents=agents[:k])
        r = soak_report(run_dir, warnings=[])[0].rates
        rows.append(ScalingRow(targets=1, agents=k, output_tok_s=r.output_tok_s or 0.0,
                               req_s=r.req_s or 0.0, run_dirs=[str(run_dir)]))
        ev.save()
    _efficiency(rows)
    return done(ScalingFigures(per_target_load=load, rows=rows,
                               kind="offered load across client machines: the same load "
                               "from each agent, on one target"))


def _scaling_load(ev: Eval) -> float:
    b = ev.phases.baseline
    base = b.concurrency if b.mode == "closed" else b.rate
    if ev.phases.scaling.per_target == "knee":
        knee, _ = knee_load(ev)
        return knee or base
    return base


async def _on_targets(ev: Eval, targets: list[str], load: float) -> ScalingRow:
    """The same load on each of `targets` at once, each its own run; their sum."""
    p, mode = ev.phases.scaling, ev.phases.baseline.mode
    n = len(targets)

    async def one(i: int, url: str) -> Path:
        cfg = phase_cfg(ev, f"scaling-{n}-{i}", url=url, mode=mode,
                         concurrency=max(1, int(load)), rate=float(load),
                         duration=float(p.duration), warmup=float(p.warmup))
        return await run_session(ev, f"scaling {i + 1}/{n}", cfg, here=True)

    dirs = await asyncio.gather(*(one(i, url) for i, url in enumerate(targets)))
    rates = [soak_report(d, warnings=[])[0].rates for d in dirs]
    return ScalingRow(targets=n, output_tok_s=sum(r.output_tok_s or 0.0 for r in rates),
                      req_s=sum(r.req_s or 0.0 for r in rates), run_dirs=[str(d) for d in dirs])


# each phase's run, by name (a test holds the keys to PHASES)
RUNS: dict[Phase, Callable[[Eval], Any]] = {
    "conformance": conformance,
    "baseline": baseline, "ramp": ramp, "batch": batching.run, "context": context.run,
    "interference": interference.run, "priority": priority.run, "long_tail": long_tail,
    "faults": faults, "leaks": leaks, "memory": memory.run, "efficiency": efficiency,
    "scaling": scaling,
}
