"""What the load is set to, and everything that changes it or ends it, in one place.

The coordinator merges what the workers measured into Snapshots; the Steering decides
the load: the operator's controls (keys, the CLI, MQTT), a --ramp, the auto-ramp's
steps, the warm-up, and the stop policy (--duration, --requests, --stop-error-rate, the
end of a --trace, every worker gone). Each change goes to the workers at once
(`apply`) and is said as an event (`say`), so the Snapshot of the tick shows it.

Once a tick, in this order: `advance(elapsed)` before the workers are asked for their
intervals (warm-up over, the ramp's next value, is a stop due?), then, once the tick is
merged, `after_tick(elapsed, dense, counters)` (the auto-ramp judges the step on what
the tick measured).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import msgspec
import numpy as np

from loadgen.model import units
from loadgen.model.snapshot import Control, Counters
from loadgen.run.auto_ramp import AutoRamp
from loadgen.run.config import Parsed, RunConfig
from loadgen.worker.wire import LoadSpec

ERROR_RATE_WINDOW_S = 10.0  # --stop-error-rate looks this far back …
ERROR_RATE_MIN_REQUESTS = 20  # … and needs at least this many requests to judge
TICK_EARLY_S = 0.01  # a tick this close to --duration is the one that reaches it
TRACE_RATE_WINDOW_S = 10.0  # a trace's rate: what it sent over this long, as the console's
# past its last entry's time by this much (trace seconds a unit of speed), the trace is done
# even if some worker never said it sent its share (a worker gone, a report lost)
TRACE_MARGIN_S = 0.3

Apply = Callable[[LoadSpec], None]
SayEvent = Callable[[str, str], None]  # (event kind, message)
LOAD_OPS = ("set_concurrency", "add_concurrency", "set_rate", "add_rate")


class Steering:
    def __init__(self, cfg: RunConfig, parsed: Parsed, apply: Apply, say: SayEvent) -> None:
        self.cfg = cfg
        self.parsed = parsed
        self.apply = apply
        self.say = say
        self.spec = cfg.load_spec()
        self.ramp = parsed.ramp
        self.auto: AutoRamp | None = None
        # elapsed seconds when the measured load began: the warm-up's end, or an auto-ramp's
        # settled load's (None while neither is over: warming_up)
        self.load_started: float | None = None
        self._restart = False  # an auto-ramp began: the measurement starts again after it
        self.elapsed = 0.0
        self._recent: deque[tuple[float, int, int]] = deque()  # (t, ok, failed)

    # ---- the start -----------------------------------------------------------------------

    def begin(self) -> None:
        """The load as the run starts it: the ramp's first value, or the auto-ramp's."""
        if self.ramp is not None:
            self._set_main_value(self.ramp.value_at(0.0))
        if self.cfg.auto_ramp:
            self._start_auto_ramp("cli")
        self.apply(self.spec)

    # ---- the operator --------------------------------------------------------------------

    def control(self, msg: Control, paused: bool) -> None:
        """A load change (the pause, the stop and marks are the coordinator's)."""
        op, v = msg.op, msg.value
        if op in LOAD_OPS and v is not None:
            self._manual_change(op, v, msg.source, paused)
        elif op == "auto_ramp":
            self._start_auto_ramp(msg.source)
            self.apply(self.spec)
        elif op == "set_mode" and msg.note in ("closed", "open") and msg.note != self.spec.mode:
            self.ramp = None
            self.auto = None
            self.spec = msgspec.structs.replace(self.spec, mode=msg.note)
            self.apply(self.spec)  # while paused the workers keep it for the resume
            later = "; from the resume" if paused else ""
            self.say("operator", f"switched to {self.load_text()} ({msg.source}){later}")

    def _start_auto_ramp(self, source: str) -> None:
        """From the load the run has now (the streams, or the rate in open loop), never past
        --auto-ramp-max; the run's measurement stops until it has settled (warming_up)."""
        cfg, spec = self.cfg, self.spec
        self.ramp = None
        now = spec.concurrency if spec.mode == "closed" else spec.rate
        self.auto = AutoRamp(self.parsed.slos, start=now, hold_s=cfg.auto_ramp_hold,
                             warmup_s=cfg.auto_ramp_warmup, max_load=cfg.auto_ramp_max,
                             mode=spec.mode)
        self.load_started = None  # the exploration is the run's warm-up: see warming_up
        self._restart = True
        self._set_main_value(self.auto.load)
        self.say("operator", f"auto-ramp started ({source}): {self._auto_start_text(now)}")

    def _auto_start_text(self, now: float) -> str:
        auto, slo = self.auto, self.cfg.slo
        assert auto is not None
        if auto.load == now:
            start = f"{auto.words(auto.load)} (the load now)"
        elif auto.load < now:
            start = f"{auto.words(auto.load)} (the --auto-ramp-max ceiling)"
        else:
            start = f"{auto.words(auto.load)} ({auto.words(now)} sends nothing)"
        judged = ("throughput scales (the knee rule: no --slo)" if auto.by_knee
                  else f"the SLOs hold ({slo})")
        return (f"from {start}, doubling while {judged}, at most "
                f"{auto.words(auto.max_load)} (--auto-ramp-max); the run's results start "
                "again once it settles")

    def _manual_change(self, op: str, v: float, source: str, paused: bool) -> None:
        """A manual change takes control back from a ramp."""
        if self.ramp is not None or self.auto is not None:
            self.ramp = None
            self.auto = None
            self.say("operator", f"ramp stopped by a manual change ({source})")
        spec = self.spec
        if op.endswith("concurrency"):
            n = max(0, round((spec.concurrency if op == "add_concurrency" else 0) + v))
            new = msgspec.structs.replace(spec, concurrency=n)
        else:
            r = max(0.0, (spec.rate if op == "add_rate" else 0.0) + v)
            new = msgspec.structs.replace(spec, rate=round(r, 3))
        if new != spec:
            self.spec = new
            self.apply(new)  # while paused the workers keep it for the resume
            later = "; from the resume" if paused else ""
            self.say("operator", f"{self.load_text()} ({source}){later}")

    def _set_main_value(self, value: float) -> None:
        if self.spec.mode == "closed":
            self.spec = msgspec.structs.replace(self.spec, concurrency=max(0, round(value)))
        else:
            self.spec = msgspec.structs.replace(self.spec, rate=max(0.0, round(value, 3)))

    # ---- once a tick ---------------------------------------------------------------------

    @property
    def warming_up(self) -> bool:
        """This tick is not measured (LoadState.warmup): --warmup, or an auto-ramp that has
        not settled yet (its exploration is left out of the run's results, so that the
        summary, the SLO verdicts and the exit code are the settled load's)."""
        return self.load_started is None

    def advance(self, elapsed: float, running: bool) -> None:
        """Before the tick is collected: warm-up, the ramp's value now."""
        self.elapsed = elapsed
        auto = self.auto
        exploring = auto is not None and not auto.measuring(elapsed)
        if self.load_started is None and elapsed >= self.cfg.warmup and not exploring:
            self._measure_from(elapsed)
        if self.ramp is not None and running:
            before = self.spec
            self._set_main_value(self.ramp.value_at(elapsed))
            if self.spec != before:
                self.apply(self.spec)
            if self.ramp.finished(elapsed):
                self.say("run", f"ramp finished at {self.load_text()}")
                self.ramp = None

    def _measure_from(self, elapsed: float) -> None:
        """The measured load begins (--duration counts from here)."""
        if self._restart:
            # after an auto-ramp (settled, or stopped by a manual change): from this tick on
            self._restart = False
            self.load_started = elapsed
            self.say("run", f"measuring {self.load_text()} from here: the run's results start "
                     "again (the auto-ramp's exploration is left out of them)")
            return
        # without a warm-up the load is measured from the start (as the windows are); with
        # one, from the tick in which it ended (the windows forget up to there)
        self.load_started = elapsed if self.cfg.warmup > 0 else 0.0
        if self.cfg.warmup > 0:
            self.say("run", f"warm-up over after {self.cfg.warmup:g} s: measuring")

    def after_tick(self, elapsed: float, dense: dict[str, np.ndarray], counters: Counters,
                   running: bool) -> None:
        """Once the tick is merged: the auto-ramp judges its step on what it measured."""
        auto = self.auto
        if auto is None or auto.settled or not running:
            return
        nxt = auto.observe(elapsed, dense, counters)
        if nxt is None:
            return
        self._set_main_value(nxt)
        self.apply(self.spec)
        settled = (f"; measured afresh after a {units.duration(auto.warmup_s)} warm-up"
                   if auto.settled else "")
        self.say("run", auto.describe(elapsed) + settled)

    def note(self, running: bool) -> str | None:
        """What the load is doing by itself, for LoadState.note."""
        if self.ramp is not None and running:
            return self.ramp.describe(self.elapsed)
        if self.auto is not None:
            return self.auto.describe(self.elapsed)
        return None

    # ---- the stop policy -----------------------------------------------------------------

    def track(self, t: float, counters: Counters) -> None:
        """The cumulative counts at `t`, for --stop-error-rate's window."""
        self._recent.append((t, counters.requests_ok, counters.requests_failed))
        while self._recent and self._recent[0][0] < t - ERROR_RATE_WINDOW_S:
            self._recent.popleft()

    def stop_due(self, elapsed: float, counters: Counters) -> str | None:
        """Why the run should stop now (--duration, --requests, --stop-error-rate), or None;
        the coordinator adds what only it can see (workers gone, a trace's end)."""
        cfg = self.cfg
        started = self.load_started
        measured = elapsed - (started if started is not None else elapsed)
        # a tick's timer may fire a little early (uvloop's have millisecond resolution): a
        # tick within TICK_EARLY_S of the duration is the one that reaches it
        if (cfg.duration is not None and started is not None
                and measured >= cfg.duration - TICK_EARLY_S):
            return f"duration of {cfg.duration:g} s reached"
        c = counters
        if cfg.max_requests is not None and c.requests_ok + c.requests_failed \
                + c.requests_cancelled >= cfg.max_requests:
            return f"{cfg.max_requests} requests done"
        return self._error_rate_passed(c)

    def _error_rate_passed(self, c: Counters) -> str | None:
        limit = self.cfg.stop_error_rate
        if limit is None or not self._recent:
            return None
        _, ok0, failed0 = self._recent[0]
        ok, failed = c.requests_ok - ok0, c.requests_failed - failed0
        n = ok + failed
        if n >= ERROR_RATE_MIN_REQUESTS and failed / n > limit:
            return (f"error rate {failed / n:.0%} over the last {ERROR_RATE_WINDOW_S:g} s "
                    f"passed --stop-error-rate {limit:g}")
        return None

    # ---- words -----------------------------------------------------------------------------

    def stagger_text(self) -> str:
        """How the closed loop's streams start (loadgen.worker.load.Stagger), for the start."""
        s = self.spec
        if s.mode != "closed" or s.concurrency < 2:
            return ""
        spread = self.cfg.stagger
        if spread is None:
            return ", started spread over one request's time (--stagger auto)"
        if spread == 0:
            return ", all started at once (--stagger 0: in lock-step when requests are alike)"
        return f", started spread over {units.duration(spread)} (--stagger)"

    def load_text(self) -> str:
        s = self.spec
        if s.mode == "closed":
            return f"{s.concurrency} streams (closed loop)"
        if s.trace:
            span = self.parsed.trace_span or 0.0
            return (f"trace {self.cfg.trace} at {s.trace_speed:g}× ({span / s.trace_speed:.0f} s, "
                    "open loop)")
        shape = f" k={s.shape:g}" if s.arrival == "gamma" else ""
        cap = f", at most {s.max_in_flight} in flight" if s.max_in_flight else ""
        return f"{s.rate:g} req/s {s.arrival}{shape} (open loop{cap})"


class TraceProgress:
    """--trace: how far the replay is (entries sent of all of them, the trace's own clock),
    the rate it sends at, and whether it is done: every entry sent. The requests still in
    flight then finish in the drain, as any run's, so the run's window ends with the trace
    (its span / speed), not with its slowest answer."""

    def __init__(self, span: float, speed: float) -> None:
        self.span = span  # trace seconds from its first entry to its last
        self.speed = speed
        self.total: int | None = None  # entries in the trace (the workers say: each read it)
        self._sent: dict[int, int] = {}  # per worker, its entries sent so far
        self._marks: deque[tuple[float, int]] = deque()  # (monotonic t, sent) per tick

    @property
    def sent(self) -> int:
        return sum(self._sent.values())

    def report(self, worker: int, sent: int, total: int) -> None:
        self._sent[worker] = sent
        if total:
            self.total = total

    def mark(self, t: float) -> None:
        """A tick at monotonic `t`, for the rate."""
        self._marks.append((t, self.sent))
        while len(self._marks) > 2 and self._marks[1][0] <= t - TRACE_RATE_WINDOW_S:
            self._marks.popleft()

    def rate(self) -> float | None:
        """Requests/s the replay sent over the last TRACE_RATE_WINDOW_S (None: one tick)."""
        if len(self._marks) < 2:
            return None
        (t0, n0), (t1, n1) = self._marks[0], self._marks[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def done(self, trace_time: float, backlog: int) -> bool:
        if self.total is not None and self.sent >= self.total:
            return True
        return trace_time >= self.span + TRACE_MARGIN_S * self.speed and backlog == 0

    def seconds_left(self, trace_time: float) -> float:
        """Wall seconds until the last entry is due (0 once it is)."""
        return max(0.0, (self.span - trace_time) / self.speed)
