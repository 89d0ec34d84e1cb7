"""The eval's typed results against eval.json files that the dict-based tokentop wrote.

fixtures/eval.json is a real eval (two simulator replicas, the faults with a chaos kill and
restart, --dcgm-url serving tests/fixtures/metrics/dcgm-exporter.txt), its run directories
renamed to /eval-fixture/out (a path that exists nowhere). eval-filled.json is a copy with
the figures that run did not have (a knee, long-tail intervals, an MTTR, leak slopes, a
bandwidth fault, DCGM energy) set by hand, so that every row of its matrix has a value;
eval-partial.json has a skipped, a failed and three missing phases; eval-old.json lacks what
the first tokentop eval did not write (DCGM, efficiency's gpu_source). The *.matrix.txt,
*.rows.json, *.md and compare.txt beside them are what the matrix code made of each before
the results were typed: the truth here (their text since as the units vocabulary prints
figures: a latency as the console does, a missing value as n/a without a unit)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from loadgen.eval import battery, compare, matrix, results
from loadgen.eval.efficiency import KvPerRequest
from loadgen.eval.phases import ABOUT, LOADED, PHASES
from loadgen.eval.plan import Phases
from loadgen.eval.results import (
    EfficiencyAt,
    PhaseResult,
    Results,
    read_state,
    skipped,
    state_to_builtins,
)

FIXTURES = Path(__file__).parent / "fixtures"
EVALS = ("eval", "eval-filled", "eval-partial", "eval-old")


def state(name: str):
    return read_state((FIXTURES / f"{name}.json").read_bytes())


# the rows that took a whole-run threshold's verdict from the dict era's "SLO" rows
JUDGED = {"ttft_p99<4s": "TTFT P99", "error_rate<50%": "error rate"}
# figures named since for what they are
RENAMED = {"GPU memory per request in flight": "GPU memory used ÷ requests in flight"}


def same_figures(made: list[dict], golden: list[dict]) -> None:
    """Every figure the dict era wrote is in the rows with its value, unit and verdict: its
    dimension without the load it carried, a whole-run threshold's verdict (its "SLO" row)
    on the row of what it judges."""
    by_figure = {(r["dimension"], r["figure"]): r for r in made}
    for g in golden:
        if g["dimension"] == "SLO":
            row = by_figure[("latency & throughput", JUDGED[g["figure"]])]
            assert row["verdict"] == g["verdict"], g
            continue
        row = by_figure[(g["dimension"].split(" (")[0], RENAMED.get(g["figure"], g["figure"]))]
        assert (row["value"], row["unit"]) == (g["value"], g["unit"]), g
        # a row judged now that was not then: the plan's threshold on it (JUDGED)
        assert row["verdict"] == g["verdict"] or g["verdict"] is None, g


@pytest.mark.parametrize("name", EVALS)
def test_an_eval_json_of_the_dict_era_makes_the_same_figures(name):
    made = json.loads(json.dumps(matrix.to_json(matrix.state_rows(state(name)))))
    same_figures(made, json.loads((FIXTURES / f"{name}.rows.json").read_text()))


def test_the_real_evals_rows_are_the_ones_it_wrote():
    """Every figure as the real eval wrote it (the notes' wording may have changed since)."""
    written = json.loads((FIXTURES / "eval.json").read_text())["rows"]
    same_figures(json.loads(json.dumps(matrix.to_json(matrix.state_rows(state("eval"))))),
                 written)


def test_compare_says_the_same():
    shown = compare.compare([("a/eval", state("eval")), ("b/filled", state("eval-filled")),
                            ("c/partial", state("eval-partial"))])
    assert shown + "\n" == (FIXTURES / "compare.txt").read_text()


@pytest.mark.parametrize("name", EVALS)
def test_eval_json_reads_and_writes_back_byte_for_byte(name):
    """Same keys, same nesting, same order, ints kept ints: a resumed eval rewrites the
    phases it kept as they were."""
    raw = (FIXTURES / f"{name}.json").read_text()
    assert json.dumps(state_to_builtins(state(name)), indent=2) + "\n" == raw


def test_every_figure_of_a_full_eval_is_in_its_row():
    """The filled fixture has every figure, so every row has a value: a field renamed in
    results.py (the JSON key no longer read) or in matrix.py leaves a cell empty here."""
    rows = matrix.state_rows(state("eval-filled"))
    assert len(rows) == 77
    # the rows of round two (the dict era did not record their figures) apart, each saying so
    assert [r.id for r in rows if r.value is None and r.note != matrix.NOT_RECORDED] == []
    assert {r.id.split(".")[0] for r in rows if r.value is None} == {
        "baseline", "faults", "leaks", "efficiency"}
    assert len({r.id for r in rows}) == len(rows)  # an id names one row


def test_the_kv_row_is_the_baselines_whatever_became_of_the_efficiency_phase():
    # the KV cache per request is the baseline's figure: the efficiency phase skipped leaves
    # it as the baseline measured it, and its note never blames the efficiency phase
    ev = state("eval-filled")  # it predates the figure: one is set here
    kv = KvPerRequest(value=12.5, unit="MB", tokens=800.0, samples=30,
                      source="the engine's KV cache usage", why=None)
    ev.phases.baseline.figures.kv_per_request = kv
    ev.phases.put("efficiency", skipped("disabled in the plan"))
    row = next(r for r in matrix.state_rows(ev) if r.id == "efficiency.kv_per_request")
    assert (row.value, row.unit) == (kv.value, kv.unit)
    assert "efficiency" not in row.note and "disabled" not in row.note, row.note
    ev.phases.put("baseline", skipped("disabled in the plan"))
    row = next(r for r in matrix.state_rows(ev) if r.id == "efficiency.kv_per_request")
    assert row.value is None and row.note == "baseline skipped: disabled in the plan"


def test_the_phases_are_named_once():
    assert tuple(ABOUT) == PHASES
    assert Results.__struct_fields__ == PHASES
    assert Phases.__struct_fields__ == PHASES
    assert tuple(battery.RUNS) == PHASES
    assert tuple(matrix.BUILDERS) == PHASES
    assert set(LOADED) == {"baseline", "ramp", "batch", "context", "interference", "priority",
                           "long_tail", "faults", "scaling"}
    # the matrix's sections come in the phases' order
    firsts = [next(r.dimension for r in matrix.BUILDERS[p](Results())) for p in PHASES]
    assert [d.split(" (")[0] for d in firsts] == [
        "API conformance", "latency & throughput", "pressure ramp", "batching",
        "context length", "interference", "priority classes", "long tail",
        "stability under faults", "leaks",
        "memory efficiency", "efficiency", "scaling"]


def test_a_phase_that_did_not_run_has_empty_figures_on_disk():
    results = Results()
    result = skipped("disabled in the plan")
    result.seconds = 0.0  # a skip takes no time: the 0.0 is still written
    results.put("scaling", result)
    ev = state("eval-partial")
    ev.phases = results
    assert state_to_builtins(ev)["phases"] == {
        "scaling": {"status": "skipped", "why": "disabled in the plan", "figures": {},
                    "seconds": 0.0}}


def test_a_key_only_some_results_have_is_left_out_not_null():
    knee = EfficiencyAt(energy_why="the ramp found no knee")
    assert msgspec.to_builtins(knee) == {"energy_why": "the ramp found no knee"}
    done = PhaseResult(status="done", figures=None, seconds=1.5)
    assert msgspec.to_builtins(done) == {"status": "done", "figures": None, "seconds": 1.5}


def test_a_file_that_is_not_an_eval_says_so(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text('{"phases": {"baseline": {"status": "done"}}}')
    with pytest.raises(ValueError, match="is not a tokentop eval"):
        results.read_eval(path)
    with pytest.raises(battery.EvalError, match="is not a tokentop eval"):
        battery.load_state(tmp_path)
    path.write_text('{"format": "tokentop-eval/1", "phases": {}}')
    with pytest.raises(battery.EvalError, match="cannot be read to resume"):
        battery.load_state(tmp_path)
