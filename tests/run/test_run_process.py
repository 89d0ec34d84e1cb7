"""The console's run process speaks for itself: the run directory comes with Ready, the
outcome with Finished, and a run process that dies is an outcome in words, told by the
console and checked against what the recording itself says."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable

import pytest
from textual.pilot import Pilot

from loadgen.record.rundir import INTERRUPTED, run_state
from loadgen.run.config import RunConfig
from loadgen.run.run_process import RunProcess
from tui.app import TokentopApp
from tui.commands.console import farewell


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


async def until(pilot: Pilot, cond: Callable[[], bool], what: str, seconds: float = 30.0):
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await pilot.pause(0.05)


def run_cfg(sim, out) -> RunConfig:
    return RunConfig(url=sim.url, concurrency=2, output_tokens="64", workers=1, tick=0.25,
                     drain_grace=1.0, out=str(out))


async def test_ready_names_the_run_directory_and_finished_carries_the_runs_own_verdict(
        sim, tmp_path):
    out = tmp_path / "run"
    source = RunProcess(run_cfg(sim, out))
    assert source.status().run_dir is None and source.status().outcome is None
    await source.start()
    try:
        assert source.status().run_dir == str(out)  # said by the run, not guessed
        seen = 0
        async for _snap in source.snapshots():
            seen += 1
            if seen == 4:
                break
    finally:
        await source.close()
    outcome = source.status().outcome
    assert outcome is not None and outcome.ending == "finished"
    # the verdict the run wrote into its own manifest, word for word
    manifest = json.loads((out / "manifest.json").read_text())
    assert outcome.reason == manifest["summary"]["exit"]["reason"]
    assert outcome.code == manifest["summary"]["exit"]["code"]
    assert outcome.line.startswith(outcome.reason) and " | p50/p99 " in outcome.line
    assert outcome.run_dir == str(out)


async def test_a_killed_run_process_is_an_outcome_and_an_event_in_words(sim, tmp_path):
    out = tmp_path / "run"
    source = RunProcess(run_cfg(sim, out))
    app = TokentopApp(source, refresh=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.windows.last is not None
                    and app.windows.last.counters.requests_ok > 0, "requests succeed")
        os.kill(source.proc.pid, signal.SIGKILL)
        await until(pilot, lambda: app.ended, "the console saw the run end")
        outcome = source.status().outcome
        assert outcome is not None and outcome.ending == "died"
        assert "the run process died (killed by SIGKILL)" in outcome.reason
        assert f"its recording in {out} is interrupted" in outcome.reason
        assert app.error == outcome.reason  # the header's error line, not "stopped"
        await until(pilot, lambda: "run process died" in " ".join(
            app.query_one("#events").plain.split()), "the events panel tells it")
        await pilot.press("q")
    # what q leaves in the terminal is the death, not a "done:" rebuilt from the windows
    assert farewell(app) == [f"tokentop: {outcome.reason}", f"tokentop: run directory {out}"]
    # and the recording itself agrees: its writer died without finishing
    assert run_state(out) == INTERRUPTED
