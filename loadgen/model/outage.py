"""What an outage is, defined once: the live run and the reports both judge by this.

An outage is a span of time in which the server cannot be reached, or nothing succeeds
and no tokens arrive, held for at least OUTAGE_MIN_S. `OutageTracker` is fed one `Tick`
per Snapshot, in order: the coordinator feeds it live (LoadState.health / outage_since and
the outage, recovery and stall events come from it) and the soak analysis feeds it the
recorded Snapshots (its outages, MTTR and availability), so both see the same outages at
the same times.

* Quiet: a tick in which no request succeeded and no output token arrived. A quiet span
  starts with a quiet tick in which something was attempted (a request in flight or one
  that failed). An idle tick (nothing in flight, nothing failed) neither starts nor
  extends one: before any evidence it ends the span (a paused load); after, it is held
  and counts only if the failure is seen again after it (a client backing off between
  refused connects attempts nothing for a while). Any success or token ends the span.
* Evidence: requests failed with OUTAGE_ERRORS (unreachable or failing server), or the
  server is frozen (every stream in flight stalled, with a second signal: some of them
  had been streaming and went silent, or /metrics stopped answering; a long wait for a
  first token alone is a busy server, not a frozen one), or /metrics, which had answered
  before, stopped answering while requests failed.
* The failure must persist: the outage begins at a tick that shows evidence once the span
  has lasted OUTAGE_MIN_S (one error followed by idle time is an error, not an outage);
  it is announced then, dated from the start of the span (backdated). It ends at the
  start of the first tick with a success or a token, or, when idle ticks came just
  before it, at the end of the last tick that tried and failed: MTTR = end − start.
* Recording gaps: wall time between two Snapshots that no tick covers (a resume, a dead
  writer). A gap neither ends an outage nor counts as outage time: the duration is the
  time Snapshots covered inside it (`gap_s` says how much was left out).
* Health: "outage" while one is announced; else "degraded" while some stream in flight is
  stalled or, over the last DEGRADED_WINDOW_S, more than DEGRADED_ERROR_RATE of the
  finished requests failed with OUTAGE_ERRORS; else "up".
* Stalls: streams in flight that received no byte for STALL_AFTER_S (the workers count
  them). A stall episode is announced once when the count turns non-zero and closed when
  it is back to zero.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from loadgen.model import units
from loadgen.model.kinds import SERVER_ERRORS, UNREACHABLE_ERRORS, EventKind, Health, Level
from loadgen.model.snapshot import Counters, ServerMetrics, Snapshot

# A stream that had started streaming and has received no byte for this long is stalled.
STALL_AFTER_S = 5.0
# A stream still waiting for its first token is stalled only past this many times the slowest
# first token the run has seen (and STALL_AFTER_S): prefills and queues are slow, not frozen.
FIRST_TOKEN_STALL_FACTOR = 4.0
# How long nothing may succeed (with evidence of a failing server) before it is an outage.
# Long enough that one multi-second stream that breaks, or a 500 while the other streams
# are between tokens, stays an error (a few quiet ticks at most); short enough that a
# restart of a few seconds is still seen as the outage it is.
OUTAGE_MIN_S = 3.0
# "degraded": more than this share of the finished requests failed with OUTAGE_ERRORS …
DEGRADED_ERROR_RATE = 0.05
# … over this much recent time (one tick holds too few requests to judge a rate).
DEGRADED_WINDOW_S = 10.0
# Uncovered time below this between two ticks is float rounding, not a recording gap.
GAP_EPSILON_S = 1e-3

# The errors that are evidence of an outage: the server cannot be reached, or it answers
# with a failure. http_429, http_4xx, http_3xx (the server said no, or elsewhere),
# cancelled and client_* (the client's own doing) are not.
OUTAGE_ERRORS = SERVER_ERRORS
# Failures that are the client's doing: never "requests failing" for the /metrics rule.
CLIENT_SIDE_ERRORS = ("cancelled", "client_backlog_full", "client_fd_limit")

Reason = Literal["unreachable", "failing", "frozen", "metrics"]
# within one tick, the evidence that names the outage first
REASON_ORDER: tuple[Reason, ...] = ("unreachable", "frozen", "failing", "metrics")


class Stalled(NamedTuple):
    """A worker's streams in flight that look frozen, and of those the first-token waits."""

    stalled: int
    stalled_first: int


@dataclass(frozen=True, slots=True)
class Tick:
    """One observation: what happened during (t − interval, t]."""

    t: float  # unix seconds at the end of the tick
    interval: float  # seconds the tick covers
    ok: int  # requests that succeeded in it
    tokens: int  # output tokens that arrived in it
    errors: Mapping[str, int]  # requests that failed in it, by kind
    in_flight: int  # at its end
    stalled: int  # streams in flight that look frozen, at its end (LoadState.stalled)
    metrics_ok: bool | None  # whether /metrics answered (None: not probed)
    stalled_first: int = 0  # of the stalled, those still waiting for their first token

    @classmethod
    def of(cls, t: float, interval: float, delta: Counters, *, in_flight: int, stalled: int,
           server: ServerMetrics | None, stalled_first: int = 0) -> Tick:
        """From this tick's counters (not cumulative ones) and the load at its end."""
        return cls(t=t, interval=interval, ok=delta.requests_ok, tokens=delta.output_tokens,
                   errors={k: n for k, n in delta.errors.items() if n > 0},
                   in_flight=in_flight, stalled=stalled, stalled_first=stalled_first,
                   metrics_ok=None if server is None else server.ok)

    @classmethod
    def between(cls, prev: Counters, snap: Snapshot) -> Tick:
        """From a recorded Snapshot and the cumulative counters of the one before it."""
        c = snap.counters
        errors = {k: n - prev.errors.get(k, 0) for k, n in c.errors.items()}
        return cls(t=snap.t, interval=snap.interval, ok=c.requests_ok - prev.requests_ok,
                   tokens=c.output_tokens - prev.output_tokens,
                   errors={k: n for k, n in errors.items() if n > 0},
                   in_flight=snap.load.in_flight, stalled=snap.load.stalled,
                   stalled_first=snap.load.stalled_first,
                   metrics_ok=None if snap.server is None else snap.server.ok)

    def evidence(self, metrics_seen_ok: bool) -> list[Reason]:
        """What in this tick says the server is out, in REASON_ORDER."""
        out: list[Reason] = []
        if any(self.errors.get(k, 0) for k in UNREACHABLE_ERRORS):
            out.append("unreachable")
        if self.frozen(metrics_seen_ok):
            out.append("frozen")
        if any(self.errors.get(k, 0) for k in OUTAGE_ERRORS if k not in UNREACHABLE_ERRORS):
            out.append("failing")
        failing = sum(n for k, n in self.errors.items() if k not in CLIENT_SIDE_ERRORS)
        if self.metrics_ok is False and metrics_seen_ok and failing:
            out.append("metrics")
        return out

    def frozen(self, metrics_seen_ok: bool) -> bool:
        """Every stream in flight looks frozen, and a second signal says the server is: some
        of them had been streaming (and went silent), or /metrics, which had answered,
        does not. Long first-token waits alone are a busy server."""
        if self.in_flight == 0 or self.stalled < self.in_flight:
            return False
        went_silent = self.stalled > self.stalled_first
        return went_silent or (self.metrics_ok is False and metrics_seen_ok)


@dataclass
class Outage:
    """One outage, ongoing (end None) or over."""

    start: float  # unix seconds: the start of its first quiet tick (backdated)
    reason: Reason  # the first evidence seen in it
    announced_at: float = 0.0  # the end of the tick at which it had been held OUTAGE_MIN_S
    end: float | None = None  # the start of the tick with the first success or token
    last_t: float = 0.0  # the end of the last tick seen inside it
    covered_s: float = 0.0  # time Snapshots covered inside it: its duration
    idle_s: float = 0.0  # idle ticks since its last attempted one (counted if it goes on)
    gap_s: float = 0.0  # recording gaps inside it (not outage time)
    failed: int = 0  # requests that failed inside it (cancelled and client_* too)
    errors: dict[str, int] = field(default_factory=dict)
    stalled: int = 0  # the most streams stalled at once inside it
    in_flight: int = 0  # in flight at that moment

    @property
    def duration_s(self) -> float:
        return self.covered_s

    def words(self) -> str:
        """Why, in words, with the errors counted so far."""
        errs = ", ".join(f"{n}× {k}" for k, n in sorted(self.errors.items()))
        counted = f" ({errs})" if errs else ""
        if self.reason == "unreachable":
            return f"requests cannot reach the server{counted}"
        if self.reason == "frozen":
            return (f"the server is frozen: {self.stalled} of {self.in_flight} streams in "
                    f"flight have received nothing for ≥{STALL_AFTER_S:g} s and no token "
                    f"arrives{counted}")
        if self.reason == "failing":
            return f"every request fails{counted}"
        return f"requests fail and /metrics does not answer{counted}"


@dataclass(frozen=True)
class Change:
    """Something the tracker saw start or end: one event for the run."""

    kind: EventKind  # outage | recovery | stall
    level: Level
    message: str
    t: float  # the end of the tick that showed it
    outage: Outage | None = None  # outage and recovery: which one
    since: float | None = None  # stall: when it began (unix seconds)
    seconds: float | None = None  # stall over: how long it lasted
    count: int | None = None  # stall: streams stalled when it began

    def payload(self) -> dict:
        """The event's typed fields (loadgen.model.snapshot.Event): the outage's start names
        it, a recovery carries its MTTR, a stall its start, size and length."""
        out = self.outage
        if out is not None:
            return {"since": out.start,
                    "seconds": out.duration_s if self.kind == "recovery" else None}
        return {"since": self.since, "seconds": self.seconds, "count": self.count}


class OutageTracker:
    """The state machine: feed `observe` one Tick per Snapshot, in order."""

    def __init__(self, min_s: float = OUTAGE_MIN_S) -> None:
        self.min_s = min_s
        self.health: Health = "up"
        self.current: Outage | None = None  # the quiet span with evidence, or the outage
        self.announced = False  # current has been held min_s: it is an outage
        self.stall_since: float | None = None  # when the stall began: its streams' last byte
        self.covered_s = 0.0  # every tick's interval: the time Snapshots covered
        self.outage_s = 0.0  # of which inside announced outages
        self._quiet: Outage | None = None  # the current quiet span, evidence or not
        self._prev_t: float | None = None
        self._metrics_seen_ok = False
        self._recent: deque[tuple[float, int, int]] = deque()  # (t, ok, outage errors)

    @property
    def outage_since(self) -> float | None:
        """The start of the announced outage (LoadState.outage_since), else None."""
        return self.current.start if self.announced and self.current is not None else None

    @property
    def quiet_since(self) -> float | None:
        """The start of the current quiet span (an outage or not, yet), else None."""
        return self._quiet.start if self._quiet is not None else None

    def observe(self, tick: Tick) -> list[Change]:
        gap = 0.0
        if self._prev_t is not None:
            uncovered = tick.t - tick.interval - self._prev_t
            gap = uncovered if uncovered > GAP_EPSILON_S else 0.0
        self._prev_t = tick.t
        self.covered_s += tick.interval
        # a stall is told before the outage it shows, and its end after the recovery
        changes = self._stall_began(tick)
        if tick.ok > 0 or tick.tokens > 0:
            changes += self._alive(tick)
        else:
            changes += self._quiet_tick(tick, gap)
        changes += self._stall_ended(tick)
        if tick.metrics_ok:
            self._metrics_seen_ok = True
        self.health = self._health(tick)
        return changes

    # ---- the outage ------------------------------------------------------------------------

    def _alive(self, tick: Tick) -> list[Change]:
        """A success or a token: whatever was quiet is over."""
        out = self.current
        announced = self.announced
        self._quiet = self.current = None
        self.announced = False
        if out is None or not announced:
            return []
        # idle ticks just before: nothing was tried then, so nothing says it was still out
        out.end = tick.t - tick.interval - out.idle_s
        self._recent.clear()  # its errors were the outage's: "degraded" starts afresh
        what = "requests succeed again" if tick.ok else "tokens arrive again"
        gaps = f" (not counting {units.duration(out.gap_s)} unrecorded)" if out.gap_s else ""
        lasted = units.duration(out.duration_s)
        return [Change("recovery", "info", f"recovered after {lasted}{gaps}: {what}", tick.t,
                       out)]

    def _quiet_tick(self, tick: Tick, gap: float) -> list[Change]:
        span = self._quiet
        failed = sum(tick.errors.values())
        idle = tick.in_flight == 0 and failed == 0  # nothing attempted, nothing could succeed
        if idle and self.current is None:
            # without evidence yet, idle time dates nothing: a paused load is not an outage
            self._quiet = None
            return []
        if idle:  # held: it is inside the span only if the failure is seen again after it
            assert span is not None
            span.idle_s += tick.interval
            return []
        if span is None:
            span = self._quiet = Outage(start=tick.t - tick.interval, reason="unreachable")
        else:
            span.gap_s += gap
            self._take_idle(span)
        span.covered_s += tick.interval
        span.last_t = tick.t
        span.failed += failed
        for k, n in tick.errors.items():
            span.errors[k] = span.errors.get(k, 0) + n
        if tick.stalled > span.stalled:
            span.stalled, span.in_flight = tick.stalled, tick.in_flight
        if self.announced:
            self.outage_s += tick.interval
            return []
        evidence = tick.evidence(self._metrics_seen_ok)
        if self.current is None and evidence:
            span.reason = evidence[0]
            self.current = span
        # announced only on a tick that still shows the failure: it must persist
        if self.current is None or not evidence or span.covered_s < self.min_s - 1e-9:
            return []
        self.announced = True
        span.announced_at = tick.t
        self.outage_s += span.covered_s
        return [Change("outage", "error", f"outage started {units.duration(span.covered_s)} ago: "
                       f"{span.words()}", tick.t, span)]

    def _take_idle(self, span: Outage) -> None:
        """An attempted tick after idle ones: the span went on through them."""
        span.covered_s += span.idle_s
        if self.announced:
            self.outage_s += span.idle_s
        span.idle_s = 0.0

    # ---- stalls and health -----------------------------------------------------------------

    def _stall_began(self, tick: Tick) -> list[Change]:
        if tick.stalled > 0 and self.stall_since is None:
            # the workers call a stream stalled STALL_AFTER_S after its last byte: the stall
            # began that long before it is seen (at least: a first token's wait is longer)
            self.stall_since = tick.t - STALL_AFTER_S
            return [Change("stall", "warn", f"{tick.stalled} of {tick.in_flight} streams in "
                           f"flight have received nothing for ≥{STALL_AFTER_S:g} s (server "
                           "frozen?)", tick.t, since=self.stall_since, count=tick.stalled)]
        return []

    def _stall_ended(self, tick: Tick) -> list[Change]:
        if tick.stalled == 0 and self.stall_since is not None:
            # from the streams' last byte to the start of the tick in which data came again
            lasted = max(0.0, tick.t - tick.interval - self.stall_since)
            since, self.stall_since = self.stall_since, None
            return [Change("stall", "info", f"stall over after {units.duration(lasted)} "
                           "without data (from the streams' last byte): no stream in flight "
                           f"has waited ≥{STALL_AFTER_S:g} s for data", tick.t,
                           since=since, seconds=lasted)]
        return []

    def _health(self, tick: Tick) -> Health:
        bad = sum(tick.errors.get(k, 0) for k in OUTAGE_ERRORS)
        recent = self._recent
        recent.append((tick.t, tick.ok, bad))
        while recent and recent[0][0] <= tick.t - DEGRADED_WINDOW_S:
            recent.popleft()
        if self.announced:
            return "outage"
        ok = sum(r[1] for r in recent)
        failed = sum(r[2] for r in recent)
        if tick.stalled > 0 or (failed and failed > DEGRADED_ERROR_RATE * (ok + failed)):
            return "degraded"
        return "up"


class OutageTally:
    """The run's outages over its Snapshots, fed in order: the same tracker the live run and
    the report use, so the summary's count, downtime and availability are theirs (the
    outages the client saw; `tokentop report` also lists /metrics' view)."""

    def __init__(self) -> None:
        self.tracker = OutageTracker()
        self.closed: list[Outage] = []
        self._prev = Counters()

    def add(self, snap: Snapshot) -> None:
        for change in self.tracker.observe(Tick.between(self._prev, snap)):
            if change.kind == "recovery" and change.outage is not None:
                self.closed.append(change.outage)
        self._prev = snap.counters

    @property
    def count(self) -> int:
        """Outages seen, the one still going included."""
        return len(self.closed) + (1 if self.tracker.outage_since is not None else 0)

    def summary(self) -> dict:
        """The summary's `stability` section."""
        t = self.tracker
        durations = [o.duration_s for o in self.closed]
        return {
            "outages": self.count,
            "ongoing": t.outage_since is not None,
            "downtime_s": round(t.outage_s, 3),
            "availability": round(1.0 - t.outage_s / t.covered_s, 6) if t.covered_s else None,
            "mttr_s": round(sum(durations) / len(durations), 3) if durations else None,
        }
