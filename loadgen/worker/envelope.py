"""One request's envelope: what both clients do around a request, whatever carries it.

The raw client (loadgen.worker.client) and the SDK client (loadgen.worker.openai_client)
differ only in how the bytes travel and in what their transport can go wrong with. All
the rest is here, once, so that the two measure and count alike (`tokentop calibrate
--client` sets them side by side):

* the in-flight count, and the measures in flight, for `stalled()`;
* the clock: t0 (perf_counter) when the request starts, before any connection is taken
  (opening one is part of the user's wait), and with `calibrate` the wall-clock stamp
  beside it, which the exact-timing simulator's `tokentop_sent_ns` send stamps compare
  with; in open loop the lag from the intended send time;
* the measure: a StreamMeasure, or a ConversationMeasure for a conversation's turn;
* the limit: the request timeout, or `--cancel-at` seconds when sooner;
* the endings: a cancel from outside is "cancelled" and re-raised; the limit is
  "cancelled" when it was the user's `--cancel-at`, else "timeout"; however it ended, what
  was measured counts (`measure.end()`);
* a closed-loop user's pacing (loadgen.worker.pacing): told once, at the end, whether the
  request failed and what wait the server asked for.

A client supplies `_prepare` (the body as its transport sends it, before the clock
starts) and `_send` (send it, feed the answer to the measure, count its transport's own
errors). Per chunk the envelope adds nothing: chunks go from the transport to the measure.
"""

from __future__ import annotations

import asyncio
from time import perf_counter, time_ns
from typing import Generic, TypeVar

from loadgen.model.outage import FIRST_TOKEN_STALL_FACTOR, STALL_AFTER_S, Stalled
from loadgen.model.slo import Slo
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.pacing import Backoff
from loadgen.worker.stream_measure import ConversationMeasure, StreamMeasure, Turn
from loadgen.worker.tokenizer import ChunkTokens

P = TypeVar("P")  # a request as the client's transport sends it


class RequestEnvelope(Generic[P]):
    """The base of both clients: `request()` is theirs, `_prepare` and `_send` their own."""

    def __init__(
        self,
        rec: IntervalRecorder,
        *,
        timeout: float,
        slo: Slo | None,
        calibrate: bool,
        chunk_tokens: ChunkTokens | None,
    ) -> None:
        self.rec = rec
        self.timeout = timeout
        self.slo = slo
        self.calibrate = calibrate  # compare with the exact-timing simulator's send stamps
        # a local tokenizer's count of a chunk's tokens, for streams without per-chunk usage
        self.chunk_tokens = chunk_tokens
        self.in_flight = 0
        self._live: set[StreamMeasure] = set()  # the streams in flight, for stalled()
        self.slowest_ttft = 0.0  # seconds: the longest first-token wait seen (0: none yet)

    async def request(
        self,
        body: bytes,
        prompt_words: int,
        t_intended: float | None = None,
        cancel_after_tokens: int | None = None,
        cancel_after_s: float | None = None,
        asked_out: int = 0,
        turn: Turn | None = None,
        pace: Backoff | None = None,
        rec: IntervalRecorder | None = None,
        slo: Slo | None = None,
    ) -> bool:
        """One streamed request; never raises except CancelledError (counted first).

        Returns False when the server could not be reached at all. `asked_out`: the output
        length asked exactly (a count that differs is counted); `turn`: a conversation's
        turn, which the measure fills in (its reply's text, whether it completed); `pace`:
        a closed-loop user's back-off, told how the request ended (a failure of any kind,
        and the server's Retry-After), so that the user waits before its next one; `rec`
        and `slo`: its class's recorder and limits (--mix), else the client's."""
        payload = self._prepare(body)
        self.in_flight += 1
        rec = rec or self.rec
        limit = self.timeout if cancel_after_s is None else min(self.timeout, cancel_after_s)
        # the wall stamp is taken beside t0, so the simulator's send stamps compare with it
        t0 = perf_counter()
        t0_ns = time_ns() if self.calibrate else None
        if t_intended is not None:
            rec.lag.append(max(0.0, (t0 - t_intended) * 1e6))
        measure = (StreamMeasure if turn is None else ConversationMeasure)(
            rec, t0, prompt_words, t_intended=t_intended, slo=slo or self.slo,
            t0_wall_ns=t0_ns, cancel_after_tokens=cancel_after_tokens,
            chunk_tokens=self.chunk_tokens, asked_out=asked_out, turn=turn,
        )
        self._live.add(measure)
        try:
            async with asyncio.timeout(limit):
                reached = await self._send(payload, measure)
        except asyncio.CancelledError:
            rec.error("cancelled", "request cancelled before it finished")
            raise
        except TimeoutError:
            if limit < self.timeout:  # the user's --cancel-at, not the server's fault
                rec.error("cancelled", f"abandoned by the client after {limit:g} s")
                measure.ok = True
            else:
                rec.error("timeout", f"no complete answer within {self.timeout:g} s")
            reached = True
        finally:
            self.in_flight -= 1
            self._live.discard(measure)
            if measure.started:
                self.slowest_ttft = max(self.slowest_ttft, measure.first - measure.t0)
            # however it ended, what it had measured counts (finish() has done it already;
            # end() is idempotent)
            measure.end()
        if pace is not None:
            pace.ended(not measure.ok, measure.retry_after)
        return reached

    def stalled(self, now: float) -> Stalled:
        """Streams in flight that look frozen (loadgen.model.outage): one that had started
        streaming and has received nothing for STALL_AFTER_S; one still waiting for its first
        token only past FIRST_TOKEN_STALL_FACTOR × the slowest first token seen (and
        STALL_AFTER_S): a long prefill or a queue at a busy server is waiting, not a stall,
        and with no first token seen yet nothing says how long one takes."""
        mid = first = 0
        for m in self._live:
            if m.started:
                self.slowest_ttft = max(self.slowest_ttft, m.first - m.t0)
                mid += now - m.seen >= STALL_AFTER_S
        if self.slowest_ttft > 0:
            patience = max(STALL_AFTER_S, FIRST_TOKEN_STALL_FACTOR * self.slowest_ttft)
            first = sum(1 for m in self._live if not m.started and now - m.t0 >= patience)
        return Stalled(stalled=mid + first, stalled_first=first)

    def _prepare(self, body: bytes) -> P:
        """The body as the transport sends it (built before the clock starts)."""
        raise NotImplementedError

    async def _send(self, payload: P, measure: StreamMeasure) -> bool:
        """Send `payload` and feed the answer to `measure`, finishing it on a clean end;
        count the transport's own errors. False: the server could not be reached.

        The limit and a cancel arrive here as CancelledError: release what the request
        holds and let it go on up (the envelope counts it). A TimeoutError, too, is the
        envelope's to count."""
        raise NotImplementedError
