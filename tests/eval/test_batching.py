"""The eval's batch phase through `tokentop eval`, against exact-timing simulator processes,
whose truth is known: every request's first token TTFT after it arrives and each next one ITL
later, so N requests at once end TTFT + (n − 1)·ITL after they are sent, and the simulator's
own generation-token counter on /metrics counts what they delivered. The fluctuation at each
ramp step is checked against the ramp's latency.hlog, read here with the hdrh library (its
decoder and its percentiles), not through loadgen's histogram code.

Two evals run at once, one a simulator each: a batch alone on a fresh simulator (its token
counter is the batch's alone), and a baseline, a ramp and a batch (the ratio, the steps)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from support import ROOT, scrape, start_sim_process, tokentop

pytestmark = pytest.mark.timeout(120)

TTFT_MS, ITL_MS = 100.0, 10.0  # the simulators' exact timing
OUT_TOKENS = 32  # every request's (ignore_eos: the simulator gives exactly this many)
ALONE_N, WITH_N = 16, 8  # the requests of each eval's batch
# the client's own share of a time (connecting, reading, its ticks) on a shared CI core
SLACK_MS = 120.0
STEPS = (1, 4)
STEP_S, STEP_WARMUP_S = 1.5, 0.5

_OFF = ("conformance", "context", "interference", "priority", "long_tail", "leaks", "memory",
        "efficiency", "scaling")


def _plan(n: int, *, baseline_and_ramp: bool) -> str:
    on = "true" if baseline_and_ramp else "false"
    text = f"""
version = 1
slo = "ttft<2s"
[phases]
faults = []
[phases.baseline]
enabled = {on}
concurrency = 4
duration = "2s"
warmup = "0.5s"
input_tokens = 32
output_tokens = {OUT_TOKENS}
[phases.ramp]
enabled = {on}
steps = {list(STEPS)}
step_duration = "{STEP_S}s"
step_warmup = "{STEP_WARMUP_S}s"
[phases.batch]
requests = {n}
timeout = "30s"
"""
    return text + "".join(f"[phases.{p}]\nenabled = false\n" for p in _OFF)


def _argv(port: int, plan: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "tui.cli", "eval", f"--url=http://127.0.0.1:{port}/v1",
            f"--plan={plan}", f"--out={out}", "--workers=1", "--headless"]


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    """(eval.json of the batch alone, its simulator's /metrics after it; eval.json and
    directory of the eval with a baseline and a ramp)."""
    tmp = tmp_path_factory.mktemp("batching")
    flags = ("--profile", "exact", f"--exact-ttft-ms={TTFT_MS}", f"--exact-itl-ms={ITL_MS}")
    sims = [start_sim_process(*flags) for _ in range(2)]
    try:
        runs = []
        for i, (n, with_ramp) in enumerate(((ALONE_N, False), (WITH_N, True))):
            plan = tmp / f"plan{i}.toml"
            plan.write_text(_plan(n, baseline_and_ramp=with_ramp))
            runs.append((tmp / f"out{i}", subprocess.Popen(
                _argv(sims[i][1], plan, tmp / f"out{i}"), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, cwd=ROOT)))
        for _, proc in runs:
            _, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err[-3000:]
        metrics = asyncio.run(scrape(f"http://127.0.0.1:{sims[0][1]}/metrics"))
        states = [json.loads((out / "eval.json").read_text()) for out, _ in runs]
        yield states[0], metrics, states[1], runs[1][0]
    finally:
        for proc, _ in sims:
            proc.stdin.close()
            proc.wait(10)


def _rows(state: dict) -> dict[str, dict]:
    return {r["id"]: r for r in state["rows"] if r["id"].startswith("batch")}


def test_the_static_batch_against_the_simulators_closed_form(evals):
    alone, metrics, _, _ = evals
    rows = _rows(alone)
    # the simulator's own count of the tokens it generated: the batch's, it ran alone
    truth_tokens = metrics["vllm:generation_tokens_total"]
    assert truth_tokens == ALONE_N * OUT_TOKENS
    assert rows["batch.output_tokens"]["value"] == truth_tokens
    assert rows["batch.requests_failed"]["value"] == 0
    assert rows["batch.requests_failed"]["samples"] == ALONE_N
    # every request sent at once: the last token TTFT + (n − 1)·ITL after the first send
    last_ms = TTFT_MS + (OUT_TOKENS - 1) * ITL_MS
    measured = rows["batch.time_to_last_token"]["value"]
    assert last_ms <= measured <= last_ms + SLACK_MS
    tok_s = rows["batch.output_tok_s"]["value"]
    assert truth_tokens / ((last_ms + SLACK_MS) / 1000) <= tok_s <= truth_tokens / (last_ms / 1000)
    assert tok_s == pytest.approx(truth_tokens / (measured / 1000), rel=1e-9)
    for q in ("p50", "p99"):
        assert TTFT_MS <= rows[f"batch.ttft.{q}"]["value"] <= TTFT_MS + SLACK_MS
    assert last_ms <= rows["batch.e2e.p50"]["value"] <= rows["batch.e2e.max"]["value"] == measured
    assert rows["batch.ttft.p50"]["samples"] == ALONE_N
    # no baseline, no ramp: the rows say why, never a silent blank
    assert rows["batch.static_vs_dynamic"]["value"] is None
    assert "baseline" in rows["batch.static_vs_dynamic"]["note"]
    assert rows["batch.fluctuation"]["value"] is None
    assert "ramp skipped" in rows["batch.fluctuation"]["note"]


def test_static_beside_the_dynamic_baseline(evals):
    _, _, state, _ = evals
    rows = _rows(state)
    baseline = state["phases"]["baseline"]["figures"]["output_tok_s"]
    static = rows["batch.output_tok_s"]["value"]
    # 8 requests at once of 32 tokens in about 0.41 s, against 4 streams at 10 ms a token
    assert static == pytest.approx(WITH_N * OUT_TOKENS / (rows["batch.time_to_last_token"]
                                                          ["value"] / 1000))
    assert rows["batch.static_vs_dynamic"]["value"] == pytest.approx(static / baseline)
    assert "4 streams" in rows["batch.static_vs_dynamic"]["note"]


def _hlog(path: Path) -> tuple[float, list[tuple[str, float, float, str]]]:
    """latency.hlog's BaseTime and its intervals (tag, start, length, blob), parsed here."""
    base, out = None, []
    for line in path.read_text().splitlines():
        if line.startswith("#[BaseTime:"):
            base = float(line.split()[1])
        elif line.startswith("Tag="):
            tag, start, length, _max, blob = line[4:].split(",")
            out.append((tag, float(start), float(length), blob))
    assert base is not None
    return base, out


def _step_spans(run_dir: Path, base: float) -> dict[int, tuple[float, float]]:
    """Each step's measured span in the hlog's time: from a warm-up after the end of the first
    tick the recording shows at its target load, for the step's seconds."""
    first: dict[int, float] = {}
    for line in (run_dir / "snapshots.jsonl").read_text().splitlines():
        snap = json.loads(line)
        first.setdefault(snap["load"]["target_concurrency"], snap["t"] - base)
    return {n: (first[n] + STEP_WARMUP_S, first[n] + STEP_WARMUP_S + STEP_S) for n in STEPS}


def test_the_fluctuation_at_each_step_against_the_hlog(evals):
    _, _, state, out = evals
    rows = _rows(state)
    base, intervals = _hlog(out / "runs" / "ramp" / "latency.hlog")
    spans = _step_spans(out / "runs" / "ramp", base)
    for n, (t0, t1) in spans.items():
        for metric in ("itl", "tpot"):
            h = HdrHistogram(1, 3_600_000_000, 3)
            for tag, start, length, blob in intervals:
                if tag == metric and t0 <= start + length / 2 <= t1:
                    h.add(HdrHistogram.decode(blob.encode()))
            p25, p50, p75, p99 = (h.get_value_at_percentile(q) / 1000 for q in (25, 50, 75, 99))
            assert h.get_total_count() > 0
            # the simulator's truth: every token ITL after the one before it
            assert ITL_MS * 0.9 <= p50 <= ITL_MS * 1.3, (n, metric, p50)
            key = f"batch.fluctuation.{n}.{metric}"
            ratio, iqr = rows[f"{key}_p99_p50"], rows[f"{key}_iqr"]
            assert ratio["samples"] == iqr["samples"] == h.get_total_count()
            assert ratio["value"] == pytest.approx(np.float64(p99) / p50, rel=1e-6)
            assert iqr["value"] == pytest.approx(np.float64(p75) - p25, abs=1e-6)
            assert ratio["load"] == f"{n} streams"


def test_a_bad_batch_setting_is_one_line(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text("version = 1\n[phases.batch]\nrequests = 0\n")
    done = tokentop("eval", "--url=http://127.0.0.1:9/v1", f"--plan={plan}",
                    f"--out={tmp_path / 'out'}", timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"tokentop eval: {plan}: phases.batch.requests: expected a whole number, at least 1, "
        "got 0"]
