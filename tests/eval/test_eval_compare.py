"""`tokentop eval compare`: the judgement against numbers computed here (numpy over repeats
made here, per cent by hand), rows matched by what they measure when the loads differ, the
formats parsed back, and the regression gate through the real command line."""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from support import tokentop

from loadgen.eval import compare, matrix
from loadgen.eval.compare import Judgement
from loadgen.eval.matrix import Row
from loadgen.eval.results import GpuInfo, Header, state_from_builtins

FIXTURES = Path(__file__).parent / "fixtures"
T_975_DF4 = 2.7764451051977987  # Student's t, 97.5th percentile, 4 degrees of freedom


def raw(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def write_eval(root: Path, name: str, data: dict) -> Path:
    d = root / name
    d.mkdir()
    (d / "eval.json").write_text(json.dumps(data))
    return d


def repeated(samples: np.ndarray, better: str = "lower") -> Row:
    """A row as an eval with 5 repeats makes it: the mean and its 95 % t-interval."""
    mean = float(np.mean(samples))
    half = T_975_DF4 * float(np.std(samples, ddof=1)) / np.sqrt(len(samples))
    return Row("latency & throughput", "TTFT P99", mean, "ms", better, id="baseline.ttft.p99",
               interval=(mean - half, mean + half), repeats=len(samples))


def one_run(value: float, better: str | None = "higher") -> Row:
    return Row("latency & throughput", "requests/s", value, "req/s", better, id="baseline.req_s")


# ---- the judgement ------------------------------------------------------------------------


def test_repeats_judge_by_the_intervals_not_the_band():
    rng = np.random.default_rng(7)
    # 3 % slower but tight: the intervals are apart, so it is worse (the band would say same)
    a, b = rng.normal(100, 0.5, 5), rng.normal(103, 0.5, 5)
    ra, rb = repeated(a), repeated(b)
    assert ra.interval[1] < rb.interval[0]  # the truth, from numpy: no overlap
    pct = (np.mean(b) - np.mean(a)) / np.mean(a) * 100
    assert pct < compare.NOISE_BAND_PCT
    change = compare.judge(ra, rb)
    assert change.judgement is Judgement.WORSE
    assert change.pct == pytest.approx(pct)
    # 10 % slower but noisy: the intervals overlap, so it is the same within noise
    a, b = np.array([80.0, 120, 95, 105, 100]), np.array([90.0, 130, 105, 115, 110])
    ra, rb = repeated(a), repeated(b)
    assert ra.interval[1] > rb.interval[0]
    assert (np.mean(b) - np.mean(a)) / np.mean(a) * 100 == pytest.approx(10)
    assert compare.judge(ra, rb).judgement is Judgement.SAME


@pytest.mark.parametrize(("a", "b", "judgement"), [
    (100.0, 104.0, Judgement.SAME), (100.0, 96.0, Judgement.SAME),
    (100.0, 106.0, Judgement.BETTER), (100.0, 94.0, Judgement.WORSE),
])
def test_one_run_each_judges_by_the_band(a, b, judgement):
    change = compare.judge(one_run(a), one_run(b))
    assert change.judgement is judgement
    assert change.pct == pytest.approx((b - a) / a * 100)
    # a lower-is-better figure: the other way round
    flipped = {Judgement.BETTER: Judgement.WORSE, Judgement.WORSE: Judgement.BETTER}
    assert compare.judge(one_run(a, "lower"), one_run(b, "lower")).judgement is \
        flipped.get(judgement, judgement)


def test_from_zero_and_to_zero_are_marked_not_a_per_cent_of_zero():
    up = compare.judge(one_run(0.0, "lower"), one_run(7.0, "lower"))
    assert (up.from_zero, up.pct, up.judgement) == (True, None, Judgement.WORSE)
    assert up.text() == "from 0 worse"
    down = compare.judge(one_run(7.0, "lower"), one_run(0.0, "lower"))
    assert (down.to_zero, down.pct, down.judgement) == (True, -100.0, Judgement.BETTER)
    assert down.text() == "-100.0% (to 0) better"


def test_a_fact_is_never_better_or_worse():
    change = compare.judge(one_run(6.0, None), one_run(1.0, None))
    assert change.judgement is Judgement.FACT
    assert change.pct == pytest.approx(-500 / 6)
    assert "worse" not in change.text() and "better" not in change.text()


# ---- matching, formatting, differences ----------------------------------------------------


def moved(data: dict) -> dict:
    """A copy of an eval whose baseline ran at 8 streams and whose knee is at 6."""
    out = copy.deepcopy(data)
    out["phases"]["baseline"]["figures"]["load"] = "8 streams"
    out["phases"]["ramp"]["figures"]["knee"]["load"] = 6.0
    return out


def test_rows_are_matched_by_what_they_measure_when_the_loads_differ():
    a = state_from_builtins(raw("eval-filled"))
    b = state_from_builtins(moved(raw("eval-filled")))
    c = compare.comparison([("a", a), ("b", b)])
    assert [line.id for line in c.lines] == [r.id for r in matrix.rows(a.phases)]
    by_id = {line.id: line for line in c.lines}
    req = by_id["baseline.req_s"]
    assert [r.load for r in req.rows] == ["4 streams", "8 streams"]
    assert req.changes[1].judgement is Judgement.SAME  # same figure, both sides present
    knee = by_id["ramp.knee"]
    assert [r.value for r in knee.rows] == [2.0, 6.0]
    assert knee.changes[1].judgement is Judgement.FACT and knee.changes[1].pct == 200
    assert [r.load for r in by_id["ramp.knee.output_tok_s"].rows] == ["2 streams", "6 streams"]
    text = compare.render(c, "text")
    assert "+200.0% not judged" in text and "8 streams" in text
    # a latency at another load says what the load did as much as the server: not judged;
    # the throughput at each side's knee is the capacity each server has: judged
    ttft = by_id["ramp.knee.ttft.p99"]
    assert ttft.changes[1].judgement is Judgement.OTHER_LOAD
    assert by_id["baseline.ttft.p99"].changes[1].judgement is Judgement.OTHER_LOAD
    assert by_id["ramp.knee.output_tok_s"].changes[1].judgement is not Judgement.OTHER_LOAD


def test_a_row_in_one_eval_only_is_n_a_with_a_note():
    a = raw("eval-filled")
    b = copy.deepcopy(a)
    del b["phases"]["faults"]["figures"]["faults"][3]  # the bandwidth fault
    c = compare.comparison([("a", state_from_builtins(a)), ("b", state_from_builtins(b))])
    line = next(x for x in c.lines if x.id == "faults.bandwidth#1.success_rate")
    assert line.rows[1] is None and line.changes[1] is None
    text = compare.render(c, "text")
    at = text.index("success rate under bandwidth")
    assert "n/a" in text[at:].splitlines()[0]
    assert "only in A: matched by what it measures (faults.bandwidth#1.success_rate)" in text


def test_a_whole_value_beside_one_with_decimals_gets_its_decimals():
    a = raw("eval-filled")
    b = copy.deepcopy(a)
    a["phases"]["faults"]["figures"]["faults"][1]["recovery_s"] = 3.0
    b["phases"]["faults"]["figures"]["faults"][1]["recovery_s"] = 3.01
    text = compare.compare([("a", state_from_builtins(a)), ("b", state_from_builtins(b))])
    row = next(x for x in text.splitlines() if "recovery after blackhole" in x)
    cells = [x.strip() for x in row.split("  ") if x.strip()]
    assert cells[:3] == ["recovery after blackhole 3 s", "3.00 s", "3.01 s"]


def test_the_text_is_aligned_and_names_are_whole():
    c = compare.comparison([("a/eval", state_from_builtins(raw("eval"))),
                            ("b/filled", state_from_builtins(raw("eval-filled")))])
    lines = compare.render(c, "text").splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("figure"))
    names = ("A", "A load", "B", "B load", "B vs A")
    # each column's right edge, from the header row (the values are right-aligned to it)
    edges = [lines[head].index(f" {n}") + 1 + len(n) for n in names]
    starts = [compare.FIGURE_WIDTH + 2] + [e + 2 for e in edges[:-1]]
    value_rows = [x for x in lines[head + 1:] if x.startswith("  ") and not x.startswith("   ")]
    assert len(value_rows) == len(c.lines)
    cells = []
    for x in value_rows:
        x = x.ljust(edges[-1])
        for start, edge in zip(starts, edges, strict=True):
            assert x[start - 2:start] == "  ", x  # a gap before every column
            cell = x[start:edge]
            assert cell.isspace() or cell == cell.rstrip(), x  # ends at the column's edge
        cells.append([x[s:e].strip() for s, e in zip(starts, edges, strict=True)])
    req = cells[[line.id for line in c.lines].index("baseline.req_s")]
    assert req == ["28.8 req/s", "4 streams", "28.8 req/s", "4 streams", "+0.0% same within noise"]
    words = " ".join(x.strip() for x in lines[head + 1:])
    for line in c.lines:  # wrapped, never cut: every word of every figure is there
        assert all(w in words for w in line.row.figure.split())
    assert any(len(line.row.figure) > compare.FIGURE_WIDTH for line in c.lines)  # one wraps


def test_every_header_difference_is_named_and_made_plain():
    a, b = state_from_builtins(raw("eval")), state_from_builtins(raw("eval"))
    a.header = Header(engine="vllm", engine_version="0.11.0", model="llama-8b", plan_digest="aa",
                      gpus=[GpuInfo(name="NVIDIA H200", memory_mb=143771, driver="570")] * 2)
    b.header = Header(engine="llama.cpp\x1b[31m", engine_version="b4000", model="llama-8b",
                      plan_digest="bb", label="cpp", meta={"tp": "1"},
                      gpus=[GpuInfo(name="NVIDIA H200", memory_mb=143771, driver="570")])
    b.quick = True
    diffs = compare.differences([("A", a), ("B", b)])
    said = "\n".join(diffs)
    for field in ("engine is", "engine version is", "plan digest is", "label is", "meta is",
                  "gpus is", "different profiles"):
        assert field in said, field
    assert "model is" not in said  # the same in both
    assert "2 × NVIDIA H200" in said and "1 × NVIDIA H200" in said
    assert "\x1b" not in said
    older = state_from_builtins(raw("eval"))
    assert compare.differences([("A", a), ("old", older)]) == [
        "old has no header (an older eval): engine, model, GPUs and plan are not compared"]


# ---- the formats parsed back --------------------------------------------------------------


def _pair() -> compare.Comparison:
    return compare.comparison([("a", state_from_builtins(raw("eval"))),
                               ("b", state_from_builtins(moved(raw("eval-filled"))))])


def test_csv_and_json_have_every_row_with_each_evals_values():
    c = _pair()
    a, b = raw("eval"), moved(raw("eval-filled"))
    ids = list(dict.fromkeys([r.id for r in matrix.rows(state_from_builtins(a).phases)] +
                             [r.id for r in matrix.rows(state_from_builtins(b).phases)]))
    table = list(csv.DictReader(io.StringIO(compare.render(c, "csv"))))
    assert sorted(t["id"] for t in table) == sorted(ids)
    by_id = {t["id"]: t for t in table}
    # the values are eval.json's own, not a rendering of them
    assert float(by_id["baseline.req_s"]["A value"]) == a["phases"]["baseline"]["figures"]["req_s"]
    assert by_id["baseline.req_s"]["B load"] == "8 streams"
    assert by_id["ramp.knee"]["A value"] == "" and float(by_id["ramp.knee"]["B value"]) == 6.0
    assert by_id["long_tail.ttft.breakouts"]["B change %"] == "from 0"
    assert by_id["long_tail.ttft.breakouts"]["B judgement"] == "worse"
    doc = json.loads(compare.render(c, "json"))
    assert [r["id"] for r in doc["rows"]] == [line.id for line in c.lines]
    assert sorted(r["id"] for r in doc["rows"]) == sorted(ids)
    req = next(r for r in doc["rows"] if r["id"] == "baseline.ttft.p99")
    truth = [a["phases"]["baseline"]["figures"]["latency_ms"]["ttft"]["p99"],
             b["phases"]["baseline"]["figures"]["latency_ms"]["ttft"]["p99"]]
    assert [e["value"] for e in req["evals"]] == truth
    assert {"interval", "samples", "flags", "load", "repeats"} <= set(req["evals"][0])
    # B ran its baseline at 8 streams, A at 4: a latency at another load is not judged
    assert req["against_first"][0]["judgement"] == "not judged: at another load"
    assert any("input_tokens" in d for d in doc["differences"])
    assert doc["noise"]["band_pct"] == compare.NOISE_BAND_PCT


def test_md_is_a_table_with_every_row():
    c = _pair()
    md = compare.render(c, "md").splitlines()
    table = [x for x in md if x.startswith("|")]
    head = [x.strip() for x in table[0].strip("|").split(" | ")]
    assert head[:4] == ["dimension", "figure", "A", "A load"] and head[-1] == "notes"
    body = table[2:]
    assert len(body) == len(c.lines)
    for x in body:  # the same number of cells on every line: no stray pipe from a figure
        assert x.replace("\\|", "").count("|") == table[0].count("|")


# ---- the regression gate, through the real command ----------------------------------------


def _worse(data: dict, factor: float) -> dict:
    out = copy.deepcopy(data)
    out["phases"]["baseline"]["figures"]["latency_ms"]["ttft"]["p99"] *= factor
    return out


def test_the_gate_exits_3_on_a_regression_beyond_its_per_cent(tmp_path):
    base = write_eval(tmp_path, "base", raw("eval"))
    slower = write_eval(tmp_path, "slower", _worse(raw("eval"), 1.30))  # TTFT P99 +30 %
    r = tokentop("eval", "compare", str(base), str(slower), "--fail-on-regression", "10")
    assert r.returncode == 3, r.stderr
    assert "regression gate: FAILED, 1 row" in r.stdout
    assert "[baseline.ttft.p99]: B +30.0% worse" in r.stdout
    # the same regression under a wider gate passes, as does a change within the noise
    r = tokentop("eval", "compare", str(base), str(slower), "--fail-on-regression", "50")
    assert r.returncode == 0 and "regression gate: passed" in r.stdout
    near = write_eval(tmp_path, "near", _worse(raw("eval"), 1.04))
    out = tmp_path / "gate.json"
    r = tokentop("eval", "compare", str(base), str(near), "--fail-on-regression", "1",
                 "--format", "json", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["gate"]["passed"] is True


def test_a_limit_that_held_and_broke_fails_the_gate_whatever_its_per_cent(tmp_path):
    """The fixture's plan says ttft_p99<4s; A's TTFT P99 is 17 ms. × 300 is 5.1 s: past the
    limit, so the gate fails even at 100,000 % (the change is +29,900 %), and says which
    limit."""
    data = raw("eval")
    assert "ttft_p99<4s" in data["plan"]["slo"]
    base = write_eval(tmp_path, "base", data)
    broken = write_eval(tmp_path, "broken", _worse(data, 300.0))
    assert _worse(data, 300.0)["phases"]["baseline"]["figures"]["latency_ms"]["ttft"]["p99"] \
        > 4000
    r = tokentop("eval", "compare", str(base), str(broken), "--fail-on-regression", "100000")
    assert r.returncode == 3, r.stdout
    assert "FAIL where A passed (< 4.00 s)" in r.stdout


@pytest.mark.parametrize(("flags", "says"), [
    (["--fail-on-regression", "lots"], "expected a per cent"),
    (["--fail-on-regression", "-5"], "0 or more"),
    (["--format", "xml"], "invalid choice"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, flags, says):
    base = write_eval(tmp_path, "base", raw("eval"))
    r = tokentop("eval", "compare", str(base), str(base), *flags)
    assert r.returncode == 2
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_repeated_rows_show_their_interval_and_the_rule_that_judged_them():
    rng = np.random.default_rng(11)
    ra, rb = repeated(rng.normal(100, 0.5, 5)), repeated(rng.normal(130, 0.5, 5))
    line = compare.Line(ra.id, (ra, rb), (None, compare.judge(ra, rb)))
    lines = (line,)
    c = compare.Comparison(("a", "b"), ("", ""), lines, (), tuple(compare._noise_notes(lines)))
    text = compare.render(c, "text")
    low, high = ra.interval
    assert f"[{low:.3g} ms – {high:.3g} ms]" in text  # three figures, as every latency
    assert "the two 95 % intervals do not overlap" in text and "one run each" not in text
    assert "worse" in text.splitlines()[-1]


def test_a_time_dated_by_the_tick_is_the_same_within_one_tick():
    """Recovery after a fault is dated by the faults phase's 0.25 s tick: 0.02 s against
    0.24 s (+1100 %) is one tick's difference, the same; 0.02 against 0.60 is not."""
    from loadgen.eval.under_fault import FAULT_TICK_S

    def recovery(value: float) -> Row:
        return Row("stability under faults", "recovery after resets", value, "s", "lower",
                   id="faults.reset#1.recovery", resolution=FAULT_TICK_S)

    assert compare.judge(recovery(0.02), recovery(0.24)).judgement is Judgement.SAME
    assert compare.judge(recovery(0.02), recovery(0.60)).judgement is Judgement.WORSE
    rows = matrix.state_rows(state_from_builtins(raw("eval")))
    assert next(r for r in rows if r.id.endswith(".recovery")).resolution == FAULT_TICK_S

