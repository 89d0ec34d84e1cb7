"""The header says, in words, what the outage definition judged short of an outage."""

from __future__ import annotations

import msgspec
from scripted_source import make_snapshot

from tui.widgets.header_bar import header_markup


def _header(**load) -> str:
    snap = make_snapshot(3)
    snap = msgspec.structs.replace(snap, load=msgspec.structs.replace(snap.load, **load))
    return header_markup(snap, description="", ended=False, error=None)


def test_degraded_and_stalled_streams_are_said_in_words():
    assert "degraded" not in _header() and "stalled" not in _header()
    text = _header(health="degraded", stalled=3, in_flight=4)
    assert "degraded" in text and "3 of 4 stalled" in text
