"""`tokentop eval compare`: evals side by side, row by row, each later eval judged against
the first; what differs between them (header, workload, profile) said first.

Rows are matched by `Row.id`, what they measure, never by their label: a label may carry
the load ("long tail (6 streams, 61 s)"), and two servers whose knees differ run the same
phase at different loads. The load is a column of its own, per eval.

The noise rule (NOISE_BAND_PCT, `judge`): a difference is called better or worse only
beyond the noise, else "same within noise".
* repeats on both sides (each row with a 95 % interval): beyond the noise when the two
  intervals do not overlap. Conservative (non-overlapping 95 % intervals are a difference
  at well under 5 %), and it needs no more than the interval, however it was computed.
* one run on either side: beyond the noise when the change exceeds ±NOISE_BAND_PCT %.
* from 0 (0 errors, 0 breakouts): any change is beyond the band; it is marked "from 0",
  with no per cent of zero.
A row whose `better` is None (the knee's load, GPU utilisation) is a fact: its change is
shown, never judged.

Every output ends with a verdict per scenario of the first eval's plan (loadgen.eval.
scenarios): which eval to pick for real-time work, batch work, production, judged by this
noise rule on the rows that matter to each.
"""

from __future__ import annotations

import csv
import io
import json
import math
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from loadgen.eval.judging import (
    NOISE_BAND_PCT,
    Change,
    Judgement,
    Line,
    Noise,
    judge,
)
from loadgen.eval.judging import letter as _letter
from loadgen.eval.matrix import Row, shown, state_rows
from loadgen.eval.results import EvalState, GpuInfo, Header, Workload
from loadgen.model import units
from loadgen.model.text import plain

if TYPE_CHECKING:
    from loadgen.eval.scenarios import Verdicts

FIGURE_WIDTH = 40  # the text's figure column: longer names wrap, never cut
FORMATS = ("text", "md", "csv", "json")


@dataclass(frozen=True)
class Comparison:
    names: tuple[str, ...]  # each eval's name (its directory), the first the baseline
    labels: tuple[str, ...]  # each eval's --label, "" when none
    lines: tuple[Line, ...]
    differences: tuple[str, ...]  # where the evals differ, one sentence each
    notes: tuple[str, ...]  # the noise rules used
    # the verdict per scenario of the plan (loadgen.eval.scenarios), the outputs' last section
    scenarios: Verdicts | None = None
    # the API conformance checks side by side (loadgen.eval.conformance), text and md only:
    # csv and json carry each check as its own row
    features: tuple[str, ...] = ()


@dataclass(frozen=True)
class Regression:
    """A judged row worse than the first eval's beyond the gate's per cent and the noise."""

    line: Line
    eval: int  # index into Comparison.names
    verdict: bool = False  # the plan's limit held in the first eval and broke in this one

    def text(self) -> str:
        """'latency & throughput / TTFT P99 [baseline.ttft.p99]: B +25.0% worse'"""
        r, change = self.line.row, self.line.changes[self.eval]
        said = change.text() if change is not None else ""
        if self.verdict:
            said = (said + "; " if said else "") + f"FAIL where A passed ({r.limit})"
        return f"{r.dimension} / {plain(r.figure)} [{r.id}]: {_letter(self.eval)} {said}"


def regressions(c: Comparison, pct: float) -> list[Regression]:
    """The judged rows of the later evals worse than the first's by more than `pct` per
    cent and beyond the noise (from 0 is beyond any per cent), and the rows whose verdict
    went from PASS to FAIL."""
    out = []
    for line in c.lines:
        first = line.rows[0]
        for i, change in enumerate(line.changes):
            row = line.rows[i]
            # a limit of the plan that held in the first eval and broke here fails the gate
            # whatever the per cent: it is what the plan says the server must do
            broke = i > 0 and first is not None and row is not None \
                and first.verdict == "PASS" and row.verdict == "FAIL"
            worse = change is not None and change.judgement is Judgement.WORSE \
                and (change.pct is None or abs(change.pct) > pct)
            if worse or broke:
                out.append(Regression(line, i, verdict=broke))
    return out


@dataclass(frozen=True)
class Gate:
    """--fail-on-regression PCT: the rows that failed it (none: it passed)."""

    pct: float
    failed: tuple[Regression, ...]

    def lines(self) -> list[str]:
        """Its verdict, then each row that failed it."""
        if not self.failed:
            return [f"regression gate: passed (no judged row worse than A by more than "
                    f"{self.pct:g} % beyond the noise, no limit broken that A met)"]
        n = len(self.failed)
        return [f"regression gate: FAILED, {n} row{'s' if n > 1 else ''} worse than A by "
                f"more than {self.pct:g} % beyond the noise, or failing a limit A met:"] + [
            f"  {r.text()}" for r in self.failed]


def gate(c: Comparison, pct: float) -> Gate:
    return Gate(pct, tuple(regressions(c, pct)))


# ---- matching -----------------------------------------------------------------------------


def comparison(evals: Sequence[tuple[str, EvalState]]) -> Comparison:
    """The evals' rows matched by id, each later one judged against the first."""
    by_eval = [{r.id: r for r in state_rows(e)} for _, e in evals]
    lines = []
    for id_ in _ids([list(t) for t in by_eval]):
        row_of = tuple(t.get(id_) for t in by_eval)
        first = row_of[0]
        changes = tuple(None if i == 0 or first is None or r is None else judge(first, r)
                        for i, r in enumerate(row_of))
        lines.append(Line(id_, row_of, changes))
    from loadgen.eval.conformance import conformance_table
    from loadgen.eval.scenarios import verdicts  # it judges with this module's judge

    return Comparison(
        names=tuple(n for n, _ in evals),
        labels=tuple(_label(e) for _, e in evals),
        lines=tuple(lines), differences=tuple(differences(evals)),
        notes=tuple(_noise_notes(lines)), scenarios=verdicts(evals, lines),
        features=tuple(conformance_table(evals)))


def _ids(orders: list[list[str]]) -> list[str]:
    """Every id once, in the first eval's order; an id only a later eval has comes after
    the id it follows there, so it stays in its dimension."""
    out = list(orders[0])
    for order in orders[1:]:
        for before, id_ in zip([None, *order], order, strict=False):
            if id_ not in out:
                out.insert(out.index(before) + 1 if before in out else len(out), id_)
    return out


def _noise_notes(lines: Iterable[Line]) -> list[str]:
    used = {c.noise for line in lines for c in line.changes if c is not None}
    out = []
    if Noise.INTERVALS in used:
        out.append("repeated on both sides: a difference is beyond the noise when the two "
                   "95 % intervals do not overlap")
    if Noise.BAND in used:
        band = f"{NOISE_BAND_PCT:g} %"
        out.append(f"one run each: differences of {band} or less are called the same within "
                   f"noise; --repeat N measures the noise")
    if Noise.RESOLUTION in used:
        out.append("a time dated by the tick or by a probe (a recovery, an MTTR): a change "
                   "within one tick (or probe) is the same")
    return out


# ---- differences --------------------------------------------------------------------------

# the header's fields compare names when they differ (date and why always may)
HEADER_FIELDS = ("label", "meta", "engine", "engine_version", "model", "gpus", "host_cpu",
                 "host_cores", "host_memory_gb", "tokentop_version", "plan_digest",
                 "load_from")


def differences(evals: Sequence[tuple[str, EvalState]]) -> list[str]:
    """Where each later eval differs from the first: header, workload, profile; and the
    evals that did not finish."""
    first_name, first = evals[0]
    lines = []
    for name, e in evals[1:]:
        lines += _header_differences(first_name, first, name, e)
        for key in Workload.__struct_fields__:
            was, value = getattr(first.workload, key), getattr(e.workload, key)
            if was != value:
                lines.append(f"the workloads differ: {key} is {_value(was)} in {first_name}, "
                             f"{_value(value)} in {name}")
        if e.quick != first.quick:
            lines.append(f"{first_name} and {name} ran different profiles (quick / full)")
    lines += [f"{name} did not finish: its missing rows are not a result"
              for name, e in evals if not e.finished]
    return lines


def _header_differences(first_name: str, first: EvalState, name: str,
                        e: EvalState) -> list[str]:
    if first.header is UNSET or e.header is UNSET:
        if first.header is UNSET and e.header is UNSET:
            return []
        older = first_name if first.header is UNSET else name
        return [f"{older} has no header (an older eval): engine, model, GPUs and plan are "
                f"not compared"]
    out = []
    for key in HEADER_FIELDS:
        was, value = _field(first.header, key), _field(e.header, key)
        if was != value:
            out.append(f"{key.replace('_', ' ')} is {_value(was)} in {first_name}, "
                       f"{_value(value)} in {name}")
    return out


def _field(h: Header, key: str) -> Any:
    """A header's field; the load's origin unset is this machine (an eval without a fleet,
    or from before it could have one)."""
    v = getattr(h, key)
    return "this machine" if key == "load_from" and v is UNSET else v


def _value(v: Any) -> str:
    """A header's or workload's value in words: text quoted and made plain (it may be a
    server's), GPUs as '2 × NVIDIA H200', unknown as n/a."""
    if v is None or v == "" or v == [] or v == {}:
        return units.NA
    if isinstance(v, list) and all(isinstance(g, GpuInfo) for g in v):
        names = [g.name or "unknown GPU" for g in v]
        return ", ".join(f"{names.count(n)} × {plain(n)}" for n in dict.fromkeys(names))
    if isinstance(v, dict):
        return ", ".join(f"{plain(str(k))}={plain(str(x))}" for k, x in v.items())
    if isinstance(v, str):
        return repr(plain(v))
    return str(v)


def _label(e: EvalState) -> str:
    return plain(e.header.label or "") if isinstance(e.header, Header) else ""


# ---- cells --------------------------------------------------------------------------------



def _texts(line: Line) -> list[str]:
    """Each eval's value as text, alike across the row: if any value has decimals, a whole
    one gets them too ("3.00 s" beside "3.01 s", not "3 s"); with its verdict and its 95 %
    interval when it has them."""
    mixed = any(r is not None and r.value is not None and not float(r.value).is_integer()
                for r in line.rows)
    out = []
    for r in line.rows:
        if r is None:
            out.append(units.NA)
            continue
        text = _number(r, r.value, mixed)
        if r.interval is not None and r.value is not None:
            low, high = (_number(r, v, True) for v in r.interval)
            text += f" [{low} – {high}]"
        out.append(text + (f" {r.verdict}" if r.verdict else ""))
    return out


def _number(r: Row, value: float | None, mixed: bool) -> str:
    """`value` in r's unit by matrix.shown; a whole value in a row with decimals is shown
    as the value just above it, so that it gets the decimals its size calls for."""
    if mixed and value is not None and value != 0 and float(value).is_integer():
        value = math.nextafter(value, math.inf)
    return shown(replace(r, value=value))


def _row_notes(c: Comparison, line: Line) -> list[str]:
    """What a reader must know about a row beside its values: the evals that have no such
    row (when there is a value to miss), a row another eval names otherwise, a value's
    validity flags (once for the evals that share them)."""
    out = []
    present = [i for i, r in enumerate(line.rows) if r is not None]
    valued = any(line.rows[i].value is not None for i in present)  # type: ignore[union-attr]
    if len(present) < len(line.rows) and valued:
        has = ", ".join(_letter(i) for i in present)
        out.append(f"only in {has}: matched by what it measures ({line.id}), not by label")
    named = line.row.figure
    out += [f"{_letter(i)} names it {plain(r.figure)!r}"
            for i, r in enumerate(line.rows) if r is not None and r.figure != named]
    flagged: dict[tuple[str, ...], list[str]] = {}
    for i, r in enumerate(line.rows):
        if r is not None and r.flags:
            flagged.setdefault(r.flags, []).append(_letter(i))
    out += [f"{', '.join(who)} flagged: " + "; ".join(plain(f) for f in flags)
            for flags, who in flagged.items()]
    return out


def _columns(c: Comparison) -> list[str]:
    head = ["dimension", "figure"]
    for i in range(len(c.names)):
        head += [_letter(i), f"{_letter(i)} load"]
        if i:
            head.append(f"{_letter(i)} vs A")
    return [*head, "notes"]


def _cells(c: Comparison, line: Line) -> list[str]:
    r = line.row
    cells = [r.dimension, plain(r.figure)]
    for i, (text, row, change) in enumerate(zip(_texts(line), line.rows, line.changes,
                                                strict=True)):
        cells += [text, plain(row.load) if row is not None else ""]
        if i:
            cells.append(change.text() if change is not None else "")
    return [*cells, "; ".join(_row_notes(c, line))]


def _legend(c: Comparison) -> list[str]:
    out = []
    for i, name in enumerate(c.names):
        label = f" (label {c.labels[i]!r})" if c.labels[i] else ""
        role = ": the baseline, the others are judged against it" if i == 0 else ""
        out.append(f"{_letter(i)} = {plain(name)}{label}{role}")
    return out


# ---- formats ------------------------------------------------------------------------------


def compare(evals: Sequence[tuple[str, EvalState]]) -> str:
    """The terminal's text of the evals compared."""
    return render(comparison(evals), "text")


def render(c: Comparison, fmt: str, judged: Gate | None = None) -> str:
    """The comparison in one of FORMATS, with the regression gate's result if one was
    asked for."""
    return {"text": _text, "md": _md, "csv": _csv, "json": _json}[fmt](c, judged)


def _text(c: Comparison, judged: Gate | None) -> str:
    out = _legend(c) + [f"note: {d}" for d in c.differences] + [f"note: {n}" for n in c.notes]
    head = _columns(c)[1:-1]  # the dimension is a heading, the notes go under their row
    table = [(line, _cells(c, line)[1:-1]) for line in c.lines]
    widths = [max([len(h)] + [len(cells[k]) for _, cells in table]) for k, h in
              enumerate(head)]
    widths[0] = FIGURE_WIDTH
    out.append("")
    out.append(_aligned(head, widths))
    dimension = None
    for line, cells in table:
        if line.row.dimension != dimension:
            dimension = line.row.dimension
            out.append(dimension)
        names = textwrap.wrap(cells[0], FIGURE_WIDTH - 2, subsequent_indent="  ") or [""]
        out.append(_aligned(["  " + names[0], *cells[1:]], widths))
        out += ["  " + n for n in names[1:]]
        out += [f"    · {n}" for n in _row_notes(c, line)]
    out += ["", *c.features] if c.features else []
    out += judged.lines() if judged else []
    out += c.scenarios.text_lines() if c.scenarios else []
    return "\n".join(out)


def _aligned(cells: list[str], widths: list[int]) -> str:
    """The figure left, the values right, two spaces between columns."""
    first, *rest = cells
    return (f"{first:<{widths[0]}}  " + "  ".join(
        f"{cell:>{w}}" for cell, w in zip(rest, widths[1:], strict=True))).rstrip()


def _md(c: Comparison, judged: Gate | None) -> str:
    out = [f"- {x}" for x in _legend(c) + list(c.differences) + list(c.notes)]
    head = _columns(c)
    out += ["", "| " + " | ".join(head) + " |",
            "|" + "|".join("---" if k < 2 or h == "notes" else "---:"
                           for k, h in enumerate(head)) + "|"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in _cells(c, line)) + " |"
            for line in c.lines]
    out += ["", "```", *c.features, "```"] if c.features else []
    if judged:
        out += ["", *(f"**{g.strip()}**" for g in judged.lines())]
    out += c.scenarios.md_lines() if c.scenarios else []
    return "\n".join(out)


def _csv(c: Comparison, judged: Gate | None) -> str:
    """One line per row id: what it is, then per eval its value and what goes with it, and
    per later eval the change against the first; then, per scenario, the row's part in it
    and the scenario's verdict. The differences are in md, text, json."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    head = ["id", "dimension", "figure", "unit", "better"]
    for i in range(len(c.names)):
        x = _letter(i)
        head += [f"{x} value", f"{x} low", f"{x} high", f"{x} repeats", f"{x} samples",
                 f"{x} load", f"{x} verdict", f"{x} flags"]
        if i:
            head += [f"{x} change %", f"{x} judgement"]
    w.writerow(head + (c.scenarios.csv_head() if c.scenarios else []))
    for line in c.lines:
        r = line.row
        cells: list[Any] = [line.id, r.dimension, plain(r.figure), r.unit, r.better or ""]
        for i, (row, change) in enumerate(zip(line.rows, line.changes, strict=True)):
            cells += _csv_cells(row)
            if i:
                cells += _csv_change(change)
        w.writerow(cells + (c.scenarios.csv_cells(line.id, len(c.names)) if c.scenarios
                            else []))
    return buf.getvalue().rstrip("\n")


def _csv_cells(r: Row | None) -> list[Any]:
    if r is None:
        return [""] * 8
    low, high = r.interval or ("", "")
    return ["" if r.value is None else r.value, low, high, r.repeats,
            "" if r.samples is None else r.samples, plain(r.load), r.verdict or "",
            "; ".join(plain(f) for f in r.flags)]


def _csv_change(change: Change | None) -> list[Any]:
    if change is None:
        return ["", Judgement.MISSING.value]
    pct = "from 0" if change.from_zero else ("" if change.pct is None else round(change.pct, 3))
    return [pct, change.judgement.value]


def _json(c: Comparison, judged: Gate | None) -> str:
    doc = {
        "evals": [{"column": _letter(i), "name": name, "label": c.labels[i] or None}
                  for i, name in enumerate(c.names)],
        "differences": list(c.differences),
        "noise": {"band_pct": NOISE_BAND_PCT, "rules": list(c.notes)},
        "rows": [_json_line(line) for line in c.lines],
        "gate": None if judged is None else {
            "fail_on_regression_pct": judged.pct, "passed": not judged.failed,
            "failed": [{"id": r.line.id, "eval": _letter(r.eval)} for r in judged.failed]},
        "scenarios": c.scenarios.json() if c.scenarios else None,
    }
    return json.dumps(doc, indent=2, ensure_ascii=False)


def _json_line(line: Line) -> dict[str, Any]:
    r = line.row
    return {
        "id": line.id, "dimension": r.dimension, "figure": plain(r.figure), "unit": r.unit,
        "better": r.better,
        "evals": [None if x is None else {
            "value": x.value, "interval": list(x.interval) if x.interval else None,
            "repeats": x.repeats, "samples": x.samples, "load": plain(x.load),
            "verdict": x.verdict, "flags": [plain(f) for f in x.flags],
            "note": plain(x.note), "figure": plain(x.figure)} for x in line.rows],
        "against_first": [None if ch is None else {
            "change_pct": ch.pct, "from_zero": ch.from_zero, "to_zero": ch.to_zero,
            "judgement": ch.judgement.value, "noise": ch.noise.value or None}
            for ch in line.changes[1:]],
    }
