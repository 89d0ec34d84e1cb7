"""Helpers for tests that talk to real processes: scrape /metrics, run the real command."""

from __future__ import annotations

import os
import subprocess
import sys

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


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
