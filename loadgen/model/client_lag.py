"""When the load generator's own delay threatens the numbers: one rule, for the live warning
(loadgen.run.coordinator) and for the eval's rows (loadgen.eval.validity).

Every latency tokentop measures is taken on a worker's event loop, so a loop late by L ms
can add up to L ms to a TTFT or an inter-token gap. What matters is L against what is being
measured: 5 ms of lag is noise beside a 40 ms inter-token gap and is most of a 4 ms one, and
it is nothing at all while no request is in flight (an idle, busy host lags 5–6 ms with
nothing to measure). So a tick's lag matters when requests are in flight and it passes both
LAG_FLOOR_MS and LAG_SHARE of the tick's median inter-token latency (the smallest latency
the rows report, so the one a lag distorts first); with no inter-token latency that tick
(no stream under way yet) LAG_FALLBACK_MS stands in.

It dominates (the live warning escalates) when it passes the median inter-token latency
itself: most of what the rows would report is then the client's delay.
"""

from __future__ import annotations

from enum import Enum

LAG_FLOOR_MS = 5.0  # below this, whatever the latencies: scheduler noise on a busy host
LAG_SHARE = 0.25  # lag above this share of the median ITL distorts the ITL rows
LAG_FALLBACK_MS = 20.0  # the limit when the tick has no inter-token latency to judge by


class Lag(Enum):
    FINE = "fine"
    MATTERS = "matters"  # latencies include a share of client delay
    DOMINATES = "dominates"  # the client's delay is as large as what is measured


def judge(lag_ms: float | None, in_flight: int, itl_p50_ms: float | None) -> Lag:
    """How this tick's worst event-loop lag bears on its latencies."""
    if lag_ms is None or in_flight <= 0:
        return Lag.FINE
    limit = LAG_FALLBACK_MS if itl_p50_ms is None else max(LAG_FLOOR_MS, LAG_SHARE * itl_p50_ms)
    if lag_ms <= limit:
        return Lag.FINE
    if itl_p50_ms is not None and lag_ms >= max(itl_p50_ms, LAG_FLOOR_MS):
        return Lag.DOMINATES
    return Lag.MATTERS


def rule() -> str:
    """The rule in words, for notes and the README."""
    return (f"event-loop lag above {LAG_SHARE:.0%} of the tick's median ITL (at least "
            f"{LAG_FLOOR_MS:g} ms; {LAG_FALLBACK_MS:g} ms before any ITL) while requests are "
            "in flight")


SUSTAINED_TICKS = 3  # a lag must hold this many ticks in a row before it is said (no spike)
CPU_BUSY_PCT = 90.0  # a worker process this busy cannot keep its loop on time


class ClientWatch:
    """The live warning: said once when the lag matters (or a worker's CPU is pegged) for
    SUSTAINED_TICKS in a row, and once more, as an error, if it comes to dominate. Not
    again after that: the eval's rows and the report count every tick it held."""

    def __init__(self) -> None:
        self._run: dict[Lag, int] = {Lag.MATTERS: 0, Lag.DOMINATES: 0}
        self.said: Lag | None = None

    def see(self, verdict: Lag, lag_ms: float | None, busy: int, workers: int) -> \
            tuple[str, str] | None:
        """This tick's verdict (and the workers over CPU_BUSY_PCT); (level, words) to say, or
        None."""
        matters = verdict is not Lag.FINE or busy > 0
        self._run[Lag.MATTERS] = self._run[Lag.MATTERS] + 1 if matters else 0
        dominates = verdict is Lag.DOMINATES
        self._run[Lag.DOMINATES] = self._run[Lag.DOMINATES] + 1 if dominates else 0
        if self._run[Lag.DOMINATES] >= SUSTAINED_TICKS and self.said is not Lag.DOMINATES:
            self.said = Lag.DOMINATES
            return "error", (f"the load generator is saturated ({_why(lag_ms, busy, workers)}):"
                             " its own delay is as large as the inter-token latency, so the "
                             "latencies measure the client; add --workers or lower the load")
        if self._run[Lag.MATTERS] >= SUSTAINED_TICKS and self.said is None:
            self.said = Lag.MATTERS
            return "warn", (f"the load generator is falling behind ({_why(lag_ms, busy, workers)})"
                            ": latencies include client delay; add --workers or lower the load")
        return None


def _why(lag_ms: float | None, busy: int, workers: int) -> str:
    parts = [f"event-loop lag {lag_ms:.1f} ms"] if lag_ms else []
    if busy:
        parts.append(f"worker CPU > {CPU_BUSY_PCT:g} % ({busy} of {workers})")
    return ", ".join(parts) or "event-loop lag"
