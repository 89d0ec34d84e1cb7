"""Priority classes (`--mix`, issue 26.6), judged by the simulator's own record of every
request it served (GET /sim/requests: the priority and lengths each body carried, when its
first token was written): each class sent as asked (its priority, its lengths, its share of
the requests), counted apart (the classes sum to the run's totals, exactly, in every tick
recorded), and measured apart (each class's TTFT against the server's own first-token
times of that class's requests, numpy over the raw records)."""

from __future__ import annotations

import asyncio
import json
import math

import aiohttp
import numpy as np
from support import WAIT_S, root, running_sim, tokentop

from loadgen.analysis.report import analyze_dir, markdown, summary_lines
from loadgen.record.replay import ReplaySource
from loadgen.record.rundir import iter_snapshots
from tui.app import TokentopApp
from tui.commands.replay import recorded_mix

# two classes told apart at the server by their priority and their lengths
FAST = ("interactive", 0.25, 16, 8, 0)  # name, share, in, out, priority
SLOW = ("batch", 0.75, 96, 24, 5)
CLASSES = (FAST, SLOW)
REQUESTS = 240
# client TTFT against the server's first write, per class median: the client reads the
# byte after the server wrote it (loopback, the worker's loop on a shared 2-core machine)
CLIENT_AFTER_MS = 15.0


# each class judged by its own limits: a per-request one (its goodput) and a percentile one
# (its verdict), loose enough to hold on a loaded machine
SLO = "ttft<10s,ttft_p99<20s"


def _mix_flags() -> list[str]:
    return [f"--mix={name} {share:.0%} in={i} out={o} priority={p} slo={SLO}"
            for name, share, i, o, p in CLASSES]


async def _served(sim) -> list[dict]:
    async with aiohttp.ClientSession() as http, http.get(f"{root(sim)}/sim/requests") as r:
        assert r.status == 200
        return await r.json()


async def test_each_class_is_sent_counted_and_measured_as_its_own(tmp_path):
    out = tmp_path / "summary.json"
    # two slots: requests queue, so the server's priority order shapes each class's TTFT
    async with running_sim(scheduling_policy="priority", slots=2) as sim:
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", "--workers=1", "--tick=0.25",
            "--concurrency=8", f"--requests={REQUESTS}", "--tokenizer=none",
            "--json", str(out), f"--out={tmp_path / 'run'}", *_mix_flags())
        served = await _served(sim)
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    rows = {r["name"]: r for r in summary["classes"]}
    assert [r["name"] for r in summary["classes"]] == [c[0] for c in CLASSES]

    last = list(iter_snapshots(tmp_path / "run"))[-1]
    ok = [s for s in served if s["status"] == 200]
    assert len(ok) == last.counters.requests_ok  # the drain's too, on both sides
    for name, share, _in, asked_out, priority in CLASSES:
        mine = [s for s in ok if s["priority"] == priority]
        counted = last.classes[name].counters
        # sent as asked: its priority on every body, its output length asked, its prompts
        assert {s["max_tokens"] for s in mine} == {asked_out}
        assert counted.requests_ok == len(mine)
        assert counted.input_tokens == sum(s["prompt_tokens"] for s in mine)
        assert counted.output_tokens == asked_out * len(mine)
        # its share of the requests: the seeded draw, within four binomial deviations
        sigma = math.sqrt(share * (1 - share) / len(ok))
        assert abs(len(mine) / len(ok) - share) < 4 * sigma, (name, len(mine), len(ok))
        assert rows[name]["priority"] == priority
        # measured apart: the class's TTFT is its own requests', by the server's clock
        server_ms = np.array([s["first_token_s"] for s in mine]) * 1e3
        client_ms = rows[name]["latency_ms"]["ttft"]["p50"]
        truth = float(np.percentile(server_ms, 50, method="inverted_cdf"))  # a rank's sample
        assert truth - 0.5 <= client_ms <= truth + CLIENT_AFTER_MS, (name, client_ms, truth)
    assert {s["priority"] for s in ok} == {c[4] for c in CLASSES}

    # counted apart: in every tick, the classes add up to the run's totals, exactly
    for snap in iter_snapshots(tmp_path / "run"):
        parts = [c.counters for c in snap.classes.values()]
        for field in ("requests_ok", "requests_failed", "requests_good", "output_tokens",
                      "input_tokens", "chunks"):
            assert sum(getattr(p, field) for p in parts) == getattr(snap.counters, field)
    # the server served the interactive class first: its TTFT tail is the shorter
    fast, slow = (rows[c[0]]["latency_ms"]["ttft"]["p50"] for c in CLASSES)
    assert fast < slow
    assert [(t["class"], t["passed"]) for t in summary["thresholds"]] == [
        (c[0], True) for c in CLASSES]
    await _console_shows_each_class(tmp_path / "run", rows)
    _report_tells_each_class(tmp_path / "run", ok, summary)


def _report_tells_each_class(run_dir, ok: list[dict], summary: dict) -> None:
    """`tokentop report` of the run: a row a class, its TTFT its own requests' by the
    server's clock (numpy over the server's record), its verdicts those of the run's end."""
    r, _ = analyze_dir(run_dir)
    assert [c["name"] for c in r["classes"]] == [c[0] for c in CLASSES]
    drained = (summary["drain"] or {}).get("requests_ok", 0)
    outside = 0  # the server's requests of each class that the window does not hold
    for row, (name, _share, _in, _out, priority) in zip(r["classes"], CLASSES, strict=True):
        mine = [s for s in ok if s["priority"] == priority]
        assert 0 < row["requests"]["ok"] <= len(mine)
        outside += len(mine) - row["requests"]["ok"]
        server_ms = np.array([s["first_token_s"] for s in mine]) * 1e3
        truth = float(np.percentile(server_ms, 50, method="inverted_cdf"))
        got = row["latency_ms"]["ttft"]["p50"]
        assert truth - 0.5 <= got <= truth + CLIENT_AFTER_MS, (name, got, truth)
        assert [t["passed"] for t in row["thresholds"]] == [
            t["passed"] for t in summary["thresholds"] if t.get("class") == name]
    assert outside == drained  # the classes' windows are the run's: only the drain is out
    text = "\n".join(summary_lines(r))
    for name, *_ in CLASSES:
        assert f"class {name} (priority" in text and f"PASS {name}: " in text
    assert "## Classes (--mix)" in markdown(r, [])


async def _console_shows_each_class(run_dir, rows: dict[str, dict]) -> None:
    """`tokentop replay` of the run: a latency line a class, each with its verdict by its
    own SLO (the replay's console takes the mix from the recording)."""
    app = TokentopApp(ReplaySource(run_dir, speed=1000.0, hold=True), refresh=0.05,
                      mix=recorded_mix(run_dir))
    async with app.run_test(size=(160, 50)) as pilot:
        latency = await _latency_once(pilot, app, lambda text: all(
            f"{name} TTFT" in text for name in rows))
    for name in rows:
        line = next(ln for ln in latency.splitlines() if f"{name} TTFT" in ln)
        assert "SLO ok" in line and " / " in line, line  # its P50 / P99, its verdict


async def _latency_once(pilot, app, shown) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not shown(text := app.query_one("#latency").plain):
        assert loop.time() < deadline, f"the classes never shown: {text}"
        await pilot.pause(0.05)
    return text
