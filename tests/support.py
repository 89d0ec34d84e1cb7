"""Helpers for tests that talk to real processes: scrape /metrics, run the real command."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadgen.sim import RunningSim, SimConfig, start_sim

ROOT = Path(__file__).resolve().parent.parent  # the project
FIXTURES = ROOT / "tests" / "fixtures"


async def scrape(url: str) -> dict[str, float]:
    """Prometheus samples of a /metrics page, summed over label sets, by sample name."""
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def tokentop(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    """Run the real command line (as `python -m tui.cli`, the console script's target)."""
    return tokentop_env({}, *args, timeout=timeout)


def tokentop_env(env: dict[str, str], *args: str, timeout: float = 90.0):
    """`tokentop` with extra environment variables (secrets travel that way, never argv)."""
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env},
    )


def run_flags(**settings: Any) -> list[str]:
    """`tokentop run` flags for RunConfig-named settings: drain_grace=1.0 → --drain-grace=1.0
    (every such flag is the field's name with dashes)."""
    return [f"--{name.replace('_', '-')}={value}" for name, value in settings.items()]


def headless_argv(*flags: str, **settings: Any) -> list[str]:
    """The real command line of a headless run, for subprocess: `python -m tui.cli run
    --headless …` (what the `tokentop` console script runs)."""
    return [sys.executable, "-m", "tui.cli", "run", "--headless", *run_flags(**settings), *flags]


# a simulator with fast steps, for tests that drive many requests through it
FAST = {"step_overhead_ms": 1.0, "decode_ms_per_seq": 0.05, "prefill_ms_per_token": 0.001}
WAIT_S = 10.0  # upper bound on every poll loop


@contextlib.asynccontextmanager
async def running_sim(**overrides: Any) -> AsyncIterator[RunningSim]:
    sim = await start_sim(SimConfig(**{**FAST, **overrides}), host="127.0.0.1", port=0)
    try:
        yield sim
    finally:
        await sim.close()


def root(sim: RunningSim) -> str:
    return sim.url.removesuffix("/v1")


def fsize_limit(limit: int):
    """A preexec_fn: the child may write files of at most `limit` bytes (a disk that fills)."""
    import resource
    import signal

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so write() fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply
