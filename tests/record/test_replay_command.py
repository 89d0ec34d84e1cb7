"""`tokentop replay DIR` with nothing to show: one line and exit 2 before any console starts
(as `tokentop report` does), through the real command line."""

from __future__ import annotations

import asyncio

import pytest
from support import tokentop


def _empty(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty", "is not a tokentop run directory"


def _missing(tmp_path):
    return tmp_path / "nope", "is not a directory"


def _a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    return tmp_path / "file", "is not a directory"


def _no_snapshot(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text('{"status": "running"}')
    return tmp_path / "run", "holds no snapshots yet"


@pytest.mark.parametrize("case", [_empty, _missing, _a_file, _no_snapshot])
async def test_nothing_to_replay_is_one_line_and_exit_2(tmp_path, case):
    path, words = case(tmp_path)
    proc = await asyncio.to_thread(tokentop, "replay", str(path), timeout=30)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert proc.stdout == ""  # no console was drawn
    assert proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith(f"tokentop replay: {path} ") and words in proc.stderr
