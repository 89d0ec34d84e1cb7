"""The eval's document: the matrix as text for the terminal and as eval.md, with what was
measured (the header) and the phases, each linked to its own report."""

from __future__ import annotations

from pathlib import Path

from loadgen.eval.matrix import Row, shown
from loadgen.eval.results import EvalState, Workload


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
