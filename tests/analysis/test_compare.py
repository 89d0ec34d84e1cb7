"""`tokentop compare` on every format version it claims to read, and on what it must refuse."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
from support import FIXTURES, headless_argv

from loadgen.analysis.compare import delta, load
from loadgen.record.rundir import INTERRUPTED, run_state
from tui.commands.compare import main

FORMATS = FIXTURES / "formats"


@pytest.mark.parametrize("name", ["run-v1", "summary-v1-unversioned.json", "sweep-v1",
                                  "sweep-v1/sweep.json"])
def test_every_supported_version_loads(name):
    item = load(FORMATS / name)
    if item.kind == "run":
        assert item.summary["rates"]["output_tok_s"] > 0
        assert item.summary["latency_ms"]["ttft"]["p99"] > 0
    else:
        assert [s.load for s in item.steps] == [1.0, 2.0]


def test_runs_side_by_side_with_percentages_and_a_workload_flag(tmp_path, capsys):
    summary = json.loads((FORMATS / "summary-v1-unversioned.json").read_text())
    faster = json.loads(json.dumps(summary))
    faster["throughput"]["output_tok_s"] = summary["throughput"]["output_tok_s"] * 1.5
    faster["config"]["output_tokens"] = "256"
    (tmp_path / "b.json").write_text(json.dumps(faster))
    png = tmp_path / "cmp.png"
    assert main([str(FORMATS / "run-v1"), str(FORMATS / "summary-v1-unversioned.json"),
                 str(tmp_path / "b.json"), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "WORKLOADS DIFFER" in out and "output_tokens '16' vs '256'" in out
    row = next(line for line in out.splitlines() if line.startswith("output tok/s"))
    assert "better" in row
    assert png.stat().st_size > 5_000


def test_sweeps_side_by_side(tmp_path, capsys):
    png = tmp_path / "curves.png"
    assert main([str(FORMATS / "sweep-v1"), str(FORMATS / "sweep-v1" / "sweep.json"),
                 "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "knee" in out and "(=)" in out
    assert png.stat().st_size > 10_000


def test_unknown_versions_are_refused_in_words(tmp_path, capsys):
    sweep = json.loads((FORMATS / "sweep-v1" / "sweep.json").read_text())
    sweep["format"] = 99
    (tmp_path / "s99.json").write_text(json.dumps(sweep))
    assert main([str(FORMATS / "sweep-v1"), str(tmp_path / "s99.json")]) == 2
    assert "sweep format 99 is not supported" in capsys.readouterr().err
    run = tmp_path / "run-v99"
    shutil.copytree(FORMATS / "run-v1", run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["format_version"] = 99
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert main([str(FORMATS / "run-v1"), str(run)]) == 2
    assert "run directory format 99 is not supported" in capsys.readouterr().err
    snaps = tmp_path / "snap-v2"
    shutil.copytree(FORMATS / "run-v1", snaps)
    lines = (snaps / "snapshots.jsonl").read_text().splitlines()
    (snaps / "snapshots.jsonl").write_text(
        "\n".join(line.replace('"v":1,', '"v":2,', 1) for line in lines) + "\n")
    assert main([str(FORMATS / "run-v1"), str(snaps)]) == 2
    err = capsys.readouterr().err
    assert "version 2" in err and "Traceback" not in err


def test_mixing_runs_and_sweeps_is_refused(capsys):
    assert main([str(FORMATS / "run-v1"), str(FORMATS / "sweep-v1")]) == 2
    assert "runs with runs and sweeps with sweeps" in capsys.readouterr().err


def test_delta_says_which_way_is_better():
    assert delta(100.0, 150.0, True) == "(+50.0% better)"
    assert delta(100.0, 150.0, False) == "(+50.0% worse)"
    assert delta(None, 1.0, True) == ""


async def test_a_killed_run_beside_a_finished_one_is_flagged(sim, tmp_path, capsys):
    """A run whose tokentop was SIGKILLed mid-run (its manifest still says "running", no
    live writer holds the lock) set beside a finished run: marked, and said not to be a
    like-for-like comparison; two finished runs say nothing of the sort."""
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        headless_argv(url=sim.url, duration=60, out=killed, concurrency=2, workers=1, tick=0.1,
                      input_tokens="16", output_tokens="16"),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        snaps = killed / "snapshots.jsonl"
        while not (snaps.exists() and snaps.read_bytes().count(b"\n") >= 10):
            assert time.monotonic() < deadline and proc.poll() is None, "the run wrote no ticks"
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert run_state(killed) == INTERRUPTED  # what the record says, read the record's way

    finished = FORMATS / "run-v1"
    assert main([str(finished), str(killed), "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    flag = next(line for line in out.splitlines() if line.startswith("killed is "))
    assert "INTERRUPTED" in flag and "not a like-for-like comparison" in flag
    state = next(line for line in out.splitlines() if line.startswith("state"))
    assert state.split()[1:] == ["finished", "INTERRUPTED"]
    doc = json.loads((tmp_path / "c.json").read_text())
    assert [i["state"] for i in doc["items"]] == ["finished", "interrupted"]

    assert main([str(finished), str(finished)]) == 0
    out = capsys.readouterr().out
    assert "not finished" not in out
    assert not any(line.startswith("state") for line in out.splitlines())
