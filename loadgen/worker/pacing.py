"""How a closed-loop stream paces itself after a failed request: a bounded, jittered back-off.

A user whose request failed (any way: an HTTP error, a broken or malformed stream, a
timeout, no connection) waits before its next one, as a polite client does: otherwise a
server that answers 500 at once takes thousands of failed requests a second from a few
streams, the error counts measure how fast the client retries, and a struggling server is
hammered. The wait doubles with each failure in a row, from BACKOFF_FIRST_S up to
BACKOFF_MAX_S, and is drawn uniformly from its upper half (equal jitter: streams that failed
together do not come back together, and a wait is never below half its step, so the number
of attempts against a failing server stays bounded); the first success resets it. On 429 and
503 the server's own `Retry-After` (seconds or an HTTP date; `retry-after-ms`, as the OpenAI
SDK reads it, first) is honoured when it asks for longer, up to RETRY_AFTER_MAX_S, so that a
hostile or mistaken header cannot park a stream for a day. A request the user abandoned on
purpose (--cancel-at, --cancel-rate) is no failure and is not paced.

Open loop is never paced: its arrivals keep their schedule whatever the server answers (a
failed arrival is a failed arrival; nothing is retried).

Only failures cost anything here: a success is one attribute test.
"""

from __future__ import annotations

import math
import random
import time
from email.utils import parsedate_to_datetime

BACKOFF_FIRST_S = 0.05  # the first failure's step; each failure in a row doubles it …
BACKOFF_MAX_S = 1.0  # … up to this (an outage's end is seen within about a second)
RETRY_AFTER_MAX_S = 60.0  # the longest wait a server's Retry-After can ask of a stream

# the server's wait applies to these answers only (RFC 9110: 429 and 503 carry it)
RETRY_AFTER_STATUSES = (429, 503)


def backoff_step(failures: int) -> float:
    """The back-off step after `failures` failures in a row (1: the first): the wait is
    drawn from [step / 2, step]."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** min(failures - 1, 32))


class Backoff:
    """One closed-loop stream's pacing. The request's envelope tells it how the request
    ended (`ended`: a success resets the back-off); after a failure the loop asks `wait()`
    how long to wait before the next one."""

    __slots__ = ("_rng", "failed", "failures", "retry_after")

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.failures = 0  # in a row
        self.failed = False  # how the last request ended
        self.retry_after: float | None = None  # the last failure's asked wait, if any

    def ended(self, failed: bool, retry_after: float | None = None) -> None:
        """The request is over: `failed`, with the server's asked wait (seconds), if any; a
        success starts the back-off again from its first step."""
        self.failed = failed
        if failed:
            self.retry_after = retry_after
        else:
            self.failures = 0
            self.retry_after = None

    def wait(self) -> tuple[float, bool]:
        """After a failure: (seconds to wait before the next request, whether the server's
        Retry-After set them). Each failure in a row doubles the step."""
        self.failed = False
        self.failures += 1
        step = backoff_step(self.failures)
        jittered = self._rng.uniform(step / 2.0, step)
        asked, self.retry_after = self.retry_after, None
        if asked is not None and asked > jittered:
            return asked, True
        return jittered, False


def retry_after(status: int, headers: dict[bytes, bytes]) -> float | None:
    """The wait a 429 or 503 asks for, in seconds within [0, RETRY_AFTER_MAX_S]; None when
    there is none (another status, no header, or one that does not parse)."""
    if status not in RETRY_AFTER_STATUSES:
        return None
    ms = headers.get(b"retry-after-ms")
    if ms is not None:
        seconds = _number(ms)
        if seconds is not None:
            return _bounded(seconds / 1000.0)
    value = headers.get(b"retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is None:
        seconds = _date_from_now(value)
    return None if seconds is None else _bounded(seconds)


def _number(raw: bytes) -> float | None:
    try:
        x = float(raw.strip()[:32])
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _date_from_now(raw: bytes) -> float | None:
    """An HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`) as seconds from now."""
    try:
        when = parsedate_to_datetime(raw[:64].decode("latin-1"))
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        return None
    return when.timestamp() - time.time()


def _bounded(seconds: float) -> float:
    return min(RETRY_AFTER_MAX_S, max(0.0, seconds))
