"""`tokentop report` and the run's --json summary of one recording say the same: the rates,
requests and seconds of the window from the end of warm-up to the start of the drain, the
same whole-run latencies, the same drain apart. The truth for the rates is the simulator's
own /metrics counters, scraped by the test over the window the report names; for the GPU
memory at the load's end, the recorder's own snapshots.jsonl."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time

import numpy as np
import pytest
from support import headless_argv, scrape

from loadgen.analysis.report import write_report
from loadgen.sim import SimConfig, start_sim
from loadgen.sim.faults import FaultConfig

RATE = 8.0  # req/s, constant arrivals: a steady load, so every whole bucket reads the same
TOKENS = 50  # 50 ms + 49 × 20 ms ≈ 1.03 s a request: ~8 in flight, staggered
DURATION, WARMUP = 6.0, 1.0
SUCCESS, GENERATED = "vllm:request_success_total", "vllm:generation_tokens_total"


class CounterLog:
    """The server's /metrics counters, scraped every POLL_S with the wall time of each scrape
    (its middle): a counter's value at any time between two scrapes is interpolated."""

    POLL_S = 0.05

    def __init__(self, url: str) -> None:
        self.url = url
        self.rows: list[tuple[float, dict[str, float]]] = []

    async def _poll(self) -> None:
        while True:
            t0 = time.time()
            page = await scrape(self.url)
            self.rows.append(((t0 + time.time()) / 2, page))
            await asyncio.sleep(self.POLL_S)

    @contextlib.asynccontextmanager
    async def running(self):
        task = asyncio.create_task(self._poll())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def between(self, name: str, a: float, b: float) -> float:
        t = np.array([r[0] for r in self.rows])
        v = np.array([r[1].get(name, 0.0) for r in self.rows])
        return float(np.interp(b, t, v) - np.interp(a, t, v))


async def _recorded_run(tmp_path, **settings) -> tuple[dict, CounterLog]:
    """A real headless run with --json and a run directory, against an exact-timing
    simulator that fails one request in ten (HTTP 500), its /metrics logged meanwhile."""
    sim = await start_sim(SimConfig(exact_ttft_ms=50.0, exact_itl_ms=20.0,
                                    faults=FaultConfig(error_rate=0.1)),
                          host="127.0.0.1", port=0)
    log = CounterLog(sim.url.removesuffix("/v1") + "/metrics")
    argv = headless_argv("--json", str(tmp_path / "summary.json"), url=sim.url, mode="open",
                         rate=RATE, arrival="constant", duration=DURATION, warmup=WARMUP,
                         drain_grace=5, output_tokens=TOKENS, input_tokens=8, workers=1,
                         tick=0.25, out=tmp_path / "run", slo="error_rate<50%,req_s>1",
                         **settings)
    try:
        async with log.running():
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await sim.close()
    assert proc.returncode == 0, err.decode()[-2000:]
    return json.loads((tmp_path / "summary.json").read_text()), log


def _report(run_dir, **kw) -> dict:
    code, _ = write_report(run_dir, plots=False, out=io.StringIO(), **kw)
    assert code == 0
    return json.loads((run_dir / "report.json").read_text())


def _load_end_gpu_mb(run_dir) -> float:
    """The GPU memory of the load's last tick (the first draining one), read from the
    recorder's own file, not through the analysis."""
    for line in (run_dir / "snapshots.jsonl").read_text().splitlines():
        snap = json.loads(line)
        if snap["load"]["state"] in ("draining", "stopped"):
            return sum(g["memory_used_bytes"] for g in snap["gpu"]["gpus"]) / 1e6
    raise AssertionError("the run never drained")


async def test_report_and_summary_of_one_recording_agree(tmp_path):
    summary, server = await _recorded_run(tmp_path)
    r = _report(tmp_path / "run", bucket_s=2.0)
    req, drain = summary["requests"], summary["drain"]
    assert drain is not None and drain["requests_ok"] >= 3  # ~8 in flight at the stop
    # every figure they share, the same
    assert r["measured_requests"] == {"ok": req["ok"], "failed": req["failed"]}
    assert r["measured_s"] == pytest.approx(summary["duration_s"], abs=1e-3)
    for key in ("req_s", "output_tok_s"):
        assert r["rates"][key] == pytest.approx(summary["throughput"][key], rel=1e-5)
    assert req["failed"] > 0
    assert r["rates"]["error_rate"] == pytest.approx(req["failed"] / (req["ok"] + req["failed"]),
                                                     rel=1e-5)
    shown = {t["text"]: t["measured"] for t in summary["thresholds"]}
    assert {t["text"]: t["measured"] for t in r["thresholds"]} == pytest.approx(shown, rel=1e-5)
    for metric in ("ttft", "itl", "e2e"):
        mine, theirs = r["latency_ms"][metric], summary["latency_ms"][metric]
        assert mine["count"] == theirs["count"] > 0
        for q in ("p50", "p90", "p99", "p99.9", "max"):
            assert mine[q] == pytest.approx(theirs[q], abs=1e-3), (metric, q)
    assert r["drain"] == drain

    # the window is the load: the --duration after the --warmup, the drain apart
    t0, t1 = r["measured_from"], r["measured_to"]
    assert t1 - t0 == pytest.approx(DURATION, abs=0.3)
    # the rates against the server's own counters over that window
    ok = server.between(SUCCESS, t0, t1)
    assert r["rates"]["req_s"] == pytest.approx(ok / (t1 - t0), rel=0.05)
    generated = server.between(GENERATED, t0, t1)
    assert r["rates"]["output_tok_s"] == pytest.approx(generated / (t1 - t0), rel=0.03)

    # drift: whole buckets of the load, the drain in none, each bucket's throughput the
    # server's over its span, and last / first as the server's counters have it
    buckets = r["drift"]["buckets"]
    assert len(buckets) == 3 and not any(b.get("partial") for b in buckets)
    assert sum(b["seconds"] for b in buckets) == pytest.approx(r["measured_s"], abs=0.01)
    true_tok_s = []
    for b in buckets:  # no recording gap: load time and wall time run together
        start = t0 + b["start_elapsed_s"] - buckets[0]["start_elapsed_s"]
        true_tok_s.append(server.between(GENERATED, start, start + b["seconds"]) / b["seconds"])
        assert b["output_tok_s"] == pytest.approx(true_tok_s[-1], rel=0.05)
    assert r["drift"]["throughput_change"] == pytest.approx(true_tok_s[-1] / true_tok_s[0],
                                                            abs=0.05)
    # "GPU memory A → B": B at the load's end, before the drain freed the KV cache
    assert r["drift"]["gpu_memory"]["last_mb"] == pytest.approx(
        _load_end_gpu_mb(tmp_path / "run"), abs=0.01)
