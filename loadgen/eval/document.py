"""The eval's document: the matrix as text for the terminal (`table`), as eval.md
(`markdown`) and as one self-contained eval.html (`html`), each with what was measured
(the header), the phases linked to their own reports, the long tail's intervals, the plots.

The three are made from the same parts (`header_items`, `phase_items`, `value_text`,
`flag_marks`), so they say the same thing. Links are relative to the eval's directory (`at`),
so the directory reads the same after a move or an scp; eval.html needs nothing beside it
(its plots are inside it, as data: URIs). Text from outside (a server's strings, a row's note
that quotes an error) is made plain (header.plain) and escaped for Markdown or HTML.
"""

from __future__ import annotations

import base64
import html as html_
import os
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

from msgspec import UNSET

from loadgen.eval.header import plain
from loadgen.eval.matrix import Row, shown
from loadgen.eval.results import EvalState, GpuInfo, Header, Workload
from loadgen.model import units

WIDTH = 100  # the terminal's table fits this many columns (notes wrap, nothing is cut)
INTERVALS_MAX = 50  # long-tail intervals listed; the phase's own report has every one
NOTE_LIMIT = 400  # characters of a row's note kept (a quoted error can be long)


# ---- the parts --------------------------------------------------------------------------------


def header_items(state: EvalState) -> list[tuple[str, str]]:
    """(what, its text) for the head of eval.md and eval.html: a field not found says why."""
    h = state.header
    items = [("target", plain(state.target)), ("workload", _workload_text(state.workload)),
             ("profile", "quick" if state.quick else "full"),
             ("finished", "yes" if state.finished else "no (resume with the same --out)")]
    if h is UNSET:
        return [("measured on", "not recorded (an eval.json from before the header)"), *items]
    return [("label", h.label or "none (--label)"),
            ("engine", _engine_text(h)),
            ("model", _or_why(h, "model")),
            ("GPUs", _gpus_text(h)),
            ("host", _host_text(h)),
            ("date", h.date),
            ("tokentop", h.tokentop_version),
            ("plan digest", h.plan_digest),
            ("load from", plain(h.load_from) if h.load_from is not UNSET else "this machine"),
            ("metadata", ", ".join(f"{k}={v}" for k, v in h.meta.items()) or "none (--meta)"),
            *items]


def _or_why(h: Header, name: str) -> str:
    value = getattr(h, name)
    if value is not None:
        return plain(value)
    why = h.why.get(name)
    return f"{units.NA} ({plain(why)})" if why else units.NA


def _engine_text(h: Header) -> str:
    if h.engine is None:
        return _or_why(h, "engine")
    return f"{plain(h.engine)} {_or_why(h, 'engine_version')}"


def _gpus_text(h: Header) -> str:
    if not h.gpus:
        return _or_why(h, "gpus")
    groups: dict[tuple, int] = {}  # alike GPUs once, with a count: "8 × H100 80GB HBM3"
    for g in h.gpus:
        groups[(g.name, g.memory_mb, g.driver)] = groups.get((g.name, g.memory_mb, g.driver), 0) + 1
    text = "; ".join(f"{n} × {_gpu_text(GpuInfo(name=k[0], memory_mb=k[1], driver=k[2]))}"
                     for k, n in groups.items())
    return text + (f" ({plain(h.why['gpus'])})" if "gpus" in h.why else "")


def _gpu_text(g: GpuInfo) -> str:
    memory = units.bytes_(None if g.memory_mb is None else g.memory_mb * 2**20)
    driver = f", driver {plain(g.driver)}" if g.driver else ""
    return f"{plain(g.name or 'GPU')}, {memory}{driver}"


def _host_text(h: Header) -> str:
    memory = units.bytes_(None if h.host_memory_gb is None else h.host_memory_gb * 2**30)
    cores = units.NA if h.host_cores is None else f"{h.host_cores} cores"
    return f"{_or_why(h, 'host_cpu')}, {cores}, {memory} (tokentop's host)"


def _workload_text(w: Workload) -> str:
    loop = f"{w.load:g} streams" if w.mode == "closed" else f"{w.load:g} req/s"
    return (f"{plain(w.api)}, {plain(w.dataset)}, {plain(w.input_tokens)} in → "
            f"{plain(w.output_tokens)} out, {w.mode} loop at {loop}"
            + (f", model {plain(w.model)}" if w.model else ""))


@dataclass(frozen=True)
class PhaseItem:
    """A phase's line: its links relative to the eval's directory, None when there is none."""

    name: str
    status: str
    why: str
    seconds: float
    run_dir: str | None  # relative to the eval's directory
    report: str | None  # its report.md, relative, when there is one


def phase_items(state: EvalState, at: Path) -> list[PhaseItem]:
    out = []
    for name, r in state.phases.items():
        report = Path(r.run_dir) / "report.md" if r.run_dir else None
        out.append(PhaseItem(
            name=name, status=r.status, why=plain(r.why, NOTE_LIMIT), seconds=r.seconds or 0.0,
            run_dir=link(Path(r.run_dir), at) if r.run_dir else None,
            # the long tail's intervals, outages and drift in full: that phase's own report
            report=link(report, at) if report is not None and report.exists() else None))
    return out


def link(path: Path, at: Path) -> str:
    """`path` (absolute, or relative to where tokentop runs) as a link from `at`, the eval's
    directory, in / form: whether --out was given relative or absolute, eval.md links to its
    own files relatively, so the directory can be moved."""
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(at))).as_posix()


def flag_marks(all_rows: list[Row]) -> dict[str, int]:
    """Each flag's number, by first appearance: a row shows [n], the legend says what n is."""
    marks: dict[str, int] = {}
    for r in all_rows:
        for f in r.flags:
            marks.setdefault(f, len(marks) + 1)
    return marks


def _mark(r: Row, marks: dict[str, int]) -> str:
    return "".join(f"[{marks[f]}]" for f in r.flags)


def value_text(r: Row) -> str:
    """The value as `shown` writes it; over repeats their mean ± the 95 % interval's half."""
    if r.repeats > 1 and r.interval is not None and r.value is not None:
        half = (r.interval[1] - r.interval[0]) / 2
        return f"{shown(r)} ± {shown(replace(r, value=half))} (n={r.repeats})"
    return shown(r)


def _samples(r: Row) -> str:
    return "" if r.samples is None else units.count(r.samples)


def _note(r: Row) -> str:
    return plain(r.note, NOTE_LIMIT)


def _tail_rows(state: EvalState) -> list[list[str]]:
    tail = state.phases.long_tail
    intervals = tail.figures.long_tail.intervals if tail and tail.figures else []
    return [[units.duration(i.rel), plain(i.metric), _ms(i.p99_ms), _ms(i.p99_9_ms),
             _ms(i.max_ms), str(i.in_flight)] for i in intervals[:INTERVALS_MAX]]


TAIL_HEAD = ("at", "metric", "P99", "P99.9", "max", "in flight")
TAIL_TITLE = "Long-tail intervals (the soak's ticks whose tail broke out)"


def _ms(value: float | None) -> str:
    return units.ms(units.us_of_ms(value))


# ---- the terminal -----------------------------------------------------------------------------


def table(all_rows: list[Row]) -> str:
    """The matrix for a terminal: a line a row, grouped by dimension, columns aligned and
    nothing cut; a note that does not fit on its row's line wraps below it, within WIDTH.
    The load and samples columns are there when a row has one; flags end the line as [n],
    said once at the end."""
    marks = flag_marks(all_rows)
    cols = [("figure", lambda r: r.figure, "<"), ("load", lambda r: r.load, "<"),
            ("value", value_text, ">"), ("samples", _samples, ">"),
            ("", lambda r: " ".join(x for x in (r.verdict or "", _mark(r, marks)) if x), "<")]
    cols = [c for c in cols if c[0] in ("figure", "value") or any(c[1](r) for r in all_rows)]
    widths = [max([len(name)] + [len(get(r)) for r in all_rows]) for name, get, _ in cols]

    def line(cells: list[str]) -> str:
        return ("  " + "  ".join(f"{c:{a}{w}}" for c, w, (_, _, a) in zip(cells, widths, cols,
                                                                       strict=True))).rstrip()

    lines = [line([name for name, _, _ in cols])]
    dim = None
    for r in all_rows:
        if r.dimension != dim:
            dim = r.dimension
            lines.append(dim)
        text = line([get(r) for _, get, _ in cols])
        note = _note(r)
        if note and len(text) + len(note) + 4 <= WIDTH:
            text += f"  ({note})"
            note = ""
        lines.append(text)
        if note:
            lines += textwrap.wrap(f"({note})", WIDTH, initial_indent=" " * 4,
                                   subsequent_indent=" " * 5, break_on_hyphens=False)
    for f, n in marks.items():
        lines += textwrap.wrap(f"[{n}] {plain(f, NOTE_LIMIT)}", WIDTH, subsequent_indent=" " * 4)
    return "\n".join(lines)


# ---- eval.md ----------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """Text made safe for a Markdown table's cell: one line, its pipes escaped."""
    return plain(text, NOTE_LIMIT).replace("\\", "\\\\").replace("|", "\\|")


def _md_table(head: tuple[str, ...] | list[str], body: list[list[str]]) -> list[str]:
    return [f"| {' | '.join(head)} |", f"|{' --- |' * len(head)}",
            *(f"| {' | '.join(_cell(c) for c in row)} |" for row in body)]


MATRIX_HEAD = ("dimension", "figure", "load", "value", "samples", "verdict", "note")


def _matrix_cells(r: Row, marks: dict[str, int]) -> list[str]:
    value = value_text(r) + (f" {_mark(r, marks)}" if r.flags else "")
    return [r.dimension, r.figure, r.load, value, _samples(r), r.verdict or "", _note(r)]


def markdown(state: EvalState, all_rows: list[Row], plots: list[Path], at: Path) -> str:
    """eval.md, written in `at` (the eval's directory): every link relative to it."""
    marks = flag_marks(all_rows)
    out = ["# tokentop eval" + (f": {_cell(state.header.label)}"
                                if state.header is not UNSET and state.header.label else ""),
           "", *_md_table(("what", "measured"), [list(i) for i in header_items(state)]),
           "", "## Matrix", "",
           *_md_table(MATRIX_HEAD, [_matrix_cells(r, marks) for r in all_rows])]
    if marks:
        out += ["", "Flags: " + "; ".join(f"[{n}] {_cell(f)}" for f, n in marks.items())]
    out += ["", "## Phases", ""]
    for p in phase_items(state, at):
        extra = f" — {p.why}" if p.why else ""
        where = f" (`{p.run_dir}`)" if p.run_dir else ""
        report = f"; [its report](<{p.report}>)" if p.report else ""
        out.append(f"* **{p.name}**: {p.status}{extra}{where}, {p.seconds:g} s{report}")
    tail = _tail_rows(state)
    if tail:
        out += ["", f"## {TAIL_TITLE}", "", *_md_table(TAIL_HEAD, tail)]
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{p.stem}](<{link(p, at)}>)" for p in plots]
    return "\n".join(out) + "\n"


# ---- eval.html --------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.value, td.samples { text-align: right; white-space: nowrap; }
tr.dimension td { background: #fafafa; font-weight: bold; }
.PASS { background: #d8f3dc; color: #1b4332; font-weight: bold; }
.FAIL { background: #ffd6d6; color: #7a0000; font-weight: bold; }
.flag { color: #b35c00; font-weight: bold; }
.note { color: #555; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
"""


def _e(text: object) -> str:
    """Text from anywhere as HTML text: plain, then escaped (quotes too, for attributes)."""
    return html_.escape(plain(text, NOTE_LIMIT), quote=True)


def _html_matrix(all_rows: list[Row], marks: dict[str, int]) -> list[str]:
    out = ["<table class='matrix'>", "<tr>" + "".join(
        f"<th>{h}</th>" for h in MATRIX_HEAD[1:]) + "</tr>"]
    dim = None
    for r in all_rows:
        if r.dimension != dim:
            dim = r.dimension
            out.append(f"<tr class='dimension'><td colspan='6'>{_e(dim)}</td></tr>")
        flags = "".join(f" <span class='flag' title='{_e(f)}'>[{marks[f]}]</span>"
                        for f in r.flags)
        verdict = f"<td class='{r.verdict}'>{r.verdict}</td>" if r.verdict in ("PASS", "FAIL") \
            else f"<td>{_e(r.verdict or '')}</td>"
        out.append(f"<tr><td>{_e(r.figure)}</td><td>{_e(r.load)}</td>"
                   f"<td class='value'>{_e(value_text(r))}{flags}</td>"
                   f"<td class='samples'>{_e(_samples(r))}</td>{verdict}"
                   f"<td class='note'>{_e(r.note)}</td></tr>")
    out.append("</table>")
    if marks:
        out.append("<p>Flags: " + "; ".join(f"<span class='flag'>[{n}]</span> {_e(f)}"
                                           for f, n in marks.items()) + "</p>")
    return out


def _html_table(head: tuple[str, ...], body: list[list[str]]) -> list[str]:
    return ["<table>", "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>",
            *("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in body),
            "</table>"]


def _html_phases(state: EvalState, at: Path) -> list[str]:
    out = ["<ul>"]
    for p in phase_items(state, at):
        extra = f" — {_e(p.why)}" if p.why else ""
        where = f" (<code>{_e(p.run_dir)}</code>)" if p.run_dir else ""
        report = (f"; <a href='{html_.escape(p.report, quote=True)}'>its report</a>"
                  if p.report else "")
        out.append(f"<li><b>{_e(p.name)}</b>: {_e(p.status)}{extra}{where}, "
                   f"{p.seconds:g} s{report}</li>")
    return [*out, "</ul>"]


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def html(state: EvalState, all_rows: list[Row], plots: list[Path], at: Path) -> str:
    """eval.html: the header, the matrix (PASS and FAIL coloured, flags marked), the phases,
    the long tail's intervals and every plot inside the page; no script, nothing fetched, so
    it reads the same offline, sent on its own. Links to the phases' reports are relative to
    `at` (they work where the directory went with it)."""
    label = state.header.label if state.header is not UNSET else None
    title = "tokentop eval" + (f": {label}" if label else "")
    out = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
           f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{_e(title)}</h1>",
           *_html_table(("what", "measured"), [list(i) for i in header_items(state)]),
           "<h2>Matrix</h2>", *_html_matrix(all_rows, flag_marks(all_rows)),
           "<h2>Phases</h2>", *_html_phases(state, at)]
    tail = _tail_rows(state)
    if tail:
        out += [f"<h2>{_e(TAIL_TITLE)}</h2>", *_html_table(TAIL_HEAD, tail)]
    if plots:
        out.append("<h2>Plots</h2>")
        out += [f"<figure><img alt='{_e(p.stem)}' src='{_data_uri(p)}'>"
                f"<figcaption>{_e(p.stem)}</figcaption></figure>" for p in plots]
    return "\n".join([*out, "</body></html>"]) + "\n"
