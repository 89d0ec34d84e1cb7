"""The real `tokentop` in a real terminal (tmux, 120x40) against the simulator as its own
process: an injected outage shows as "outage" and then a recovery line; killing the
terminal stops everything the console started.

Kept to about 30 s (not the 2 minutes of the brief): the 2-minute run is
tests/bench/bench_console.py, which also measures CPU and bytes.
Loopback only; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
from support import ROOT, start_sim_process

from loadgen.record.rundir import read_events

ENGINE_MARKERS = ("loadgen.run.run_process", "loadgen.worker.main", "loadgen.sim", "tui.cli")


class Tmux:
    """A private tmux server (its own socket), so a user's sessions are never touched."""

    def __init__(self, name: str) -> None:
        self.socket = f"tokentop-test-{os.getpid()}-{name}"
        self.session = name

    def run(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                             timeout=10, check=check)
        return out.stdout

    def start(self, command: str, width: int = 120, height: int = 40) -> int:
        self.run("new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height),
                 command)
        return int(self.run("display-message", "-p", "-t", self.session, "#{pane_pid}").strip())

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.session, check=False)

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.session, *keys)

    def kill(self) -> None:
        self.run("kill-server", check=False)


def wait_for(cond: Callable[[], bool], seconds: float, what: str, screen=None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.25)
    shown = f"\n--- screen ---\n{screen()}" if screen else ""
    raise AssertionError(f"{what}: not within {seconds:g} s{shown}")


def descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def ours_alive(procs: list[psutil.Process]) -> list[str]:
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                cmd = " ".join(p.cmdline())
                if any(m in cmd for m in ENGINE_MARKERS):
                    alive.append(f"{p.pid}: {cmd}")
    return alive


def post_outage(port: int, seconds: float) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/sim/faults", data=json.dumps({"outage_s": seconds}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def test_outage_and_recovery_on_screen_then_terminal_loss_stops_everything(tmp_path: Path):
    sim, port = start_sim_process()
    tmux = Tmux("outage")
    env = (f"env XDG_CONFIG_HOME={tmp_path} XDG_DATA_HOME={tmp_path} TERM=xterm-256color "
           f"TOKENTOP_TEST=1")
    cmd = (f"cd {ROOT} && {env} {sys.executable} -m tui.cli --url http://127.0.0.1:{port}/v1 "
           f"-c 4 --output-tokens 64 --workers 1 --tick 0.5 --drain-grace 2")
    try:
        pane = tmux.start(cmd)
        wait_for(lambda: "running" in tmux.screen() and "in flight 4" in tmux.screen(), 30,
                 "the console shows the running load", tmux.screen)
        tree = descendants(pane)
        assert ours_alive(tree), "the console's engine processes were not found"
        post_outage(port, 5.0)
        wait_for(lambda: "outage" in tmux.screen().splitlines()[0], 12,
                 "the header shows the outage", tmux.screen)
        wait_for(lambda: "outage started" in tmux.screen(), 5, "the outage is logged",
                 tmux.screen)
        wait_for(lambda: "recovered after" in tmux.screen(), 20, "the recovery is logged",
                 tmux.screen)
        wait_for(lambda: "outage" not in tmux.screen().splitlines()[0], 10,
                 "the header is back to running", tmux.screen)
        tree = descendants(pane)
        # the terminal goes away (as when SSH drops): everything the console started stops
        tmux.kill()
        wait_for(lambda: not ours_alive(tree), 15, "the console and its engine exit")
        # and its recording says why the run stopped: nobody pressed q
        (manifest,) = tmp_path.rglob("manifest.json")
        stops = [e["message"] for e in read_events(manifest.parent)
                 if e["message"].startswith("stopping (")]
        assert stops and stops[0].startswith("stopping (the terminal went away)"), stops
    finally:
        tmux.kill()
        sim.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            sim.wait(5)
        if sim.poll() is None:
            sim.kill()


def test_quitting_leaves_the_summary_and_the_run_directory_in_the_terminal(tmp_path: Path):
    """After `q q` the alternate screen is gone: the run's one-line verdict and its run
    directory stay in the terminal, in full, even at 80x24."""
    tmux = Tmux("farewell")
    env = (f"env XDG_CONFIG_HOME={tmp_path} XDG_DATA_HOME={tmp_path} TERM=xterm-256color "
           f"TOKENTOP_TEST=1")
    # `; sleep`: the pane outlives the console, so what it printed can be read
    cmd = (f"cd {ROOT} && {env} {sys.executable} -m tui.cli -c 2 --output-tokens 16 "
           f"--workers 1 --tick 0.5 --drain-grace 1; sleep 60")
    try:
        tmux.start(cmd, width=80, height=24)
        wait_for(lambda: "in flight 2" in tmux.screen(), 40, "the console shows the load",
                 tmux.screen)
        time.sleep(1.0)  # a few requests complete, so there is something to summarise
        tmux.keys("q")
        wait_for(lambda: "press q again" in tmux.screen(), 5, "the first q asks", tmux.screen)
        tmux.keys("q")
        wait_for(lambda: "run directory" in tmux.screen(), 30, "the run directory is printed",
                 tmux.screen)
        # the pane wraps long lines: join them back before reading the path
        lines = tmux.run("capture-pane", "-p", "-J", "-t", tmux.session).splitlines()
        verdict = next(ln for ln in lines if ln.startswith("tokentop: done:"))
        assert "requests ok" in verdict
        where = next(ln for ln in lines if ln.startswith("tokentop: run directory "))
        run_dir = Path(where.removeprefix("tokentop: run directory ").strip())
        assert run_dir.is_relative_to(tmp_path) and (run_dir / "manifest.json").exists()
    finally:
        tmux.kill()
