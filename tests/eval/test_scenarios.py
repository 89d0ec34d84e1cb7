"""Selection by scenario in `tokentop eval compare`: evals built through results.py's typed
Structs with values whose truth is set here (a clear winner, a split, repeats whose 95 %
intervals numpy says overlap, a phase skipped, a limit, a weighted rule, rows no eval has),
their verdicts checked against that truth, and one run of the real command line on two
eval.json files written from such states."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest
from support import tokentop

from loadgen.eval import compare
from loadgen.eval.plan import PlanError, parse_plan, plan_to_builtins
from loadgen.eval.results import (
    EVAL_FORMAT,
    BaselineFigures,
    EvalState,
    Results,
    Workload,
    done,
    skipped,
    state_to_builtins,
)
from loadgen.eval.scenarios import NO_WINNER

T_975_DF4 = 2.7764451051977987  # Student's t, 97.5th percentile, 4 degrees of freedom

PLAN = """
[scenarios.speed]
about = "latency and throughput"
rows = ["baseline.ttft.p99", "baseline.output_tok_s"]

[scenarios.strict]
about = "fast first tokens under a tight ITL limit"
rows = ["baseline.ttft.p99", "baseline.itl.p99"]
slo = "itl_p99<20ms"

[scenarios.weighted]
about = "throughput first"
rows = ["baseline.ttft.p99", "baseline.output_tok_s"]
rule = "weighted"
weights = [1, 3]

[scenarios.robust]
about = "under faults"
rows = ["faults.*.success_rate", "faults.*.recovery"]
"""


def baseline(ttft_p99: float, tok_s: float, itl_p99: float = 10.0,
             repeats: dict[str, list[float | None]] | None = None) -> BaselineFigures:
    return BaselineFigures(
        load="4 streams", req_s=10.0, output_tok_s=tok_s, goodput_req_s=9.0, error_rate=0.0,
        latency_ms={"ttft": {"count": 500, "p50": ttft_p99 / 2, "p99": ttft_p99},
                    "itl": {"count": 5000, "p50": itl_p99 / 2, "p99": itl_p99}},
        thresholds=[], tokens_per_joule=None, req_s_per_w=None, gpu_util_pct=None,
        gpu_memory_mb_per_in_flight=None, gpu_source="none", energy_why="no GPU",
        goodput_slo="ttft<2.00 s", **({"repeats": repeats} if repeats else {}))


def state(figures: BaselineFigures | None, plan: str = PLAN) -> EvalState:
    result = done(figures) if figures is not None else skipped("--skip baseline")
    return EvalState(
        format=EVAL_FORMAT, started=0.0, finished=True, quick=True, target="http://x/v1",
        workload=Workload(api="chat", model=None, dataset="synthetic", input_tokens="32",
                          output_tokens="16", tokenizer=None, mode="closed", load=4),
        plan=plan_to_builtins(parse_plan(plan)), phases=Results(baseline=result))


def verdicts(*figures: BaselineFigures | None) -> dict:
    c = compare.comparison([(f"e{i}", state(f)) for i, f in enumerate(figures)])
    assert c.scenarios is not None
    return {v.name: v for v in c.scenarios.verdicts}


def test_a_clear_winner_is_named_with_the_rows_it_is_better_on():
    v = verdicts(baseline(80.0, 500.0), baseline(50.0, 600.0))["speed"]
    assert v.winner == 1 and v.said == "B"
    assert "TTFT P99 (50.0 ms against 80.0 ms)" in v.reason
    assert "output tokens/s (600 tok/s against 500 tok/s)" in v.reason
    # the other way round: A wins
    assert verdicts(baseline(50.0, 600.0), baseline(80.0, 500.0))["speed"].winner == 0


def test_a_split_is_no_clear_winner_naming_each_side():
    v = verdicts(baseline(80.0, 500.0), baseline(50.0, 400.0))["speed"]
    assert v.winner is None and v.said == NO_WINNER
    assert "A is better on output tokens/s" in v.reason
    assert "B on TTFT P99" in v.reason
    # the weighted scenario weighs tok/s 3 to TTFT's 1: A wins it
    w = verdicts(baseline(80.0, 500.0), baseline(50.0, 400.0))["weighted"]
    assert w.winner == 0 and "worse on TTFT P99" in w.reason


def test_repeats_whose_intervals_overlap_are_within_the_noise():
    rng = np.random.default_rng(3)
    a_ttft, b_ttft = rng.normal(80, 12, 5), rng.normal(70, 12, 5)  # B 12 % faster, noisy
    a_tok, b_tok = rng.normal(500, 40, 5), rng.normal(520, 40, 5)

    def interval(x: np.ndarray) -> tuple[float, float]:
        half = T_975_DF4 * float(np.std(x, ddof=1)) / np.sqrt(len(x))
        return float(np.mean(x)) - half, float(np.mean(x)) + half

    for a, b in ((a_ttft, b_ttft), (a_tok, b_tok)):  # the truth, from numpy: they overlap
        (a_low, a_high), (b_low, b_high) = interval(a), interval(b)
        assert a_low <= b_high and b_low <= a_high
    assert abs(np.mean(b_ttft) - np.mean(a_ttft)) / np.mean(a_ttft) > 0.05  # past the band

    def figures(ttft: np.ndarray, tok: np.ndarray) -> BaselineFigures:
        return baseline(float(ttft[0]), float(tok[0]), repeats={
            "baseline.ttft.p99": [float(x) for x in ttft],
            "baseline.output_tok_s": [float(x) for x in tok]})

    v = verdicts(figures(a_ttft, a_tok), figures(b_ttft, b_tok))["speed"]
    assert v.winner is None
    assert v.reason == "every row within the noise (TTFT P99, output tokens/s)"


def test_a_row_an_eval_lacks_is_said_never_counted():
    v = verdicts(baseline(80.0, 500.0), None)["speed"]
    assert v.winner is None
    assert v.reason == "none of its rows can be judged in these evals"
    assert any("missing in B: baseline skipped: --skip baseline" in n for n in v.notes)


def test_a_scenario_whose_rows_no_eval_has_says_so():
    v = verdicts(baseline(80.0, 500.0), baseline(50.0, 600.0))["robust"]
    assert v.winner is None and v.reason == "none of its rows is in these evals"
    assert any("faults.*.success_rate" in n and "A, B: faults did not run" in n
               for n in v.notes)


def test_a_winner_must_meet_the_limits_another_meets():
    # B is 40 % faster to its first token, its ITL within the noise of A's (+5 %), but past
    # the scenario's itl_p99<20ms, which A meets
    v = verdicts(baseline(80.0, 500.0, itl_p99=19.5), baseline(48.0, 500.0, itl_p99=20.4))
    strict = v["strict"]
    assert strict.winner is None
    assert "fails itl_p99<20ms, which another eval meets" in strict.reason
    assert "limit itl_p99<20ms on ITL P99: A PASS, B FAIL" in strict.notes
    # under the limit, the same B wins
    ok = verdicts(baseline(80.0, 500.0, itl_p99=15.0), baseline(48.0, 500.0, itl_p99=15.5))
    assert ok["strict"].winner == 1


def test_goodput_within_another_slo_than_the_scenarios_is_not_counted():
    realtime = verdicts(baseline(80.0, 500.0), baseline(50.0, 600.0))["realtime"]
    assert any("goodput [baseline.goodput]" in n and "not the scenario's ttft<100 ms" in n
               for n in realtime.notes)


def test_three_evals_the_winner_beats_each_other():
    v = verdicts(baseline(80.0, 500.0), baseline(50.0, 600.0), baseline(65.0, 550.0))["speed"]
    assert v.winner == 1
    v = verdicts(baseline(80.0, 500.0), baseline(50.0, 600.0), baseline(40.0, 550.0))["speed"]
    assert v.winner is None
    assert v.reason.startswith("B is better on output tokens/s (600 tok/s against 550 tok/s), "
                               "C on TTFT P99 (40.0 ms against 50.0 ms)")
    assert v.reason.endswith("; A is beaten by B, C")  # no split: each is better than A


def test_a_bad_scenario_row_is_one_line_naming_its_path():
    with pytest.raises(PlanError) as e:
        parse_plan('[scenarios.mine]\nabout = "x"\nrows = ["baseline.ttft.p99", '
                   '"baseline.ttft.p95"]')
    assert str(e.value) == ('plan.toml: scenarios.mine.rows[1]: "baseline.ttft.p95" is no row '
                            'of the matrix (did you mean "baseline.ttft.p99"?)')
    with pytest.raises(PlanError, match=r"scenarios\.mine\.weights: expected 1"):
        parse_plan('[scenarios.mine]\nabout = "x"\nrows = ["baseline.ttft.p99"]\n'
                   'rule = "weighted"')


# ---- through the command line ---------------------------------------------------------------


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("scenarios")
    out = []
    for name, f in (("a", baseline(80.0, 500.0)), ("b", baseline(50.0, 600.0))):
        d = root / name
        d.mkdir()
        (d / "eval.json").write_bytes(msgspec.json.encode(state_to_builtins(state(f))))
        out.append(d)
    return out[0], out[1]


def test_the_command_ends_with_the_verdicts_in_text_and_csv_and_json(dirs):
    a, b = dirs
    r = tokentop("eval", "compare", str(a), str(b))
    assert r.returncode == 0, r.stderr
    tail = r.stdout[r.stdout.index("\nscenarios (A's plan's)"):]
    assert "speed: latency and throughput\n    verdict: B: better on TTFT P99" in tail
    assert "robust: under faults\n    verdict: no clear winner: none of its rows" in tail
    r = tokentop("eval", "compare", str(a), str(b), "--format", "json")
    doc = json.loads(r.stdout)
    by_name = {v["name"]: v for v in doc["scenarios"]["verdicts"]}
    assert by_name["speed"]["winner"] == "B" and by_name["robust"]["winner"] is None
    assert [x["judgement"] for x in by_name["speed"]["rows"][0]["pairs"]] == ["better"]
    r = tokentop("eval", "compare", str(a), str(b), "--format", "csv")
    table = {t["id"]: t for t in csv.DictReader(io.StringIO(r.stdout))}
    assert table["baseline.ttft.p99"]["scenario speed"] == "B better than A"
    assert table["baseline.ttft.p99"]["scenario speed verdict"].startswith("B: better on")
    assert table["baseline.req_s"]["scenario speed"] == ""
    md = compare.render(compare.comparison([("a", state(baseline(80.0, 500.0))),
                                            ("b", state(baseline(50.0, 600.0)))]), "md")
    assert "- **speed** (latency and throughput): **B**: better on" in md
