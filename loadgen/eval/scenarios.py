"""Selection by scenario: `tokentop eval compare A B …` ends with a verdict per scenario of
the plan ([scenarios]: real-time interaction, large batch work, production, or a team's
own), each judged on the matrix rows that matter to it, with the reason.

Comparing frameworks is for picking one for a use, and no framework wins every row: the
one with the lowest TTFT may not have the most tokens per joule. A scenario names its rows;
each row is judged between every two evals by compare's own noise rule (`compare.judge`:
non-overlapping 95 % intervals with repeats, else the ±NOISE_BAND_PCT band), and:
* rule "no worse": an eval wins when, against every other, it is better beyond the noise
  on one of the rows or more and worse on none;
* rule "weighted": when, against every other, the weights of the rows it is better on
  outweigh those of the rows it is worse on;
* the scenario's whole-run limits (its `slo`'s thresholds) judge the rows they apply to,
  and a winner must meet each limit another eval meets;
* else "no clear winner", with the rows that split and those within the noise.
A row an eval lacks (its phase skipped, a fault it did not run) is said with why, never
counted; a goodput row is judged only where every eval counted goodput within the
scenario's per-request SLO (goodput within another SLO is another figure).

The scenarios are the first eval's plan's (eval.json keeps it); an eval from before
scenarios gets the default plan's, and evals whose plans hold other scenarios are named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any

from msgspec import UNSET

from loadgen.eval.judging import Change, Judgement, Line, judge
from loadgen.eval.judging import letter as _letter
from loadgen.eval.matrix import Row, shown
from loadgen.eval.matrix import judge as judge_limit
from loadgen.eval.phases import PHASES
from loadgen.eval.plan import PlanError, Scenario, default_plan, scenarios_from_builtins
from loadgen.eval.results import EvalState
from loadgen.model.slo import parse_slos
from loadgen.model.text import plain

NO_WINNER = "no clear winner"
RULE = ("a winner is better beyond the noise on the rows that matter to each, and worse on "
        "none (or outweighs them, by a weighted rule)")
GOODPUT_ROWS = ("baseline.goodput", "ramp.max_goodput")  # counted within a per-request SLO


@dataclass(frozen=True)
class Pair:
    """One row between two evals: `later` against `first` (compare.judge(first, later))."""

    first: int
    later: int
    change: Change

    def for_(self, i: int) -> Judgement:
        """The judgement from eval i's side (i is one of the two)."""
        j = self.change.judgement
        if i == self.later or j not in (Judgement.BETTER, Judgement.WORSE):
            return j
        return Judgement.WORSE if j is Judgement.BETTER else Judgement.BETTER


@dataclass(frozen=True)
class ScenarioRow:
    """A row that matters to a scenario: each eval's value, the pairs judged, or why not."""

    id: str
    figure: str
    weight: float
    values: tuple[str, ...]  # each eval's, as shown (n/a where it has none)
    pairs: tuple[Pair, ...]  # every two evals, when the row is judged
    why: str = ""  # why the row is not judged ("" when it is)
    limit: str = ""  # the scenario's limit on it ("ttft_p99<100ms"), "" when none
    verdicts: tuple[str | None, ...] = ()  # each eval's PASS / FAIL against that limit

    @property
    def judged(self) -> bool:
        return not self.why


@dataclass(frozen=True)
class Verdict:
    """A scenario's verdict: the winner's index into the evals, or None, and why."""

    name: str
    about: str
    rule: str
    winner: int | None
    reason: str
    rows: tuple[ScenarioRow, ...]
    notes: tuple[str, ...]  # the rows not counted, and why; the limits each eval met

    @property
    def said(self) -> str:
        """'B' or 'no clear winner'."""
        return NO_WINNER if self.winner is None else _letter(self.winner)

    def text(self) -> str:
        """'B: better on …' or 'no clear winner: …'."""
        return f"{self.said}: {self.reason}"


@dataclass(frozen=True)
class Verdicts:
    """Every scenario's verdict, and where the scenarios came from."""

    verdicts: tuple[Verdict, ...]
    source: str  # "A's plan's", "the default plan's: A's plan has none (…)"

    def text_lines(self) -> list[str]:
        out = ["", f"scenarios ({self.source}): {RULE}"]
        for v in self.verdicts:
            out.append(f"{plain(v.name)}: {plain(v.about)}")
            # indented deeper than the table's rows (two spaces): a reader tells them apart
            out.append(f"    verdict: {v.text()}")
            out += [f"      · {n}" for n in v.notes]
        return out

    def md_lines(self) -> list[str]:
        out = ["", f"**scenarios** ({_md(self.source)}): {RULE}", ""]
        for v in self.verdicts:
            out.append(f"- **{_md(v.name)}** ({_md(v.about)}): **{v.said}**: {_md(v.reason)}")
            out += [f"  - {_md(n)}" for n in v.notes]
        return out

    def csv_head(self) -> list[str]:
        """Two columns per scenario: a row's part in it, and the scenario's verdict."""
        return [h for v in self.verdicts for h in (f"scenario {v.name}",
                                                   f"scenario {v.name} verdict")]

    def csv_cells(self, id_: str, n: int) -> list[str]:
        out = []
        for v in self.verdicts:
            row = next((r for r in v.rows if r.id == id_), None)
            out += ["", ""] if row is None else [_part(row, n), v.text()]
        return out

    def json(self) -> dict[str, Any]:
        return {"source": self.source, "verdicts": [{
            "name": v.name, "about": v.about, "rule": v.rule,
            "winner": None if v.winner is None else _letter(v.winner), "reason": v.reason,
            "notes": list(v.notes),
            "rows": [{"id": r.id, "figure": r.figure, "weight": r.weight, "judged": r.judged,
                      "why": r.why or None, "limit": r.limit or None,
                      "verdicts": list(r.verdicts) if r.limit else None,
                      "pairs": [{"first": _letter(p.first), "later": _letter(p.later),
                                 "judgement": p.change.judgement.value,
                                 "change_pct": p.change.pct} for p in r.pairs]}
                     for r in v.rows]} for v in self.verdicts]}


def _md(text: str) -> str:
    return plain(text).replace("|", "\\|").replace("*", "\\*")


def _part(row: ScenarioRow, n: int) -> str:
    """A row's part in a scenario, for the csv: 'B better than A', 'same within noise'."""
    if not row.judged:
        return f"not counted: {row.why}"
    return "; ".join(f"{_letter(p.later)} {p.change.judgement} than {_letter(p.first)}"
                     if p.change.judgement in (Judgement.BETTER, Judgement.WORSE)
                     else f"{_letter(p.later)} against {_letter(p.first)}: "
                     f"{p.change.judgement}" for p in row.pairs)


# ---- where the scenarios come from ----------------------------------------------------------


def plan_scenarios(evals: Sequence[tuple[str, EvalState]]) -> tuple[dict[str, Scenario], str,
                                                                     list[str]]:
    """The first eval's scenarios, where they came from, and notes: the evals whose plans
    hold other scenarios, or whose plan's cannot be read."""
    notes: list[str] = []
    read: list[dict[str, Scenario] | None] = []
    for i, (name, e) in enumerate(evals):
        try:
            read.append(scenarios_from_builtins(e.plan, f"{plain(name)}/eval.json"))
        except PlanError as err:
            read.append(None)
            notes.append(f"{_letter(i)}'s plan's scenarios cannot be read ({plain(str(err))})")
    first = read[0]
    if first is None:
        why = "cannot be read" if notes and notes[0].startswith("A's") \
            else "has none: an eval from before them"
        scenarios, source = default_plan().scenarios, f"the default plan's: A's plan {why}"
    else:
        scenarios, source = first, "A's plan's"
    others = [_letter(i) for i, s in enumerate(read) if i and s is not None and s != first]
    if others:
        notes.append(f"{', '.join(others)} {'holds' if len(others) == 1 else 'hold'} other "
                     f"scenarios in {'its' if len(others) == 1 else 'their'} plan: A's are "
                     "used")
    return scenarios, source, notes


# ---- judging --------------------------------------------------------------------------------


def verdicts(evals: Sequence[tuple[str, EvalState]], lines: Sequence[Line]) -> Verdicts:
    """Every scenario of the first eval's plan judged on the compared lines."""
    scenarios, source, notes = plan_scenarios(evals)
    states = [e for _, e in evals]
    out = tuple(verdict(name, s, states, lines) for name, s in scenarios.items())
    if notes and out:  # where the scenarios came from concerns every verdict: said once
        first = out[0]
        out = (replace(first, notes=(*notes, *first.notes)), *out[1:])
    return Verdicts(out, source)


def verdict(name: str, s: Scenario, states: Sequence[EvalState],
            lines: Sequence[Line]) -> Verdict:
    """One scenario's verdict over the evals (their states say why a row is missing)."""
    slos = parse_slos(s.slo)
    rows = _rows(s, states, lines, slos.thresholds, slos.per_request and slos.per_request.text)
    winner, reason = _winner(s, rows, len(states))
    return Verdict(name, s.about, s.rule, winner, reason, tuple(rows), tuple(_notes(rows)))


def _rows(s: Scenario, states: Sequence[EvalState], lines: Sequence[Line],
          thresholds: list, per_request: str | None) -> list[ScenarioRow]:
    """The scenario's rows, patterns made the ids they match, in the comparison's order."""
    weights = s.weights if s.rule == "weighted" else [1.0] * len(s.rows)
    out: list[ScenarioRow] = []
    seen: set[str] = set()
    for pattern, weight in zip(s.rows, weights, strict=True):
        matched = [line for line in lines if fnmatchcase(line.id, pattern)]
        if not matched:
            why = _grouped({i: _why_missing(e, pattern, None) for i, e in enumerate(states)})
            out.append(ScenarioRow(pattern, pattern, weight, (), (), f"in no eval ({why})"))
        for line in matched:
            if line.id not in seen:
                seen.add(line.id)
                out.append(_row(line, float(weight), states, thresholds, per_request))
    return out


def _row(line: Line, weight: float, states: Sequence[EvalState], thresholds: list,
         per_request: str | None) -> ScenarioRow:
    r = line.row
    values = tuple(shown(x) if x is not None else "n/a" for x in line.rows)
    row = ScenarioRow(line.id, plain(r.figure), weight, values, ())
    limit, marks = _limits(line, thresholds)
    row = replace(row, limit=limit, verdicts=marks)
    why = _not_judged(line, states, per_request)
    if why:
        return replace(row, why=why)
    n = len(line.rows)
    pairs = tuple(Pair(i, j, judge(line.rows[i], line.rows[j]))  # type: ignore[arg-type]
                  for i in range(n) for j in range(i + 1, n))
    odd = next((p for p in pairs if p.change.judgement not in _COUNTED), None)
    if odd is not None:  # a fact, or a latency taken at another load in each eval
        return replace(row, why=str(odd.change.judgement))
    return replace(row, pairs=pairs)


_COUNTED = (Judgement.BETTER, Judgement.WORSE, Judgement.SAME)


def _not_judged(line: Line, states: Sequence[EvalState], per_request: str | None) -> str:
    """Why a row cannot be counted: an eval without its value, goodput within another SLO."""
    missing = {i: _why_missing(states[i], line.id, r)
               for i, r in enumerate(line.rows) if r is None or r.value is None}
    if missing:
        return "missing in " + _grouped(missing)
    if line.id in GOODPUT_ROWS:
        within = [_goodput_slo(e, line.id) for e in states]
        if per_request is not None and any(w != per_request for w in within):
            return (f"goodput counted within {_slo_list(within)}, not the scenario's "
                    f"{per_request} (the eval's plan slo sets it)")
        if len(set(within)) > 1:
            return f"goodput counted within different SLOs ({_slo_list(within)})"
    return ""


def _grouped(whys: dict[int, str]) -> str:
    """'A, B: ramp skipped: …; C: …': the evals that share a reason named once."""
    by_why: dict[str, list[str]] = {}
    for i, why in whys.items():
        by_why.setdefault(why, []).append(_letter(i))
    return "; ".join(f"{', '.join(who)}: {why}" for why, who in by_why.items())


def _slo_list(within: list[str | None]) -> str:
    shown_ = {w: [_letter(i) for i, x in enumerate(within) if x == w] for w in within}
    return "; ".join(f"{plain(w) if w else 'no per-request SLO'} in {', '.join(who)}"
                     for w, who in shown_.items())


def _why_missing(e: EvalState, id_: str, row: Row | None) -> str:
    """Why an eval has no value for a row: its phase's status, or the row's own note."""
    if row is not None:
        return plain(row.note) or "no value"
    phase = id_.split(".", 1)[0]
    result = e.phases.of(phase) if phase in PHASES else None  # type: ignore[arg-type]
    if phase in PHASES and result is None:
        return f"{phase} did not run"
    if result is not None and result.status != "done":
        return plain(f"{phase} {result.status}: {result.why}")
    return "no such row (not in its plan)"


def _goodput_slo(e: EvalState, id_: str) -> str | None:
    """The per-request SLO an eval counted a goodput row within, as Slo.text writes it."""
    plan = e.plan if isinstance(e.plan, dict) else {}
    base = e.phases.baseline
    if id_ == "baseline.goodput" and base is not None and base.figures is not None \
            and base.figures.goodput_slo is not UNSET:  # older evals: the plan's says it
        return base.figures.goodput_slo
    text = plan.get("slo") or ""
    if id_ == "ramp.max_goodput":
        ramp = (plan.get("quick" if e.quick else "phases") or {}).get("ramp") or {}
        text = ramp.get("slo") or text
    try:
        slo = parse_slos(text).per_request
    except ValueError:
        return None
    return slo.text if slo is not None else None


def _limits(line: Line, thresholds: list) -> tuple[str, tuple[str | None, ...]]:
    """The scenario's limit on the row and each eval's verdict against it."""
    if not thresholds or line.row.judged_as is None:
        return "", ()
    marks = tuple(None if r is None else judge_limit(replace(r, verdict=None, limit=""),
                                                    thresholds).verdict for r in line.rows)
    if all(m is None for m in marks):
        return "", ()
    th = next(t for t in reversed(thresholds) if (t.metric, t.stat) == line.row.judged_as)
    return th.text, marks


def _winner(s: Scenario, rows: list[ScenarioRow], n: int) -> tuple[int | None, str]:
    judged = [r for r in rows if r.judged]
    if not judged:
        return None, ("none of its rows can be judged in these evals" if rows and any(
            r.values for r in rows) else "none of its rows is in these evals")
    for x in range(n):
        if all(_beats(s, judged, x, y) for y in range(n) if y != x):
            failed = _failed_limits(rows, x)
            if failed:
                return None, (f"{_letter(x)} is better on {_list(judged, x, Judgement.BETTER)}"
                              f" but fails {failed}, which another eval meets")
            return x, _won(s, judged, x, n)
    return None, _split(judged, n)


def _beats(s: Scenario, rows: list[ScenarioRow], x: int, y: int) -> bool:
    """x beats y on these rows by the scenario's rule."""
    better = [r.weight for r in rows if _side(r, x, y) is Judgement.BETTER]
    worse = [r.weight for r in rows if _side(r, x, y) is Judgement.WORSE]
    if s.rule == "weighted":
        return sum(better) > sum(worse)
    return bool(better) and not worse


def _side(r: ScenarioRow, x: int, y: int) -> Judgement:
    pair = next(p for p in r.pairs if {p.first, p.later} == {x, y})
    return pair.for_(x)


def _failed_limits(rows: list[ScenarioRow], x: int) -> str:
    """The scenario's limits x fails while another eval meets them."""
    return ", ".join(r.limit for r in rows if r.limit and r.verdicts[x] == "FAIL"
                     and "PASS" in r.verdicts)


def _list(rows: list[ScenarioRow], x: int, j: Judgement, y: int | None = None) -> str:
    """The rows where x is `j` (against y, or against any other eval)."""
    names = [_named(r, x, y) for r in rows
             if any(_side(r, x, o) is j for o in _others(r, x, y))]
    return ", ".join(names) or "none"


def _others(r: ScenarioRow, x: int, y: int | None) -> list[int]:
    if y is not None:
        return [y]
    return sorted(({p.first for p in r.pairs} | {p.later for p in r.pairs}) - {x})


def _named(r: ScenarioRow, x: int, y: int | None) -> str:
    """'TTFT P99 (36.0 ms against 52.0 ms)': x's value against the other's."""
    other = y if y is not None else next(o for o in _others(r, x, None))
    if len(r.values) == 2 or y is not None:
        return f"{r.figure} ({r.values[x]} against {r.values[other]})"
    return f"{r.figure} ({r.values[x]})"


def _won(s: Scenario, rows: list[ScenarioRow], x: int, n: int) -> str:
    worse = _list(rows, x, Judgement.WORSE)
    same = [r.figure for r in rows if all(_side(r, x, y) is Judgement.SAME
                                          for y in range(n) if y != x)]
    out = f"better on {_list(rows, x, Judgement.BETTER)}"
    out += f"; worse on {worse}" if worse != "none" else "; worse on none beyond the noise"
    if s.rule == "weighted" and worse != "none":
        out += " (outweighed by its rule's weights)"
    return out + (f"; the same within noise on {', '.join(same)}" if same else "")


def _split(rows: list[ScenarioRow], n: int) -> str:
    """Why no eval wins: each pair's split, or every row within the noise."""
    if all(p.change.judgement is Judgement.SAME for r in rows for p in r.pairs):
        return "every row within the noise (" + ", ".join(r.figure for r in rows) + ")"
    parts, beaten = [], []
    for x in range(n):
        for y in range(x + 1, n):
            a, b = _list(rows, x, Judgement.BETTER, y), _list(rows, y, Judgement.BETTER, x)
            if a == "none" or b == "none":  # one side dominates (or neither): no split
                if a != b:
                    beaten.append((y, x) if a == "none" else (x, y))  # (winner, loser)
                continue
            same = [r.figure for r in rows if _side(r, x, y) is Judgement.SAME]
            said = f"{_letter(x)} is better on {a}, {_letter(y)} on {b}"
            parts.append(said + (f"; within the noise: {', '.join(same)}" if same else ""))
    for loser in dict.fromkeys(o for _, o in beaten):
        by = ", ".join(_letter(w) for w, o in beaten if o == loser)
        parts.append(f"{_letter(loser)} is beaten by {by}")
    return "; ".join(parts) or "no eval is better on a row and worse on none"


def _notes(rows: list[ScenarioRow]) -> list[str]:
    out = [f"not counted: {r.figure} [{r.id}]: {r.why}" for r in rows if not r.judged]
    for r in rows:
        if r.limit:
            marks = ", ".join(f"{_letter(i)} {m or 'n/a'}" for i, m in enumerate(r.verdicts))
            out.append(f"limit {plain(r.limit)} on {r.figure}: {marks}")
    return out
