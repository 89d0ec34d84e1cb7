"""The events screen (`l`), the events panel's wrapping, Ctrl-C and the footer, in the real
console (App.run_test, Pilot) over a scripted run whose events are known in advance.

The truth each test compares with is the list of events the script hands the console
(built here, read by kind and text here), never the console's own log."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from scripted_source import T0, ScriptedSource, make_snapshots
from support import WAIT_S
from textual.pilot import Pilot
from textual.widgets._footer import FooterKey

from loadgen.model.snapshot import Event
from tui.app import TokentopApp
from tui.events_screen import EventsScreen
from tui.help_screen import HelpScreen
from tui.widgets import EventsPanel

KINDS = ("error", "slo", "outage", "recovery", "operator", "fault", "run", "probe", "stall")
TICKS = 30
PER_TICK = 7
ADVICE = "add --max-in-flight 64 to bound the backlog"


def scripted_events() -> list[list[Event]]:
    """Each tick's events: every kind, some at level error, one with markup in its text."""
    ticks = []
    n = 0
    for i in range(TICKS):
        tick = []
        for _ in range(PER_TICK):
            kind = KINDS[n % len(KINDS)]
            tick.append(Event(t=T0 + i + n / 1000, kind=kind,  # type: ignore[arg-type]
                              level="error" if n % 11 == 0 else "info",
                              message=f"event {n} of kind {kind} [red]as written[/red]"))
            n += 1
        ticks.append(tick)
    return ticks


def source(events: list[list[Event]], *, hold: bool = True) -> ScriptedSource:
    snaps = make_snapshots(len(events))
    for snap, tick in zip(snaps, events, strict=True):
        snap.events = list(tick)
    return ScriptedSource(snaps, hold=hold)


async def until(pilot: Pilot, cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await pilot.pause(0.02)


def rows(app: TokentopApp) -> list[str]:
    screen = app.screen
    assert isinstance(screen, EventsScreen)
    return screen.plain_rows


async def test_l_lists_every_event_filters_by_kind_and_searches() -> None:
    ticks = scripted_events()
    given = [e for tick in ticks for e in tick]
    app = TokentopApp(source(ticks), refresh=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.drawn_seq == TICKS - 1, "every tick drawn")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen), "the events screen")
        await until(pilot, lambda: len(rows(app)) == len(given), "a row per event")
        # in order, each once, its text as written (markup shown, not applied)
        for row, e in zip(rows(app), given, strict=True):
            assert row.endswith(e.message) and f" {e.kind[:8]}" in row

        expected = {
            "errors": [e for e in given if e.kind == "error" or e.level == "error"],
            "slo": [e for e in given if e.kind == "slo"],
            "outages": [e for e in given if e.kind in ("outage", "recovery", "stall")],
            "operator": [e for e in given if e.kind == "operator"],
            "faults": [e for e in given if e.kind == "fault"],
        }
        for name, wanted in expected.items():
            await pilot.press("f")
            assert app.screen.filter == name
            shown = rows(app)
            assert len(shown) == len(wanted) > 0, name
            assert all(r.endswith(e.message) for r, e in zip(shown, wanted, strict=True)), name
        await pilot.press("f")  # round to all again
        assert len(rows(app)) == len(given)

        await pilot.press("slash", *"event 12")
        wanted = [e for e in given if "event 12" in e.message]  # 12, 120…129
        await until(pilot, lambda: len(rows(app)) == len(wanted), "the search's rows")
        assert all("event 12" in r for r in rows(app))
        await pilot.press("escape")  # ends the search: every row again
        await until(pilot, lambda: len(rows(app)) == len(given), "the search cleared")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, EventsScreen), "back")


async def test_new_events_reach_the_open_screen_and_it_follows_them() -> None:
    ticks = scripted_events()
    src = source(ticks)
    src.delay = 0.05
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.drawn_seq is not None, "a first tick")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen), "the events screen")
        total = TICKS * PER_TICK
        await until(pilot, lambda: len(rows(app)) == total, "every event, as it came")
        options = app.screen.options
        assert options.highlighted == total - 1  # the newest, in sight


async def test_the_panel_wraps_the_newest_event_whole_at_80x24() -> None:
    long = ("outage: the server answers nothing since 14:03:27 (connect refused on every "
            f"request); if it is overloaded rather than down, {ADVICE}")
    ticks = [[Event(t=T0 + 1, kind="run", message="run started")],
             [Event(t=T0 + 2, kind="outage", level="error", message=long)]]
    app = TokentopApp(source(ticks), refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.drawn_seq == 1, "both ticks drawn")
        panel = app.query_one(EventsPanel)
        await until(pilot, lambda: ADVICE.split()[-1] in panel.plain, "the advice shown")
        words = " ".join(panel.plain.split())
        assert ADVICE in words and "outage: the server" in words
        assert all(len(line) <= panel.content_size.width for line in panel.plain.split("\n"))


@pytest.mark.parametrize("key", ["ctrl+c", "q"])
async def test_ctrl_c_quits_as_q_does(key: str) -> None:
    src = source(scripted_events()[:3])
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.drawn_seq == 2, "drawn")
        await pilot.press(key)  # load is running: the first only asks, in the key's name
        await pilot.pause(0.05)
        assert not src.closed and app.return_code is None
        assert any(f"press {key} again" in n.message for n in app._notifications)
        assert not any("ctrl+q" in n.message for n in app._notifications)
        await pilot.press(key)
        await until(pilot, lambda: app.return_code is not None, "the app exits")
    assert src.closed  # drained and closed, as q does
    assert app.return_code == 0


@pytest.mark.parametrize(("key", "screen"), [("l", EventsScreen), ("question_mark", HelpScreen)])
async def test_ctrl_c_quits_from_the_events_and_help_screens(key: str, screen: type) -> None:
    src = source(scripted_events()[:2], hold=False)  # ended: no load to stop, no asking
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.ended, "the run ended")
        await pilot.press(key)
        await until(pilot, lambda: isinstance(app.screen, screen), "the screen")
        await pilot.press("ctrl+c")
        await until(pilot, lambda: app.return_code is not None, "the app exits")
    assert src.closed


async def test_the_80_column_footer_keeps_help_and_quit_and_help_lists_l() -> None:
    app = TokentopApp(source(scripted_events()[:2]), refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.drawn_seq == 1, "drawn")
        await pilot.pause(0.1)
        keys = list(app.screen.query(FooterKey))
        # the palette's key sits on the right edge, over whatever reaches it
        palette = next(k for k in keys if k.action == "command_palette")
        visible = {k.action for k in keys
                   if k is not palette and k.region.width and k.region.right <= palette.region.x}
        assert {"help", "quit"} <= visible
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        keys = str(app.screen.query_one("#help-keys").render())
        assert " l  every event of the run" in keys and "ctrl+c  quit, as q" in keys
