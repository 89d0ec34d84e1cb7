"""The eval's one matrix: a row per dimension and figure, from what the phases found
(loadgen.eval.battery), with the SLO verdict where one applies; as text for the terminal,
as eval.md, and side by side for `tokentop eval compare`.

A row whose phase did not run, or whose figure this machine cannot give (no GPU energy
counter, a soak too short to judge a slope), is kept with the reason in its note: every
row is filled or explained.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, asdict, dataclass, replace
from typing import TypeVar

from msgspec import UNSET, UnsetType

from loadgen.analysis.soak_result import Summary, ThresholdResult
from loadgen.analysis.sweep import StepResult
from loadgen.eval import validity
from loadgen.eval.chaos import PROBE_EVERY_S
from loadgen.eval.phases import PHASES, Phase
from loadgen.eval.results import (
    BatchFigures,
    ClassFigures,
    ContextRung,
    Dcgm,
    EvalState,
    InterferenceRun,
    LeaksFigures,
    PhaseResult,
    Results,
    UnderFault,
)
from loadgen.eval.under_fault import FAULT_TICK_S
from loadgen.model import knee as knee_rules
from loadgen.model import units
from loadgen.model.outage import OUTAGE_MIN_S
from loadgen.model.slo import Threshold, parse_slos

F = TypeVar("F")
T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    dimension: str
    figure: str
    value: float | None  # with repeats, their mean
    unit: str = ""
    better: str | None = None  # "higher" | "lower" | None (not a better-or-worse figure)
    verdict: str | None = None  # PASS | FAIL | None
    note: str = ""
    _: KW_ONLY
    # what the row measures, the same in every eval whatever its load or label: compare
    # matches rows by it ("baseline.ttft.p99", "faults.blackhole#1.recovery")
    id: str
    load: str = ""  # the load it ran at ("16 streams", "6 streams, 61 s"): a column
    samples: int | None = None  # the requests (or tokens) the figure is over
    flags: tuple[str, ...] = ()  # why it may not mean what it says (client saturated …)
    interval: tuple[float, float] | None = None  # 95 % over the repeats
    repeats: int = 1
    limit: str = ""  # the plan's limit the verdict judged ("< 500 ms"), "" when none
    # the SLO metric and statistic the value is ("ttft", "p99"): the plan's threshold on
    # them gives the row its verdict (judge)
    judged_as: tuple[str, str | None] | None = None
    # the smallest difference the figure can tell (a time dated by the tick: its tick), in
    # its unit: compare calls a change within it the same
    resolution: float = 0.0


def rows(results: Results, slo: str | None = None) -> list[Row]:
    """Every row, in the phases' order; with the plan's `slo`, each row a whole-run threshold
    of it applies to is judged (its verdict and limit)."""
    thresholds = parse_slos(slo).thresholds if slo else []
    out: list[Row] = []
    for name in PHASES:
        out += [judge(r, thresholds) for r in BUILDERS[name](results)]
    return out


def state_rows(state: EvalState) -> list[Row]:
    """An eval's rows, judged by its own plan's SLOs."""
    slo = state.plan.get("slo") if isinstance(state.plan, dict) else None
    return rows(state.phases, slo if isinstance(slo, str) else None)


def judge(r: Row, thresholds: list[Threshold]) -> Row:
    """The row with the verdict of the threshold on what it measures (the last one given,
    as --slo reads a repeated limit), its value taken in the threshold's unit."""
    if r.judged_as is None or r.value is None or r.verdict is not None:
        return r
    metric, stat = r.judged_as
    for th in reversed(thresholds):
        if (th.metric, th.stat) == (metric, stat):
            measured = r.value * _TO_THRESHOLD.get(r.unit, 1.0)
            return replace(r, verdict="PASS" if th.passes(measured) else "FAIL",
                           limit=f"{th.op} {_limit_text(th)}")
    return r


# a row's unit to the threshold's: ms to µs, % to a fraction
_TO_THRESHOLD = {"ms": 1000.0, "%": 0.01}


def _limit_text(th: Threshold) -> str:
    if th.stat is not None:
        return units.ms(th.value)
    if th.metric in ("error_rate", "availability"):
        return units.pct(th.value)
    return f"{th.value:g}"


def _ran(result: PhaseResult[F] | None, name: Phase) -> tuple[F | None, str]:
    """(figures, "") of a phase that ran, or (None, why it did not). The builders read a
    figure as `f and f.req_s`: None when the phase has no figures, its row then saying why;
    a Struct is never false."""
    if result is None:
        return None, f"{name} did not run (the eval stopped before it)"
    if result.status != "done":
        return None, f"{name} {result.status}: {result.why}"
    return result.figures, ""


def _predates(results: Results, name: Phase) -> bool:
    """The eval is from a tokentop before the phase: it has no result while a later phase
    has one. Its section then has no rows at all, so that an old eval's matrix and its
    comparisons stay what they were (an eval stopped before the phase still says so)."""
    return results.of(name) is None and any(
        results.of(p) is not None for p in PHASES[PHASES.index(name) + 1:])


def _given(value: T | UnsetType) -> T | None:
    """A figure eval.json may not have (an older tokentop's, or one of a shape without it)
    as None, like a figure that is null."""
    return None if value is UNSET else value


def _missing(value: object, why: str) -> str:
    """A row's note for a figure that is missing: not recorded (UNSET: an eval.json from
    before the figure), or `why` (None: the eval measured nothing)."""
    if value is UNSET:
        return NOT_RECORDED
    return why if value is None else ""


NOT_RECORDED = "not recorded: an eval from before this figure"


def _ms(latency: dict[str, Summary | None] | None, metric: str, q: str) -> float | None:
    # a summary is a mapping (its keys are hdr.PERCENTILES' labels), not a Struct
    summary = latency.get(metric) if latency is not None else None
    return summary.get(q) if summary is not None else None


def _conformance(results: Results) -> Iterator[Row]:
    """A row per API check: a fact, not a figure (value None), its verdict and evidence in
    the note (✓ yes, ✗ no, ~ partial); one row saying why when there are none, and none
    at all for an eval from before the phase (its other phases ran, this one has no result),
    so that its matrix and its comparisons stay what they were."""
    from loadgen.eval.conformance import MARKS  # the checks' module imports aiohttp

    if _predates(results, "conformance"):
        return
    f, why = _ran(results.conformance, "conformance")
    dim = "API conformance"
    if f is None:
        yield Row(dim, "API checks", None, note=why, id="conformance")
        return
    for c in f.checks:
        yield Row(dim, c.name, None, note=f"{MARKS[c.verdict]} {c.verdict}: {c.evidence}",
                  id=f"conformance.{c.id}")


def _baseline(results: Results) -> Iterator[Row]:
    f, why = _ran(results.baseline, "baseline")
    dim = "latency & throughput"
    load = f.load if f else ""
    span = f and _given(f.span)
    flags = span.flags() if span else ()
    requests = f and _given(f.requests)
    repeats = (f and _given(f.repeats)) or {}

    def row(figure: str, value: float | None, unit: str, better: str | None, id_: str,
            note: str = "", samples: int | None = requests, extra: tuple[str, ...] = (),
            judged_as: tuple[str, str | None] | None = None) -> Row:
        r = Row(dim, figure, value, unit, better, note=why or note, id=id_, load=load,
                samples=samples, flags=() if why else flags + extra, judged_as=judged_as)
        return _repeated(r, repeats.get(id_))

    yield row("requests/s", f and f.req_s, "req/s", "higher", "baseline.req_s",
              judged_as=("req_s", None))
    yield row("output tokens/s", f and f.output_tok_s, "tok/s", "higher",
              "baseline.output_tok_s", judged_as=("output_tok_s", None))
    yield row("input tokens/s", f and _given(f.input_tok_s), "tok/s", "higher",
              "baseline.input_tok_s", note=_missing(f.input_tok_s, "") if f else "")
    goodput, slo = f and f.goodput_req_s, f and _given(f.goodput_slo)
    yield row("goodput", goodput, "req/s", "higher", "baseline.goodput",
              note=f"requests within {slo}" if slo
              else ("no per-request SLO" if goodput is None else ""),
              judged_as=("goodput_req_s", None))
    rate = f and f.error_rate
    yield row("error rate", None if rate is None else rate * 100, "%", "lower",
              "baseline.error_rate", judged_as=("error_rate", None))
    latency = f and f.latency_ms
    for metric, qs in BASELINE_PERCENTILES:
        summary = latency.get(metric) if latency else None
        count = summary.get("count") if summary else None
        # an eval.json from before TPOT was kept has no summary of it at all
        unrecorded = NOT_RECORDED if latency is not None and metric not in latency else ""
        for q in qs:
            few = validity.too_few(count if isinstance(count, int) else None, q)
            yield row(f"{metric.upper()} {q.upper()}", _ms(latency, metric, q), "ms", "lower",
                      f"baseline.{metric}.{q}", samples=count if isinstance(count, int) else None,
                      extra=(few,) if few else (), judged_as=(metric, q), note=unrecorded)
    tpot = _ms(latency, "tpot", "p50")
    no_tpot = NOT_RECORDED if latency is not None and "tpot" not in latency \
        else "no TPOT (no request with two tokens or more)"
    yield row("per-user output tokens/s", None if not tpot else 1000.0 / tpot, "tok/s",
              "higher", "baseline.per_user_tok_s",
              note="1000 ÷ TPOT P50: the decode speed one user sees" if tpot else no_tpot)
    for t in f.thresholds if f else []:
        if (t.metric, t.stat) in _ROWS_JUDGED:
            continue  # its verdict is on the row it judges
        value, unit = _threshold_value(t)
        yield Row("SLO", t.text, value, unit, None, "PASS" if t.passed else "FAIL", note=t.shown,
                  id=f"slo.{t.text}", load=load)


BASELINE_PERCENTILES = (("ttft", ("p50", "p90", "p99", "p99.9")), ("itl", ("p50", "p99", "p99.9")),
                        ("tpot", ("p50", "p99")), ("e2e", ("p50", "p90", "p99")))
# the whole-run thresholds a baseline row judges (its `judged_as`): their verdict is there
_ROWS_JUDGED = {("req_s", None), ("output_tok_s", None), ("goodput_req_s", None),
                ("error_rate", None)} | {(m, q) for m, qs in BASELINE_PERCENTILES for q in qs}


def _repeated(r: Row, values: list[float | None] | None) -> Row:
    """The row with its repeats: their mean as the value, and the 95 % interval."""
    if not values or len(values) < 2 or r.value is None:
        return r
    got = [v for v in values if v is not None]
    if len(got) < 2:
        return replace(r, repeats=len(values))
    mean, low, high = interval(got)
    return replace(r, value=mean, interval=(low, high), repeats=len(got))


def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % interval of the mean, Student's t (n − 1 degrees)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _T95[min(n - 1, len(_T95)) - 1] * sd / math.sqrt(n)
    return mean, mean - half, mean + half


# Student's t, two-sided 95 %, for 1 … 30 degrees of freedom (beyond: 30's, within 2 %)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def _threshold_value(t: ThresholdResult) -> tuple[float | None, str]:
    """A whole-run threshold's measured value in the unit a reader expects (ms for times)."""
    if t.measured is None:
        return None, ""
    if t.unit == "us":
        return t.measured / 1000.0, "ms"
    if t.unit in ("fraction", "ratio"):
        return t.measured * 100.0, "%"
    return float(t.measured), t.unit


def _ramp(results: Results) -> Iterator[Row]:
    f, _ = _ran(results.ramp, "ramp")
    repeats = (f and _given(f.repeats)) or {}
    for r in _ramp_rows(results):
        yield _repeated(r, repeats.get(r.id))


def _ramp_rows(results: Results) -> Iterator[Row]:
    f, why = _ran(results.ramp, "ramp")
    unit = f.unit if f else "streams"
    knee, best = (f.knee, f.best_goodput) if f else (None, None)
    knee_why = why or ("" if knee else "no knee: throughput scaled to the last step; extend "
                       "the steps")
    dim = "pressure ramp"
    at_knee = f"{knee.load:g} {unit}" if knee else ""
    # the knee's load is a fact about the server, not better or worse: compare shows it
    yield Row(dim, "knee (load)", knee and knee.load, unit, None, note=knee_why,
              id="ramp.knee")
    knee_n = _step_requests(knee)
    yield Row(dim, "output tokens/s at the knee", knee and knee.output_tok_s, "tok/s",
              "higher", note=knee_why, id="ramp.knee.output_tok_s", load=at_knee,
              samples=knee_n)
    yield Row(dim, "TTFT P99 at the knee", knee and knee.ttft_ms.get("p99"), "ms", "lower",
              note=knee_why, id="ramp.knee.ttft.p99", load=at_knee, samples=knee_n,
              flags=tuple(f for f in [validity.too_few(knee_n, "p99")] if f),
              judged_as=("ttft", "p99"))
    best_why = why or ("" if best else "no per-request SLO, or no step met it")
    steps = f.steps if f else []
    threshold = (f and _given(f.knee_scaling)) or knee_rules.KNEE_SCALING
    if best and knee_rules.lower_bound(best.load, steps, threshold):
        best_why = knee_rules.LOWER_BOUND
    yield Row(dim, "max goodput", best and best.goodput_req_s, "req/s", "higher",
              note=best_why, id="ramp.max_goodput", load=f"{best.load:g} {unit}" if best else "",
              samples=_step_requests(best))
    top = max(steps, key=lambda s: s.output_tok_s) if steps else None
    rising = top is not None and knee_rules.lower_bound(top.load, steps, threshold)
    yield Row(dim, "max output tokens/s", f and f.max_output_tok_s, "tok/s", "higher",
              note=why or (knee_rules.LOWER_BOUND if rising else ""),
              id="ramp.max_output_tok_s", load=f"{top.load:g} {unit}" if top else "",
              samples=_step_requests(top))


def _step_requests(step: StepResult | None) -> int | None:
    """The requests a ramp step's figures are over (its rate × its measured seconds)."""
    return round(step.req_s * step.seconds) if step is not None else None


def _long_tail(results: Results) -> Iterator[Row]:
    f, why = _ran(results.long_tail, "long_tail")
    dim = "long tail"
    load = f"{f.load}, {_span(f.seconds)}" if f and f.load else ""
    counts = f.long_tail.counts if f else {}  # by metric
    rule = f.long_tail.rule if f else ""
    span = f and _given(f.span)
    flags = span.flags() if span else ()
    client = span.client_breakouts if span else {}
    for metric in ("ttft", "itl"):
        n, theirs = counts.get(metric), client.get(metric, 0)
        note = why or rule
        if n is not None and theirs:
            n -= theirs  # the client's, not the server's: said, not counted
            note += (f"; {theirs} more coincide with client lag (attributed to the client, "
                     "not the server)")
        yield Row(dim, f"intervals whose {metric.upper()} tail breaks out", n, "", "lower",
                  note=note, id=f"long_tail.{metric}.breakouts", load=load,
                  samples=span.ticks if span else None, flags=flags)
    avail = f and f.availability
    yield Row(dim, "availability", None if avail is None else avail * 100, "%", "higher",
              note=why, id="long_tail.availability", load=load, flags=flags,
              samples=span.ticks if span else None,
              judged_as=("availability", None))
    summary = f.latency_ms.get("ttft") if f else None
    count = summary.get("count") if summary else None
    count = count if isinstance(count, int) else None
    few = validity.too_few(count, "p99.9")
    yield Row(dim, "TTFT P99.9", _ms(f and f.latency_ms, "ttft", "p99.9"), "ms", "lower",
              note=why, id="long_tail.ttft.p99.9", load=load, samples=count,
              flags=flags + ((few,) if few else ()), judged_as=("ttft", "p99.9"))


def _faults(results: Results) -> Iterator[Row]:
    f, why = _ran(results.faults, "faults")
    dim = "stability under faults"
    if f is None:
        yield Row(dim, "success rate under faults", None, "%", "higher", note=why,
                  id="faults.success_rate")
        yield Row(dim, "MTTR after a kill and restart", None, "s", "lower", note=why,
                  id="faults.chaos.mttr")
        return
    seen: dict[str, int] = {}
    span = _given(f.span)
    # the client's flag only: a blackhole or a delay bunches completions by design, so the
    # lock-step flag would name the fault, not the load
    flags = tuple(x for x in [span.client_flag()] if x) if span else ()
    for fault in f.faults:
        seen[fault.fault] = seen.get(fault.fault, 0) + 1
        for r in _fault_rows(dim, fault, f"faults.{fault.fault}#{seen[fault.fault]}"):
            yield replace(r, flags=r.flags + flags)
    chaos = f.chaos
    killed = chaos is not None and chaos.killed
    mttr = f.mttr_s.any  # without the kill's outage when there was a kill (battery.faults)
    if mttr is not None:
        note = "the kill's outage apart: its MTTR is the next row" if killed else ""
    elif killed and f.outages:
        note = "no outage but the kill's: its MTTR is the next row"
    else:
        note = f"no outage (no failure held {units.duration(OUTAGE_MIN_S)})"
    yield Row(dim, "MTTR of the outages seen", mttr, "s", "lower", note=note, id="faults.mttr",
              resolution=FAULT_TICK_S)
    if chaos is None:
        note = "not run: opt-in, --chaos-restart-cmd CMD"
    else:
        every = units.ms(PROBE_EVERY_S * 1e6)
        note = chaos.why or (f"from the kill to the first token after it: a probe every "
                             f"{every}, so late by at most {every}")
    yield Row(dim, "MTTR after a kill and restart", chaos and _given(chaos.mttr_s), "s", "lower",
              note=note, id="faults.chaos.mttr", resolution=PROBE_EVERY_S)


def _fault_rows(dim: str, fault: UnderFault, id_: str) -> Iterator[Row]:
    name = _fault_name(fault)
    rate = fault.success_rate
    errors = ", ".join(f"{n}× {k}" for k, n in sorted(fault.errors.items()))
    yield Row(dim, f"success rate under {name}", None if rate is None else rate * 100, "%",
              "higher", note=errors or ("no request ended in it" if rate is None else ""),
              id=f"{id_}.success_rate", samples=fault.requests_ok + fault.requests_failed)
    during = f"while {name} was on"
    yield Row(dim, f"output tokens/s under {name}", _given(fault.output_tok_s), "tok/s",
              "higher", id=f"{id_}.output_tok_s",
              note=_missing(fault.output_tok_s, f"no tick wholly {during}"))
    for metric, q in (("itl", "p50"), ("itl", "p99"), ("e2e", "p50"), ("e2e", "p90"),
                      ("e2e", "p99")):
        value = getattr(fault, f"{metric}_{q}_ms")
        yield Row(dim, f"{metric.upper()} {q.upper()} under {name}", _given(value), "ms",
                  "lower", id=f"{id_}.{metric}.{q}",
                  note=_missing(value, f"no request measured {during}"))
    if fault.fault == "blackhole":
        truth = (fault.end - fault.start) if fault.end else None
        yield Row(dim, f"silence seen in {name}", fault.silence_s, "s", None,
                  note="" if truth is None else f"{truth:.2f} s at the proxy",
                  id=f"{id_}.silence")
    if fault.fault in ("blackhole", "reset"):
        yield Row(dim, f"recovery after {name}", fault.recovery_s, "s", "lower",
                  note="" if fault.recovery_s is not None else "no success after it",
                  resolution=FAULT_TICK_S,
                  id=f"{id_}.recovery")


def _fault_name(fault: UnderFault) -> str:
    p = fault.params  # the kind's own keys (the plan's fault tables)
    kind = fault.fault
    if kind == "latency":
        return f"latency {p.get('ms', 0):g}±{p.get('jitter_ms', 0):g} ms"
    if kind == "reset":
        return f"resets ({p.get('probability', 0) * 100:g} %)"
    if kind == "blackhole":
        return f"blackhole {p.get('seconds', 0):g} s"
    if kind == "bandwidth":
        return f"bandwidth {p.get('bytes_per_s', 0) / 1024:g} KiB/s"
    return str(kind)


def _leaks(results: Results) -> Iterator[Row]:
    f, why = _ran(results.leaks, "leaks")
    dim = "leaks"
    for key, name, s in (("server_rss", "server RSS growth", f and f.server_rss),
                         ("gpu_memory", "GPU memory growth", f and f.gpu_memory)):
        verdict = None if s is None or s.passed is None else ("PASS" if s.passed else "FAIL")
        note = why or (s.why if s else "")
        if f is not None and not why and not f.judged:
            note = (note + "; " if note else "") + (
                f"not judged: soak {_span(f.soak_s or 0)} < {_span(f.min_soak_s)}")
        elif verdict and s is not None:
            note = f"limit {s.limit_mb_h:g} MB/h"
        yield Row(dim, name, s and s.slope_mb_h, "MB/h", "lower", verdict, note,
                  id=f"leaks.{key}", limit=f"≤ {s.limit_mb_h:g} MB/h" if verdict else "")
    yield _engine_kv_row(dim, f, why)


def _engine_kv_row(dim: str, f: LeaksFigures | None, why: str) -> Row:
    """GPU-side leaks as the engine's own figures show them: its KV cache in use."""
    leak = f and _given(f.engine_kv)
    if leak is None:
        return Row(dim, "KV cache in use growth", None, "", "lower", note=why or NOT_RECORDED,
                   id="leaks.engine_kv")
    s = leak.slope
    verdict = None if leak.passed is None else ("PASS" if leak.passed else "FAIL")
    note = s.why or ""
    if f is not None and not f.judged and s.slope is not None:
        note = (note + "; " if note else "") + (
            f"not judged: soak {_span(f.soak_s)} < {_span(f.min_soak_s)}")
    unit = s.unit or ""
    return Row(dim, "KV cache in use growth", s.slope, unit, "lower", verdict, note,
               id="leaks.engine_kv", samples=s.samples,
               limit=f"≤ {leak.limit:g} {unit}" if verdict else "")


def _efficiency(results: Results) -> Iterator[Row]:
    """The efficiency rows; those of the baseline's window say the requests it is over."""
    base, _ = _ran(results.baseline, "baseline")
    requests = base and _given(base.requests)
    for r in _efficiency_rows(results):
        yield replace(r, samples=requests) if "baseline" in r.id and r.value is not None else r


def _efficiency_rows(results: Results) -> Iterator[Row]:
    f, why = _ran(results.efficiency, "efficiency")
    dim = "efficiency"
    base = _given(f.baseline) if f else None
    simulated = base is not None and base.gpu_source == "simulated"
    for at, point in (("baseline", base), ("knee", _given(f.knee) if f else None)):
        note = why or (point and _given(point.energy_why)) or (
            "" if point else f"not measured at the {at}")
        note = note or ("the simulator's pretend GPU" if simulated else "")
        yield Row(dim, f"output tokens per joule ({at})",
                  point and _given(point.tokens_per_joule), "tok/J", "higher", note=note,
                  id=f"efficiency.{at}.tokens_per_joule")
        per_w = point and _given(point.req_s_per_w)
        yield Row(dim, f"requests/s per watt ({at})", per_w, "req/s/W", "higher",
                  note=why or ("" if per_w else "no GPU power"), id=f"efficiency.{at}.req_s_per_w")
    yield from _dcgm_rows(dim, why, base and _given(base.dcgm))
    util = base and _given(base.gpu_util_pct)
    yield Row(dim, "GPU utilisation (baseline)", util, "%", None,
              note=why or ("" if util is not None else "no GPU"), id="efficiency.gpu_util")
    yield _kv_row(dim, results)
    per_request = base and _given(base.gpu_memory_mb_per_in_flight)
    # a fact, not better or worse: an engine preallocates, so this is its pool ÷ N
    yield Row(dim, "GPU memory used ÷ requests in flight", per_request, "MB", None,
              note=why or ("the preallocated memory ÷ N, not what a request uses: see the KV "
                           "row" if per_request is not None else "no GPU"),
              id="efficiency.gpu_memory_per_request")


def _kv_row(dim: str, results: Results) -> Row:
    """Memory per request as the engine's KV cache shows it: the baseline's figure, over its
    window, whatever became of the efficiency phase."""
    f, base_why = _ran(results.baseline, "baseline")
    kv = f and _given(f.kv_per_request)
    if kv is None:
        return Row(dim, "KV cache per request in flight", None, "", "lower",
                   note=base_why or NOT_RECORDED, id="efficiency.kv_per_request")
    return Row(dim, "KV cache per request in flight", kv.value, kv.unit or "", "lower",
               note=kv.why or "", id="efficiency.kv_per_request", samples=kv.samples,
               load=f.load if f else "")


def _dcgm_rows(dim: str, why: str, dcgm: Dcgm | None) -> Iterator[Row]:
    """The baseline's DCGM activity and energy, or why there are none."""
    dcgm_why = dcgm.why if dcgm else None
    for key, name, value in (
            ("sm", "SM activity", dcgm and _given(dcgm.sm_active)),
            ("tensor", "tensor-pipe activity", dcgm and _given(dcgm.tensor_active)),
            ("dram", "DRAM activity (memory bandwidth)", dcgm and _given(dcgm.dram_active))):
        yield Row(dim, f"{name} (baseline, DCGM)", None if value is None else value * 100, "%",
                  None, note=why or ("" if value is not None else dcgm_why or "n/a"),
                  id=f"efficiency.dcgm.{key}")
    tpj = dcgm and _given(dcgm.tokens_per_joule)
    yield Row(dim, "output tokens per joule (baseline, DCGM)", tpj, "tok/J", "higher",
              note=why or ("" if tpj is not None else dcgm_why or "no energy counter"),
              id="efficiency.dcgm.tokens_per_joule")


def _scaling(results: Results) -> Iterator[Row]:
    f, why = _ran(results.scaling, "scaling")
    dim = "scaling"
    if f is None:
        yield Row(dim, "throughput against N × one", None, "%", "higher", note=why,
                  id="scaling.efficiency")
        return
    for row in f.rows:
        # over targets (scaling.N.…) or over a fleet's agents on one (scaling.agents.N.…)
        n, unit = (row.agents, "agent") if row.agents else (row.targets, "target")
        key = f"agents.{n}" if row.agents else f"{n}"
        load = f"{f.per_target_load:g} per {unit}"
        many = f"{n} {unit}{'s' if n > 1 else ''}"
        yield Row(dim, f"output tokens/s {'from' if row.agents else 'on'} {many}",
                  row.output_tok_s, "tok/s", "higher", note=f.kind,
                  id=f"scaling.{key}.output_tok_s", load=load)
        if n > 1:
            eff = row.efficiency
            yield Row(dim, f"efficiency {f'from {many}' if row.agents else f'on {n}'} "
                      f"(against {n} × one)", None if eff is None else eff * 100, "%",
                      "higher", id=f"scaling.{key}.efficiency", load=load)


def _batch(results: Results) -> Iterator[Row]:
    """Static batching beside the dynamic baseline; the fluctuation at each ramp step."""
    if _predates(results, "batch"):
        return
    f, why = _ran(results.batch, "batch")
    dim = "batching"
    n, ok = (f.requests, f.requests_ok) if f else (None, None)
    load = f"{n} requests at once" if f else ""
    over = why or (f.why if f else "")  # why the batch has no end to count to

    def row(figure: str, value: float | None, unit: str, better: str | None, id_: str,
            note: str = "", samples: int | None = ok, q: str | None = None) -> Row:
        few = validity.too_few(samples, q) if q and value is not None else None
        return Row(dim, f"static batch: {figure}", value, unit, better, note=why or note,
                   id=id_, load=load, samples=samples, flags=(few,) if few else ())

    yield row("requests failed", f and f.requests_failed, "", "lower", "batch.requests_failed",
              note=f"{ok} of {n} ok" if f else "", samples=n)
    yield row("output tokens", f and f.output_tokens, "tokens", None, "batch.output_tokens",
              note="delivered, every request's")
    yield row("time to the last token", f and f.time_to_last_token_ms, "ms", "lower",
              "batch.time_to_last_token", note=over or "from the first send: the longest "
              "request's E2E (every request sent at once)")
    yield row("output tokens/s", f and f.output_tok_s, "tok/s", "higher", "batch.output_tok_s",
              note=over or "output tokens ÷ the time to the last token")
    yield row("static ÷ dynamic output tokens/s", f and f.static_vs_dynamic, "×", None,
              "batch.static_vs_dynamic", note=_static_vs_dynamic_note(f, over), samples=None)
    for metric, q in (("ttft", "p50"), ("ttft", "p99"), ("e2e", "p50"), ("e2e", "max")):
        value = (f.ttft_ms if metric == "ttft" else f.e2e_ms).get(q) if f else None
        yield row(f"{metric.upper()} {q.upper()}", value, "ms", "lower", f"batch.{metric}.{q}",
                  note="" if value is not None else "no request finished", q=q)
    yield from _fluctuation_rows(dim, f, why)


def _static_vs_dynamic_note(f: BatchFigures | None, over: str) -> str:
    if f is None or over:
        return over
    if f.dynamic_why:
        return f.dynamic_why
    return (f"{units.rate(f.output_tok_s, 'tok/s')} at once ÷ the baseline's "
            f"{units.rate(f.dynamic_output_tok_s, 'tok/s')} ({f.dynamic_load}, dynamic)")


def _fluctuation_rows(dim: str, f: BatchFigures | None, why: str) -> Iterator[Row]:
    """ITL and TPOT P99 ÷ P50 and interquartile range at each ramp step, by its load (the
    ids stay the same across evals at the same loads); one row saying why when none."""
    if f is None or not f.steps:
        yield Row(dim, "latency fluctuation at each ramp step", None, "×", "lower",
                  note=why or (f.steps_why if f else ""), id="batch.fluctuation")
        return
    for step in f.steps:
        at = f"{step.load:g} {f.steps_unit}"
        key = f"batch.fluctuation.{step.load:g}"
        for metric, s in (("itl", step.itl), ("tpot", step.tpot)):
            name = metric.upper()
            none = f"no {name} sample in the step's measured ticks" if not s.count else ""
            few = validity.too_few(s.count, "p99") if s.count else None
            yield Row(dim, f"{name} P99 ÷ P50 at {at}", s.p99_over_p50, "×", "lower",
                      note=none or f"P50 {_ms_text(s.p50_ms)}, P99 {_ms_text(s.p99_ms)}",
                      id=f"{key}.{metric}_p99_p50", load=at, samples=s.count,
                      flags=(few,) if few else ())
            yield Row(dim, f"{name} IQR (P75 − P25) at {at}", s.iqr_ms, "ms", "lower",
                      note=none or f"P25 {_ms_text(s.p25_ms)}, P75 {_ms_text(s.p75_ms)}",
                      id=f"{key}.{metric}_iqr", load=at, samples=s.count)


def _ms_text(value: float | None) -> str:
    return units.ms(units.us_of_ms(value))


def _context(results: Results) -> Iterator[Row]:
    """The input- and output-length ladders: a row per rung and figure (its lengths in the
    id), the longest prompt served and the max context the server states."""
    if _predates(results, "context"):
        return
    f, why = _ran(results.context, "context")
    dim = "context length"
    if f is None:
        yield Row(dim, "longest prompt served", None, "tokens", "higher", note=why,
                  id="context.longest_prompt")
        return
    for rung in f.input_ladder:
        yield from _rung_rows(dim, f.concurrency, rung, f"context.input.{rung.input_tokens}",
                              f"{rung.input_tokens:,} in", prefill=True)
    for rung in f.output_ladder:
        yield from _rung_rows(dim, f.concurrency, rung, f"context.output.{rung.output_tokens}",
                              f"{rung.output_tokens:,} out", prefill=False)
    lp = f.longest
    yield Row(dim, "longest prompt served", lp.tokens, "tokens", "higher", note=lp.how,
              id="context.longest_prompt",
              load=f"{f.input_ladder[0].output_tokens:,} out" if f.input_ladder else "")
    # a fact about the server, not better or worse
    yield Row(dim, "max context (as the server states it)", f.max_context, "tokens", None,
              note=f.max_context_from, id="context.max_context")


def _rung_rows(dim: str, streams: int, rung: ContextRung, id_: str, at: str, *,
               prefill: bool) -> Iterator[Row]:
    """A rung's rows: TTFT and prefill tok/s on the input ladder, ITL on both, tok/s on the
    output ladder, errors on both; a rung not sent (or not served) says why in each."""
    load = f"{streams} streams, {rung.input_tokens:,} in / {rung.output_tokens:,} out"
    note = rung.why

    def row(figure: str, value: float | None, unit: str, better: str, key: str,
            samples: int | None = None, q: str = "", extra: str = "") -> Row:
        few = validity.too_few(samples, q) if q and value is not None else None
        missing = "" if value is not None else "nothing measured in the rung's window"
        return Row(dim, f"{figure}, {at}", value, unit, better, note=note or extra or missing,
                   id=f"{id_}.{key}", load=load, samples=samples, flags=(few,) if few else ())

    ttft, itl = rung.ttft_ms, rung.itl_ms
    ttft_n = _count(ttft)
    itl_n = _count(itl)
    if prefill:
        for q in ("p50", "p99"):
            yield row(f"TTFT {q.upper()}", ttft and ttft.get(q), "ms", "lower", f"ttft.{q}",
                      ttft_n, q)
        yield row("prefill tokens/s", rung.prefill_tok_s, "tok/s", "higher", "prefill_tok_s",
                  ttft_n, extra="input tokens ÷ TTFT P50: one request's, queueing included")
    for q in ("p50", "p99"):
        yield row(f"ITL {q.upper()}", itl and itl.get(q), "ms", "lower", f"itl.{q}", itl_n, q)
    if not prefill:
        yield row("output tokens/s", rung.output_tok_s, "tok/s", "higher", "output_tok_s")
    rate = rung.error_rate
    done_n = None if rung.requests_ok is None else rung.requests_ok + (rung.requests_failed or 0)
    yield row("error rate", None if rate is None else rate * 100, "%", "lower", "error_rate",
              done_n)


def _count(summary: Summary | None) -> int | None:
    n = summary.get("count") if summary else None
    return n if isinstance(n, int) else None


def _interference(results: Results) -> Iterator[Row]:
    """The baseline load alone, then beside each neighbour: TTFT P99, ITL P99 and output
    tok/s (the note: the change against alone), the neighbour's CPU time as the OS
    measured it, and where each process ran."""
    if _predates(results, "interference"):
        return
    f, why = _ran(results.interference, "interference")
    dim = "interference"
    if f is None:  # the alone rows and the default neighbours' throughput, saying why
        for kind in ("alone", *_NEIGHBORS_SHOWN):
            yield Row(dim, f"output tokens/s {_beside(kind)}", None, "tok/s", "higher",
                      note=why, id=f"interference.{kind}.output_tok_s")
        return
    yield Row(dim, "where each ran", None, note=f"{f.placement} ({f.server_why})",
              id="interference.placement")
    alone = next((r for r in f.runs if r.neighbor == "alone"), None)
    again = next((r for r in f.runs if r.neighbor == "alone_after"), None)
    flags = _host_drift(alone, again)
    for run in f.runs:
        yield from _interference_rows(dim, run, alone,
                                      flags if run.neighbor not in _ALONE else ())


_NEIGHBORS_SHOWN = ("cpu", "memory", "disk")  # the default plan's, shown when it did not run
_ALONE = ("alone", "alone_after")
HOST_DRIFT = 0.10  # alone before and after differing by more: the neighbours' rows flagged


def _beside(kind: str) -> str:
    return {"alone": "alone", "alone_after": "alone again, after the neighbours"}.get(
        kind, f"beside the {kind} neighbour")


def _host_drift(alone: InterferenceRun | None, again: InterferenceRun | None) -> tuple[str, ...]:
    """A flag for the neighbours' rows when the load alone before them and after them
    differ by more than HOST_DRIFT in tok/s or ITL P99: the host changed under the phase,
    and a neighbour's change may be the host's (an eval before the second run: none)."""
    if alone is None or again is None:
        return ()
    pairs = ((alone.output_tok_s, again.output_tok_s),
             (_summary_p99(alone.itl_ms), _summary_p99(again.itl_ms)))
    drifts = [abs(b - a) / a for a, b in pairs if a and b is not None]
    if not drifts or max(drifts) <= HOST_DRIFT:
        return ()
    return (f"the host drifted: alone before and after the neighbours differ by "
            f"{max(drifts) * 100:.0f} %",)


def _interference_rows(dim: str, run: InterferenceRun, alone: InterferenceRun | None,
                       flags: tuple[str, ...]) -> Iterator[Row]:
    kind = run.neighbor
    figures = (("TTFT P99", "ttft.p99", "ms", "lower", _summary_p99(run.ttft_ms),
                alone and _summary_p99(alone.ttft_ms)),
               ("ITL P99", "itl.p99", "ms", "lower", _summary_p99(run.itl_ms),
                alone and _summary_p99(alone.itl_ms)),
               ("output tokens/s", "output_tok_s", "tok/s", "higher", run.output_tok_s,
                alone and alone.output_tok_s))
    for name, key, unit, better, value, base in figures:
        note = run.why
        if kind != "alone" and value is not None:
            change = _change_text(value, base)
            note = f"{change}; {note}" if note else change
        yield Row(dim, f"{name} {_beside(kind)}", value, unit, better,
                  note=note or ("" if value is not None else "not measured"),
                  id=f"interference.{kind}.{key}", load=run.load, samples=run.requests,
                  flags=flags)
    if kind in _ALONE:
        return
    use = run.use
    note = run.why or "the neighbour did not start"
    if use is not None:
        disk = units.bytes_(use.disk_write_bytes) if use.disk_write_bytes is not None \
            else use.disk_why
        note = f"{run.what}; over {units.duration(use.seconds)}, {use.ended}; disk " \
               f"written: {disk}"
    # what the neighbour took, a fact of the run (it really ran), not better or worse
    yield Row(dim, f"the {kind} neighbour's CPU time", use and use.cpu_s, "s", None,
              note=note, id=f"interference.{kind}.cpu_s", load=run.load)


def _summary_p99(summary: Summary | None) -> float | None:
    value = summary.get("p99") if summary is not None else None
    return float(value) if value is not None else None


def _change_text(value: float, base: float | None) -> str:
    """"+12.5 % against alone"; why not when alone has no figure to compare."""
    if not base:
        return "alone has no figure to compare"
    return f"{(value - base) / base * 100:+.1f} % against alone"


def _priority(results: Results) -> Iterator[Row]:
    """Each class of the plan's mix: its requests failed, TTFT P50 / P99, ITL and E2E P99,
    goodput within its SLO, its own SLO's verdicts, and its TTFT P99 with its priority
    against the same mix without (the ids by class name: the same in evals of one plan)."""
    if _predates(results, "priority"):
        return
    f, why = _ran(results.priority, "priority")
    dim = "priority classes"
    if f is None:
        yield Row(dim, "priority classes", None, note=why, id="priority")
        return
    without = {c.name: c for c in f.without}
    refused = next((c.name for c in f.classes if c.refused), None)
    # a class refused for its priority leaves the others the server to themselves: the
    # runs are not alike, and no class's with ÷ without means what it says
    unlike = f"the server refused {refused}'s priority: the two runs are not alike" \
        if refused else ""
    for c in f.classes:
        yield from _class_rows(dim, c, without.get(c.name), f.without_why, f.load, unlike)


def _class_rows(dim: str, c: ClassFigures, bare: ClassFigures | None, bare_why: str,
                load: str, refused: str) -> Iterator[Row]:
    key, n = f"priority.{c.name}", c.requests_ok + c.requests_failed
    sent = "not sent" if c.priority is None else f"priority {c.priority}"
    shares = f"{units.pct(c.share_asked)} asked, {units.pct(c.share_sent)} sent"

    def row(figure: str, value: float | None, unit: str, better: str | None, id_: str,
            note: str = "", samples: int | None = c.requests_ok, q: str | None = None,
            verdict: str | None = None) -> Row:
        few = validity.too_few(samples, q) if q and value is not None else None
        return Row(dim, f"{c.name}: {figure}", value, unit, better, verdict, note=note,
                   id=f"{key}.{id_}", load=load, samples=samples, flags=(few,) if few else ())

    yield row("requests failed", c.requests_failed, "", "lower", "requests_failed",
              note=c.why or f"{sent}; {shares}", samples=n)
    for metric, q in (("ttft", "p50"), ("ttft", "p99"), ("itl", "p99"), ("e2e", "p99")):
        value = _ms({m: getattr(c, f"{m}_ms") for m in ("ttft", "itl", "e2e")}, metric, q)
        yield row(f"{metric.upper()} {q.upper()}", value, "ms", "lower", f"{metric}.{q}",
                  note=c.why if value is None else "", q=q)
    yield row("goodput", c.goodput_req_s, "req/s", "higher", "goodput",
              note=f"requests within {c.limits}" if c.limits else "no per-request SLO")
    for t in c.thresholds:
        verdict = None if t.passed is None else ("PASS" if t.passed else "FAIL")
        yield row(t.shown, None, "", None, f"slo.{t.shown}", note=t.measured, verdict=verdict)
    yield _with_against_without(row, c, bare, bare_why or refused)


def _with_against_without(row: Callable[..., Row], c: ClassFigures, bare: ClassFigures | None,
                          why: str) -> Row:
    """TTFT P99 with the class's priority ÷ the same without: below 1, the server served it
    sooner for its priority (`why`: why there is no comparison, "" when there is)."""
    mine = _summary_p99(c.ttft_ms)
    theirs = _summary_p99(bare.ttft_ms) if bare is not None and not why else None
    ratio = mine / theirs if mine is not None and theirs else None
    if ratio is not None:
        note = f"{_ms_text(mine)} with, {_ms_text(theirs)} without"
    elif why or bare is None:
        note = why or "the run without priorities has no such class"
    else:
        note = c.why or bare.why or "no TTFT measured"
    return row("TTFT P99 with ÷ without priorities", ratio, "×", "lower", "ttft.p99_vs_without",
               note=note, samples=None)


def _memory(results: Results) -> Iterator[Row]:
    """The model's size, GPU memory used and per billion parameters; the KV cache's
    capacity in tokens and bytes. The GPU rows are the baseline's window's (its load)."""
    if _predates(results, "memory"):
        return
    f, why = _ran(results.memory, "memory")
    dim = "memory efficiency"
    base, _ = _ran(results.baseline, "baseline")
    load = base.load if base and f and f.gpu_samples else ""
    ticks = f.gpu_samples if f and f.gpu_samples else None
    gpus = f"{f.gpu_count} GPU{'s' if f.gpu_count != 1 else ''} ({f.gpu_source})" if f else ""
    # the parameters and the GPU memory are facts of the deployment, not better or worse
    yield Row(dim, "model parameters", f and f.params_b, "B params", None,
              note=why or (f.params_why if f and f.params_b is None else f.params_source
                           if f else ""), id="memory.params_b")
    yield Row(dim, "GPU memory used (baseline)", f and f.gpu_memory_gb, "GB", None,
              note=why or (f.gpu_why if f and f.gpu_why else f"summed over {gpus}"),
              id="memory.gpu_memory_gb", load=load, samples=ticks)
    yield Row(dim, "GPU memory per billion parameters", f and f.gb_per_b_params, "GB/B",
              "lower", note=why or (f.gb_per_b_why or "" if f else ""),
              id="memory.gb_per_b_params", load=load, samples=ticks)
    kv_note = why or (f.kv_why if f and f.kv_why else f.kv_source if f else "")
    yield Row(dim, "KV cache capacity", f and f.kv_tokens, "tokens", "higher", note=kv_note,
              id="memory.kv_capacity_tokens")
    bytes_note = why or (f.kv_bytes_why if f and f.kv_bytes_why else f.kv_source if f else "")
    yield Row(dim, "KV cache bytes per token", f and f.kv_bytes_per_token, "bytes/token",
              "lower", note=bytes_note, id="memory.kv_bytes_per_token")
    gb = f.kv_bytes / 1e9 if f and f.kv_bytes is not None else None
    yield Row(dim, "KV cache size", gb, "GB", "higher", note=bytes_note,
              id="memory.kv_capacity_gb")


# each phase's section of the matrix, by name (a test holds the keys to PHASES)
BUILDERS: dict[Phase, Callable[[Results], Iterator[Row]]] = {
    "conformance": _conformance,
    "baseline": _baseline, "ramp": _ramp, "batch": _batch, "context": _context,
    "interference": _interference, "priority": _priority, "long_tail": _long_tail,
    "faults": _faults,
    "leaks": _leaks, "memory": _memory, "efficiency": _efficiency, "scaling": _scaling,
}


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


# ---- text --------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    """A figure's number (its unit apart): counts and whole loads without decimals, others to
    about three figures; a missing one is n/a."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return units.NA
    a = abs(value)
    if float(value).is_integer() and a < 1e6:  # counts and whole loads: no decimals
        return f"{int(value):,}"
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if a >= 1 else f"{value:.3g}"


def shown(r: Row) -> str:
    """A row's value with its unit, as every tokentop output prints it: a latency as the
    console does (ms, then s from 1000 ms on), a missing value as n/a, never with a unit."""
    if r.value is None or (isinstance(r.value, float) and math.isnan(r.value)):
        return units.NA
    if r.unit == "ms":
        return units.ms(units.us_of_ms(r.value))
    if r.unit == "%":
        return units.pct(r.value, whole=100.0)
    return f"{fmt(r.value)} {r.unit}".rstrip()


def to_json(all_rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in all_rows]
