"""A replay of a real recording in the real console (App.run_test, Pilot): seeking back and
playing again shows each recorded event once; Enter on an event in the events screen (`l`)
seeks the replay to it; a killed run's replay says at its end how the run ended; the GPU
panel shows the simulator's line the run recorded.

The truth is the run directory read here with json (events.jsonl, snapshots.jsonl,
manifest.json), never through the reader the replay uses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import WAIT_S, headless_argv
from textual.pilot import Pilot

from loadgen.record.replay import ReplaySource
from loadgen.run.watch import WatchedSource
from tui.app import TokentopApp
from tui.commands.replay import replay_source
from tui.events_screen import EventsScreen
from tui.widgets import GpuPanel

DURATION = 8.0
LOAD = dict(concurrency=2, workers=1, tick=0.5, output_tokens="16", input_tokens="16",
            drain_grace=1.0)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real run: `tokentop run --headless` against its embedded simulator, recorded."""
    home = tmp_path_factory.mktemp("home")
    out = home / "run"
    done = subprocess.run(
        headless_argv(duration=DURATION, out=out, **LOAD),
        capture_output=True, text=True, timeout=DURATION + 60, stdin=subprocess.DEVNULL,
        env={**os.environ, "XDG_DATA_HOME": str(home / "data"),
             "XDG_CONFIG_HOME": str(home / "config")})
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def recorded(run_dir: Path) -> list[dict]:
    """events.jsonl as written, line by line."""
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def console(run_dir: Path, speed: float) -> tuple[TokentopApp, ReplaySource]:
    """The console as `tokentop replay DIR --speed S` builds it."""
    source, slo = replay_source(run_dir, speed=speed)
    app = TokentopApp(source, refresh=0.05, slo=slo)
    replay = source.source if isinstance(source, WatchedSource) else source
    assert isinstance(replay, ReplaySource)
    return app, replay


async def until(pilot: Pilot, cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await pilot.pause(0.02)


def at_end(replay: ReplaySource) -> bool:
    status = replay.status().replay
    return status is not None and status.at_end and not status.following


def shown(app: TokentopApp) -> list[tuple[str, str]]:
    """The recorded events in the console's log, in order (the replay's own news aside)."""
    return [(x.event.kind, x.event.message) for x in app.events.entries
            if x.event.kind != "replay"]


async def test_seeking_back_shows_each_recorded_event_once(run_dir) -> None:
    truth = [(e["kind"], e["message"]) for e in recorded(run_dir)]
    assert len(truth) >= 3  # started, recording, stopping at least
    app, replay = console(run_dir, speed=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: at_end(replay), "the end")
        await until(pilot, lambda: shown(app) == truth, "every recorded event, once")
        for _ in range(2):  # back to the start and through again, twice
            rewinds = app.events.generation
            await pilot.press("left")
            # the replay starts again from the first Snapshot: the log takes back its events
            await until(pilot, lambda r=rewinds: app.events.generation > r, "the seek back")
            await until(pilot, lambda: at_end(replay), "the end again")
            await until(pilot, lambda: app.drawn_seq == app.windows.last.seq, "drawn")
            assert shown(app) == truth
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen), "the events screen")
        rows = [r for r in app.screen.plain_rows if " replay " not in r]
        assert len(rows) == len(truth)


async def test_enter_on_an_event_seeks_the_replay_to_it(run_dir) -> None:
    first = recorded(run_dir)[0]
    app, replay = console(run_dir, speed=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: at_end(replay), "the end")
        await pilot.press("p")  # the replay paused: the seek's Snapshot alone comes
        await until(pilot, lambda: replay.paused, "paused")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen), "the events screen")
        assert app.screen.plain_rows[0].endswith(first["message"])
        await pilot.press("home", "enter")
        await until(pilot, lambda: not isinstance(app.screen, EventsScreen), "back on the run")
        await until(pilot, lambda: abs(replay.position - first["elapsed"]) < 0.002,
                    f"the replay at {first['elapsed']} s")


def killed_copy(run_dir: Path, dest: Path) -> Path:
    """The recording as a killed writer leaves it: the manifest still says running, and no
    process holds writer.lock."""
    copy = dest / "killed"
    shutil.copytree(run_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.update(status="running", end_time=None)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


async def test_a_killed_runs_replay_knows_it_was_interrupted(run_dir, tmp_path) -> None:
    copy = killed_copy(run_dir, tmp_path)
    app, replay = console(copy, speed=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: at_end(replay), "the end")
        assert replay.status().replay.ended == "interrupted"


async def test_a_killed_runs_replay_header_says_interrupted(run_dir, tmp_path) -> None:
    copy = killed_copy(run_dir, tmp_path)
    app, replay = console(copy, speed=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: at_end(replay), "the end")
        await pilot.pause(0.2)
        header = str(app.query_one("#header").render())
        assert "recorded: running" not in header and "interrupted" in header


async def test_the_gpu_panel_shows_the_recorded_simulator_line(run_dir) -> None:
    lines = (run_dir / "snapshots.jsonl").read_text().splitlines()
    about = json.loads(lines[-1])["target"]["about"]
    assert about and about.startswith("simulator")
    app, replay = console(run_dir, speed=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: at_end(replay), "the end")
        await until(pilot, lambda: about in app.query_one(GpuPanel).plain, "the simulator line")
        await pilot.press("left")
        await until(pilot, lambda: at_end(replay), "the end again")
        await pilot.pause(0.2)
        assert about in app.query_one(GpuPanel).plain
