"""Shared fixtures: a real simulator on 127.0.0.1, and a way to run the real `tokentop`."""

from __future__ import annotations

import pytest

from loadgen.sim import SimConfig, start_sim


@pytest.fixture
async def sim():
    """A fast simulator (small steps) on a free loopback port."""
    running = await start_sim(SimConfig(slots=8), host="127.0.0.1", port=0)
    yield running
    await running.close()
