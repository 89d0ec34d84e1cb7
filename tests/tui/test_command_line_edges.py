"""The command line at its edges, through the real `tokentop` process: an open loop without
a rate is refused in one line (it once ran 1 req/s unsaid), and a reader that stops reading
(`tokentop report DIR | head`) is not a failed report."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from support import FIXTURES, ROOT, tokentop


def test_an_open_loop_without_a_rate_is_refused_naming_rate():
    done = tokentop("run", "--headless", "--mode", "open", "-c", "4", "--duration", "1")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--rate" in lines[0] and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_report_into_a_pipe_closed_early_exits_quietly_and_still_writes(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURES / "formats" / "run-v1", run_dir)
    out_dir = tmp_path / "report"
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "report", str(run_dir), "--out-dir", str(out_dir)],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=write_end, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")})
    os.close(write_end)
    reader = os.fdopen(read_end, "rb")
    first = reader.readline()  # as `head -1` does: one line, then the reader is gone
    reader.close()
    assert first.strip(), "the report printed nothing"
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert stderr == "", stderr  # not "cannot write the report: Broken pipe", no traceback
    # the output ended, the report did not: its files are all there
    deadline = time.monotonic() + 5
    while not (out_dir / "report.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (out_dir / "report.md").read_text().startswith("#")
    assert (out_dir / "report.json").stat().st_size > 0
