"""Auto-ramp (the `a` key): climb while the SLOs hold, settle at the boundary.

Concurrency doubles step by step; each step is held for a warm-up and a
measured period and judged on what that period alone showed. At the first
failing step the search narrows by halving the gap between the highest step
that passed and the lowest that failed, until the two are adjacent (or within
10 %; within 25 % when the knee decides, see _knee_resolved); the load then
settles at the highest passing step and stays there.

A step passes when every whole-run threshold of `--slo` holds over it
(ttft_p99<…, error_rate<…), at least 90 % of its requests met the per-request
limits (ttft<…), and its error rate is under 5 %. With no SLO at all the
knee of the throughput curve decides instead, by the one rule the sweep uses
(loadgen/model/knee.py): a step fails when it is past the knee over the highest
step that passed, its scaling ln(tok/s ratio) / ln(streams ratio) under
KNEE_SCALING (doubling 16 → 32 streams must add at least 15 % tok/s). So on one
server the auto-ramp settles where a sweep's knee is. Comparing with the first
step instead (tokens per stream at one stream) called a server whose throughput
still climbed "saturated" at 8. Throughput is the output tokens counted over
the measured period (the sweep's figure), not chunks.
Every verdict is said in words (`describe`): what was judged, and why a step failed.
"""

from __future__ import annotations

import numpy as np

from loadgen.model import hdr
from loadgen.model.knee import KNEE_SCALING, past_knee
from loadgen.model.slo import Slos, Threshold
from loadgen.model.snapshot import Counters

GOOD_FRACTION = 0.9
MAX_ERROR_RATE = 0.05
KNEE_RESOLUTION = 1.25  # no SLO: how close the knee is bracketed (see _knee_resolved)


class AutoRamp:
    def __init__(self, slos: Slos, *, start: int = 1, hold_s: float = 10.0,
                 warmup_s: float = 3.0, max_load: int = 4096) -> None:
        self.slos = slos
        self.hold_s = hold_s
        self.warmup_s = warmup_s
        self.max_load = max_load
        self.load = start
        self.passed: int | None = None  # highest step that met the SLOs
        self.failed: int | None = None  # lowest step that did not
        self.settled = False
        self.history: list[tuple[int, bool, float]] = []  # (load, passed, output tok/s)
        self._step_start: float | None = None
        self._dense: dict[str, np.ndarray] = {}
        self._c0: Counters | None = None
        self._t0 = 0.0  # elapsed seconds when the measured period began
        self.why: dict[int, str] = {}  # load -> why that step failed, in words

    @property
    def by_knee(self) -> bool:
        """No SLO given: the knee of the throughput curve decides."""
        return not self.slos.thresholds and self.slos.per_request is None

    def observe(
        self, elapsed: float, dense: dict[str, np.ndarray], counters: Counters
    ) -> int | None:
        """Feed one tick; returns the next load to apply when the step is over."""
        if self.settled:
            return None
        if self._step_start is None:
            self._step_start = elapsed
        in_step = elapsed - self._step_start
        if in_step < self.warmup_s:
            return None
        if self._c0 is None:
            self._c0, self._t0 = _copy(counters), elapsed
        for m, d in dense.items():
            self._dense[m] = self._dense[m] + d if m in self._dense else d.copy()
        if in_step < self.warmup_s + self.hold_s:
            return None
        ok = self._judge(counters, elapsed - self._t0)
        return self._next(ok)

    def _judge(self, counters: Counters, seconds: float) -> bool:
        c0 = self._c0 or Counters()
        done = counters.requests_ok - c0.requests_ok
        failed = counters.requests_failed - c0.requests_failed
        good = counters.requests_good - c0.requests_good
        seconds = seconds if seconds > 0 else self.hold_s
        # between the same two ticks as the counts above, as the sweep counts a step
        tput = (counters.output_tokens - c0.output_tokens) / seconds
        why = []
        if done == 0:
            why.append("no request completed")
        elif failed / (done + failed) > MAX_ERROR_RATE:
            why.append(f"{failed / (done + failed):.0%} errors")
        if done and self.slos.per_request is not None and good < GOOD_FRACTION * done:
            why.append(f"{good / done:.0%} of requests within the per-request SLO")
        for t in self.slos.thresholds:
            if not t.passes(self._measure(t, done, failed, seconds, tput)):
                why.append(f"{t.text} broken")
        if not why and self.by_knee:
            knee = self._knee(tput)
            if knee:
                why.append(knee)
        ok = not why
        if why:
            self.why[self.load] = "; ".join(why)
        self.history.append((self.load, ok, tput))
        return ok

    def _measure(self, t: Threshold, done: int, failed: int, seconds: float,
                 tput: float) -> float | None:
        if t.metric == "error_rate":
            return failed / (done + failed) if done + failed else None
        if t.metric == "req_s":
            return done / seconds
        if t.metric == "output_tok_s":
            return tput
        if t.metric == "goodput_req_s":
            return None
        dense = self._dense.get(t.metric)
        return None if dense is None else hdr.summarize(dense)[t.stat or "p99"]

    def _knee(self, tput: float) -> str | None:
        """With no SLO: why this step is past the knee over the highest step that passed, in
        words (loadgen/model/knee.py), or None."""
        below = [h for h in self.history if h[1] and h[0] < self.load]
        if not below:
            return None
        prev_load, _, prev_tput = max(below)
        return past_knee(prev_load, prev_tput, self.load, tput, KNEE_SCALING)

    def _next(self, ok: bool) -> int | None:
        if ok:
            self.passed = max(self.passed or 0, self.load)
        else:
            self.failed = self.load if self.failed is None else min(self.failed, self.load)
        if self.failed is None:
            nxt = min(self.load * 2, self.max_load)
            if nxt == self.load:
                return self._settle()
        else:
            low = self.passed or 0
            if self.failed - low <= max(1, low // 10) or self._knee_resolved(low):
                return self._settle()
            nxt = (low + self.failed) // 2
            if nxt in (low, self.failed) or nxt == 0:
                return self._settle()
        return self._begin(nxt)

    def _knee_resolved(self, low: int) -> bool:
        """With no SLO, narrowing stops once the failed step is within KNEE_RESOLUTION× of
        the passed one: over a smaller load ratio the scaling amplifies a wobble in tok/s by
        1 / ln(ratio) (a 2 % wobble reads 0.17 at 8 → 9 streams, against a threshold of
        0.2), so a step there is judged on noise (a refilled slot, a tick's jitter) rather
        than on the curve."""
        return self.by_knee and low > 0 and self.failed is not None \
            and self.failed <= KNEE_RESOLUTION * low

    def _begin(self, load: int) -> int:
        self.load = load
        self._step_start = None
        self._dense = {}
        self._c0 = None
        return load

    def _settle(self) -> int:
        self.settled = True
        self.load = self.passed or 1
        return self.load

    def describe(self, elapsed: float) -> str:
        judged = "throughput knee, no --slo" if self.by_knee else "the SLOs"
        failed = f"; {self.failed} failed: {self.why.get(self.failed, '?')}" \
            if self.failed else ""
        if self.settled:
            if self.passed is None:
                return f"auto-ramp: no step passed ({judged}); holding 1 stream{failed}"
            best = ("the highest step before throughput stopped rising" if self.by_knee
                    else "the highest step within the SLOs")
            return f"auto-ramp settled at {self.load} streams ({best}{failed})"
        start = self._step_start if self._step_start is not None else elapsed
        left = max(0.0, self.warmup_s + self.hold_s - (elapsed - start))
        bounds = f", passed {self.passed}" if self.passed else ""
        return (f"auto-ramp ({judged}): trying {self.load} streams, {left:.0f} s left"
                f"{bounds}{failed}")


def _copy(c: Counters) -> Counters:
    out = Counters()
    out.add(c)
    return out
