"""`tokentop eval --repeat N`: the baseline and each ramp step run N times, and each row is
their mean with a 95 % interval. Truth: each repeat's own run summary (the manifest the run
wrote, not the eval's report of it), numpy over those, and Student's t quantile integrated
here from its density (not the table the matrix keeps)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import ROOT, only_phases

from loadgen.eval.matrix import interval

pytestmark = pytest.mark.timeout(300)

PLAN = only_phases("""
version = 1
slo = "ttft<2s,ttft_p99<4s"
repeat = 2
[phases.baseline]
concurrency = 2
duration = "2s"
warmup = "0.5s"
input_tokens = 16
output_tokens = "uniform:8:24"
[phases.ramp]
steps = [1, 2]
step_duration = "1.5s"
step_warmup = "0.3s"
""")


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile by integrating its density on a fine grid."""
    x = np.linspace(0.0, 200.0, 2_000_001)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    pdf = c * (1 + x * x / df) ** (-(df + 1) / 2)
    cdf = 0.5 + np.concatenate([[0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(x))])
    return float(np.interp(p, cdf, x))


@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_the_interval_is_students_at_95_percent(n):
    rng = np.random.default_rng(n)
    values = list(rng.normal(100.0, 7.0, n))
    mean, low, high = interval(values)
    half = t_quantile(0.975, n - 1) * np.std(values, ddof=1) / math.sqrt(n)
    assert mean == pytest.approx(np.mean(values))
    assert (low, high) == pytest.approx((mean - half, mean + half), rel=1e-3)


@pytest.fixture(scope="module")
def repeated(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("repeat")
    (tmp / "plan.toml").write_text(PLAN)
    out = tmp / "out"
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", "eval", f"--plan={tmp / 'plan.toml'}", f"--out={out}",
         "--workers=1", "--repeat=3", "--headless"], capture_output=True, text=True,
        timeout=280, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def summary(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "manifest.json").read_text())["summary"]


def test_each_baseline_row_is_the_mean_of_its_repeats_runs(repeated):
    """--repeat 3 overrides the plan's 2: three baseline runs, each recorded; the rows are
    the mean of what each run's own summary says, within each its interval."""
    state = json.loads((repeated / "eval.json").read_text())
    base = state["phases"]["baseline"]["figures"]
    assert len(base["run_dirs"]) == 3
    runs = [summary(d) for d in base["run_dirs"]]
    by_id = {r["id"]: r for r in state["rows"]}
    for id_, truth in (("baseline.output_tok_s", [s["throughput"]["output_tok_s"] for s in runs]),
                       ("baseline.ttft.p50", [s["latency_ms"]["ttft"]["p50"] for s in runs])):
        row = by_id[id_]
        assert row["repeats"] == 3
        assert row["value"] == pytest.approx(np.mean(truth), rel=0.02), (id_, truth)
        low, high = row["interval"]
        assert low <= np.min(truth) * 1.02 or low <= row["value"] <= high
        assert low < row["value"] < high or np.ptp(truth) == 0


def test_the_ramp_is_repeated_at_the_same_loads(repeated):
    state = json.loads((repeated / "eval.json").read_text())
    ramp = state["phases"]["ramp"]["figures"]
    assert [s["load"] for s in ramp["steps"]] == [1, 2]
    assert len(ramp["repeats"]["ramp.max_output_tok_s"]) == 3
    row = {r["id"]: r for r in state["rows"]}["ramp.max_output_tok_s"]
    assert row["value"] == pytest.approx(np.mean(ramp["repeats"]["ramp.max_output_tok_s"]))
    assert (repeated / "runs" / "ramp.r3").is_dir()
