"""A dead writer known for certain: writer.lock, held by the live recording process.

A run killed with SIGKILL is "interrupted" (not "running") to run_state, the report and
the replay; a live run is "running" and refuses a second writer in one line (exit 2); a
finished one is "finished"; a full disk leaves "recording stopped" and why, even on a
file system with no byte left (the lock's reserve is freed for the last manifest)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from msgspec import to_builtins
from support import WAIT_S, headless_argv, tokentop

from loadgen.model.snapshot import Counters, LoadState, Snapshot, Target
from loadgen.record.recorder import Recorder, Recording, RecordingError
from loadgen.record.replay import ReplaySource
from loadgen.record.rundir import (
    FINISHED,
    INTERRUPTED,
    RECORDING_STOPPED,
    RUNNING,
    read_manifest,
    run_state,
    writer_alive,
)
from loadgen.run.config import RunConfig
from loadgen.sim import RunningSim

LOAD = dict(concurrency=3, workers=1, tick=0.1, output_tokens="16", input_tokens="16",
            drain_grace=1.0)


def tick(seq: int) -> Snapshot:
    return Snapshot(run_id="r1", seq=seq, t=1e9 + seq, elapsed=seq + 1.0, interval=1.0,
                    target=Target(url="http://127.0.0.1:1/v1", model="m"),
                    load=LoadState(state="running"), counters=Counters())


def start_run(sim: RunningSim, out: Path, duration: float = 60.0) -> subprocess.Popen:
    """A real headless run in its own session (so its workers can be killed with it)."""
    return subprocess.Popen(headless_argv(url=sim.url, duration=duration, out=out, **LOAD),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


async def until_ticks(out: Path, n: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    path = out / "snapshots.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the run wrote no {n} ticks (exit {proc.poll()})")


async def replay_all(src: ReplaySource, got: list) -> None:
    async for snap in src.snapshots():
        got.append(snap)


def first_line(report: subprocess.CompletedProcess) -> str:
    assert report.returncode == 0, report.stderr
    return report.stdout.splitlines()[0]


async def test_a_live_run_is_running_and_killed_it_is_interrupted(sim, tmp_path):
    out = tmp_path / "run"
    proc = start_run(sim, out)
    try:
        await until_ticks(out, 5, proc)
        assert writer_alive(out) and run_state(out) == RUNNING
        follower = ReplaySource(out, speed=0, poll_s=0.05)
        await follower.start()
        assert follower.follow and "following" in follower.description
        followed: list = []
        following = asyncio.create_task(replay_all(follower, followed))

        second, report = await asyncio.gather(
            asyncio.to_thread(tokentop, "run", "--headless", "--resume", str(out),
                              "--duration", "1", timeout=60),
            asyncio.to_thread(tokentop, "report", str(out), "--no-plots", timeout=60))
        assert second.returncode == 2, second.stderr
        assert second.stderr.strip().count("\n") == 0
        assert f"is being written by another tokentop (pid {proc.pid} on " in second.stderr
        assert "running (a tokentop process is still writing it" in first_line(report)

        proc.send_signal(signal.SIGKILL)  # tokentop itself; its workers live on a moment
        proc.wait(timeout=10)
        assert run_state(out) == INTERRUPTED and not writer_alive(out)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert read_manifest(out)["status"] == RUNNING  # what it says, and why it is not so

    await asyncio.wait_for(following, WAIT_S)  # the follower ends: no writer, no more ticks
    assert followed and "interrupted" in follower.description

    line = first_line(await asyncio.to_thread(tokentop, "report", str(out), "--no-plots"))
    assert "interrupted (its writer died without finishing" in line and "running" not in line

    replay = ReplaySource(out, speed=0)
    await replay.start()
    assert not replay.follow
    got: list = []
    await asyncio.wait_for(replay_all(replay, got), WAIT_S)
    assert len(got) >= len(followed)
    ends = [e for e in got[-1].events if e.kind == "replay"]
    assert ends and "interrupted" in ends[0].message and ends[0].level == "warn"


async def test_a_finished_run_is_finished(sim, tmp_path):
    out = tmp_path / "run"
    done = await asyncio.to_thread(
        subprocess.run, headless_argv(url=sim.url, duration=1.0, out=out, **LOAD),
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert run_state(out) == FINISHED and not writer_alive(out)
    line = first_line(await asyncio.to_thread(tokentop, "report", str(out), "--no-plots"))
    assert f" {FINISHED} " in line and "interrupted" not in line


def test_one_writer_a_directory_even_in_one_process(tmp_path):
    out = tmp_path / "run"
    rec = Recorder.create(out, to_builtins(RunConfig()), run_id="r1")
    for again in (lambda: Recorder.resume(out),
                  lambda: Recorder.create(out, {}, run_id="r2")):
        with pytest.raises(RecordingError, match=f"another tokentop \\(pid {os.getpid()} on"):
            again()
    assert run_state(out) == RUNNING  # the refusals left the first writer's lock alone
    rec.close()
    assert run_state(out) == FINISHED
    Recorder.resume(out).close()  # no writer left: resuming is fine again


def test_disk_full_says_recording_stopped_at_once(tmp_path):
    """The manifest tells the final state when recording fails, not only at close (the
    process may not live that long)."""
    run = tmp_path / "run"
    Recorder.create(run, to_builtins(RunConfig()), run_id="r1").close(status="running")
    (run / "snapshots.jsonl").unlink()
    (run / "snapshots.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    r = Recording(Recorder.resume(run), "stop")
    assert r.take(tick(0)) is not None
    m = read_manifest(run)
    assert m["status"] == RECORDING_STOPPED and "disk full" in m["recording_stopped"]
    assert writer_alive(run) and run_state(run) == RECORDING_STOPPED
    assert r.close({"done": True}) is None
    m = read_manifest(run)
    assert m["status"] == RECORDING_STOPPED and m["summary"] == {"done": True}
    assert not writer_alive(run)


def _can_mount_tmpfs(where: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs tmpfs {where}"],
                           capture_output=True, timeout=10)
    return probe.returncode == 0


async def test_a_really_full_disk_still_gets_the_final_manifest(sim, tmp_path):
    """A tmpfs of 128 KiB (its own mount namespace): every byte gone, yet the manifest says
    "recording stopped", why, and the summary, in the space writer.lock held for it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _can_mount_tmpfs(disk):
        pytest.skip("cannot mount a tmpfs here (unshare -rm)")
    argv = " ".join(f"'{a}'" for a in headless_argv(url=sim.url, duration=30.0,
                                                        out=disk / "run", **LOAD))
    script = (f"mount -t tmpfs -o size=128k tmpfs {disk} && {argv}; "
              f"echo exit=$?; cp -a {disk}/run {tmp_path}/copy")  # the mount dies with us
    done = await asyncio.to_thread(subprocess.run, ["unshare", "-rm", "sh", "-c", script],
                                   capture_output=True, text=True, timeout=60,
                                   stdin=subprocess.DEVNULL)
    assert "exit=4" in done.stdout, done.stderr  # recording failed: the load was stopped
    assert "disk full while writing" in done.stderr
    m = json.loads((tmp_path / "copy" / "manifest.json").read_text())
    assert m["status"] == RECORDING_STOPPED and "disk full" in m["recording_stopped"]
    assert m["summary"]["exit"]["code"] == 4
    line = first_line(await asyncio.to_thread(tokentop, "report", str(tmp_path / "copy"),
                                              "--no-plots"))
    assert f" {RECORDING_STOPPED} " in line
