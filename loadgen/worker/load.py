"""Load control inside a worker: closed loop (N users) and open loop (a request rate).

Closed loop: N simulated users, each sending its next request when the last
ends. The target can change at any moment. Raising it starts users at once;
lowering it lets the surplus users finish the request they are in and then
leave, so turning load down never shows up as cancelled requests.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Awaitable, Callable
from time import perf_counter


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


# A user whose server refuses connections waits before trying again (doubling up to the
# cap), as any real client would: otherwise an outage turns into a busy loop of tens of
# thousands of refused connections a second that swamps the worker and the error counts.
RECONNECT_BACKOFF_S = (0.05, 1.0)


class ClosedLoop:
    def __init__(self, send_one: Callable[[], Awaitable[bool]]) -> None:
        self._send_one = send_one
        self.target = 0
        self._users: dict[int, asyncio.Task] = {}
        self._running = asyncio.Event()
        self._running.set()
        self._stopping = False

    @property
    def active_users(self) -> int:
        return len(self._users)

    def set_target(self, n: int) -> None:
        self.target = max(0, n)
        if self._stopping:
            return
        for uid in range(self.target):
            old = self._users.get(uid)
            if old is None or old.done():
                task = asyncio.create_task(self._user(uid), name=f"user-{uid}")
                self._users[uid] = task
                task.add_done_callback(self._forget)

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

    async def _user(self, uid: int) -> None:
        first, cap = RECONNECT_BACKOFF_S
        backoff = first
        while uid < self.target and not self._stopping:
            if not self._running.is_set():
                await self._running.wait()
                continue
            if await self._send_one():
                backoff = first
            else:
                await asyncio.sleep(backoff)
                backoff = min(cap, backoff * 2)

    async def drain(self, grace: float) -> None:
        """Stop sending; let in-flight requests finish for `grace` seconds, then cancel them."""
        self._stopping = True
        self.target = 0
        self._running.set()  # paused users must wake up to leave
        await finish_within(list(self._users.values()), grace)


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
        send_at: Callable[[float], Awaitable[bool]],
        arrivals: Arrivals,
        on_overflow: Callable[[], None],
    ) -> None:
        self._send_at = send_at
        self.arrivals = arrivals
        self._on_overflow = on_overflow
        self.cap: int | None = None
        self.in_flight = 0
        self.backlog: deque[float] = deque()
        self._tasks: set[asyncio.Task] = set()
        self._scheduler: asyncio.Task | None = None
        self._paused = False

    def start(self) -> None:
        if self._scheduler is None:
            self._scheduler = asyncio.create_task(self._schedule())

    def set(self, rate: float, cap: int | None) -> None:
        changed = rate != self.arrivals.rate
        self.arrivals.rate = rate
        self.cap = cap
        if changed and self._scheduler is not None:
            # a new rate starts a new schedule from now
            self._scheduler.cancel()
            self._scheduler = asyncio.create_task(self._schedule())
        self._release()

    def pause(self, paused: bool) -> None:
        self._paused = paused
        if paused and self._scheduler is not None:
            self._scheduler.cancel()
            self._scheduler = None
        elif not paused:
            self.start()

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        t = perf_counter()
        while True:
            gap = self.arrivals.next_gap()
            if gap is None:  # rate 0: nothing to send until the rate changes
                return
            t += gap
            delay = t - perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self._due(t)
            if delay < -1.0:  # more than a second behind: the loop is saturated
                loop.call_soon(lambda: None)

    def _due(self, t_intended: float) -> None:
        self.backlog.append(t_intended)
        if len(self.backlog) > self.MAX_BACKLOG:
            self.backlog.popleft()
            self._on_overflow()
        self._release()

    def _release(self) -> None:
        while self.backlog and (self.cap is None or self.in_flight < self.cap):
            t_intended = self.backlog.popleft()
            self.in_flight += 1
            task = asyncio.create_task(self._send_at(t_intended))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self.in_flight -= 1
        if not self._paused:
            self._release()

    async def drain(self, grace: float) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            self._scheduler = None
        self._paused = True
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
