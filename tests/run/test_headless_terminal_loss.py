"""A headless run whose terminal goes away (a real tmux pane killed, as when SSH drops): the
run stops in order with a short drain and says why in its record, "the terminal went
away", not "stopped by the operator"; its recording ends finished, not interrupted."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time

from support import ROOT, headless_argv

from loadgen.record.rundir import read_events, read_manifest


def tmux(socket: str, *args: str) -> str:
    done = subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True,
                          timeout=10, check=False)
    return done.stdout


def wait_for(cond, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {seconds:g} s")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def ticks(out) -> int:
    with contextlib.suppress(OSError):
        return (out / "snapshots.jsonl").read_bytes().count(b"\n")
    return 0


def test_terminal_loss_stops_a_headless_run_in_words(tmp_path):
    out = tmp_path / "run"
    socket = f"tokentop-test-{os.getpid()}-hangup"
    argv = headless_argv(concurrency=2, workers=1, tick=0.2, duration=120.0,
                         output_tokens="16", out=out, drain_grace=30.0)
    assert argv[0] == sys.executable
    # exec: tokentop itself is the pane's process, the one the terminal's hang-up reaches
    command = (f"cd {shlex.quote(str(ROOT))} && exec env XDG_DATA_HOME={tmp_path} "
               f"{shlex.join(argv)}")
    try:
        tmux(socket, "new-session", "-d", "-s", "hangup", "-x", "120", "-y", "30", command)
        pid = int(tmux(socket, "display-message", "-p", "-t", "hangup", "#{pane_pid}"))
        wait_for(lambda: ticks(out) >= 5, 30, "the run records")
        t0 = time.monotonic()
        tmux(socket, "kill-server")  # the terminal goes away
        wait_for(lambda: not alive(pid), 20, "the run ends")
        ended_in = time.monotonic() - t0
    finally:
        tmux(socket, "kill-server")
    manifest = read_manifest(out)
    assert manifest["status"] == "finished", json.dumps(manifest)[:2000]
    stops = [e["message"] for e in read_events(out) if e["message"].startswith("stopping (")]
    assert stops and stops[0].startswith("stopping (the terminal went away)"), stops
    assert ended_in < 15  # a short drain (2 s), not --drain-grace's 30 s


async def test_the_consoles_run_process_records_the_reason_the_console_gives(sim, tmp_path):
    """The console's terminal gone, it asks its run process to stop with that reason (the
    Control's note): the run records "the terminal went away", a q "stopped by the
    operator". Read back from each recording."""
    from loadgen.model.notice import TERMINAL_GONE
    from loadgen.model.snapshot import Control
    from loadgen.run.config import RunConfig
    from loadgen.run.run_process import RunProcess

    for note, said in ((TERMINAL_GONE, "the terminal went away"),
                       (None, "stopped by the operator")):
        out = tmp_path / f"run-{bool(note)}"
        source = RunProcess(RunConfig(url=sim.url, concurrency=2, output_tokens="16",
                                      workers=1, tick=0.25, drain_grace=30.0, out=str(out)))
        await source.start()
        try:
            async for _snap in source.snapshots():
                break
            await source.control(Control(op="stop", source="key", note=note))
        finally:
            await source.close()
        stops = [e["message"] for e in read_events(out)
                 if e["message"].startswith("stopping (")]
        assert stops and stops[0].startswith(f"stopping ({said})"), stops
