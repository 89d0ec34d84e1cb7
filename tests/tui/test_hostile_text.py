"""Outside text with Textual markup in it, in the real console (App.run_test, Pilot): a
model id of "[red]x[/red]" is shown as written in the header, a source's error in its toast,
an agent's target in the fleet table; none is read as markup (the rendered text says so)."""

from __future__ import annotations

from collections.abc import Callable

from mosquitto import settings
from scripted_source import ScriptedSource, make_snapshots
from textual.pilot import Pilot
from textual.widgets import DataTable
from textual.widgets._toast import Toast

from loadgen.fleet.monitor import FleetMonitor
from tui.app import TokentopApp
from tui.fleet_app import FleetApp

MARKUP = "[red]x[/red]"
SIZE = (160, 40)


async def _until(pilot: Pilot, cond: Callable[[], bool], tries: int = 300) -> None:
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.01)
    raise AssertionError("the app never reached the expected state")


def _lines(widget) -> list[str]:
    """What `widget` draws, line by line, as the terminal gets it (markup already read)."""
    return ["".join(seg.text for seg in widget.render_line(y)) for y in range(widget.size.height)]


def _toasts(app) -> list[str]:
    return [" ".join(_lines(t)) for t in app.screen.query(Toast)]


async def test_a_model_id_with_markup_is_shown_as_written_in_the_header() -> None:
    snaps = make_snapshots(3)
    for s in snaps:
        s.target.model = MARKUP
    app = TokentopApp(ScriptedSource(snaps, hold=True), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await _until(pilot, lambda: app.drawn_seq == 2)
        header = str(app.query_one("#header").render())
        assert f"{MARKUP} @ http" in header, header


async def test_a_source_error_with_markup_is_shown_as_written_in_its_toast() -> None:
    app = TokentopApp(ScriptedSource([], start_error=f"cannot reach {MARKUP}"), refresh=0.05)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await _until(pilot, lambda: any("cannot reach" in t for t in _toasts(app)))
        assert any(f"cannot reach {MARKUP}" in t for t in _toasts(app)), _toasts(app)


async def test_an_agents_target_with_markup_is_shown_as_written_in_the_fleet_table() -> None:
    monitor = FleetMonitor(settings("mqtt://127.0.0.1:9"), "t")  # never started: no broker
    [snap] = make_snapshots(1)
    snap.target.url = MARKUP
    monitor.take_snapshot("gpu-07", snap)
    app = FleetApp(monitor, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(DataTable)
        await _until(pilot, lambda: table.row_count == 2)
        await _until(pilot, lambda: any("gpu-07" in line for line in _lines(table)))
        [line] = [line for line in _lines(table) if "gpu-07" in line]
        assert MARKUP in line, line
