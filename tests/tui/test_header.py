"""The header says, in words, what the outage definition judged short of an outage, and in a
replay where it is, at what speed, and whose pause it is."""

from __future__ import annotations

import msgspec
from scripted_source import make_snapshot
from textual.content import Content

from loadgen.model.source import ReplayStatus
from tui.widgets.header_bar import header_markup


def _header(**load) -> str:
    snap = make_snapshot(3)
    snap = msgspec.structs.replace(snap, load=msgspec.structs.replace(snap.load, **load))
    return header_markup(snap, description="", ended=False, error=None)


def test_degraded_and_stalled_streams_are_said_in_words():
    assert "degraded" not in _header() and "stalled" not in _header()
    text = _header(health="degraded", stalled=3, in_flight=4)
    assert "degraded" in text and "3 of 4 stalled" in text


def _replay_header(state: str, **status) -> str:
    """The header's words (markup dropped) for a replay standing as `status` says."""
    replay = ReplayStatus(**{**REPLAY, **status})
    snap = make_snapshot(3)
    snap = msgspec.structs.replace(snap, elapsed=replay.position,
                                   load=msgspec.structs.replace(snap.load, state=state))
    return Content.from_markup(header_markup(snap, description="", ended=False, error=None,
                                             source_kind="replay", replay=replay)).plain


REPLAY = dict(position=104.0, length=352.0, speed=10.0, paused=False, following=False,
              at_end=False)


def test_a_replay_shows_its_speed_and_position_of_length():
    text = _replay_header("running")
    assert text.startswith("tokentop  replay ×10  1:44 / 5:52  ● recorded: running")
    long = _replay_header("running", position=3700.0, length=7300.0, speed=0.0)
    assert "replay ×max  1:01:40 / 2:01:40" in long  # as fast as it can; hours on both sides


def test_a_recorded_pause_is_not_the_replays_pause():
    recorded = _replay_header("paused")
    assert "recorded: paused" in recorded and "replay paused" not in recorded
    own = _replay_header("running", paused=True)
    assert "replay paused" in own and "recorded: running" in own
    assert "recorded" not in _header(state="paused")  # live: the run's own state, unlabelled


def test_the_end_is_said_unless_the_run_is_still_written():
    assert "end" in _replay_header("stopped", position=352.0, at_end=True).split("●")[0]
    following = _replay_header("running", position=352.0, at_end=True, following=True)
    assert "end" not in following.split("●")[0]
