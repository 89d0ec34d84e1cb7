"""What one refresh draws from: a frozen view the app builds once per redraw.

Panels and detail screens alike render from a `View`, never from the app's live
state, so what is on screen at one moment is one consistent picture, and a
widget can be tested with a View alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from loadgen.model.snapshot import Event, Snapshot
from loadgen.model.windows import WindowStats

if TYPE_CHECKING:
    from loadgen.model.slo import Slos
    from tui.history import History


@dataclass(frozen=True)
class View:
    """The newest Snapshot, its windows' statistics, the history rings and what detail
    screens need (the chosen window's histograms, the latest error events)."""

    snap: Snapshot
    stats: Mapping[str, WindowStats]
    window: str = "10s"  # the latency window the user picked (`w`)
    history: History | None = None
    slos: Slos | None = None
    outage: bool = False
    # the chosen window's summed histograms (dense counts, µs): read-only
    dense: Mapping[str, np.ndarray] = field(default_factory=dict)
    error_events: tuple[Event, ...] = ()
    # --mix: each class's statistics over the chosen window, and the SLOs each is judged by
    # (its own, else the run's), in the mix's order; empty without a mix
    classes: Mapping[str, WindowStats] = field(default_factory=dict)
    class_slos: Mapping[str, Slos | None] = field(default_factory=dict)
