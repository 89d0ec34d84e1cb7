"""What a run tells as it goes adds up to what it counted: error events to the totals, and
a server restart (its counters back at zero) is an event and a line in the report."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from aiohttp import web
from support import FIXTURES, running_sim

from loadgen.sim.faults import FaultConfig

SMALL = ["--workers", "1", "-c", "4", "--input-tokens", "8", "--output-tokens", "8",
         "--tick", "0.25", "--drain-grace", "1"]


async def cli(*args: str) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "tui.cli", *args],
                                   capture_output=True, text=True, timeout=90,
                                   stdin=subprocess.DEVNULL)


def events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


async def test_error_events_add_up_to_the_summarys_counts(tmp_path):
    faults = FaultConfig(error_rate=0.3, rate_limit_rate=0.2, retry_after_s=0.0, seed=7)
    async with running_sim(faults=faults) as sim:
        run, summary = tmp_path / "run", tmp_path / "summary.json"
        done = await cli("run", "--headless", "--url", sim.url, *SMALL, "--duration", "3",
                         "--out", str(run), "--json", str(summary))
    assert done.returncode == 0, done.stderr
    result = json.loads(summary.read_text())
    counted = dict(result["requests"]["errors"])
    for kind, n in ((result["drain"] or {}).get("errors") or {}).items():  # the drain's too
        counted[kind] = counted.get(kind, 0) + n
    assert counted.get("http_5xx", 0) > 5 and counted.get("http_429", 0) > 3
    told: dict[str, int] = {}
    for e in events(run):
        if e["kind"] == "error" and e["error"] is not None:  # the typed payload, not prose
            told[e["error"]] = told.get(e["error"], 0) + e["count"]
    assert told == counted  # nothing held back at the end


async def test_a_server_restart_is_an_event_and_in_the_report(tmp_path, unused_tcp_port):
    pages = [(FIXTURES / "metrics" / name).read_text()
             for name in ("vllm.txt", "vllm_next.txt", "vllm_restart.txt")]
    served = {"n": 0}

    async def metrics(_request):  # the server's /metrics: twice as before, then restarted
        page = pages[min(served["n"], 2)]
        served["n"] += 1
        return web.Response(text=page)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        async with running_sim() as sim:
            run = tmp_path / "run"
            done = await cli("run", "--headless", "--url", sim.url, *SMALL, "--duration", "4",
                             "--metrics-url", f"http://127.0.0.1:{unused_tcp_port}/metrics",
                             "--out", str(run))
    finally:
        await runner.cleanup()
    assert done.returncode == 0, done.stderr
    assert served["n"] >= 3
    restarts = [e for e in events(run) if e["kind"] == "restart"]
    assert len(restarts) == 1 and "restarted" in restarts[0]["message"]
    assert "the server restarted" in done.stderr
    report = await cli("report", str(run))
    assert report.returncode == 0, report.stderr
    assert "the server restarted" in (run / "report.md").read_text()
