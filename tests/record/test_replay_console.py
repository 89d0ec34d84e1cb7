"""`tokentop replay` in the real console (App.run_test, Pilot) over a real recorded run: a
short headless run against the simulator, recorded once for the module.

The header says where the replay is (position / length) and at what speed, and keeps the
replay's own pause apart from the recorded state; the footer shows the replay keys, not
the load keys; at the end ← still seeks back and → says it is the end; fast presses each
seek (they add up rather than being lost while a seek is under way)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from scripted_source import ScriptedSource, make_snapshots
from support import WAIT_S, headless_argv, start_sim_process
from textual import events
from textual.pilot import Pilot
from textual.widgets._footer import FooterKey

from loadgen.record.replay import ReplaySource
from loadgen.record.rundir import last_snapshot
from loadgen.run.watch import WatchedSource
from tui.app import TokentopApp
from tui.commands.replay import replay_source

SIZE = (120, 30)
TICK = 0.5
# longer than one 30 s seek, shorter than two: so that two presses land apart from one
DURATION = 36.0
LOAD = dict(concurrency=2, workers=1, tick=TICK, output_tokens="16", input_tokens="16",
            drain_grace=1.0)
REPLAY_KEYS = {"replay_speed(1)", "replay_speed(10)", "replay_speed(100)", "seek_by(-30)",
               "seek_by(30)", "replay_pause"}
LOAD_KEYS = {"step(1)", "step(-1)", "step(10)", "step(-10)", "set_exact", "toggle_mode",
             "pause"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real run: `tokentop run --headless` against `tokentop sim`, recorded."""
    home = tmp_path_factory.mktemp("home")
    out = home / "run"
    sim, port = start_sim_process()
    try:
        done = subprocess.run(
            headless_argv(url=f"http://127.0.0.1:{port}/v1", duration=DURATION, out=out, **LOAD),
            capture_output=True, text=True, timeout=DURATION + 60, stdin=subprocess.DEVNULL,
            env={**os.environ, "XDG_DATA_HOME": str(home / "data"),
                 "XDG_CONFIG_HOME": str(home / "config")})
    finally:
        sim.stdin.close()
        sim.wait(10)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture
def length(run_dir) -> float:
    return last_snapshot(run_dir).elapsed


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


def header(app: TokentopApp) -> str:
    return str(app.query_one("#header").render())


def footer_actions(app: TokentopApp) -> set[str]:
    return {key.action for key in app.query(FooterKey)}


async def footer(pilot: Pilot, app: TokentopApp) -> set[str]:
    """The actions of the keys the footer shows, once it has drawn them."""
    await until(pilot, lambda: "quit" in footer_actions(app), "the footer drawn")
    return footer_actions(app)


def drawn_at(app: TokentopApp, elapsed: float) -> bool:
    """The Snapshot on screen is the first at or after `elapsed` (what a seek lands on)."""
    snap = app.windows.last
    return (snap is not None and app.drawn_seq == snap.seq
            and elapsed <= snap.elapsed < elapsed + TICK + 0.05)


async def at_the_end_paused(pilot: Pilot, app: TokentopApp, replay: ReplaySource,
                            length: float) -> None:
    await until(pilot, lambda: replay.status().replay.at_end and drawn_at(app, length),
                "the replay reached the end")
    await pilot.press("p")
    await until(pilot, lambda: replay.paused, "p paused the replay")


def press_fast(app: TokentopApp, *keys: str) -> None:
    """Keys as a terminal delivers a quick burst: all queued before any is handled."""
    for key in keys:
        app._driver.send_message(events.Key(key, None))


async def test_header_says_position_length_speed_and_whose_pause(run_dir, length):
    ended_as = last_snapshot(run_dir).load.state
    app, replay = console(run_dir, speed=10)
    async with app.run_test(size=SIZE) as pilot:
        total = f"/ 0:{int(length):02d}"
        # the recorded state is labelled so: a recorded pause is not the replay's
        await until(pilot, lambda: all(words in header(app) for words in (
            "replay ×10", total, "● recorded: running")), "the speed, length, recorded state")
        await pilot.press("3")
        await until(pilot, lambda: "replay ×100" in header(app), "3: ×100 in the header")
        await at_the_end_paused(pilot, app, replay, length)
        await until(pilot, lambda: "replay paused" in header(app), "the header says paused")
        text = header(app)
        assert f"0:{int(length):02d} {total}" in text and "end" in text
        assert f"recorded: {ended_as}" in text and "recorded: paused" not in text


async def test_footer_shows_replay_keys_and_hides_load_keys(run_dir):
    app, replay = console(run_dir, speed=1)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.drawn_seq is not None, "a first Snapshot drawn")
        shown = await footer(pilot, app)
        assert shown >= REPLAY_KEYS and not shown & LOAD_KEYS
        await pilot.press("p")  # the replay's pause, not the load's (whose key it shares)
        await until(pilot, lambda: replay.paused, "p paused the replay")
        await pilot.press("p")
        await until(pilot, lambda: not replay.paused, "p resumed the replay")
    live = TokentopApp(ScriptedSource(make_snapshots(3), hold=True), refresh=0.05)
    async with live.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: live.drawn_seq == 2, "the live console drawn")
        shown = await footer(pilot, live)
        assert LOAD_KEYS - {"step(10)", "step(-10)"} <= shown and not shown & REPLAY_KEYS


async def test_at_the_end_left_seeks_back_and_right_says_so(run_dir, length):
    app, replay = console(run_dir, speed=100)
    async with app.run_test(size=SIZE) as pilot:
        await at_the_end_paused(pilot, app, replay, length)
        last_seq = app.windows.last.seq
        await pilot.press("right")
        await until(pilot, lambda: any("at the end" in n.message for n in app._notifications),
                    "→ at the end says so")
        assert replay.status().replay.at_end and drawn_at(app, length)
        await pilot.press("left")
        await until(pilot, lambda: drawn_at(app, length - 30), "← landed 30 s back")
        assert app.windows.last.seq < last_seq and "end" not in header(app).split("●")[0]


async def test_fast_presses_each_seek(run_dir, length):
    app, replay = console(run_dir, speed=100)
    async with app.run_test(size=SIZE) as pilot:
        await at_the_end_paused(pilot, app, replay, length)
        press_fast(app, "left", "left")  # 60 s back from the end: before the start
        await until(pilot, lambda: drawn_at(app, 0.0), "two ← landed at the start")
        press_fast(app, "right", "right")  # 60 s on from the start: past the end
        await until(pilot, lambda: drawn_at(app, length), "two → landed at the end")


async def test_q_quits_a_replay_at_once_and_the_palette_has_no_load_commands(run_dir):
    app, _ = console(run_dir, speed=1.0)
    async with app.run_test(size=SIZE) as pilot:
        # a replay early on: the recorded run was "running" there, which is not our load
        await until(pilot, lambda: app.windows.last is not None, "a snapshot")
        assert app.windows.last.load.state == "running"
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert "Replay: pause / resume the replay" in titles
        assert "Switch closed loop / open loop" not in titles
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the console exits on one q")
