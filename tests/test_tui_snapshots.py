"""Pictures of the main screen at the three target sizes, default theme, scripted data.

The scripted source holds after its last Snapshot (as a live run does), and
each picture waits until that Snapshot is on screen, so the pictures do not
depend on timing.
"""

from __future__ import annotations

import pytest
from scripted_source import ScriptedSource, make_snapshots
from textual.pilot import Pilot

from tui.app import TokentopApp

N = 12


async def _final_snapshot_drawn(pilot: Pilot) -> None:
    app = pilot.app
    assert isinstance(app, TokentopApp)
    for _ in range(300):
        if app.drawn_seq == N - 1:
            break
        await pilot.pause(0.01)
    assert app.drawn_seq == N - 1, "the last scripted Snapshot never reached the screen"
    await pilot.pause()


@pytest.mark.parametrize(
    ("size", "gpus"),
    [((80, 24), 1), ((120, 40), 2), ((200, 60), 4)],
    ids=["80x24", "120x40", "200x60"],
)
def test_main_screen(snap_compare, size: tuple[int, int], gpus: int) -> None:
    source = ScriptedSource(make_snapshots(N, gpus=gpus), hold=True)
    app = TokentopApp(source, theme="tokentop-dark", refresh=0.05)
    assert snap_compare(app, terminal_size=size, run_before=_final_snapshot_drawn)
