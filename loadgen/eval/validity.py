"""Whether a row means what it says: what the recording shows about the span a row measures,
beside the figure itself.

* the client: ticks whose event-loop lag mattered (loadgen.model.client_lag's one rule): the
  latencies then hold client delay, and a long-tail interval in such a tick is the client's;
* the samples: a percentile from too few of them is the maximum, not a tail (too_few);
* lock-step: closed-loop streams that finish together, round after round, so every round
  prefills the whole batch at once (the artefact the stagger removes): completions bunched
  into a few ticks, told by their dispersion across ticks.

One pass over the span's Snapshots (loadgen.record.rundir.iter_snapshots), in bounded memory.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from loadgen.model import client_lag, hdr, units
from loadgen.record.rundir import iter_snapshots

# a percentile needs this many samples beyond it before it is a tail and not the maximum
BEYOND_MIN = 10
# a span with client lag in more than this share of its loaded ticks, and in CLIENT_MIN_TICKS
# at least (one spike is not a saturated client), is flagged
CLIENT_SHARE = 0.05
CLIENT_MIN_TICKS = 3
# completions per tick whose variance passes this many times their mean are bunched (a
# smooth closed loop is near 1, below it; N streams in lock-step finishing every k ticks
# give N·(1 − 1/k))
BUNCHED_DISPERSION = 3.0
LOCKSTEP_MIN_STREAMS = 4


class Span(msgspec.Struct, kw_only=True):
    """What the recording shows about one measured span (eval.json keeps it with the row's
    figures)."""

    ticks: int  # ticks with requests in flight
    client_ticks: int  # of those, ticks whose lag mattered
    client_worst_ms: float | None  # the worst lag of those
    client_dominated: int  # ticks whose lag was as large as the median ITL
    client_at: list[float]  # the unix times of those ticks (a long-tail interval there is
    # the client's), the first CLIENT_AT_MAX
    input_tokens: int
    seconds: float
    dispersion: float | None  # variance ÷ mean of completions per tick (closed loop)
    streams: int  # the closed loop's streams (0: open loop)
    # ticks whose tail broke the long-tail limit while the client's lag mattered, by metric:
    # the client's, not the server's (only with span_of's tail_limits_ms)
    client_breakouts: dict[str, int] = {}

    @property
    def input_tok_s(self) -> float | None:
        return self.input_tokens / self.seconds if self.seconds > 0 else None

    def client_flag(self) -> str | None:
        """The row flag when the client was saturated in this span, else None."""
        if self.client_ticks < CLIENT_MIN_TICKS or self.client_ticks / self.ticks <= CLIENT_SHARE:
            return None
        worst = units.ms((self.client_worst_ms or 0.0) * 1000)
        return (f"client saturated in {self.client_ticks} of {self.ticks} ticks (lag up to "
                f"{worst}): latencies include client delay")

    def lockstep_flag(self) -> str | None:
        if self.streams < LOCKSTEP_MIN_STREAMS or self.dispersion is None \
                or self.dispersion <= BUNCHED_DISPERSION:
            return None
        return (f"completions bunched (dispersion {self.dispersion:.1f} across ticks): streams "
                "in lock-step, or a server that batches statically")

    def flags(self) -> tuple[str, ...]:
        return tuple(f for f in (self.client_flag(), self.lockstep_flag()) if f)


CLIENT_AT_MAX = 10_000


def span_of(run_dir: Path | str, t0: float | None, t1: float | None,
            tail_limits_ms: dict[str, float | None] | None = None) -> Span:
    """The Span of [t0, t1] in a run's recording (the whole run when either is None); with
    the long tail's limits (ms, by metric), the breakouts in ticks of client lag too."""
    ticks = client = dominated = 0
    breakouts: dict[str, int] = {}
    worst: float | None = None
    at: list[float] = []
    done: list[int] = []
    first = last = None
    streams = 0
    for snap in iter_snapshots(run_dir):
        if (t0 is not None and snap.t < t0) or (t1 is not None and snap.t > t1):
            continue
        if first is None:
            first = snap
        else:
            done.append(snap.counters.requests_ok - last.counters.requests_ok)
        last = snap
        streams = max(streams, snap.load.target_concurrency if snap.load.mode == "closed" else 0)
        if snap.load.in_flight <= 0:
            continue
        ticks += 1
        verdict = client_lag.judge(snap.client.loop_lag_ms, snap.load.in_flight, _itl_p50(snap))
        if verdict is client_lag.Lag.FINE:
            continue
        client += 1
        dominated += verdict is client_lag.Lag.DOMINATES
        worst = max(worst or 0.0, snap.client.loop_lag_ms or 0.0)
        if len(at) < CLIENT_AT_MAX:
            at.append(snap.t)
        for metric, limit in (tail_limits_ms or {}).items():
            if limit is not None and _breaks_out(snap, metric, limit):
                breakouts[metric] = breakouts.get(metric, 0) + 1
    seconds = last.t - first.t if first is not None and last is not None else 0.0
    # the whole run counts from nothing: its first tick's tokens were sent before it
    since = 0 if t0 is None or first is None else first.counters.input_tokens
    tokens = last.counters.input_tokens - since if seconds else 0
    return Span(ticks=ticks, client_ticks=client, client_worst_ms=worst,
                client_dominated=dominated, client_at=at, input_tokens=tokens,
                seconds=seconds, dispersion=_dispersion(done) if streams else None,
                streams=streams, client_breakouts=breakouts)


def _breaks_out(snap, metric: str, limit_ms: float) -> bool:
    """The tick's P99.9 or max above the long-tail limit (the soak analysis's rule)."""
    enc = snap.hist.get(metric)
    if not enc:
        return False
    s = hdr.summarize(hdr.decode(enc), (99.9,))
    worst = max(v for v in (s["p99.9"], s["max"]) if v is not None) if s["max"] else 0
    return worst / 1000.0 > limit_ms


def _itl_p50(snap) -> float | None:
    enc = snap.hist.get("itl")
    if not enc:
        return None
    p50 = hdr.summarize(hdr.decode(enc), (50.0,))["p50"]
    return None if p50 is None else p50 / 1000.0


def _dispersion(done: list[int]) -> float | None:
    """Variance ÷ mean of completions per tick; None when too few ticks or none completed."""
    if len(done) < 10:
        return None
    c = np.asarray(done, float)
    mean = c.mean()
    return float(c.var() / mean) if mean > 0 else None


def too_few(samples: int | None, q: str) -> str | None:
    """The flag of a percentile ("p99.9") from too few samples to be a tail, else None."""
    if samples is None or not q.startswith("p"):
        return None
    share = 1.0 - float(q[1:]) / 100.0
    if samples * share >= BEYOND_MIN:
        return None
    need = int(np.ceil(round(BEYOND_MIN / share, 6)))  # 10 / 0.001 is 10000.000000000002
    beyond = "it is the maximum" if samples * share < 1 else "it is near the maximum"
    return (f"{samples:,} samples: too few for {q.upper()} ({need:,} give {BEYOND_MIN} beyond "
            f"it); {beyond}")
