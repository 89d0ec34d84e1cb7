"""Benchmark: the console's own cost at steady state, in a real terminal.

Runs `python -m tui.cli` inside tmux (120x40 by default) under `script`, so every
byte the console writes to its terminal lands in a log file, and measures over
the steady-state part of the run:

* CPU of the console process only (psutil; not the engine, workers or simulator),
  as a percentage of one core;
* bytes written to the terminal per second (growth of the `script` log).

    python tests/bench/bench_console.py                 # 60 s, embedded simulator, -c 16
    python tests/bench/bench_console.py --seconds 120 --outage-at 60   # the 2-minute run,
        with an external simulator and a 5 s outage in the middle; prints the screen at the end

Prints figures; asserts nothing (performance is checked by benchmarks, never by timed asserts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def tmux(socket: str, *args: str, check: bool = True) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True,
                          timeout=10, check=check).stdout


def find_console(pane_pid: int, deadline: float) -> psutil.Process:
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in psutil.Process(pane_pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    cmd = " ".join(p.cmdline())
                    if "tui.cli" in cmd and "script" not in p.name():
                        return p
        time.sleep(0.2)
    raise SystemExit("the console process never appeared")


def start_sim() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "sim", "--port", "0", "--announce", "--exit-with-parent"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("TOKENTOP_SIM_LISTENING"):
        proc.kill()
        raise SystemExit("the simulator did not announce its port")
    return proc, int(line.split()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds not measured")
    ap.add_argument("--size", default="120x40")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--refresh", type=float, default=0.5)
    ap.add_argument("--theme", default="tokentop-dark")
    ap.add_argument("--outage-at", type=float, help="seconds into the run: a 5 s outage")
    args = ap.parse_args()
    width, height = (int(x) for x in args.size.split("x"))
    socket = f"tokentop-bench-{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="tokentop-bench-"))
    log = tmp / "terminal.log"
    sim = None
    target = ""
    if args.outage_at is not None:
        sim, port = start_sim()
        target = f"--url http://127.0.0.1:{port}/v1"
    console = (f"{sys.executable} -m tui.cli {target} -c {args.concurrency} --workers 1 "
               f"--refresh {args.refresh} --theme {args.theme}")
    command = (f"cd {ROOT} && env XDG_CONFIG_HOME={tmp} XDG_DATA_HOME={tmp} TERM=xterm-256color "
               f"script -q -f {log} -c '{console}'")
    tmux(socket, "new-session", "-d", "-s", "bench", "-x", str(width), "-y", str(height), command)
    wrapper = None
    try:
        pane = int(tmux(socket, "display-message", "-p", "-t", "bench", "#{pane_pid}").strip())
        proc = find_console(pane, time.monotonic() + 30)
        wrapper = proc.parent()  # `script`: it outlives a killed tmux, and the console with it
        t_start = time.monotonic()
        time.sleep(args.warmup)
        cpu0 = proc.cpu_times()
        b0, t0 = log.stat().st_size, time.monotonic()
        outage_done = args.outage_at is None
        while time.monotonic() - t_start < args.seconds:
            if not outage_done and time.monotonic() - t_start >= args.outage_at:
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/sim/faults",
                    data=json.dumps({"outage_s": 5}).encode(),
                    headers={"Content-Type": "application/json"}, method="POST")
                urllib.request.urlopen(req, timeout=5).close()
                outage_done = True
            time.sleep(0.5)
        cpu1 = proc.cpu_times()
        b1, t1 = log.stat().st_size, time.monotonic()
        dt = t1 - t0
        cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / dt * 100.0
        screen = tmux(socket, "capture-pane", "-p", "-t", "bench", check=False)
        print(screen)
        print(f"size {args.size}, -c {args.concurrency}, refresh {args.refresh} s, "
              f"theme {args.theme}, measured {dt:.0f} s after {args.warmup:.0f} s of warm-up")
        print(f"console CPU: {cpu:.2f} % of one core")
        print(f"terminal output: {(b1 - b0) / dt / 1024:.2f} KiB/s "
              f"({(b1 - b0) / dt:.0f} bytes/s; {b1} bytes in all)")
    finally:
        tmux(socket, "kill-server", check=False)
        if wrapper is not None:
            with contextlib.suppress(psutil.Error):
                wrapper.terminate()  # the console sees its terminal go and stops the load
        if sim is not None:
            sim.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                sim.wait(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
