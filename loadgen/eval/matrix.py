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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from loadgen.analysis.soak_result import Summary, ThresholdResult
from loadgen.eval.chaos import PROBE_EVERY_S
from loadgen.eval.phases import PHASES, Phase
from loadgen.eval.results import (
    Dcgm,
    EvalState,
    PhaseResult,
    Results,
    UnderFault,
    Workload,
    read_state,
)
from loadgen.model import units
from loadgen.model.outage import OUTAGE_MIN_S

F = TypeVar("F")
T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    dimension: str
    figure: str
    value: float | None
    unit: str = ""
    better: str | None = None  # "higher" | "lower" | None (not a better-or-worse figure)
    verdict: str | None = None  # PASS | FAIL | None
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.dimension} / {self.figure}"


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
    dim = "latency & throughput" + (f" ({f.load})" if f and f.load else "")
    yield Row(dim, "requests/s", f and f.req_s, "req/s", "higher", note=why)
    yield Row(dim, "output tokens/s", f and f.output_tok_s, "tok/s", "higher", note=why)
    goodput = f and f.goodput_req_s
    yield Row(dim, "goodput", goodput, "req/s", "higher",
              note=why or ("" if goodput is not None else "no per-request SLO"))
    rate = f and f.error_rate
    yield Row(dim, "error rate", None if rate is None else rate * 100, "%", "lower", note=why)
    latency = f and f.latency_ms
    for metric, qs in (("ttft", ("p50", "p90", "p99", "p99.9")), ("itl", ("p50", "p99", "p99.9")),
                       ("e2e", ("p50", "p99"))):
        for q in qs:
            yield Row(dim, f"{metric.upper()} {q.upper()}", _ms(latency, metric, q), "ms",
                      "lower", note=why)
    for t in f.thresholds if f else []:
        value, unit = _threshold_value(t)
        yield Row("SLO", t.text, value, unit, None, "PASS" if t.passed else "FAIL", note=t.shown)


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
    yield Row(dim, "knee (load)", knee and knee.load, unit, "higher", note=knee_why)
    yield Row(dim, "output tokens/s at the knee", knee and knee.output_tok_s, "tok/s",
              "higher", note=knee_why)
    yield Row(dim, "TTFT P99 at the knee", knee and knee.ttft_ms.get("p99"), "ms", "lower",
              note=knee_why)
    best_why = why or ("" if best else "no per-request SLO, or no step met it")
    yield Row(dim, "max goodput", best and best.goodput_req_s, "req/s", "higher",
              note=best_why or (f"at {best.load:g} {unit}" if best else ""))
    yield Row(dim, "max output tokens/s", f and f.max_output_tok_s, "tok/s", "higher",
              note=why)


def _long_tail(results: Results) -> Iterator[Row]:
    f, why = _ran(results.long_tail, "long_tail")
    dim = "long tail" + (f" ({f.load}, {_span(f.seconds)})" if f and f.load else "")
    counts = f.long_tail.counts if f else {}  # by metric
    rule = f.long_tail.rule if f else ""
    for metric in ("ttft", "itl"):
        yield Row(dim, f"intervals whose {metric.upper()} tail breaks out", counts.get(metric),
                  "", "lower", note=why or rule)
    avail = f and f.availability
    yield Row(dim, "availability", None if avail is None else avail * 100, "%", "higher",
              note=why)
    yield Row(dim, "TTFT P99.9", _ms(f and f.latency_ms, "ttft", "p99.9"), "ms", "lower",
              note=why)


def _faults(results: Results) -> Iterator[Row]:
    f, why = _ran(results.faults, "faults")
    dim = "stability under faults"
    if f is None:
        yield Row(dim, "success rate under faults", None, "%", "higher", note=why)
        yield Row(dim, "MTTR after a kill and restart", None, "s", "lower", note=why)
        return
    for fault in f.faults:
        yield from _fault_rows(dim, fault)
    chaos = f.chaos
    killed = chaos is not None and chaos.killed
    mttr = f.mttr_s.any  # without the kill's outage when there was a kill (battery.faults)
    if mttr is not None:
        note = "the kill's outage apart: its MTTR is the next row" if killed else ""
    elif killed and f.outages:
        note = "no outage but the kill's: its MTTR is the next row"
    else:
        note = f"no outage (no failure held {units.duration(OUTAGE_MIN_S)})"
    yield Row(dim, "MTTR of the outages seen", mttr, "s", "lower", note=note)
    if chaos is None:
        note = "not run: opt-in, --chaos-restart-cmd CMD"
    else:
        every = units.ms(PROBE_EVERY_S * 1e6)
        note = chaos.why or (f"from the kill to the first token after it: a probe every "
                             f"{every}, so late by at most {every}")
    yield Row(dim, "MTTR after a kill and restart", chaos and _given(chaos.mttr_s), "s", "lower",
              note=note)


def _fault_rows(dim: str, fault: UnderFault) -> Iterator[Row]:
    name = _fault_name(fault)
    rate = fault.success_rate
    errors = ", ".join(f"{n}× {k}" for k, n in sorted(fault.errors.items()))
    yield Row(dim, f"success rate under {name}", None if rate is None else rate * 100, "%",
              "higher", note=errors or ("no request ended in it" if rate is None else ""))
    if fault.fault == "blackhole":
        truth = (fault.end - fault.start) if fault.end else None
        yield Row(dim, f"silence seen in {name}", fault.silence_s, "s", None,
                  note="" if truth is None else f"{truth:.2f} s at the proxy")
    if fault.fault in ("blackhole", "reset"):
        yield Row(dim, f"recovery after {name}", fault.recovery_s, "s", "lower",
                  note="" if fault.recovery_s is not None else "no success after it")


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
    for name, s in (("server RSS growth", f and f.server_rss),
                    ("GPU memory growth", f and f.gpu_memory)):
        verdict = None if s is None or s.passed is None else ("PASS" if s.passed else "FAIL")
        note = why or (s.why if s else "")
        if f is not None and not why and not f.judged:
            note = (note + "; " if note else "") + (
                f"not judged: soak {_span(f.soak_s or 0)} < {_span(f.min_soak_s)}")
        elif verdict and s is not None:
            note = f"limit {s.limit_mb_h:g} MB/h"
        yield Row(dim, name, s and s.slope_mb_h, "MB/h", "lower", verdict, note)


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
                  point and _given(point.tokens_per_joule), "tok/J", "higher", note=note)
        per_w = point and _given(point.req_s_per_w)
        yield Row(dim, f"requests/s per watt ({at})", per_w, "req/s/W", "higher",
                  note=why or ("" if per_w else "no GPU power"))
    yield from _dcgm_rows(dim, why, base and _given(base.dcgm))
    util = base and _given(base.gpu_util_pct)
    yield Row(dim, "GPU utilisation (baseline)", util, "%", None,
              note=why or ("" if util is not None else "no GPU"))
    per_request = base and _given(base.gpu_memory_mb_per_in_flight)
    yield Row(dim, "GPU memory per request in flight", per_request, "MB", "lower",
              note=why or ("" if per_request is not None else "no GPU"))


def _dcgm_rows(dim: str, why: str, dcgm: Dcgm | None) -> Iterator[Row]:
    """The baseline's DCGM activity and energy, or why there are none."""
    dcgm_why = dcgm.why if dcgm else None
    for name, value in (
            ("SM activity", dcgm and _given(dcgm.sm_active)),
            ("tensor-pipe activity", dcgm and _given(dcgm.tensor_active)),
            ("DRAM activity (memory bandwidth)", dcgm and _given(dcgm.dram_active))):
        yield Row(dim, f"{name} (baseline, DCGM)", None if value is None else value * 100, "%",
                  None, note=why or ("" if value is not None else dcgm_why or "n/a"))
    tpj = dcgm and _given(dcgm.tokens_per_joule)
    yield Row(dim, "output tokens per joule (baseline, DCGM)", tpj, "tok/J", "higher",
              note=why or ("" if tpj is not None else dcgm_why or "no energy counter"))


def _scaling(results: Results) -> Iterator[Row]:
    f, why = _ran(results.scaling, "scaling")
    dim = "scaling"
    if f is None:
        yield Row(dim, "throughput against N × one", None, "%", "higher", note=why)
        return
    for row in f.rows:
        n = row.targets
        yield Row(dim, f"output tokens/s on {n} target{'s' if n > 1 else ''}",
                  row.output_tok_s, "tok/s", "higher", note=f.kind)
        if n > 1:
            eff = row.efficiency
            yield Row(dim, f"efficiency on {n} (against {n} × one)",
                      None if eff is None else eff * 100, "%", "higher")


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


def table(all_rows: list[Row]) -> str:
    """The matrix for a terminal, one line a row, grouped by dimension."""
    lines: list[str] = []
    dim = None
    width = max((len(r.figure) for r in all_rows), default=10)
    for r in all_rows:
        if r.dimension != dim:
            dim = r.dimension
            lines.append(f"{dim}")
        value = shown(r)
        verdict = f" {r.verdict}" if r.verdict else ""
        note = f"  ({r.note})" if r.note else ""
        lines.append(f"  {r.figure:<{width}}  {value:>14}{verdict}{note}")
    return "\n".join(lines)


def markdown(state: EvalState, all_rows: list[Row], plots: list[str]) -> str:
    out = ["# tokentop eval", "", f"Target: {state.target}  ",
           f"Workload: {_workload_text(state.workload)}  ",
           f"Profile: {'quick' if state.quick else 'full'}; "
           f"finished: {'yes' if state.finished else 'no (resume with the same --out)'}",
           "", "| dimension | figure | value | verdict | note |", "| --- | --- | --- | --- | --- |"]
    for r in all_rows:
        out.append(f"| {r.dimension} | {r.figure} | {shown(r)} | "
                   f"{r.verdict or ''} | {r.note} |")
    out += ["", "## Phases", ""]
    for name, r in state.phases.items():
        extra = f" — {r.why}" if r.why else ""
        where = f" (`{r.run_dir}`)" if r.run_dir else ""
        report = Path(r.run_dir) / "report.md" if r.run_dir else None
        # the long tail's intervals, outages and drift in full: that phase's own report
        link = f"; [its report]({report})" if report is not None and report.exists() else ""
        out.append(f"* **{name}**: {r.status}{extra}{where}, {r.seconds or 0:g} s{link}")
    tail = state.phases.long_tail
    intervals = tail.figures.long_tail.intervals if tail and tail.figures else []
    if intervals:
        out += ["", "## Long-tail intervals (the soak's ticks whose tail broke out)", "",
                "| at (s) | metric | P99 (ms) | P99.9 (ms) | max (ms) | in flight |",
                "| --- | --- | --- | --- | --- | --- |"]
        out += [f"| {i.rel} | {i.metric} | {i.p99_ms} | {i.p99_9_ms} | {i.max_ms} | "
                f"{i.in_flight} |" for i in intervals[:50]]
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(out) + "\n"


def _workload_text(w: Workload) -> str:
    return (f"{w.api}, {w.dataset}, {w.input_tokens} in → {w.output_tokens} out, "
            f"{w.mode} loop")


def to_json(all_rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in all_rows]


# ---- compare -----------------------------------------------------------------------------


def read_eval(path: Path) -> EvalState:
    """An eval directory's eval.json (or the file itself); ValueError in words."""
    f = path / "eval.json" if path.is_dir() else path
    try:
        return read_state(f.read_bytes())
    except FileNotFoundError:
        raise ValueError(f"{path}: no eval.json (is it a `tokentop eval --out` directory?)") \
            from None
    except msgspec.ValidationError as e:  # JSON, not an eval's (a DecodeError: caught first)
        raise ValueError(f"{f} is not a tokentop eval ({e})") from None
    except (OSError, msgspec.DecodeError) as e:
        raise ValueError(f"{f}: cannot be read ({e})") from None


def compare(evals: list[tuple[str, EvalState]]) -> str:
    """Rows side by side: each eval's value, the change against the first in per cent and
    which is better; the lines that say where the workloads (or the profiles) differ."""
    names = [n for n, _ in evals]
    by_eval = [{r.key: r for r in rows(e.phases)} for _, e in evals]
    lines = _differences(evals)
    keys = list(by_eval[0])
    for table_rows in by_eval[1:]:
        keys += [k for k in table_rows if k not in keys]
    head = "  ".join(f"{n[-18:]:>18}" for n in names)
    lines.append(f"{'figure':<58}{head}")
    for key in keys:
        first = by_eval[0].get(key)
        cells = []
        for i, table_rows in enumerate(by_eval):
            r = table_rows.get(key)
            cell = units.NA if r is None else shown(r) + (f" {r.verdict}" if r.verdict else "")
            if i and r is not None and first is not None:
                cell += _change(first, r)
            cells.append(f"{cell:>18}")
        lines.append(f"{key[:57]:<58}{'  '.join(cells)}")
    return "\n".join(lines)


def _change(a: Row, b: Row) -> str:
    if a.value is None or b.value is None or a.value == 0:
        return ""
    pct = (b.value - a.value) / abs(a.value) * 100
    if a.better is None or abs(pct) < 0.5:
        return f" {pct:+.0f}%"
    good = (pct > 0) == (a.better == "higher")
    return f" {pct:+.0f}% {'better' if good else 'worse'}"


def _differences(evals: list[tuple[str, EvalState]]) -> list[str]:
    first_name, first = evals[0]
    lines = []
    for name, e in evals[1:]:
        for key in Workload.__struct_fields__:
            was, value = getattr(first.workload, key), getattr(e.workload, key)
            if was != value:
                lines.append(f"note: the workloads differ: {key} is {was!r} in {first_name}, "
                             f"{value!r} in {name}")
        if e.quick != first.quick:
            lines.append(f"note: {first_name} and {name} ran different profiles (quick / full)")
        if not e.finished:
            lines.append(f"note: {name} did not finish: its missing rows are not a result")
    if not first.finished:
        lines.append(f"note: {first_name} did not finish: its missing rows are not a result")
    return lines
