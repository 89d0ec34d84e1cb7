"""Auto-ramp (the `a` key, `--auto-ramp`): climb while the SLOs hold, settle at the boundary.

It starts from the load the run has now (the `a` key pressed at 12 streams tries 12
first; `--auto-ramp -c 4` tries 4; an idle console starts at 1), and in closed loop it
steps the streams, in open loop the request rate. The load doubles step by step, never
past `--auto-ramp-max` (a step that would is tried at the ceiling); each step is held for
a warm-up and a measured period and judged on what that period alone showed. At the first
failing step the search narrows by halving the gap between the highest step that passed
and the lowest that failed, until the two are adjacent (or within 10 %; within 25 % when
the knee decides, see _knee_resolved); the load then settles at the highest passing step
and stays there. From the settle on (after one more step's warm-up) the run is measured
afresh: the exploration is its warm-up (loadgen.run.steering), so the summary, the SLO
verdicts and the exit code are those of the settled load.

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
the measured period (the sweep's figure), not chunks. The knee needs a step below to
compare with: a first step above 1 passes until one above it is judged past the knee
over it; then a step at half of it is measured (`_probe_below`), and the first step is
judged over that one, so a start already past the knee steps down to it.
Every verdict is said in words (`describe`): what was judged, and why a step failed.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from loadgen.model import hdr
from loadgen.model.knee import KNEE_SCALING, past_knee
from loadgen.model.slo import Slos, Threshold
from loadgen.model.snapshot import Counters

GOOD_FRACTION = 0.9
MAX_ERROR_RATE = 0.05
KNEE_RESOLUTION = 1.25  # no SLO: how close the knee is bracketed (see _knee_resolved)
NARROW_FRACTION = 0.1  # with SLOs, narrowing stops when the bracket is within 10 % …
# … or within one of these: a stream, or a hundredth of a request a second
GRAIN = {"closed": 1.0, "open": 0.01}

Mode = Literal["closed", "open"]


def load_words(load: float, mode: Mode) -> str:
    """A load with its unit: "1 stream", "9 streams", "2.5 req/s"."""
    if mode == "open":
        return f"{load:g} req/s"
    return f"{load:g} stream{'' if load == 1 else 's'}"


class AutoRamp:
    def __init__(self, slos: Slos, *, start: float = 1, hold_s: float = 10.0,
                 warmup_s: float = 3.0, max_load: float = 4096, mode: Mode = "closed") -> None:
        self.slos = slos
        self.hold_s = hold_s
        self.warmup_s = warmup_s
        self.mode: Mode = mode
        self.max_load = max_load
        self.start = min(self._step(max(start, GRAIN[mode] if mode == "open" else 1)),
                         max_load)
        self.load = self.start
        self.passed: float | None = None  # highest step that met the SLOs
        self.failed: float | None = None  # lowest step that did not
        self.settled = False
        self.settled_at: float | None = None  # elapsed seconds when it settled
        self.history: list[tuple[float, bool, float]] = []  # (load, passed, output tok/s)
        self._step_start: float | None = None
        self._dense: dict[str, np.ndarray] = {}
        self._c0: Counters | None = None
        self._t0 = 0.0  # elapsed seconds when the measured period began
        self.why: dict[float, str] = {}  # load -> why that step failed, in words
        # knee rule: the lowest step, passed with nothing below to compare it with
        self._unreferenced: float | None = None
        self._probing: float | None = None  # the unreferenced step a step below is measured for

    @property
    def by_knee(self) -> bool:
        """No SLO given: the knee of the throughput curve decides."""
        return not self.slos.thresholds and self.slos.per_request is None

    @property
    def unit(self) -> str:
        return "req/s" if self.mode == "open" else "streams"

    def words(self, load: float) -> str:
        return load_words(load, self.mode)

    def measuring(self, elapsed: float) -> bool:
        """Settled, and past the settled load's own warm-up: the run is measured again."""
        return self.settled_at is not None and elapsed >= self.settled_at + self.warmup_s

    def observe(
        self, elapsed: float, dense: dict[str, np.ndarray], counters: Counters
    ) -> float | None:
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
        nxt = self._next(ok)
        if self.settled:
            self.settled_at = elapsed
        return nxt

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
        return past_knee(prev_load, prev_tput, self.load, tput, KNEE_SCALING, self.unit)

    def _next(self, ok: bool) -> float | None:
        if self._probing is not None:
            self._rejudge_above(ok)
        elif ok:
            if self.by_knee and self.passed is None and self.load > self._floor():
                self._unreferenced = self.load  # nothing below it to judge it by yet
            self.passed = max(self.passed or 0, self.load)
        else:
            self.failed = self.load if self.failed is None else min(self.failed, self.load)
        if self.failed is None:
            nxt = min(self._step(self.load * 2), self.max_load)
            if nxt == self.load:
                return self._settle()
            return self._begin(nxt)
        if self._unreferenced is not None and self.passed == self._unreferenced:
            return self._probe_below()
        low = self.passed or 0
        if self.failed - low <= max(GRAIN[self.mode], low * NARROW_FRACTION) \
                or self._knee_resolved(low):
            return self._settle()
        nxt = self._step((low + self.failed) / 2)
        if nxt in (low, self.failed) or nxt <= 0:
            return self._settle()
        return self._begin(nxt)

    def _probe_below(self) -> float:
        """Knee rule: the step that passed first had nothing below it to be judged by, and
        the one above it is past the knee over it; measure half of it, to judge it by."""
        above = self._unreferenced
        assert above is not None
        self._unreferenced = None
        self._probing = above
        return self._begin(max(self._floor(), self._step(above / 2)))

    def _rejudge_above(self, ok: bool) -> None:
        """The step below the first one was measured: judge the first one over it now. Past
        the knee, it fails and this step is the lowest that passed (and may need a step
        below it in turn); else the first one holds, and this step passed beneath it."""
        above, self._probing = self._probing, None
        assert above is not None
        if not ok:
            return  # this step failed on its own (errors): the first one keeps its pass
        here = self.history[-1][2]
        above_tput = next(h[2] for h in reversed(self.history) if h[0] == above)
        why = past_knee(self.load, here, above, above_tput, KNEE_SCALING, self.unit)
        if why is None:
            return
        self.why[above] = why
        self.history = [(ld, ld != above and p, tp) for ld, p, tp in self.history]
        self.failed = above if self.failed is None else min(self.failed, above)
        self.passed = self.load
        if self.load > self._floor():
            self._unreferenced = self.load

    def _floor(self) -> float:
        return GRAIN[self.mode] if self.mode == "open" else 1

    def _step(self, x: float) -> float:
        """A load the server can be given: whole streams, rates to a hundredth."""
        return float(max(1, round(x))) if self.mode == "closed" else round(x, 2)

    def _knee_resolved(self, low: float) -> bool:
        """With no SLO, narrowing stops once the failed step is within KNEE_RESOLUTION× of
        the passed one: over a smaller load ratio the scaling amplifies a wobble in tok/s by
        1 / ln(ratio) (a 2 % wobble reads 0.17 at 8 → 9 streams, against a threshold of
        0.2), so a step there is judged on noise (a refilled slot, a tick's jitter) rather
        than on the curve."""
        return self.by_knee and low > 0 and self.failed is not None \
            and self.failed <= KNEE_RESOLUTION * low

    def _begin(self, load: float) -> float:
        self.load = load
        self._step_start = None
        self._dense = {}
        self._c0 = None
        return load

    def _settle(self) -> float:
        self.settled = True
        tried = [h[0] for h in self.history]
        self.load = self.passed or min(tried, default=self.start)
        return self.load

    def tried_text(self) -> str:
        """Every step in the order tried, each with its verdict: "4 ✓ 8 ✓ 16 ✗ 12 ✗"."""
        marks = {ld: p for ld, p, _ in self.history}  # a step judged again: its last verdict
        return " ".join(f"{ld:g} {'✓' if marks[ld] else '✗'}" for ld, _, _ in self.history)

    def describe(self, elapsed: float) -> str:
        judged = "throughput knee, no --slo" if self.by_knee else "the SLOs"
        failed = f"; {self.failed:g} failed: {self.why.get(self.failed, '?')}" \
            if self.failed else ""
        if self.settled:
            tried = f"; tried {self.tried_text()} {self.unit}" if self.history else ""
            if self.passed is None:
                return (f"auto-ramp: no step passed ({judged}); holding "
                        f"{self.words(self.load)}{failed}{tried}")
            best = ("the highest step before throughput stopped rising" if self.by_knee
                    else "the highest step within the SLOs")
            ceiling = (", the --auto-ramp-max ceiling: it may hold more"
                       if self.failed is None and self.load >= self.max_load else "")
            return (f"auto-ramp settled at {self.words(self.load)} ({best}{ceiling}"
                    f"{failed}{tried})")
        start = self._step_start if self._step_start is not None else elapsed
        left = max(0.0, self.warmup_s + self.hold_s - (elapsed - start))
        bounds = f", {self.words(self.passed)} passed" if self.passed else ""
        return (f"auto-ramp trying {self.words(self.load)}: {left:.0f} s left ({judged})"
                f"{bounds}{failed}")


def _copy(c: Counters) -> Counters:
    out = Counters()
    out.add(c)
    return out
