"""Coalesced wake-ups: a busy worker reads its sockets in batches, not one at a time.

At a thousand streams a worker's chunks arrive ~20 µs apart, and its loop woke for
nearly each one: a sleep in epoll, a wake-up, one socket read, back to sleep. The
wake-up, not the chunk, was most of the cost (`tokentop calibrate`, 1000 streams:
10.6 µs a chunk, 33 000 wake-ups a second for 48 000 chunks). While chunks come fast the
loop instead naps NAP_S between its turns, and each turn then reads every socket that
became ready meanwhile.

A nap makes no stamp late: the stamps are the kernel's (loadgen.worker.stamped), taken as
each chunk reached its socket, so coalescing is only switched on for a client whose every
connection is stamped that way. What a nap does delay, by NAP_S at most, is the loop's
own work: a request sent, a timer due. The loop-lag meter sees that, as it sees any lag.
At a low rate a nap would cost more wake-ups than it saves, so it runs only while the
last report's interval brought at least ON_RATE chunks a second, and stops below OFF_RATE.
"""

from __future__ import annotations

import asyncio
import time

NAP_S = 0.0002  # ~10 chunks a turn at 1000 streams; 0.2 ms a send or timer may wait
ON_RATE = 5000.0  # chunks/s: a nap then finds one chunk waiting, on average
OFF_RATE = 2500.0  # below this, napping wakes more often than the chunks would


class Coalescer:
    """Naps between the loop's turns while the chunk rate is high (see the module)."""

    def __init__(self, nap_s: float = NAP_S) -> None:
        self.nap_s = nap_s
        self.on = False
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def rate(self, chunks: int, seconds: float) -> None:
        """The last interval's chunks: switch napping on or off."""
        if seconds <= 0:
            return
        r = chunks / seconds
        if not self.on and r >= ON_RATE:
            self.on = True
            if not self._scheduled:
                self._loop = asyncio.get_running_loop()
                self._scheduled = True
                self._loop.call_soon(self._nap)
        elif self.on and r < OFF_RATE:
            self.on = False  # the next nap is the last

    def _nap(self) -> None:
        if not self.on:
            self._scheduled = False
            return
        time.sleep(self.nap_s)
        self._loop.call_soon(self._nap)
