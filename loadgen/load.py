"""Closed-loop load: N simulated users, each sending its next request when the last ends.

The target can change at any moment. Raising it starts users at once;
lowering it lets the surplus users finish the request they are in and then
leave, so turning load down never shows up as cancelled requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class ClosedLoop:
    def __init__(self, send_one: Callable[[], Awaitable[None]]) -> None:
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
        while uid < self.target and not self._stopping:
            if not self._running.is_set():
                await self._running.wait()
                continue
            await self._send_one()

    async def drain(self, grace: float) -> None:
        """Stop sending; let in-flight requests finish for `grace` seconds, then cancel them."""
        self._stopping = True
        self.target = 0
        self._running.set()  # paused users must wake up to leave
        tasks = list(self._users.values())
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=grace)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
