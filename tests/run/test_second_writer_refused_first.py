"""Two writers on one run directory: `--resume` of a run whose writer still runs is refused
by writer.lock before it reads a line of the recording. The directory the live writer
holds has a line no tokentop can read (a future format version): a second writer that
read first would stop at that line; one refused first never sees it."""

from __future__ import annotations

import os
import socket
import subprocess

from msgspec import to_builtins
from support import headless_argv

from loadgen.model.snapshot import Counters, LoadState, Snapshot, Target
from loadgen.record.recorder import Recorder
from loadgen.run.config import RunConfig


def test_resume_of_a_live_run_is_refused_before_reading_it(tmp_path):
    run_dir = tmp_path / "run"
    cfg = RunConfig(url="http://127.0.0.1:1/v1", duration=60.0)
    writer = Recorder.create(run_dir, to_builtins(cfg), run_id="r1")  # the live writer
    try:
        writer.write(Snapshot(run_id="r1", seq=0, t=1_700_000_001.0, elapsed=1.0,
                              interval=1.0, target=Target(url=cfg.url, model="m"),
                              load=LoadState(state="running"), counters=Counters()))
        with open(run_dir / "snapshots.jsonl", "ab") as f:  # a line from a later tokentop
            f.write(b'{"v":999,"run_id":"r1","seq":1}\n')
        env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
        done = subprocess.run(headless_argv(resume=run_dir), capture_output=True, text=True,
                              timeout=60, env=env, stdin=subprocess.DEVNULL)
    finally:
        writer.close()
    assert done.returncode == 2, done.stderr
    said = done.stderr.strip().splitlines()
    assert said == [f"tokentop: {run_dir} is being written by another tokentop (pid "
                    f"{os.getpid()} on {socket.gethostname()}): one writer a run directory; "
                    "let that run end, or stop it, first"], said
