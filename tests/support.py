"""Helpers for tests that talk to real processes: scrape /metrics, run the real command."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from loadgen.eval.phases import PHASES
from loadgen.sim import RunningSim, SimConfig, start_sim

ROOT = Path(__file__).resolve().parent.parent  # the project
FIXTURES = ROOT / "tests" / "fixtures"


def only_phases(text: str) -> str:
    """An eval plan's text with every phase it does not name (`[phases.NAME]`, keys or none)
    turned off, and no faults unless it has some: a test's plan says what it runs, and a
    phase added to the battery later stays off in it."""
    off = [p for p in PHASES if p != "faults" and f"[phases.{p}]" not in text]
    text += "".join(f"\n[phases.{p}]\nenabled = false\n" for p in off)
    if "[[phases.faults]]" in text or "\nfaults = " in text:
        return text
    if "\n[phases]\n" in text:
        return text.replace("\n[phases]\n", "\n[phases]\nfaults = []\n", 1)
    return text + "\n[phases]\nfaults = []\n"


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


@contextlib.asynccontextmanager
async def serving(app) -> AsyncIterator[str]:
    """An aiohttp app of a test's own (a stub server, a DCGM exporter) on 127.0.0.1, on a
    free port: its base URL, http://127.0.0.1:PORT."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def measured_stream(http: aiohttp.ClientSession, url: str, body: bytes,
                          measure) -> tuple[bytes, list[dict]]:
    """POST `body` to `url` and feed the stream to `measure` as it arrives (finished at the
    end); the raw bytes and the stream's JSON events, read here from the same bytes."""
    from time import perf_counter

    raw = b""
    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200, resp.status
        async for piece in resp.content.iter_any():
            measure.feed(piece, perf_counter())
            raw += piece
    measure.finish()
    events = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]
    return raw, events


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


def start_sim_process(*flags: str) -> tuple[subprocess.Popen[str], int]:
    """`tokentop sim` as its own process on 127.0.0.1 (it exits when its stdin closes): the
    process and its port. For tests that must stop it (SIGSTOP) or see it from outside."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "sim", "--host", "127.0.0.1", "--port", "0",
         "--announce", "--exit-with-parent", *flags],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("TOKENTOP_SIM_LISTENING"):
            return proc, int(line.split()[1])
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("the simulator did not announce its port")


async def server_arrivals(sim: RunningSim) -> np.ndarray:
    """When each completion request arrived at the simulator (its loop clock), sorted."""
    async with aiohttp.ClientSession() as http, http.get(f"{root(sim)}/sim/arrivals") as r:
        assert r.status == 200
        return np.array(sorted(await r.json()))


def rate_between(arrivals: np.ndarray, a: float, b: float) -> float:
    return int(((arrivals >= a) & (arrivals < b)).sum()) / (b - a)


def chat_body(max_tokens: int = 4, *, model: str = "tokentop-sim") -> bytes:
    """A streamed chat request body as the workload sends it (usage on every chunk)."""
    return json.dumps({
        "model": model, "messages": [{"role": "user", "content": "hi there"}],
        "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }).encode()  # fmt: skip


def worker_connections(coord, port: int) -> list[int]:
    """Per load worker process of a Coordinator, its established TCP connections to the
    server on `port` (the kernel's count: which worker carries which streams)."""
    import psutil

    out = []
    for w in coord.pool.workers:
        conns = psutil.Process(w.proc.pid).net_connections(kind="tcp")
        out.append(sum(1 for c in conns if c.raddr and c.raddr.port == port
                       and c.status == psutil.CONN_ESTABLISHED))
    return out
