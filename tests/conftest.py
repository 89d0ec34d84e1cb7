"""Shared fixtures: a real simulator on 127.0.0.1, and a private home for every test."""

from __future__ import annotations

import aiohttp
import pytest
from support import running_sim

from loadgen.sim import SimConfig, start_sim


@pytest.fixture(autouse=True)
def private_dirs(tmp_path_factory, monkeypatch):
    """Runs are recorded by default and the console remembers its theme: keep both (and
    anything a child process writes) out of the real home directory."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    return home


@pytest.fixture
async def fast_sim():
    """A simulator with fast steps (support.FAST), for tests that drive many requests."""
    async with running_sim() as running:
        yield running


@pytest.fixture
async def http():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
async def sim():
    """A fast simulator (small steps) on a free loopback port."""
    running = await start_sim(SimConfig(slots=8), host="127.0.0.1", port=0)
    yield running
    await running.close()
