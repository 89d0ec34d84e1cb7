"""The eval's one matrix: a row per dimension and figure, from what the phases found
(loadgen.eval.battery), with the SLO verdict where one applies; as text for the terminal,
as eval.md, and side by side for `tokentop eval compare`.

A row whose phase did not run, or whose figure this machine cannot give (no GPU energy
counter, a soak too short to judge a slope), is kept with the reason in its note: every
row is filled or explained.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec


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


def rows(results: dict[str, dict]) -> list[Row]:
    out: list[Row] = []
    for build in (_baseline, _ramp, _long_tail, _faults, _leaks, _efficiency, _scaling):
        out += list(build(results))
    return out


def _phase(results: dict, name: str) -> tuple[dict, str]:
    """(figures, "") of a phase that ran, or ({}, why it did not)."""
    r = results.get(name)
    if r is None:
        return {}, f"{name} did not run (the eval stopped before it)"
    if r.get("status") != "done":
        return {}, f"{name} {r.get('status')}: {r.get('why')}"
    return r.get("figures") or {}, ""


def _ms(figures: dict, metric: str, q: str) -> float | None:
    return ((figures.get("latency_ms") or {}).get(metric) or {}).get(q)


def _baseline(results: dict) -> Iterator[Row]:
    f, why = _phase(results, "baseline")
    dim = "latency & throughput" + (f" ({f['load']})" if f.get("load") else "")
    yield Row(dim, "requests/s", f.get("req_s"), "req/s", "higher", note=why)
    yield Row(dim, "output tokens/s", f.get("output_tok_s"), "tok/s", "higher", note=why)
    yield Row(dim, "goodput", f.get("goodput_req_s"), "req/s", "higher",
              note=why or ("" if f.get("goodput_req_s") is not None else "no per-request SLO"))
    rate = f.get("error_rate")
    yield Row(dim, "error rate", None if rate is None else rate * 100, "%", "lower", note=why)
    for metric, qs in (("ttft", ("p50", "p90", "p99", "p99.9")), ("itl", ("p50", "p99", "p99.9")),
                       ("e2e", ("p50", "p99"))):
        for q in qs:
            yield Row(dim, f"{metric.upper()} {q.upper()}", _ms(f, metric, q), "ms", "lower",
                      note=why)
    for t in f.get("thresholds") or []:
        value, unit = _threshold_value(t)
        yield Row("SLO", t.get("text", "?"), value, unit, None,
                  "PASS" if t.get("passed") else "FAIL", note=t.get("shown", ""))


def _threshold_value(t: dict) -> tuple[float | None, str]:
    """A whole-run threshold's measured value in the unit a reader expects (ms for times)."""
    measured = t.get("measured")
    if measured is None:
        return None, ""
    if t.get("unit") == "us":
        return measured / 1000.0, "ms"
    if t.get("unit") in ("fraction", "ratio"):
        return measured * 100.0, "%"
    return float(measured), str(t.get("unit") or "")


def _ramp(results: dict) -> Iterator[Row]:
    f, why = _phase(results, "ramp")
    unit = f.get("unit", "streams")
    knee, best = f.get("knee"), f.get("best_goodput")
    knee_why = why or ("" if knee else "no knee: throughput scaled to the last step")
    dim = "pressure ramp"
    yield Row(dim, "knee (load)", knee and knee["load"], unit, "higher", note=knee_why)
    yield Row(dim, "output tokens/s at the knee", knee and knee["output_tok_s"], "tok/s",
              "higher", note=knee_why)
    yield Row(dim, "TTFT P99 at the knee", knee and (knee.get("ttft_ms") or {}).get("p99"),
              "ms", "lower", note=knee_why)
    best_why = why or ("" if best else "no per-request SLO, or no step met it")
    yield Row(dim, "max goodput", best and best.get("goodput_req_s"), "req/s", "higher",
              note=best_why or f"at {best['load']:g} {unit}")
    yield Row(dim, "max output tokens/s", f.get("max_output_tok_s"), "tok/s", "higher",
              note=why)


def _long_tail(results: dict) -> Iterator[Row]:
    f, why = _phase(results, "long_tail")
    dim = "long tail" + (f" ({f['load']}, {_span(f['seconds'])})" if f.get("load") else "")
    tail = f.get("long_tail") or {}
    counts = tail.get("counts") or {}
    rule = tail.get("rule", "")
    for metric in ("ttft", "itl"):
        n = counts.get(metric)
        yield Row(dim, f"intervals whose {metric.upper()} tail breaks out", n, "", "lower",
                  note=why or rule)
    avail = f.get("availability")
    yield Row(dim, "availability", None if avail is None else avail * 100, "%", "higher",
              note=why)
    yield Row(dim, "TTFT P99.9", _ms(f, "ttft", "p99.9"), "ms", "lower", note=why)


def _faults(results: dict) -> Iterator[Row]:
    f, why = _phase(results, "faults")
    dim = "stability under faults"
    if why:
        yield Row(dim, "success rate under faults", None, "%", "higher", note=why)
        yield Row(dim, "MTTR after a kill and restart", None, "s", "lower", note=why)
        return
    for fault in f.get("faults") or []:
        yield from _fault_rows(dim, fault)
    mttr = (f.get("mttr_s") or {}).get("any")
    yield Row(dim, "MTTR of the outages seen", mttr, "s", "lower",
              note="" if mttr is not None else "no outage (under OUTAGE_MIN_S of failure)")
    chaos = f.get("chaos")
    if chaos is None:
        note = "not run: opt-in, --chaos-restart-cmd CMD"
    else:
        note = chaos.get("why") or "from the kill to the first success after it"
    yield Row(dim, "MTTR after a kill and restart", (chaos or {}).get("mttr_s"), "s", "lower",
              note=note)


def _fault_rows(dim: str, fault: dict) -> Iterator[Row]:
    name = _fault_name(fault)
    rate = fault.get("success_rate")
    errors = ", ".join(f"{n}× {k}" for k, n in sorted((fault.get("errors") or {}).items()))
    yield Row(dim, f"success rate under {name}", None if rate is None else rate * 100, "%",
              "higher", note=errors or ("no request ended in it" if rate is None else ""))
    if fault.get("fault") == "blackhole":
        truth = (fault["end"] - fault["start"]) if fault.get("end") else None
        yield Row(dim, f"silence seen in {name}", fault.get("silence_s"), "s", None,
                  note="" if truth is None else f"{truth:.2f} s at the proxy")
    if fault.get("fault") in ("blackhole", "reset"):
        yield Row(dim, f"recovery after {name}", fault.get("recovery_s"), "s", "lower",
                  note="" if fault.get("recovery_s") is not None else "no success after it")


def _fault_name(fault: dict) -> str:
    p = fault.get("params") or {}
    kind = fault.get("fault")
    if kind == "latency":
        return f"latency {p.get('ms', 0):g}±{p.get('jitter_ms', 0):g} ms"
    if kind == "reset":
        return f"resets ({p.get('probability', 0) * 100:g} %)"
    if kind == "blackhole":
        return f"blackhole {p.get('seconds', 0):g} s"
    if kind == "bandwidth":
        return f"bandwidth {p.get('bytes_per_s', 0) / 1024:g} KiB/s"
    return str(kind)


def _leaks(results: dict) -> Iterator[Row]:
    f, why = _phase(results, "leaks")
    dim = "leaks"
    for key, name in (("server_rss", "server RSS growth"), ("gpu_memory", "GPU memory growth")):
        s = f.get(key) or {}
        verdict = None if s.get("passed") is None else ("PASS" if s["passed"] else "FAIL")
        note = why or s.get("why") or ""
        if not why and not f.get("judged"):
            note = (note + "; " if note else "") + (
                f"not judged: soak {_span(f.get('soak_s') or 0)} < {_span(f['min_soak_s'])}")
        elif verdict:
            note = f"limit {s.get('limit_mb_h'):g} MB/h"
        yield Row(dim, name, s.get("slope_mb_h"), "MB/h", "lower", verdict, note)


def _efficiency(results: dict) -> Iterator[Row]:
    f, why = _phase(results, "efficiency")
    dim = "efficiency"
    simulated = (f.get("baseline") or {}).get("gpu_source") == "simulated"
    for at in ("baseline", "knee"):
        e = f.get(at) or {}
        note = why or e.get("energy_why") or ("" if e else f"not measured at the {at}")
        note = note or ("the simulator's pretend GPU" if simulated else "")
        yield Row(dim, f"output tokens per joule ({at})", e.get("tokens_per_joule"), "tok/J",
                  "higher", note=note)
        yield Row(dim, f"requests/s per watt ({at})", e.get("req_s_per_w"), "req/s/W",
                  "higher", note=why or ("" if e.get("req_s_per_w") else "no GPU power"))
    base = f.get("baseline") or {}
    dcgm = base.get("dcgm") or {}
    for key, name in (("sm_active", "SM activity"), ("tensor_active", "tensor-pipe activity"),
                      ("dram_active", "DRAM activity (memory bandwidth)")):
        value = dcgm.get(key)
        yield Row(dim, f"{name} (baseline, DCGM)", None if value is None else value * 100, "%",
                  None, note=why or ("" if value is not None else dcgm.get("why") or "n/a"))
    yield Row(dim, "output tokens per joule (baseline, DCGM)", dcgm.get("tokens_per_joule"),
              "tok/J", "higher", note=why or ("" if dcgm.get("tokens_per_joule") is not None
                                             else dcgm.get("why") or "no energy counter"))
    yield Row(dim, "GPU utilisation (baseline)", base.get("gpu_util_pct"), "%", None,
              note=why or ("" if base.get("gpu_util_pct") is not None else "no GPU"))
    yield Row(dim, "GPU memory per request in flight", base.get("gpu_memory_mb_per_in_flight"),
              "MB", "lower", note=why or ("" if base.get("gpu_memory_mb_per_in_flight")
                                          is not None else "no GPU"))


def _scaling(results: dict) -> Iterator[Row]:
    f, why = _phase(results, "scaling")
    dim = "scaling"
    if why:
        yield Row(dim, "throughput against N × one", None, "%", "higher", note=why)
        return
    for row in f.get("rows") or []:
        n = row["targets"]
        yield Row(dim, f"output tokens/s on {n} target{'s' if n > 1 else ''}",
                  row["output_tok_s"], "tok/s", "higher", note=f.get("kind", ""))
        if n > 1:
            eff = row.get("efficiency")
            yield Row(dim, f"efficiency on {n} (against {n} × one)",
                      None if eff is None else eff * 100, "%", "higher")


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


# ---- text --------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
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


def table(all_rows: list[Row]) -> str:
    """The matrix for a terminal, one line a row, grouped by dimension."""
    lines: list[str] = []
    dim = None
    width = max((len(r.figure) for r in all_rows), default=10)
    for r in all_rows:
        if r.dimension != dim:
            dim = r.dimension
            lines.append(f"{dim}")
        value = f"{fmt(r.value)} {r.unit}".rstrip()
        verdict = f" {r.verdict}" if r.verdict else ""
        note = f"  ({r.note})" if r.note else ""
        lines.append(f"  {r.figure:<{width}}  {value:>14}{verdict}{note}")
    return "\n".join(lines)


def markdown(results: dict, all_rows: list[Row], meta: dict, plots: list[str]) -> str:
    out = ["# tokentop eval", "", f"Target: {meta.get('target')}  ",
           f"Workload: {_workload_text(meta.get('workload') or {})}  ",
           f"Profile: {'quick' if meta.get('quick') else 'full'}; "
           f"finished: {'yes' if meta.get('finished') else 'no (resume with the same --out)'}",
           "", "| dimension | figure | value | verdict | note |", "| --- | --- | --- | --- | --- |"]
    for r in all_rows:
        out.append(f"| {r.dimension} | {r.figure} | {fmt(r.value)} {r.unit} | "
                   f"{r.verdict or ''} | {r.note} |")
    out += ["", "## Phases", ""]
    for name, r in results.items():
        extra = f" — {r['why']}" if r.get("why") else ""
        where = f" (`{r['run_dir']}`)" if r.get("run_dir") else ""
        report = Path(r["run_dir"]) / "report.md" if r.get("run_dir") else None
        # the long tail's intervals, outages and drift in full: that phase's own report
        link = f"; [its report]({report})" if report is not None and report.exists() else ""
        out.append(f"* **{name}**: {r.get('status')}{extra}{where}, "
                   f"{r.get('seconds', 0):g} s{link}")
    tail = ((results.get("long_tail") or {}).get("figures") or {}).get("long_tail") or {}
    if tail.get("intervals"):
        out += ["", "## Long-tail intervals (the soak's ticks whose tail broke out)", "",
                "| at (s) | metric | P99 (ms) | P99.9 (ms) | max (ms) | in flight |",
                "| --- | --- | --- | --- | --- | --- |"]
        out += [f"| {i.get('rel')} | {i.get('metric')} | {i.get('p99_ms')} | "
                f"{i.get('p99.9_ms')} | {i.get('max_ms')} | {i.get('in_flight')} |"
                for i in tail["intervals"][:50]]
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(out) + "\n"


def _workload_text(w: dict) -> str:
    return (f"{w.get('api')}, {w.get('dataset')}, {w.get('input_tokens')} in → "
            f"{w.get('output_tokens')} out, {w.get('mode')} loop")


def to_json(all_rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in all_rows]


# ---- compare -----------------------------------------------------------------------------


def read_eval(path: Path) -> dict:
    """An eval directory's eval.json (or the file itself); ValueError in words."""
    f = path / "eval.json" if path.is_dir() else path
    try:
        data = msgspec.json.decode(f.read_bytes())
    except FileNotFoundError:
        raise ValueError(f"{path}: no eval.json (is it a `tokentop eval --out` directory?)") \
            from None
    except (OSError, msgspec.DecodeError) as e:
        raise ValueError(f"{f}: cannot be read ({e})") from None
    if not isinstance(data, dict) or "phases" not in data:
        raise ValueError(f"{f} is not a tokentop eval")
    return data


def compare(evals: list[tuple[str, dict]]) -> str:
    """Rows side by side: each eval's value, the change against the first in per cent and
    which is better; the lines that say where the workloads (or the profiles) differ."""
    names = [n for n, _ in evals]
    by_eval = [{r.key: r for r in rows(e.get("phases") or {})} for _, e in evals]
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
            cell = "–" if r is None else fmt(r.value) + (f" {r.verdict}" if r.verdict else "")
            if i and r is not None and first is not None:
                cell += _change(first, r)
            cells.append(f"{cell:>18}")
        unit = (first or next(t[key] for t in by_eval if key in t)).unit
        lines.append(f"{(key + (f' ({unit})' if unit else ''))[:57]:<58}{'  '.join(cells)}")
    return "\n".join(lines)


def _change(a: Row, b: Row) -> str:
    if a.value is None or b.value is None or a.value == 0:
        return ""
    pct = (b.value - a.value) / abs(a.value) * 100
    if a.better is None or abs(pct) < 0.5:
        return f" {pct:+.0f}%"
    good = (pct > 0) == (a.better == "higher")
    return f" {pct:+.0f}% {'better' if good else 'worse'}"


def _differences(evals: list[tuple[str, dict]]) -> list[str]:
    first_name, first = evals[0]
    lines = []
    for name, e in evals[1:]:
        for key, value in (e.get("workload") or {}).items():
            if (first.get("workload") or {}).get(key) != value:
                lines.append(f"note: the workloads differ: {key} is "
                             f"{(first.get('workload') or {}).get(key)!r} in {first_name}, "
                             f"{value!r} in {name}")
        if bool(e.get("quick")) != bool(first.get("quick")):
            lines.append(f"note: {first_name} and {name} ran different profiles (quick / full)")
        if not e.get("finished"):
            lines.append(f"note: {name} did not finish: its missing rows are not a result")
    if not first.get("finished"):
        lines.append(f"note: {first_name} did not finish: its missing rows are not a result")
    return lines
