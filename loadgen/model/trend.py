"""When a memory slope (MB/h) is long enough to judge: one rule, live and in reports.

A slope over minutes of samples is start-up growth (allocators warming up, caches
filling), not a leak: a 17 s run read +36056 MB/h, a 70 s one +27 MB/h. So the server-RSS
slope the console shows (probes.process.RssTrend) and the report's memory slopes
(loadgen.analysis.soak) are both withheld until their samples span MIN_SLOPE_SPAN_S.
"""

from __future__ import annotations

from loadgen.model import units

MIN_SLOPE_SPAN_S = 600.0


def long_enough(span_s: float) -> bool:
    """Whether samples over `span_s` seconds give a slope worth quoting."""
    return span_s >= MIN_SLOPE_SPAN_S - 1e-9


def needs() -> str:
    """Why a slope is withheld, in words: "needs ≥ 10.0 min"."""
    return f"needs ≥ {units.duration(MIN_SLOPE_SPAN_S)}"
