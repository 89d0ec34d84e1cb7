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
from dataclasses import KW_ONLY, asdict, dataclass
from typing import TypeVar

from msgspec import UNSET, UnsetType

from loadgen.analysis.soak_result import Summary, ThresholdResult
from loadgen.eval.chaos import PROBE_EVERY_S
from loadgen.eval.phases import PHASES, Phase
from loadgen.eval.results import (
    Dcgm,
    PhaseResult,
    Results,
    UnderFault,
)
from loadgen.model import units
from loadgen.model.outage import OUTAGE_MIN_S

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

    @property
    def key(self) -> str:
        return self.id


def rows(results: Results) -> list[Row]:
    out: list[Row] = []
    for name in PHASES:
        out += list(BUILDERS[name](results))
    return out


def _ran(result: PhaseResult[F] | None, name: Phase) -> tuple[F | None, str]:
    """(figures, "") of a phase that ran, or (None, why it did not). The builders read a
    figure as `f and f.req_s`: None when the phase has no figures, its row then saying why;
    a Struct is never false."""
    if result is None:
        return None, f"{name} did not run (the eval stopped before it)"
    if result.status != "done":
        return None, f"{name} {result.status}: {result.why}"
    return result.figures, ""


def _given(value: T | UnsetType) -> T | None:
    """A figure eval.json may not have (an older tokentop's, or one of a shape without it)
    as None, like a figure that is null."""
    return None if value is UNSET else value


def _ms(latency: dict[str, Summary | None] | None, metric: str, q: str) -> float | None:
    # a summary is a mapping (its keys are hdr.PERCENTILES' labels), not a Struct
    summary = latency.get(metric) if latency is not None else None
    return summary.get(q) if summary is not None else None


def _baseline(results: Results) -> Iterator[Row]:
    f, why = _ran(results.baseline, "baseline")
    dim = "latency & throughput"
    load = f.load if f else ""
    yield Row(dim, "requests/s", f and f.req_s, "req/s", "higher", note=why,
              id="baseline.req_s", load=load)
    yield Row(dim, "output tokens/s", f and f.output_tok_s, "tok/s", "higher", note=why,
              id="baseline.output_tok_s", load=load)
    goodput = f and f.goodput_req_s
    yield Row(dim, "goodput", goodput, "req/s", "higher",
              note=why or ("" if goodput is not None else "no per-request SLO"),
              id="baseline.goodput", load=load)
    rate = f and f.error_rate
    yield Row(dim, "error rate", None if rate is None else rate * 100, "%", "lower", note=why,
              id="baseline.error_rate", load=load)
    latency = f and f.latency_ms
    for metric, qs in (("ttft", ("p50", "p90", "p99", "p99.9")), ("itl", ("p50", "p99", "p99.9")),
                       ("e2e", ("p50", "p99"))):
        for q in qs:
            yield Row(dim, f"{metric.upper()} {q.upper()}", _ms(latency, metric, q), "ms",
                      "lower", note=why, id=f"baseline.{metric}.{q}", load=load)
    for t in f.thresholds if f else []:
        value, unit = _threshold_value(t)
        yield Row("SLO", t.text, value, unit, None, "PASS" if t.passed else "FAIL", note=t.shown,
                  id=f"slo.{t.text}", load=load)


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
    f, why = _ran(results.ramp, "ramp")
    unit = f.unit if f else "streams"
    knee, best = (f.knee, f.best_goodput) if f else (None, None)
    knee_why = why or ("" if knee else "no knee: throughput scaled to the last step")
    dim = "pressure ramp"
    at_knee = f"{knee.load:g} {unit}" if knee else ""
    # the knee's load is a fact about the server, not better or worse: compare shows it
    yield Row(dim, "knee (load)", knee and knee.load, unit, None, note=knee_why,
              id="ramp.knee")
    yield Row(dim, "output tokens/s at the knee", knee and knee.output_tok_s, "tok/s",
              "higher", note=knee_why, id="ramp.knee.output_tok_s", load=at_knee)
    yield Row(dim, "TTFT P99 at the knee", knee and knee.ttft_ms.get("p99"), "ms", "lower",
              note=knee_why, id="ramp.knee.ttft.p99", load=at_knee)
    best_why = why or ("" if best else "no per-request SLO, or no step met it")
    yield Row(dim, "max goodput", best and best.goodput_req_s, "req/s", "higher",
              note=best_why, id="ramp.max_goodput", load=f"{best.load:g} {unit}" if best else "")
    yield Row(dim, "max output tokens/s", f and f.max_output_tok_s, "tok/s", "higher",
              note=why, id="ramp.max_output_tok_s")


def _long_tail(results: Results) -> Iterator[Row]:
    f, why = _ran(results.long_tail, "long_tail")
    dim = "long tail"
    load = f"{f.load}, {_span(f.seconds)}" if f and f.load else ""
    counts = f.long_tail.counts if f else {}  # by metric
    rule = f.long_tail.rule if f else ""
    for metric in ("ttft", "itl"):
        yield Row(dim, f"intervals whose {metric.upper()} tail breaks out", counts.get(metric),
                  "", "lower", note=why or rule, id=f"long_tail.{metric}.breakouts", load=load)
    avail = f and f.availability
    yield Row(dim, "availability", None if avail is None else avail * 100, "%", "higher",
              note=why, id="long_tail.availability", load=load)
    yield Row(dim, "TTFT P99.9", _ms(f and f.latency_ms, "ttft", "p99.9"), "ms", "lower",
              note=why, id="long_tail.ttft.p99.9", load=load)


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
    for fault in f.faults:
        seen[fault.fault] = seen.get(fault.fault, 0) + 1
        yield from _fault_rows(dim, fault, f"faults.{fault.fault}#{seen[fault.fault]}")
    chaos = f.chaos
    killed = chaos is not None and chaos.killed
    mttr = f.mttr_s.any  # without the kill's outage when there was a kill (battery.faults)
    if mttr is not None:
        note = "the kill's outage apart: its MTTR is the next row" if killed else ""
    elif killed and f.outages:
        note = "no outage but the kill's: its MTTR is the next row"
    else:
        note = f"no outage (no failure held {units.duration(OUTAGE_MIN_S)})"
    yield Row(dim, "MTTR of the outages seen", mttr, "s", "lower", note=note, id="faults.mttr")
    if chaos is None:
        note = "not run: opt-in, --chaos-restart-cmd CMD"
    else:
        every = units.ms(PROBE_EVERY_S * 1e6)
        note = chaos.why or (f"from the kill to the first token after it: a probe every "
                             f"{every}, so late by at most {every}")
    yield Row(dim, "MTTR after a kill and restart", chaos and _given(chaos.mttr_s), "s", "lower",
              note=note, id="faults.chaos.mttr")


def _fault_rows(dim: str, fault: UnderFault, id_: str) -> Iterator[Row]:
    name = _fault_name(fault)
    rate = fault.success_rate
    errors = ", ".join(f"{n}× {k}" for k, n in sorted(fault.errors.items()))
    yield Row(dim, f"success rate under {name}", None if rate is None else rate * 100, "%",
              "higher", note=errors or ("no request ended in it" if rate is None else ""),
              id=f"{id_}.success_rate", samples=fault.requests_ok + fault.requests_failed)
    if fault.fault == "blackhole":
        truth = (fault.end - fault.start) if fault.end else None
        yield Row(dim, f"silence seen in {name}", fault.silence_s, "s", None,
                  note="" if truth is None else f"{truth:.2f} s at the proxy",
                  id=f"{id_}.silence")
    if fault.fault in ("blackhole", "reset"):
        yield Row(dim, f"recovery after {name}", fault.recovery_s, "s", "lower",
                  note="" if fault.recovery_s is not None else "no success after it",
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
                  id=f"leaks.{key}", limit=f"≤ {s.limit_mb_h:g} MB/h" if s else "")


def _efficiency(results: Results) -> Iterator[Row]:
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
    per_request = base and _given(base.gpu_memory_mb_per_in_flight)
    yield Row(dim, "GPU memory per request in flight", per_request, "MB", "lower",
              note=why or ("" if per_request is not None else "no GPU"),
              id="efficiency.memory_per_request")


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
        n = row.targets
        load = f"{f.per_target_load:g} per target"
        yield Row(dim, f"output tokens/s on {n} target{'s' if n > 1 else ''}",
                  row.output_tok_s, "tok/s", "higher", note=f.kind,
                  id=f"scaling.{n}.output_tok_s", load=load)
        if n > 1:
            eff = row.efficiency
            yield Row(dim, f"efficiency on {n} (against {n} × one)",
                      None if eff is None else eff * 100, "%", "higher",
                      id=f"scaling.{n}.efficiency", load=load)


# each phase's section of the matrix, by name (a test holds the keys to PHASES)
BUILDERS: dict[Phase, Callable[[Results], Iterator[Row]]] = {
    "baseline": _baseline, "ramp": _ramp, "long_tail": _long_tail, "faults": _faults,
    "leaks": _leaks, "efficiency": _efficiency, "scaling": _scaling,
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
