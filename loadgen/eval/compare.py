"""`tokentop eval compare`: evals side by side, row by row, with the change against the
first and which is better; the lines that say where the evals differ."""

from __future__ import annotations

from loadgen.eval.matrix import Row, rows, shown
from loadgen.eval.results import EvalState, Workload
from loadgen.model import units


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
