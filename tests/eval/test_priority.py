"""The eval's priority phase through `tokentop eval`, against simulator processes whose own
record is the truth (GET /sim/requests: the priority and lengths each body carried, when
its first token went out, its status).

Two evals at once, a simulator each, both with two slots so that requests queue: one whose
server schedules by priority (each class's figures against the server's record of that
class in that run, and the urgent class served sooner with its priority than without), and
one whose server does not (vLLM's default: a nonzero priority refused, and the row says
why, in the words that fix it)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import numpy as np
import pytest
from support import ROOT, only_phases, start_sim_process

pytestmark = pytest.mark.timeout(120)

FAST = ("fast", 0.25, 16, 8, 0)  # name, share, in, out, priority: told apart by their out
SLOW = ("slow", 0.75, 96, 24, 5)
CONCURRENCY = 8
# the client reads the first byte after the server wrote it (loopback, a shared core)
CLIENT_AFTER_MS = 15.0


def _plan() -> str:
    classes = ", ".join(f'"{n} {s:.0%} in={i} out={o} priority={p} slo=ttft_p99<30s"'
                        for n, s, i, o, p in (FAST, SLOW))
    return only_phases(f"""
version = 1
slo = "ttft<30s"
[phases.baseline]
enabled = false
concurrency = {CONCURRENCY}
[phases.priority]
classes = [{classes}]
load = "baseline"
factor = 1.0
duration = "3s"
warmup = "0s"
without = true
""")


async def _served(port: int) -> list[dict]:
    async with aiohttp.ClientSession() as http, \
            http.get(f"http://127.0.0.1:{port}/sim/requests") as r:
        assert r.status == 200
        return await r.json()


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    """(eval.json, the server's record) of the eval against a priority-scheduling server,
    then of the one against a first-come-first-served one."""
    tmp = tmp_path_factory.mktemp("priority")
    plan = tmp / "plan.toml"
    plan.write_text(_plan())
    sims = [start_sim_process("--slots=2", *flags)
            for flags in (["--scheduling-policy=priority"], [])]
    try:
        runs = [(tmp / f"out{i}", subprocess.Popen(
            [sys.executable, "-m", "tui.cli", "eval", f"--url=http://127.0.0.1:{port}/v1",
             f"--plan={plan}", f"--out={tmp / f'out{i}'}", "--workers=1", "--headless",
             "--tokenizer=none"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
            cwd=ROOT)) for i, (_, port) in enumerate(sims)]
        for _, proc in runs:
            _, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err[-3000:]
        yield [(json.loads((out / "eval.json").read_text()), asyncio.run(_served(port)))
               for (out, _), (_, port) in zip(runs, sims, strict=True)]
    finally:
        for proc, _ in sims:
            proc.stdin.close()
            proc.wait(10)


def _runs(served: list[dict]) -> tuple[list[dict], list[dict]]:
    """The server's record split into the run with priorities and the one after it without:
    the second begins with the first slow request that came without its priority."""
    start = min(s["arrived_s"] for s in served if s["max_tokens"] == SLOW[3]
                and s["priority"] == 0)
    return ([s for s in served if s["arrived_s"] < start],
            [s for s in served if s["arrived_s"] >= start])


def _rows(state: dict) -> dict[str, dict]:
    return {r["id"]: r for r in state["rows"] if r["id"].startswith("priority")}


def test_each_class_against_the_servers_record(evals):
    (state, served), _ = evals
    figures = state["phases"]["priority"]["figures"]
    with_, without = _runs(served)
    assert figures["load"] == f"{CONCURRENCY} streams"
    for run, classes, prioritised in ((with_, figures["classes"], True),
                                      (without, figures["without"], False)):
        assert [c["name"] for c in classes] == [FAST[0], SLOW[0]]
        for c, (name, _share, _in, out, priority) in zip(classes, (FAST, SLOW),
                                                              strict=True):
            mine = [s for s in run if s["max_tokens"] == out and s["status"] == 200]
            # sent as asked: its priority with, none without; every one of them counted
            assert {s["priority"] for s in mine} == {priority if prioritised else 0}
            assert c["priority"] == (priority if prioritised else None)
            # the figures are the run's window: what ended in its drain (at most a request
            # a stream) is the server's but not the window's
            assert len(mine) - CONCURRENCY <= c["requests_ok"] <= len(mine)
            assert c["requests_failed"] == 0
            # measured apart: its TTFT median is its own requests' by the server's clock
            # (the rank's sample, as a histogram's percentile is: few samples, two modes)
            truth = float(np.percentile([s["first_token_s"] * 1e3 for s in mine], 50,
                                        method="inverted_cdf"))
            assert truth - 0.5 <= c["ttft_ms"]["p50"] <= truth + CLIENT_AFTER_MS, (name, c)
            assert [t["passed"] for t in c["thresholds"]] == [True]
    rows = _rows(state)
    # the urgent class is served sooner for its priority: the server's own TTFTs say so,
    # and so does its row, which is the ratio of the two runs' P99s
    fast_ms = [np.percentile([s["first_token_s"] for s in run if s["max_tokens"] == FAST[3]],
                             99) for run in (with_, without)]
    assert fast_ms[0] < fast_ms[1]
    ratio = rows["priority.fast.ttft.p99_vs_without"]
    assert ratio["value"] < 1.0
    p99 = [c["ttft_ms"]["p99"] for c in (figures["classes"][0], figures["without"][0])]
    assert ratio["value"] == pytest.approx(p99[0] / p99[1])
    assert rows["priority.fast.slo.ttft_p99<30s"]["verdict"] == "PASS"
    assert rows["priority.slow.goodput"]["note"].startswith("requests within ttft<30")


def test_a_server_that_does_not_schedule_by_priority_is_said(evals):
    _, (state, served) = evals
    figures = state["phases"]["priority"]["figures"]
    fast, slow = figures["classes"]
    with_, _ = _runs(served)
    # the server refused every slow request (priority 5) before serving it: none recorded
    assert not [s for s in with_ if s["max_tokens"] == SLOW[3]]
    assert slow["requests_ok"] == 0 and slow["requests_failed"] > 0
    assert "--scheduling-policy priority" in slow["why"]
    ok = len([s for s in with_ if s["status"] == 200])
    assert ok - CONCURRENCY <= fast["requests_ok"] <= ok
    assert fast["why"] == ""
    assert figures["without"][1]["requests_ok"] > 0  # without its priority, it is served
    rows = _rows(state)
    assert "does not schedule by priority" in rows["priority.slow.requests_failed"]["note"]
    # the fast class had the server to itself with the slow one refused: no comparison
    ratio = rows["priority.fast.ttft.p99_vs_without"]
    assert ratio["value"] is None and "not alike" in ratio["note"]
    assert rows["priority.slow.slo.ttft_p99<30s"]["verdict"] == "FAIL"
