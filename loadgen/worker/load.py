"""Load control inside a worker: closed loop (N users) and open loop (a request rate).

Closed loop: N simulated users, each sending its next request when the last
ends. The target can change at any moment. Raising it starts users (spread out,
see Stagger); lowering it lets the surplus users finish the request they are in
and then leave, so turning load down never shows up as cancelled requests.

Stagger: streams that start at one instant stay in step when the requests are
alike (fixed lengths), so every round the server prefills the whole batch at once
and TTFT measures that lock-step, not a server under steady load (598 ms against
68 ms for the same server with varied lengths). So several streams started
together are spread out, as Locust and k6 ramp their users: by default (auto) the
first goes at once and measures one request's time, and each of the others starts
at a random moment within that time. Started from nothing running, that time was
measured alone, so under the others' load a request takes longer and the starts would
cover only part of it: so, once, after its first request (which ran under the group's
load), each of the others waits a random moment within that request's time, which
spreads the streams evenly over a round whatever its length (one delay uniform over a
period makes the phase uniform). Streams added to running ones are spread over a time
measured under load, and need no more. `--stagger S` spreads them over S seconds, once,
and `--stagger 0` starts them all at once. One stream added alone (`+`) starts at once,
and the same spread applies when a paused load resumes.

Failures: a closed-loop user whose request failed (any way) waits its back-off before the
next (loadgen.worker.pacing: jittered, doubling to a cap, the server's Retry-After honoured
on 429/503, reset by a success), and the wait is counted (Counters.backoffs, backoff_us).
Open loop never waits: a failed arrival is a failed arrival, the schedule goes on.

Open loop over several workers: the process at the server must be the one
asked for whatever the worker count (a constant 10 req/s split as four
independent 2.5 req/s schedules arrives in bursts of four; a split gamma
process is no longer gamma). So every worker generates the SAME global arrival
sequence (the same seed, the full rate) from the same start instant, the
`epoch`, and worker `share` of `of` sends arrivals share, share + of,
share + 2·of … (a round-robin phase split): together they send exactly the
global sequence (each worker draws every gap, a microsecond per arrival, and
every schedule replays the seeded sequence from its start). The epoch is the
coordinator's time.perf_counter() when the
schedule (re)starts; on Linux that is CLOCK_MONOTONIC, one clock for every
process on the host, so the workers agree on it without talking to each
other. A new rate or arrival process starts a new global schedule from a new
epoch (the pool sets it); a load change that leaves the schedule as it is does
not restart it. With an in-flight cap the whole schedule runs in one worker
(see loadgen/run/pool.py), so that the cap and the backlog are exact.

Pause: the arrival schedule stops; requests in flight finish; due requests in
the backlog stay there and are sent on resume with their intended send time
moved later by the length of the pause (the pause is the operator's, not the
server's, so it is not latency). A rate or mode change while paused is kept
and takes effect at resume, which starts a fresh schedule; nothing is sent
while paused. Paused closed-loop users finish their request and wait, also
the users a concurrency change adds while paused.

A trace (--trace, loadgen.worker.trace) takes the arrival process's place: the schedule's
times are the trace's offsets / speed from the epoch, worker i of n sends entries i, i + n …,
each with its entry's lengths. A trace is replayed once: a new schedule (a resume, a new
placement) goes on from the trace time its epoch stands for (frozen over a pause), never from
the trace's start. The entries a worker has sent (not those waiting in the backlog) are
counted, `trace_sent`: the coordinator's sum says how far the replay is, and when it is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter

from loadgen.worker.pacing import Backoff
from loadgen.worker.trace import Trace


class Arrivals:
    """Inter-arrival gaps for a rate: constant, Poisson, or gamma (burstiness).

    Gamma with shape k has the same mean gap as Poisson (which is gamma with
    k = 1); k < 1 is burstier, k > 1 more regular.
    """

    KINDS = ("constant", "poisson", "gamma")

    def __init__(self, rate: float, kind: str = "poisson", shape: float = 1.0, seed: int = 0):
        if kind not in self.KINDS:
            raise ValueError(f"unknown arrival process {kind!r}; use one of {self.KINDS}")
        self.rate = rate
        self.kind = kind
        self.shape = shape
        self.rng = random.Random(seed)

    def next_gap(self) -> float | None:
        if self.rate <= 0:
            return None
        mean = 1.0 / self.rate
        if self.kind == "constant":
            return mean
        if self.kind == "poisson":
            return self.rng.expovariate(self.rate)
        return self.rng.gammavariate(self.shape, mean / self.shape)


AUTO_STAGGER_WAIT_S = 10.0  # auto: how long the others wait for the first request's time …
AUTO_STAGGER_MAX_S = 30.0  # … and the widest spread (a very long request would stall the start)


class Stagger:
    """When each stream of a group started together sends its first request (see the
    module's docstring). `spread`: seconds to spread them over, 0 for all at once, or None
    for auto: over one request's time as measured (the latest that reached the server)."""

    def __init__(self, spread: float | None, seed: int = 0) -> None:
        self.spread = spread
        self.rng = random.Random(seed)
        self.measured: float | None = None
        self._known = asyncio.Event()
        self._pathfinder_sent = False

    def took(self, seconds: float) -> None:
        """A request reached the server and ended after `seconds`."""
        self.measured = seconds
        self._known.set()

    async def window(self) -> float:
        """The spread for one stream of a group (0: go now)."""
        if self.spread is not None:
            return self.spread
        if self.measured is None and not self._pathfinder_sent:
            self._pathfinder_sent = True  # this one goes first and measures
            return 0.0
        if self.measured is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._known.wait(), AUTO_STAGGER_WAIT_S)
        return min(self.measured or AUTO_STAGGER_WAIT_S, AUTO_STAGGER_MAX_S)


class ClosedLoop:
    """`send_one(user, pace)` sends user `user`'s next request and tells `pace` (the user's
    Backoff) how it ended; `think(user)`, if given, is the seconds that user waits after a
    request before its next (a conversation's think time). After a failed request the user
    waits its back-off (loadgen.worker.pacing), and `backed_off(seconds, asked)` counts the
    wait. The drain ends either wait at once, so a waiting user never holds a stop up."""

    def __init__(self, send_one: Callable[[int, Backoff], Awaitable[object]],
                 think: Callable[[int], float] | None = None,
                 stagger: Stagger | None = None,
                 backed_off: Callable[[float, bool], None] | None = None) -> None:
        self._send_one = send_one
        self._think = think
        self._backed_off = backed_off
        self.stagger = stagger or Stagger(0.0)
        self.target = 0
        self._users: dict[int, asyncio.Task] = {}
        self._running = asyncio.Event()
        self._running.set()
        self._stopping = False
        self._stopped = asyncio.Event()

    @property
    def active_users(self) -> int:
        return len(self._users)

    def set_target(self, n: int) -> None:
        self.target = max(0, n)
        if self._stopping:
            return
        new = [uid for uid in range(self.target)
               if (old := self._users.get(uid)) is None or old.done()]
        spread = len(new) > 1  # one stream added alone has nothing to be in step with
        # from nothing running, the auto window is a request's time alone: re-phase once
        # (see the module's docstring); added to running streams, it was measured under load
        rephase = spread and self.stagger.spread is None and len(new) == len(self._alive())
        for uid in new:
            task = asyncio.create_task(self._user(uid, spread, rephase), name=f"user-{uid}")
            self._users[uid] = task
            task.add_done_callback(self._forget)

    def _alive(self) -> list[int]:
        """The users to be running once set_target's new ones are (those not done)."""
        return [uid for uid in range(self.target)
                if (t := self._users.get(uid)) is None or not t.done()]

    def _forget(self, task: asyncio.Task) -> None:
        uid = int(task.get_name().removeprefix("user-"))
        if self._users.get(uid) is task:
            del self._users[uid]

    def pause(self, paused: bool) -> None:
        """Paused users finish their current request and wait before the next."""
        if paused:
            self._running.clear()
        else:
            self._running.set()

    async def _user(self, uid: int, spread: bool, rephase: bool = False) -> None:
        pace = Backoff(self.stagger.rng)
        if spread:
            # the first of the group (no wait: it measures) is what the others are spread
            # against, so it is not re-phased
            rephase = await self._spread() > 0 and rephase
        while uid < self.target and not self._stopping:
            if not self._running.is_set():
                await self._running.wait()
                await self._spread()  # the whole group resumes at once: spread it again
                continue
            t0 = perf_counter()
            await self._send_one(uid, pace)
            took = perf_counter() - t0
            if pace.failed:
                if self.stagger.measured is None:
                    # a failure measures no request's time, but must not hold the group
                    # waiting for one (a server that fails everything would, for 10 s)
                    self.stagger.took(took)
                await self._back_off(pace)
                continue
            self.stagger.took(took)
            if rephase and not self._stopping:
                rephase = False
                await self._sleep(self.stagger.rng.uniform(0.0, took))
            wait = self._think(uid) if self._think is not None else 0.0
            if wait > 0 and not self._stopping:
                await self._sleep(wait)

    async def _back_off(self, pace: Backoff) -> None:
        """After a failed request: the user's back-off, counted as it was waited (the drain
        cuts it short)."""
        wait, asked = pace.wait()
        if self._stopping:
            return
        t = perf_counter()
        await self._sleep(wait)
        if self._backed_off is not None:
            self._backed_off(perf_counter() - t, asked)

    async def _spread(self) -> float:
        """Wait a random moment within the stagger's window (or less if the loop stops); the
        window (0: this one went at once)."""
        window = await self.stagger.window()
        if window > 0 and not self._stopping:
            await self._sleep(self.stagger.rng.uniform(0.0, window))
        return window

    async def _sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less if the loop stops meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    async def drain(self, grace: float) -> None:
        """Stop sending; let in-flight requests finish for `grace` seconds, then cancel them."""
        self._stopping = True
        self._stopped.set()
        self.target = 0
        self._running.set()  # paused users must wake up to leave
        await finish_within(list(self._users.values()), grace)


@dataclass(frozen=True)
class Schedule:
    """One global arrival sequence (rate, process, start instant) and this worker's phase
    of it: it sends arrivals share, share + of, share + 2·of …"""

    rate: float
    kind: str
    shape: float
    epoch: float  # perf_counter() (CLOCK_MONOTONIC, one clock for the host) of the start
    share: int = 0
    of: int = 1
    trace_speed: float = 0.0  # > 0: the worker's trace at this speed, not the process above


class OpenLoop:
    """Requests at a target rate, whatever the server does (a fixed arrival schedule).

    Each request has an intended send time from the arrival process. When an
    in-flight cap is set and reached, due requests wait in a backlog (the
    client queue depth) and keep their intended time, so latencies measured
    from it include the wait: the coordinated-omission correction wrk2 makes.
    """

    MAX_BACKLOG = 100_000  # past this the schedule is hopeless; drop the oldest, counted

    def __init__(
        self,
        send_at: Callable[[float, int], Awaitable[bool]],
        seed: int,
        on_overflow: Callable[[], None],
    ) -> None:
        self._send_at = send_at
        self._seed = seed  # the same in every worker: they all draw the one global sequence
        self._on_overflow = on_overflow
        self.schedule: Schedule | None = None  # None: no open-loop arrivals here
        self.cap: int | None = None
        self.in_flight = 0
        # (intended send time, trace entry or -1)
        self.backlog: deque[tuple[float, int]] = deque()
        self.trace: Trace | None = None  # the whole trace (every worker holds it), if any
        self._trace_next = -1  # the next trace entry this worker schedules (-1: not begun)
        self._trace_clock: tuple[float, float, float] | None = None  # (epoch, base, speed)
        self._trace_frozen: float | None = None  # trace time at the pause
        self.trace_sent = 0  # trace entries sent so far (the backlog's are not yet)
        self._tasks: set[asyncio.Task] = set()
        self._scheduler: asyncio.Task | None = None
        self._paused_at: float | None = None
        self._stopping = False

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def set(self, schedule: Schedule | None, cap: int | None) -> None:
        """Follow `schedule` (None or rate 0: no new arrivals) under `cap`. The same schedule
        again leaves the one running alone; while paused a new one waits for the resume."""
        self.cap = cap
        if schedule != self.schedule:
            self.schedule = schedule
            self._restart()
        if not self.paused:
            self._release()

    def pause(self, paused: bool, at: float) -> None:
        """Pause or resume at `at` (the coordinator's perf_counter(), the same instant for
        every worker). On resume the backlog's intended times move later by the pause."""
        if paused:
            if self._paused_at is None:
                self._paused_at = at
                self._cancel_scheduler()
                if self._trace_clock is not None:
                    self._trace_frozen = self._trace_time(at)
            return
        if self._paused_at is None:
            return
        shift = max(0.0, at - self._paused_at)
        self._paused_at = None
        if shift and self.backlog:
            self.backlog = deque((t + shift, k) for t, k in self.backlog)
        self._restart()
        self._release()

    def _restart(self) -> None:
        self._cancel_scheduler()
        s = self.schedule
        if s is None or self.paused or self._stopping:
            return
        if s.trace_speed > 0 and self.trace is not None:
            self._scheduler = asyncio.create_task(self._replay(s, self.trace))
        elif s.rate > 0 and s.trace_speed <= 0:
            self._scheduler = asyncio.create_task(self._schedule(s))

    def _trace_time(self, at: float) -> float:
        """The trace's own time (its offsets) at perf_counter() `at` of the running replay."""
        assert self._trace_clock is not None
        epoch, base, speed = self._trace_clock
        return base + max(0.0, at - epoch) * speed

    async def _replay(self, s: Schedule, trace: Trace) -> None:
        """The trace's entries share, share + of … at epoch + (offset - base) / speed, where
        base is the trace time the epoch stands for (0 at the first start)."""
        if self._trace_frozen is not None:
            base = self._trace_frozen
        elif self._trace_clock is not None:
            base = self._trace_time(s.epoch)
        else:
            base = 0.0
        self._trace_frozen = None
        self._trace_clock = (s.epoch, base, s.trace_speed)
        if self._trace_next < 0:
            self._trace_next = s.share
        offsets = trace.offsets
        while self._trace_next < len(offsets):
            k = self._trace_next
            t = s.epoch + (float(offsets[k]) - base) / s.trace_speed
            delay = t - perf_counter()
            await asyncio.sleep(delay if delay > 0 else 0)
            self._trace_next = k + s.of
            self._due(t, k)

    def _cancel_scheduler(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            self._scheduler = None

    async def _schedule(self, s: Schedule) -> None:
        arrivals = Arrivals(s.rate, s.kind, s.shape, self._seed)
        t = s.epoch
        k = -1
        while True:
            gap = arrivals.next_gap()
            if gap is None:
                return
            t += gap
            k += 1
            if k % s.of != s.share:
                continue  # another worker's arrival: drawn here only to keep the sequence
            delay = t - perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                # behind the schedule: send at once, but let the sends already made run
                await asyncio.sleep(0)
            self._due(t, -1)

    def _due(self, t_intended: float, entry: int) -> None:
        self.backlog.append((t_intended, entry))
        if len(self.backlog) > self.MAX_BACKLOG:
            self.backlog.popleft()
            self._on_overflow()
        self._release()

    def _release(self) -> None:
        while self.backlog and (self.cap is None or self.in_flight < self.cap):
            t_intended, entry = self.backlog.popleft()
            self.in_flight += 1
            if entry >= 0:
                self.trace_sent += 1
            task = asyncio.create_task(self._send_at(t_intended, entry))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self.in_flight -= 1
        if not self.paused and not self._stopping:
            self._release()

    async def drain(self, grace: float) -> None:
        self._stopping = True
        self._cancel_scheduler()
        self.backlog.clear()
        await finish_within(list(self._tasks), grace)


async def finish_within(tasks: list[asyncio.Task], grace: float) -> None:
    """Let requests in flight finish for `grace` seconds, then cancel the rest (each
    cancelled request is counted as such by the client)."""
    if not tasks:
        return
    _done, pending = await asyncio.wait(tasks, timeout=grace)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
