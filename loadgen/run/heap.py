"""Hand the C heap's free pages back to the system now and then (glibc; elsewhere nothing).

A long run allocates and frees blocks of every size each tick (Snapshots, their JSON,
histogram blobs, probe readings). glibc keeps what is freed inside its heap, as holes
between blocks still in use, and reuses those holes only for blocks that fit: over hours
the holes add up, and the consuming process' RSS creeps up although nothing is kept
(tracemalloc's total stays flat; mallinfo's free part is what grows).
`malloc_trim(0)` gives the whole pages inside those holes back (MADV_DONTNEED), so RSS
follows what is in use. Once a minute it costs well under a millisecond.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

TRIM_EVERY_S = 60.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError, TypeError):  # not glibc (macOS, Windows, …)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """Call `maybe_trim()` once a tick; it trims at most every `every_s` seconds."""

    def __init__(self, every_s: float = TRIM_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._trim = _malloc_trim()
        self._next = clock() + every_s
        self.trims = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe_trim(self) -> bool:
        """True when it trimmed now."""
        if self._trim is None:
            return False
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.every_s
        self._trim(0)
        self.trims += 1
        return True
