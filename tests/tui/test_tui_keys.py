"""Every key of the console against the scripted source: the controls it sends, what it
changes on screen, what it writes (config, screenshot, Snapshot). Bounded waits only."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec
import pytest
from scripted_source import T0, ScriptedSource, make_snapshot, make_snapshots
from test_tui import SIZE, held, text, wait_drawn, wait_until
from textual.widgets import Input

from loadgen.model.slo import parse_slos
from loadgen.model.snapshot import Counters, Event, ServerMetrics, Snapshot
from themes import THEME_NAMES
from tui.app import TokentopApp
from tui.screens import DistributionScreen, ErrorsScreen, GpuScreen, InputModal, SnapshotScreen
from tui.widgets.latency_panel import cell, slo_limit


@pytest.fixture(autouse=True)
def _config_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("NO_COLOR", raising=False)
    return tmp_path / "config"


def open_loop(n: int = 3) -> list[Snapshot]:
    snaps = make_snapshots(n)
    for s in snaps:
        s.load.mode = "open"
        s.load.target_rate = 20.0
        s.load.arrival = "poisson"
    return snaps


@pytest.mark.parametrize(
    ("keys", "values"),
    [(["plus"], [1.0]), (["minus"], [-1.0]), (["]"], [10.0]), (["["], [-10.0])],
)
async def test_open_loop_keys_change_the_rate(keys: list[str], values: list[float]) -> None:
    src = ScriptedSource(open_loop(), hold=True)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 2)
        assert "rate 20 req/s" in text(app, "#load")
        await pilot.press(*keys)
        await wait_until(pilot, lambda: len(src.controls) == len(values))
        assert [(c.op, c.value, c.source) for c in src.controls] == [
            ("add_rate", v, "key") for v in values
        ]


async def test_equals_sets_an_exact_concurrency_and_refuses_words() -> None:
    src = held(2)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        await pilot.press("=")
        await wait_until(pilot, lambda: isinstance(app.screen, InputModal))
        app.screen.query_one(Input).value = "lots"
        await pilot.press("enter")
        await pilot.pause(0.05)
        assert isinstance(app.screen, InputModal), "a bad value keeps the modal open"
        assert "not a number" in str(app.screen.query_one("#input-error").render())
        assert src.controls == []
        app.screen.query_one(Input).value = "32"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(src.controls) == 1)
        assert (src.controls[0].op, src.controls[0].value) == ("set_concurrency", 32.0)
        assert not isinstance(app.screen, InputModal)


async def test_equals_keeps_typed_text_when_focus_comes_back_under_load() -> None:
    # a live run: Snapshots (and events) keep coming while the operator types
    snaps = make_snapshots(200)
    for i, s in enumerate(snaps):
        s.events = [Event(t=s.t, kind="operator", message=f"tick {i}")]
    src = ScriptedSource(snaps, delay=0.01, hold=True)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.drawn_seq is not None)
        await pilot.press("=")
        await wait_until(pilot, lambda: isinstance(app.screen, InputModal))
        field = app.screen.query_one(Input)
        assert field.value == "" and field.placeholder == "64", "the current value is a hint"
        await pilot.press("3")
        field.blur()  # focus leaves and comes back (a click, a toast, the terminal's focus)
        await pilot.pause(0.05)
        field.focus()
        await pilot.pause(0.05)
        await pilot.press("2")
        await wait_until(pilot, lambda: app.drawn_seq is not None and app.drawn_seq > 20)
        assert field.value == "32"
        # the dashboard behind the dialog kept drawing
        events = app.screen_stack[0].query_one("#events")
        assert f"tick {app.drawn_seq}" in events.plain
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(src.controls) == 1)
        assert (src.controls[0].op, src.controls[0].value) == ("set_concurrency", 32.0)


async def test_equals_in_open_loop_sets_the_rate_and_escape_cancels() -> None:
    src = ScriptedSource(open_loop(), hold=True)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 2)
        await pilot.press("=")
        await wait_until(pilot, lambda: isinstance(app.screen, InputModal))
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, InputModal))
        assert src.controls == []
        await pilot.press("=")
        await wait_until(pilot, lambda: isinstance(app.screen, InputModal))
        app.screen.query_one(Input).value = "12.5"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(src.controls) == 1)
        assert (src.controls[0].op, src.controls[0].value) == ("set_rate", 12.5)


async def test_m_switches_the_loop_mode() -> None:
    src = held(2)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        await pilot.press("m")
        await wait_until(pilot, lambda: len(src.controls) == 2)
        # the load level is kept: open loop at the req/s the closed loop measured
        rate = app.windows.stats("10s").req_s
        assert rate and [(c.op, c.value, c.note) for c in src.controls] == [
            ("set_rate", round(rate, 1), None), ("set_mode", None, "open")]
    src = ScriptedSource(open_loop(), hold=True)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 2)
        await pilot.press("m")
        await wait_until(pilot, lambda: len(src.controls) == 2)
        # and back: closed loop at about the concurrency the open loop had in flight
        in_flight = float(app.windows.last.load.in_flight)
        assert [(c.op, c.value, c.note) for c in src.controls] == [
            ("set_concurrency", in_flight, None), ("set_mode", None, "closed")]


async def test_p_pauses_a_running_load_and_resumes_a_paused_one() -> None:
    src = held(2)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        await pilot.press("p")
        await wait_until(pilot, lambda: len(src.controls) == 1)
        assert src.controls[0].op == "pause"
    src = ScriptedSource(make_snapshots(2, state="paused"), hold=True)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        assert "paused" in text(app, "#header")
        await pilot.press("p")
        await wait_until(pilot, lambda: len(src.controls) == 1)
        assert src.controls[0].op == "resume"


async def test_w_cycles_the_latency_window_and_r_resets() -> None:
    app = TokentopApp(held(), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app)
        latency = app.query_one("#latency")
        assert "10 s" in latency.border_title
        seen = []
        for _ in range(4):
            await pilot.press("w")
            await pilot.pause(0.05)
            seen.append((app.window, latency.border_title))
        assert [w for w, _ in seen] == ["1m", "10m", "run", "10s"]
        assert "whole run" in seen[2][1] and "1 min" in seen[0][1]
        assert app.windows.stats("run").latency["ttft"]["count"] == 1200
        await pilot.press("r")
        await wait_until(pilot, lambda: "windows reset" in text(app, "#events"))
        assert app.windows.stats("run").latency["ttft"]["count"] == 0
        assert "–" in text(app, "#latency")  # no samples since the reset


async def test_t_cycles_themes_and_remembers_the_choice(_config_home: Path) -> None:
    app = TokentopApp(held(2), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        assert app.theme == THEME_NAMES[0]
        names = []
        for _ in range(len(THEME_NAMES)):
            await pilot.press("t")
            await pilot.pause()
            names.append(app.theme)
        assert names == [*THEME_NAMES[1:], THEME_NAMES[0]]
        await pilot.press("t")
        await pilot.pause()
    saved = tomllib.loads((_config_home / "tokentop" / "config.toml").read_text())
    assert saved["theme"] == THEME_NAMES[1]
    # the next start remembers it; --theme still wins; NO_COLOR wins over the file
    assert TokentopApp(held(1)).theme == THEME_NAMES[1]
    assert TokentopApp(held(1), theme="tokentop-mono").theme == "tokentop-mono"


async def test_a_broken_config_file_is_a_warning_not_a_crash(_config_home: Path) -> None:
    path = _config_home / "tokentop" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("theme = [unclosed\n")
    app = TokentopApp(held(2), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        assert app.theme == "tokentop-dark"
        assert any("ignored" in n.message for n in app._notifications)
        await pilot.press("t")
        await pilot.pause()
        assert any("not overwriting" in n.message for n in app._notifications)
    assert path.read_text() == "theme = [unclosed\n"


async def test_e_marks_an_event_with_a_note() -> None:
    src = held(2)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, InputModal))
        await pilot.press(*"kv bump")
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(src.controls) == 1)
        assert (src.controls[0].op, src.controls[0].note) == ("mark", "kv bump")


async def test_s_saves_a_screenshot_and_the_snapshot(tmp_path: Path) -> None:
    app = TokentopApp(held(3), refresh=0.05, save_dir=tmp_path / "shots")
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 2)
        await pilot.press("s")
        await wait_until(pilot, lambda: len(app.saved) == 2)
        assert any("saved" in n.message for n in app._notifications)
    svg, js = app.saved
    assert svg.suffix == ".svg" and svg.name.startswith("tokentop-") and svg.exists()
    assert "<svg" in svg.read_text()[:200]
    assert js.suffix == ".json" and js.stem == svg.stem
    assert msgspec.json.decode(js.read_bytes())["seq"] == 2


async def test_s_saves_into_the_run_directory_not_the_current_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "the-run"
    source = held(3)
    source.run_dir = str(run_dir)  # where the source says its run records
    app = TokentopApp(source, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 2)
        await pilot.press("s")
        await wait_until(pilot, lambda: len(app.saved) == 2)
    assert [p.parent for p in app.saved] == [run_dir, run_dir]
    assert all(p.exists() for p in app.saved)


async def test_q_quits_at_once_when_no_load_runs() -> None:
    src = ScriptedSource(make_snapshots(2, state="paused"), hold=True)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        await pilot.press("q")
        await wait_until(pilot, lambda: app.return_code is not None)
    assert src.closed


@pytest.mark.parametrize(
    ("key", "screen", "needle"),
    [
        ("d", DistributionScreen, "P99.99"),
        ("g", GpuScreen, "SM 1980 MHz"),
        ("x", ErrorsScreen, "timeout"),
        ("v", SnapshotScreen, '"run_id"'),
    ],
)
async def test_detail_screens_open_and_escape_returns(key, screen, needle) -> None:
    app = TokentopApp(held(), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app)
        await pilot.press(key)
        await wait_until(pilot, lambda: isinstance(app.screen, screen))
        await wait_until(pilot, lambda: needle in app.screen.plain)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, screen))


async def test_help_lists_every_key() -> None:
    app = TokentopApp(held(2), refresh=0.05)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause(0.05)
        keys = str(app.screen.query_one("#help-keys").render())
        for key in ("+", "-", "]", "[", "=", "m", "p", "a", "w", "r", "t", "e", "s", "d", "g", "x",
                    "v", "?", "q"):
            assert f" {key}  " in f"\n{keys}".replace("\n", " \n "), key


def outage_run() -> list[Snapshot]:
    """10 good ticks, 6 ticks where every connection is refused, then good again, with the
    engine's outage state and events as the coordinator sends them."""
    snaps = []
    ok, failed, connect = 0, 0, 0
    for i in range(22):
        s = make_snapshot(i)
        down = 10 <= i < 16
        if down:
            failed += 4
            connect += 4
            s.server = ServerMetrics(url="http://127.0.0.1:8000/metrics", ok=False,
                                     error="connection refused")
            s.load.outage_since = snaps[10].t if i > 10 else s.t
        else:
            ok += 10
        if i == 10:
            s.events = [Event(t=s.t, kind="outage", level="error",
                              message="outage started: 4 requests could not reach the server")]
        if i == 16:
            s.events = [Event(t=s.t, kind="recovery", message="recovered after 3.0 s: requests "
                              "succeed again")]
        s.counters = Counters(requests_ok=ok, requests_failed=failed,
                              errors={"connect": connect} if connect else {})
        snaps.append(s)
    return snaps


async def test_engine_outage_is_shown_and_logged_with_its_recovery() -> None:
    snaps = outage_run()
    src = ScriptedSource([], hold=True)
    app = TokentopApp(src, refresh=0.02)
    seen_outage = []
    async with app.run_test(size=SIZE) as pilot:
        # step through the run one Snapshot per draw, as a live run would arrive
        for s in snaps:
            app._take(s)
            app.redraw_now()
            seen_outage.append("outage" in text(app, "#header"))
            await pilot.pause()
        events = text(app, "#events")
    assert any(seen_outage[10:17]) and not any(seen_outage[:10]) and not seen_outage[-1]
    assert "outage started" in events
    assert "recovered after" in events
    assert T0  # timestamps come from the Snapshots


def test_slo_cells_are_coloured_against_their_limits() -> None:
    slos = parse_slos("ttft_p99<300ms,tpot<50ms")
    assert slo_limit(slos, "ttft", "p99") == ("<", 300_000)
    assert slo_limit(slos, "tpot", "p99") == ("<=", 50_000)
    assert slo_limit(slos, "tpot", "p50") is None
    assert "$error" in cell({"p99": 389_000}, "ttft", "p99", slos)
    assert "$success" in cell({"p99": 19_700}, "tpot", "p99", slos)
    assert "$" not in cell({"p50": 10_000}, "tpot", "p50", slos)


async def palette(app: TokentopApp, pilot) -> dict:
    await wait_drawn(pilot, app, 1)
    return {c.help: c for c in app.get_system_commands(app.screen)}


async def test_the_palette_is_made_from_the_key_bindings() -> None:
    """One list of keys: every binding that is on has its palette command, and running it
    does what the key does (here `t`, the next theme); a replay's palette has its keys."""
    app = TokentopApp(held(2), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        commands = await palette(app, pilot)
        assert "key m" in commands and "key 1" not in commands
        before = app.theme
        app.call_later(commands["key t"].callback)  # as the palette runs a command
        await wait_until(pilot, lambda: app.theme != before)
    source = held(2)
    source.kind = "replay"
    replay = TokentopApp(source, refresh=0.05)
    async with replay.run_test(size=SIZE) as pilot:
        commands = await palette(replay, pilot)
        assert "key 1" in commands and "key m" not in commands
