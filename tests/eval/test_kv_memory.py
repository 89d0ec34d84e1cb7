"""GPU memory per request from the engine's KV cache, and GPU-side leaks on the engine's own
figures (loadgen.eval.efficiency: kv_per_request, engine_memory_slope). Recorded runs of the
real command line against the simulator, which preallocates its GPU memory as vLLM does and
states its KV pool in vLLM's cache_config_info; the truth is the simulator's own accounting,
read by the test from its engine every 25 ms (the KV tokens each live request holds), never
through /metrics or the recording."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest
from support import headless_argv

from loadgen.analysis.report import soak_report
from loadgen.eval.efficiency import engine_memory_slope, kv_per_request
from loadgen.record.rundir import iter_snapshots
from loadgen.sim import SimConfig, start_sim

LOAD = {"concurrency": 16, "input_tokens": 64, "output_tokens": 100, "warmup": 3.0,
        "duration": 12.0, "tick": 0.25, "workers": 1, "drain_grace": 10}
LEAK = 0.3  # of each finished request's KV never freed
SLOPE_SPAN_S = 5.0  # a test's soak: the eval's own rule wants ten minutes
POLL_S = 0.025


class Truth:
    """The engine's state over time, as the simulator itself holds it: (wall time, KV tokens
    in use, requests live in the engine)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, int]] = []

    def between(self, a: float, b: float) -> np.ndarray:
        rows = np.array(self.rows, dtype=float)
        return rows[(rows[:, 0] >= a) & (rows[:, 0] <= b)]


async def _watch(sim, truth: Truth) -> None:
    engine = sim.model
    while True:
        live = engine.live()
        truth.rows.append((time.time(), sum(s.kv for s in live) + engine.kv_leaked, len(live)))
        await asyncio.sleep(POLL_S)


async def _record(out, **sim_cfg):
    sim = await start_sim(SimConfig(slots=32, **sim_cfg), host="127.0.0.1", port=0)
    truth = Truth()
    watching = asyncio.create_task(_watch(sim, truth))
    try:
        proc = await asyncio.create_subprocess_exec(
            *headless_argv(url=sim.url, out=out, **LOAD),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 90)
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        cfg = sim.model.cfg
        await sim.close()
    assert proc.returncode == 0, err.decode()[-2000:]
    r, _ = soak_report(out, warnings=[])
    return out, r, truth, cfg


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The two engines' runs, at once (each its own simulator and client: half the wall
    time of one after the other; the truths are each simulator's own state)."""

    async def both():
        return await asyncio.gather(
            _record(tmp_path_factory.mktemp("healthy") / "run", state_kv_bytes=True),
            _record(tmp_path_factory.mktemp("leaking") / "run", kv_leak_fraction=LEAK))

    return asyncio.run(both())


@pytest.fixture(scope="module")
def healthy(recorded):
    """An engine that states its pool's bytes (vLLM with --kv-cache-memory-bytes)."""
    return recorded[0]


@pytest.fixture(scope="module")
def leaking(recorded):
    """vLLM's default: no bytes stated, so tokens."""
    return recorded[1]


def _per_request_truth(truth: Truth, r) -> float:
    """The engine's KV tokens per live request, the mean over the measured window."""
    rows = truth.between(r.measured_from, r.measured_to)
    rows = rows[rows[:, 2] > 0]
    return float(np.mean(rows[:, 1] / rows[:, 2]))


def _slope_truth(truth: Truth, r) -> float:
    """The engine's KV tokens in use, least squares over the window, per hour."""
    rows = truth.between(r.measured_from, r.measured_to)
    return float(np.polyfit((rows[:, 0] - rows[0, 0]) / 3600.0, rows[:, 1], 1)[0])


def _slope_noise(truth: Truth, r) -> float:
    """The standard error (tokens/h) of a slope fitted to this series sampled once a second
    (the probe's period): its scatter about its own line over √n times the times' spread."""
    rows = truth.between(r.measured_from, r.measured_to)
    t = (rows[:, 0] - rows[0, 0]) / 3600.0
    line = np.polyfit(t, rows[:, 1], 1)
    scatter = float(np.std(rows[:, 1] - np.polyval(line, t)))
    samples = max(2.0, (rows[-1, 0] - rows[0, 0]) / 1.0)
    return scatter / (np.sqrt(samples) * float(np.std(t)))


def test_kv_per_request_in_mb_is_the_engines_own_tokens_per_request(healthy):
    run_dir, r, truth, cfg = healthy
    kv = kv_per_request(run_dir, r)
    true_tokens = _per_request_truth(truth, r)
    assert 100 < true_tokens < 64 + 100  # a request holds its prompt and part of its output
    assert kv.unit == "MB" and kv.why is None
    assert kv.samples >= 4 * LOAD["duration"] - 4  # ticks of 0.25 s
    assert kv.tokens == pytest.approx(true_tokens, rel=0.05)
    assert kv.value == pytest.approx(true_tokens * cfg.kv_bytes_per_token / 1e6, rel=0.05)
    # the old figure, GPU memory ÷ in flight, is the preallocation ÷ N: a hundred times more
    gpu_mb = cfg.gpu_memory_utilization * cfg.gpu_memory_bytes / 1e6 / LOAD["concurrency"]
    assert gpu_mb > 100 * kv.value


def test_kv_per_request_in_tokens_says_why_not_mb(leaking):
    run_dir, r, truth, _ = leaking
    kv = kv_per_request(run_dir, r)
    assert kv.unit == "tokens" and kv.value == kv.tokens
    assert kv.why is not None and "kv_cache_memory_bytes" in kv.why
    # the engine's page is scraped once a second (the probe period) and a tick carries the
    # latest: a series that rises with the leak reads up to a second's growth low
    per_s = _slope_truth(truth, r) / 3600.0 / LOAD["concurrency"]
    true_tokens = _per_request_truth(truth, r)
    assert kv.value == pytest.approx(true_tokens, abs=0.05 * true_tokens + per_s * 1.0)


def test_a_kv_leak_shows_on_the_engines_figure_while_gpu_memory_stays_flat(leaking):
    run_dir, r, truth, cfg = leaking
    slope = engine_memory_slope(run_dir, r, min_span_s=SLOPE_SPAN_S)
    true_slope = _slope_truth(truth, r)
    assert true_slope > 1e5  # tokens/h: the leak is there, in the engine
    assert slope.unit == "tokens/h" and slope.slope is not None
    assert slope.slope == pytest.approx(true_slope, rel=0.1)
    # the GPU's memory, as recorded, never moved: the preallocation, on every tick
    used = {g.memory_used_bytes for s in iter_snapshots(run_dir) for g in s.gpu.gpus}
    assert used == {int(cfg.gpu_memory_utilization * cfg.gpu_memory_bytes)}
    gpu = r.drift.gpu_memory  # so the report's GPU-memory series has nothing to show
    assert gpu.first_mb == gpu.last_mb == gpu.peak_mb
    assert "preallocated 90.0% of GPU memory" in slope.gpu_memory_why


def test_a_healthy_engine_has_no_slope_to_speak_of(healthy, leaking):
    run_dir, r, truth, cfg = healthy
    slope = engine_memory_slope(run_dir, r, min_span_s=SLOPE_SPAN_S)
    assert slope.unit == "MB/h" and slope.slope is not None
    mb_per_token = cfg.kv_bytes_per_token / 1e6
    leak_mb_h = _slope_truth(leaking[2], leaking[1]) * mb_per_token
    # against the same engine's own slope, within what fitting one scrape a second of its
    # sawtooth (requests come and go) can tell apart on a 12 s window, and well under the leak
    truth_mb_h = _slope_truth(truth, r) * mb_per_token
    noise_mb_h = _slope_noise(truth, r) * mb_per_token
    print(f"slope {slope.slope:.0f} truth {truth_mb_h:.0f} noise {noise_mb_h:.0f} "
          f"leak {leak_mb_h:.0f} MB/h")
    assert noise_mb_h < 0.1 * leak_mb_h  # the window can tell a leak from none at all
    assert slope.slope == pytest.approx(truth_mb_h, abs=4 * noise_mb_h)
    assert abs(slope.slope) < 0.25 * leak_mb_h


def test_the_slope_is_withheld_on_a_short_soak_in_words(healthy):
    run_dir, r, _, _ = healthy
    slope = engine_memory_slope(run_dir, r)  # the eval's rule: ten minutes
    assert slope.slope is None and slope.why is not None
    assert slope.why.startswith("soak too short for a slope") and "10.0 min" in slope.why
