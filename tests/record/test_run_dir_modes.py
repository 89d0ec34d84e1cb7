"""One mode for every file of a run directory: what any file the user makes gets (0666 less
the umask), the manifest included (it was 0600 alone: tempfile.mkstemp's, kept by the
rename). Read with stat(2) from real runs under two umasks, and after a resume."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest
from support import headless_argv


def run(argv: list[str], tmp_path, umask: int) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env,
                          stdin=subprocess.DEVNULL, preexec_fn=lambda: os.umask(umask))
    assert done.returncode == 0, done.stderr


def modes(run_dir) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir() if p.is_file()}


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_file_of_a_run_directory_has_one_mode(tmp_path, umask: int):
    out = tmp_path / "run"
    run(headless_argv(concurrency=2, workers=1, tick=0.2, duration=1.0, output_tokens="8",
                      out=out, drain_grace=1.0), tmp_path, umask)
    want = 0o666 & ~umask
    got = modes(out)
    assert {"manifest.json", "snapshots.jsonl", "latency.hlog", "events.jsonl",
            "writer.lock"} <= set(got)
    assert got == dict.fromkeys(got, want), {k: oct(v) for k, v in got.items()}
    run(headless_argv(resume=out, duration=0.5), tmp_path, umask)  # rewritten on resume
    got = modes(out)
    assert got == dict.fromkeys(got, want), {k: oct(v) for k, v in got.items()}
