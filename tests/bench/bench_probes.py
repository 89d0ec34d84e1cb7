"""What the probes cost: all of them at 1 Hz for ~20 s against a local simulator.

Not a test: run it and read the figures.

    python tests/bench/bench_probes.py [--seconds 20] [--hz 1]

The simulator runs in its own process with a small load generator beside it (a
second process), so the only work in this process is the probes'. The figure
per probe is the CPU time (all threads: the GPU probe runs in a worker thread)
spent inside its sample() call; the total is this process's CPU time over the
whole run, background threads (NVML events) and the event loop's idling
included, as % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from probes.gpu import GpuProbe  # noqa: E402
from probes.host import HostProbe  # noqa: E402
from probes.process import ProcessProbe  # noqa: E402
from probes.server_metrics import ServerMetricsProbe, metrics_url_for  # noqa: E402

ANNOUNCE = "TOKENTOP_SIM_LISTENING"

# A few streams against the simulator, so its counters and histograms move.
LOAD = textwrap.dedent(
    """
    import asyncio, sys, time
    import aiohttp

    async def main(url, seconds):
        deadline = time.monotonic() + seconds
        body = {"model": "tokentop-sim", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 64}
        async with aiohttp.ClientSession() as s:
            async def worker():
                while time.monotonic() < deadline:
                    async with s.post(url + "/chat/completions", json=body) as r:
                        await r.read()
            await asyncio.gather(*(worker() for _ in range(4)))

    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
    """
)


def _start_sim() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "sim", "--port", "0", "--announce", "--exit-with-parent"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith(ANNOUNCE):
        proc.kill()
        raise SystemExit(f"simulator did not start: {line!r}")
    return proc, int(line.split()[-1])


def _cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


async def bench(seconds: float, hz: float) -> None:
    sim, port = _start_sim()
    url = f"http://127.0.0.1:{port}/v1"
    load = subprocess.Popen(
        [sys.executable, "-c", LOAD, url, str(seconds + 5)], stderr=subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession() as session:
            host = HostProbe()
            process = ProcessProbe(port=port)
            gpu = await GpuProbe.create(url.removesuffix("/v1"), session)
            server = ServerMetricsProbe(metrics_url_for(url), session)
            cpu = dict.fromkeys(("host", "process", "gpu", "server_metrics"), 0.0)
            wall = dict.fromkeys(cpu, 0.0)
            await asyncio.sleep(0.5)  # let the load start
            period = 1.0 / hz
            ticks = 0
            cpu0, t0 = _cpu(), time.monotonic()
            next_tick = t0
            last = {}
            while time.monotonic() - t0 < seconds:
                for name, call in (
                    ("host", host.sample),
                    ("process", process.sample),
                ):
                    c, w = time.process_time(), time.perf_counter()
                    last[name] = call()
                    cpu[name] += time.process_time() - c
                    wall[name] += time.perf_counter() - w
                for name, acall in (("gpu", gpu.sample), ("server_metrics", server.sample)):
                    c, w = time.process_time(), time.perf_counter()
                    last[name] = await acall()
                    cpu[name] += time.process_time() - c
                    wall[name] += time.perf_counter() - w
                gpu.drain_events()
                process.drain_events()
                ticks += 1
                next_tick += period
                await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
            elapsed = time.monotonic() - t0
            total = _cpu() - cpu0
            gpu.close()
    finally:
        load.kill()
        sim.kill()
        load.wait()
        sim.wait()

    m = last["server_metrics"]
    print(f"probes at {hz:g} Hz for {elapsed:.1f} s ({ticks} polls), pid {os.getpid()}")
    print(
        f"GPU source: {last['gpu'].source}; engine: {m.engine}; latency keys: {list(m.latency_ms)}"
    )
    print(f"{'probe':<16}{'CPU % of a core':>16}{'CPU ms/poll':>14}{'wall ms/poll':>14}")
    for name in cpu:
        print(
            f"{name:<16}{100.0 * cpu[name] / elapsed:>16.3f}"
            f"{1000.0 * cpu[name] / ticks:>14.3f}{1000.0 * wall[name] / ticks:>14.3f}"
        )
    inside = sum(cpu.values())
    print(f"{'sum of probes':<16}{100.0 * inside / elapsed:>16.3f}{1000.0 * inside / ticks:>14.3f}")
    print(f"{'process total':<16}{100.0 * total / elapsed:>16.3f}{1000.0 * total / ticks:>14.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--hz", type=float, default=1.0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(bench(args.seconds, args.hz))


if __name__ == "__main__":
    main()
