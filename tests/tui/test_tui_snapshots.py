"""Pictures of the main screen at the three target sizes, in each of the four themes, on
scripted data (with SLOs, so the latency cells are coloured).

The scripted source holds after its last Snapshot (as a live run does), and
each picture waits until that Snapshot is on screen, so the pictures do not
depend on timing. Event timestamps are shown in UTC here, whatever the machine's zone.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from scripted_source import (
    LATENCY_US,
    ScriptedEvalSource,
    ScriptedSource,
    encode_values,
    eval_progress,
    make_snapshots,
)
from textual.pilot import Pilot

from loadgen.model.slo import parse_slos
from loadgen.run.watch import WatchedSource
from themes import THEME_NAMES
from tui.app import TokentopApp

N = 12
SLO = "ttft_p99<300ms,tpot<50ms,e2e<10s"


@pytest.fixture(autouse=True)
def _utc_and_no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("NO_COLOR", raising=False)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def _final_snapshot_drawn(pilot: Pilot) -> None:
    app = pilot.app
    assert isinstance(app, TokentopApp)
    for _ in range(300):
        if app.drawn_seq == N - 1:
            break
        await pilot.pause(0.01)
    assert app.drawn_seq == N - 1, "the last scripted Snapshot never reached the screen"
    app.redraw_now()  # the events panel knows its height only after the first layout
    await pilot.pause()


@pytest.mark.parametrize(
    "theme", THEME_NAMES, ids=[t.removeprefix("tokentop-") for t in THEME_NAMES]
)
@pytest.mark.parametrize(
    ("size", "gpus"),
    [((80, 24), 1), ((120, 40), 2), ((200, 60), 4)],
    ids=["80x24", "120x40", "200x60"],
)
def test_main_screen(snap_compare, size: tuple[int, int], gpus: int, theme: str) -> None:
    # watched as a live run is (SLO breach events, tokens per joule)
    source = WatchedSource(ScriptedSource(make_snapshots(N, gpus=gpus), hold=True),
                           parse_slos(SLO))
    app = TokentopApp(source, theme=theme, refresh=0.05, slo=SLO)
    assert snap_compare(app, terminal_size=size, run_before=_final_snapshot_drawn)


@pytest.mark.parametrize(("size", "gpus"), [((80, 24), 1), ((120, 40), 2)],
                         ids=["80x24", "120x40"])
def test_eval_screen(snap_compare, size: tuple[int, int], gpus: int) -> None:
    """The console over an eval: the phase strip under the header (shortened at 80 columns,
    with what the phase measures at 120), the running phase's panels below it."""
    source = ScriptedEvalSource(make_snapshots(N, gpus=gpus), eval_progress(), hold=True)
    app = TokentopApp(source, refresh=0.05, slo=SLO)
    assert snap_compare(app, terminal_size=size, run_before=_final_snapshot_drawn)


def open_loop_snapshots(gpus: int) -> list:
    """The scripted run in open loop (12 req/s, poisson): each tick also carries the
    latencies from the intended send time and the schedule's lag (0.2..6 ms), as an open
    loop's Snapshots do."""
    lag = 200 + 5_800 * np.linspace(0.0, 1.0, 100) ** 3
    hist = {"ttft_co": encode_values(LATENCY_US["ttft"] + lag),
            "e2e_co": encode_values(LATENCY_US["e2e"] + lag), "lag": encode_values(lag)}
    snaps = make_snapshots(N, gpus=gpus)
    for snap in snaps:
        snap.load.mode, snap.load.target_rate, snap.load.arrival = "open", 12.0, "poisson"
        snap.hist.update(hist)
    return snaps


@pytest.mark.parametrize(
    ("size", "gpus"),
    [((80, 24), 1), ((120, 40), 2), ((200, 60), 4)],
    ids=["80x24", "120x40", "200x60"],
)
def test_open_loop_screen(snap_compare, size: tuple[int, int], gpus: int) -> None:
    """Open loop: the corrected TTFT / E2E and the lag in the latency panel (one P99 line
    at 80x24, rows under their caption where the screen is tall)."""
    source = WatchedSource(ScriptedSource(open_loop_snapshots(gpus), hold=True),
                           parse_slos(SLO))
    app = TokentopApp(source, refresh=0.05, slo=SLO)
    assert snap_compare(app, terminal_size=size, run_before=_final_snapshot_drawn)
