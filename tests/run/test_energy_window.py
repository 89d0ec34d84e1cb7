"""Tokens per joule and requests/s per watt: energy and tokens over the same times, inside
the measured window (after warm-up, before the drain). One recorded run against the
simulator, a dcgm-exporter served beside it; the truths are the simulator's own counters
(its GPU's energy, which integrates its power: loadgen/sim/gpu.py; its /metrics token and
request counters), and the exporter's energy counter, which the test advances at a known
power, all scraped by the test with their times."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from support import FIXTURES, headless_argv, scrape, serving

from loadgen.analysis.report import soak_report
from loadgen.eval.dcgm_watch import DcgmWatch
from loadgen.eval.efficiency import gpu_use
from loadgen.record.rundir import iter_snapshots
from loadgen.sim import SimConfig, start_sim

# the simulated GPU's power follows a change of load within ~2 s (loadgen/sim/gpu.py)
STEADY = {"rate": 12, "output_tokens": 120, "warmup": 3.0, "duration": 14.0}  # ~1.3 s each
# long requests (~7 s), a few at a time: a 7 s drain of ever fewer streams, which gives
# fewer tokens a joule than the load (the GPU's idle power is shared by fewer of them)
DRAINED = {"rate": 1, "output_tokens": 1000, "warmup": 6.0, "duration": 8.0}
STEADY_S = 11.0  # a live figure's ~10 s, and a probe period: inside the load from here on
DCGM_W = (400.0, 100.0)  # the exporter's two GPUs draw this, exactly
DCGM_DELAY_S = 0.25  # and take this long to answer a scrape
FIXTURE = (FIXTURES / "metrics" / "dcgm-exporter.txt").read_text()
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


class Log:
    """(time, value) rows of one counter, interpolated between rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float]] = []

    def add(self, t0: float, value: float) -> None:
        self.rows.append(((t0 + time.time()) / 2, value))

    def between(self, a: float, b: float) -> float:
        t, v = np.array(self.rows).T
        return float(np.interp(b, t, v) - np.interp(a, t, v))


async def _poll(root: str, logs: dict[str, Log]) -> None:
    """The simulator's GPU energy and its /metrics counters, every 50 ms."""
    async with aiohttp.ClientSession() as http:
        while True:
            t0 = time.time()
            async with http.get(f"{root}/sim/gpu") as r:
                logs["energy"].add(t0, (await r.json())["energy_j"])
            t0 = time.time()
            page = await scrape(f"{root}/metrics")
            logs["tokens"].add(t0, page["vllm:generation_tokens_total"])
            logs["requests"].add(t0, page["vllm:request_success_total"])
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _exporter():
    """A dcgm-exporter page whose energy counters (mJ) advance at DCGM_W from now on, slow
    to answer."""
    t0 = time.time()

    async def page(_request: web.Request) -> web.Response:
        await asyncio.sleep(DCGM_DELAY_S)
        gpu = iter(range(2))
        text = re.sub(rf"^({ENERGY}{{.*}}) \d+$",
                      lambda m: f"{m[1]} {int(DCGM_W[next(gpu)] * (time.time() - t0) * 1e3)}",
                      FIXTURE, flags=re.M)
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", page)
    async with serving(app) as base:
        yield f"{base}/metrics"


async def _record(tmp_path, load: dict):
    """One run: open loop at a constant rate (streams staggered, so the drain is a tail of
    ever fewer of them, at a lower tokens per joule than the load's)."""
    sim = await start_sim(SimConfig(slots=16), host="127.0.0.1", port=0)
    root = sim.url.removesuffix("/v1")
    logs = {"energy": Log(), "tokens": Log(), "requests": Log()}
    polling = asyncio.create_task(_poll(root, logs))
    argv = headless_argv(url=sim.url, mode="open", arrival="constant", drain_grace=10,
                         input_tokens=64, workers=1, tick=0.25, out=tmp_path / "run", **load)
    try:
        async with _exporter() as url:
            dcgm = DcgmWatch(url, 0.0)
            watching = asyncio.create_task(dcgm.run())
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), 90)
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    finally:
        polling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await polling
        await sim.close()
    assert proc.returncode == 0, err.decode()[-2000:]
    return tmp_path / "run", logs, dcgm


@pytest.fixture(scope="module")
def steady(tmp_path_factory):
    return asyncio.run(_record(tmp_path_factory.mktemp("steady"), STEADY))


@pytest.fixture(scope="module")
def drained(tmp_path_factory):
    return asyncio.run(_record(tmp_path_factory.mktemp("drained"), DRAINED))


def _eval_figures(recorded) -> tuple:
    """The eval's efficiency figures of a recorded run, and the simulator's over the same
    window: (tokens per joule, requests per joule) of each."""
    run_dir, logs, _ = recorded
    r, _ = soak_report(run_dir, warnings=[])
    t0, t1 = r.measured_from, r.measured_to
    joules = logs["energy"].between(t0, t1)
    use = gpu_use(run_dir, r)
    truth = (logs["tokens"].between(t0, t1) / joules, logs["requests"].between(t0, t1) / joules)
    return r, (use.tokens_per_joule, use.req_s_per_w), truth


def test_the_evals_tokens_per_joule_leaves_the_drain_out(drained):
    r, (tpj, _), (true_tpj, _) = _eval_figures(drained)
    assert r.drain is not None and r.drain.seconds > 4.0  # a drain the figure leaves out
    assert tpj == pytest.approx(true_tpj, rel=0.025)


def test_the_evals_tokens_per_joule_and_req_s_per_watt_are_the_simulated_gpus(steady):
    _, (tpj, req_s_per_w), (true_tpj, requests_per_j) = _eval_figures(steady)
    assert tpj == pytest.approx(true_tpj, rel=0.025)
    # req/s per W is requests per joule (~170 requests: one either side of the span is ~1 %)
    assert req_s_per_w == pytest.approx(requests_per_j, rel=0.04)


def test_the_runs_own_tokens_per_joule_is_the_simulated_gpus(steady):
    """Snapshot.efficiency (the last ~10 s) at every tick of the load once its window lies
    in the steady load, against the simulator's counters over the last 10 s."""
    run_dir, logs, _ = steady
    r, _ = soak_report(run_dir, warnings=[])
    judged = 0
    for snap in iter_snapshots(run_dir):
        if not r.measured_from + STEADY_S <= snap.t <= r.measured_to:
            continue
        a, b = snap.t - 10.0, snap.t
        truth = logs["tokens"].between(a, b) / logs["energy"].between(a, b)
        assert snap.efficiency is not None
        assert snap.efficiency.tokens_per_joule == pytest.approx(truth, rel=0.04), snap.seq
        judged += 1
    assert judged >= 4 * (STEADY["duration"] - STEADY_S) - 2  # ticks of 0.25 s


def test_dcgm_tokens_per_joule_over_the_samples_own_times(drained):
    """The exporter answers in 0.25 s and draws exactly 500 W: tokens per joule is the
    tokens of the measured window over 500 W × its length (the samples' span is a little
    shorter, at the same rate)."""
    run_dir, logs, dcgm = drained
    r, _ = soak_report(run_dir, warnings=[])
    t0, t1 = r.measured_from, r.measured_to
    truth = logs["tokens"].between(t0, t1) / (sum(DCGM_W) * (t1 - t0))
    assert dcgm.result(run_dir, r).tokens_per_joule == pytest.approx(truth, rel=0.04)
