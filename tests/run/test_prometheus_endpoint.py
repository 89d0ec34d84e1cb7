"""The Prometheus endpoint (--prometheus-port), scraped with the parser tokentop reads servers
with (prometheus_client's text_string_to_metric_families, as probes/server_metrics.py),
during real runs against the simulator on 127.0.0.1. The truths: the run's own recording
(the Snapshot of the seq the page names, its histograms decoded here by the hdrh package
and read with numpy, not by loadgen.model.hdr), and the simulator's own counters (the
tokens it generated, the requests that arrived at it)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
from hdrh.histogram import HdrHistogram
from prometheus_client.parser import text_string_to_metric_families
from support import WAIT_S, headless_argv, root, running_sim, server_arrivals

from loadgen.model.kinds import ERROR_KINDS
from loadgen.model.snapshot import Control
from loadgen.run.config import RunConfig
from loadgen.run.run_process import RunProcess

SERVING = re.compile(r"serving figures for Prometheus at (http://\S+/metrics)")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def _page(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return await r.text()


def _samples(text: str) -> Samples:
    """Every sample of a page by (name, labels but the target), the target checked once."""
    out: Samples = {}
    targets = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = dict(s.labels)
            targets.add(labels.pop("target"))
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    assert len(targets) == 1, targets  # one run, one target, on every family
    return out


def _one(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _hdr_values(snaps: list[dict], metric: str) -> np.ndarray:
    """Every recorded value of `metric` over `snaps`, from their interval histograms decoded
    by the hdrh package (each value its bucket's highest equivalent, as HDR reads one)."""
    total = None
    for s in snaps:
        blob = s["hist"].get(metric)
        if blob:
            h = HdrHistogram.decode(blob)
            total = h if total is None else (total.add(h) or total)
    assert total is not None
    values = [(total.get_highest_equivalent_value(i.value_iterated_to),
               i.count_at_value_iterated_to) for i in total.get_recorded_iterator()]
    return np.repeat([v for v, _ in values], [n for _, n in values]).astype(np.float64)


def _rank_value(values: np.ndarray, q: float) -> float:
    """HdrHistogram's quantile, by its definition: the value of rank round(q × n) (at least
    the first) among the sorted values."""
    ranked = np.sort(values)
    return float(ranked[max(1, int(q * len(ranked) + 0.5)) - 1])


def _check_against_snapshot(samples: Samples, snap: dict, snaps: list[dict]) -> None:
    """The page's figures are its Snapshot's counters, its quantiles those of the recorded
    histograms (the last minute: all of a short run) within HDR's 3 significant figures."""
    c = snap["counters"]
    assert _one(samples, "tokentop_requests_total", outcome="ok") == c["requests_ok"]
    assert _one(samples, "tokentop_requests_total", outcome="failed") == c["requests_failed"]
    assert _one(samples, "tokentop_requests_total", outcome="cancelled") == \
        c["requests_cancelled"]
    for kind in ERROR_KINDS:
        assert _one(samples, "tokentop_errors_total", kind=kind) == c["errors"].get(kind, 0)
    for field, name in (("output_tokens", "tokentop_output_tokens_total"),
                        ("input_tokens", "tokentop_input_tokens_total"),
                        ("chunks", "tokentop_chunks_total")):
        assert _one(samples, name) == c[field], name
    assert _one(samples, "tokentop_backoff_seconds_total") == c["backoff_us"] / 1e6
    assert _one(samples, "tokentop_in_flight_requests") == snap["load"]["in_flight"]
    assert _one(samples, "tokentop_run_state", state=snap["load"]["state"]) == 1
    assert _one(samples, "tokentop_target_health", health="up") == 1
    if (lag := snap["client"]["loop_lag_ms"]) is not None:
        assert _one(samples, "tokentop_client_loop_lag_seconds") == lag / 1e3
    upto = [s for s in snaps if s["seq"] <= snap["seq"] and s["t"] > snap["t"] - 60.0]
    for metric in ("ttft", "itl", "e2e"):
        values = _hdr_values(upto, metric)
        name = f"tokentop_{metric}_seconds"
        assert _one(samples, f"{name}_count") == len(values)
        for q in (0.5, 0.9, 0.99):
            want = _rank_value(values, q) / 1e6
            got = _one(samples, name, quantile=f"{q:g}")
            assert abs(got - want) <= 1e-3 * want, (metric, q, got, want)
        mean = _one(samples, f"{name}_sum") / len(values)
        assert abs(mean - values.mean() / 1e6) <= 1e-3 * values.mean() / 1e6, metric


async def _sim_truth(sim) -> tuple[float, int]:
    """The simulator's own count of generated tokens and of the requests that reached it."""
    text = await _page(f"{root(sim)}/metrics")
    generated = sum(s.value for fam in text_string_to_metric_families(text)
                    for s in fam.samples if s.name == "vllm:generation_tokens_total")
    return generated, len(await server_arrivals(sim))


async def test_a_headless_run_serves_its_snapshot_and_the_simulators_counts(tmp_path: Path):
    """Its load ramps down to no stream and holds there: once nothing is in flight, the page,
    the simulator and the recorded Snapshot all rest, and must agree exactly."""
    out = tmp_path / "run"
    async with running_sim() as sim:
        argv = headless_argv(url=sim.url, ramp="linear:3:0:1.5", duration=5, workers=1,
                             tick=0.25, output_tokens=24, prometheus_port=0, out=out)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        url, said = None, []
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, said  # the run ended before it said where it serves
            said.append(line)
            if m := SERVING.search(line):
                url = m.group(1)
        assert url is not None and url.startswith("http://127.0.0.1:"), said
        drain = asyncio.create_task(proc.stderr.read())
        pages: list[str] = []
        at_rest: Samples | None = None
        while at_rest is None and time.monotonic() < deadline:
            pages.append(await _page(url))
            page = _samples(pages[-1]) if "tokentop_snapshot_seq" in pages[-1] else {}
            if page and _one(page, "tokentop_target_concurrency_streams") == 0 \
                    and _one(page, "tokentop_in_flight_requests") == 0:
                at_rest = page
            await asyncio.sleep(0.05)  # a poll's pace, not a wait for a result
        assert at_rest is not None, "the ramp never came down to rest"
        generated, arrived = await _sim_truth(sim)
        again = _samples(await _page(url))  # after the simulator's: nothing moved between
        rest = (await drain).decode()
        assert await proc.wait() == 0, rest
    snaps = [json.loads(x) for x in (out / "snapshots.jsonl").read_text().splitlines()]
    by_seq = {s["seq"]: s for s in snaps}
    snap = by_seq[int(_one(at_rest, "tokentop_snapshot_seq"))]
    _check_against_snapshot(at_rest, snap, snaps)
    c = snap["counters"]
    assert c["requests_ok"] >= 3
    assert _one(at_rest, "tokentop_output_tokens_total") == generated == c["output_tokens"]
    requests = sum(_one(at_rest, "tokentop_requests_total", outcome=o)
                   for o in ("ok", "failed", "cancelled"))
    assert requests == arrived == c["requests_ok"]
    assert _one(again, "tokentop_output_tokens_total") == generated
    # and a page mid-run is of its own Snapshot too
    middle = _samples(next(p for p in pages if "tokentop_ttft_seconds_count" in p))
    _check_against_snapshot(middle, by_seq[int(_one(middle, "tokentop_snapshot_seq"))], snaps)


def test_a_port_in_use_is_one_line_and_exit_2_before_the_load(tmp_path: Path):
    import subprocess

    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        done = subprocess.run(headless_argv(duration=2, prometheus_port=port,
                                            out=tmp_path / "run"),
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    finally:
        taken.close()
    assert done.returncode == 2
    assert done.stderr == (f"tokentop: cannot serve the Prometheus figures on 127.0.0.1:{port} "
                           "(--prometheus-port, --prometheus-host): the port is in use\n")
    assert not (tmp_path / "run").exists()  # refused before the run directory, the load


async def test_the_consoles_run_process_serves_it_paused_equal_to_the_simulator(tmp_path):
    async with running_sim() as sim:
        cfg = RunConfig(url=sim.url, concurrency=2, workers=1, tick=0.25, output_tokens="16",
                        prometheus_port=0, out=str(tmp_path / "run"))
        run = RunProcess(cfg, log_path=tmp_path / "run.log")
        await run.start()
        try:
            said = [n.text for n in run.status().said]
            url = next(m.group(1) for t in said if (m := SERVING.search(t)))
            assert url.startswith("http://127.0.0.1:")
            by_seq: dict[int, dict] = {}
            paused = False
            deadline = time.monotonic() + 4 * WAIT_S
            async for snap in run.snapshots():
                by_seq[snap.seq] = _builtins(snap)
                if not paused and snap.counters.requests_ok >= 4:
                    await run.control(Control(op="pause", source="key"))
                    paused = True
                if snap.load.state == "paused" and snap.load.in_flight == 0:
                    break
                assert time.monotonic() < deadline, "the run never came to rest"
            samples = _samples(await _page(url))
            generated, arrived = await _sim_truth(sim)
            seq = int(_one(samples, "tokentop_snapshot_seq"))
            while seq not in by_seq and time.monotonic() < deadline:  # the page may be ahead
                snap = await anext(run.snapshots())
                by_seq[snap.seq] = _builtins(snap)
        finally:
            await run.close()
    counters = by_seq[seq]["counters"]
    assert _one(samples, "tokentop_output_tokens_total") == generated == counters["output_tokens"]
    assert _one(samples, "tokentop_requests_total", outcome="ok") == arrived == \
        counters["requests_ok"]
    assert _one(samples, "tokentop_run_state", state="paused") == 1


def _builtins(snap) -> dict:
    import msgspec

    return msgspec.to_builtins(snap)


async def test_an_agent_serves_it(tmp_path: Path):
    """`tokentop agent` (its broker not there: the run goes on) serves the same page; its
    --url's credentials are nowhere on it, the target label is the public URL."""
    async with running_sim() as sim:
        dead = socket.create_server(("127.0.0.1", 0))
        broker = f"mqtt://127.0.0.1:{dead.getsockname()[1]}"
        dead.close()  # nothing listens there now
        argv = [sys.executable, "-m", "tui.cli", "agent", "--broker", broker, "--name", "a1",
                "--url", sim.url.replace("//", "//ops:hunter2@"), "--duration", "3",
                "--concurrency", "1", "--workers", "1", "--tick", "0.25",
                "--prometheus-port", "0", "--out", str(tmp_path / "run")]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        try:
            url = None
            deadline = time.monotonic() + 60
            while url is None and time.monotonic() < deadline:
                line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
                assert line, "the agent ended before it said where it serves"
                url = m.group(1) if (m := SERVING.search(line)) else None
            assert url is not None and url.startswith("http://127.0.0.1:")
            ok = 0.0
            while ok == 0 and time.monotonic() < deadline:
                text = await _page(url)
                if "tokentop_requests_total" in text:
                    ok = _one(_samples(text), "tokentop_requests_total", outcome="ok")
                await asyncio.sleep(0.1)  # a poll's pace, not a wait for a result
            assert ok > 0
            assert "hunter2" not in text and "ops:" not in text
            info = next(x for fam in text_string_to_metric_families(text) for x in fam.samples
                        if x.name == "tokentop_run_info")
            assert info.labels["target"] == sim.url
        finally:
            proc.terminate()
            await proc.wait()
