"""Measuring one streamed response from its body bytes, as they arrive.

Whatever transport delivers the bytes (the raw HTTP protocol or the openai
SDK) hands them here with the arrival time it took before doing anything
else. Metric definitions are the README's ("What is measured"):

* TTFT: request sent → first chunk that carries text (a role-only chunk does not count);
* ITL: per token; a chunk that carried k tokens (k from continuous usage) is k gaps of gap/k;
* ICL: the raw gap between text-bearing chunks;
* TPOT: (last token − first token) / (output tokens − 1), per request;
* E2E: request sent → last text-bearing chunk.

In open loop the same request is also measured from its *intended* send time
(coordinated-omission corrected, as wrk2 does): `ttft_co`, `e2e_co`, and the
lag between intended and actual send is `lag`.
"""

from __future__ import annotations

import msgspec

from loadgen.model.slo import Slo
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.sse import DONE, SseParser, chunk_decoder

US = 1e6


class StreamMeasure:
    """One request's stream. `feed` returns False once the stream is judged broken."""

    __slots__ = (
        "cancel_after_tokens",
        "chunks",
        "done",
        "first",
        "k_total",
        "last",
        "parser",
        "prompt_words",
        "rec",
        "sent_ns",
        "slo",
        "t0",
        "t0_wall_ns",
        "t_intended",
        "usage_in",
        "usage_out",
    )

    def __init__(
        self,
        rec: IntervalRecorder,
        t0: float,
        prompt_words: int,
        *,
        t_intended: float | None = None,
        slo: Slo | None = None,
        t0_wall_ns: int | None = None,
        cancel_after_tokens: int | None = None,
    ) -> None:
        self.rec = rec
        self.cancel_after_tokens = cancel_after_tokens  # a user who stops reading
        self.t0 = t0
        self.t_intended = t_intended
        self.prompt_words = prompt_words
        self.slo = slo
        # calibration: the wall-clock send time, to compare with the server's send stamps
        self.t0_wall_ns = t0_wall_ns
        self.parser = SseParser()
        self.first = self.last = 0.0
        self.k_total = 0  # tokens so far (continuous usage, else one per text chunk)
        self.chunks = 0
        self.usage_out: int | None = None
        self.usage_in: int | None = None
        self.done = False
        self.sent_ns: int | None = None

    def feed(self, data: bytes, now: float) -> bool:
        try:
            payloads = self.parser.feed(data)
        except ValueError as e:
            self.rec.error("malformed_chunk", str(e))
            return False
        for payload in payloads:
            if payload == DONE:
                self.done = True
                continue
            try:
                chunk = chunk_decoder.decode(payload)
            except msgspec.DecodeError as e:
                self.rec.error("malformed_chunk", f"bad chunk ({e}): {payload[:80]!r}")
                return False
            if chunk.error is not None:
                self.rec.error("stream_broken", f"server error in stream: {chunk.error.message}")
                return False
            if not self.chunk(chunk, now):
                return False
        return True

    def chunk(self, chunk, now: float) -> bool:
        """Measure one decoded chunk; False when the client abandons the stream here."""
        k = 1
        usage = chunk.usage
        if usage is not None:
            if usage.completion_tokens is not None:
                # continuous usage: this chunk carried the difference
                k = usage.completion_tokens - (self.usage_out or 0)
                self.usage_out = usage.completion_tokens
            if usage.prompt_tokens is not None:
                self.usage_in = usage.prompt_tokens
        if not chunk.has_text():
            return True
        rec = self.rec
        self.chunks += 1
        if k < 1:
            k = 1
        if self.k_total == 0:
            self.first = now
            ttft = (now - self.t0) * US
            rec.ttft.append(ttft)
            if self.t_intended is not None:
                rec.ttft_co.append((now - self.t_intended) * US)
            sent = chunk.tokentop_sent_ns
            if self.t0_wall_ns is not None and sent is not None:
                # truth: the server wrote it (sent − t0) after we sent; the rest is our error
                rec.ttft_err.append(abs(ttft - (sent - self.t0_wall_ns) / 1e3))
        else:
            gap = (now - self.last) * US
            rec.icl.append(gap)
            rec.itl_v.append(gap / k)
            rec.itl_w.append(k)
            if chunk.tokentop_sent_ns is not None and self.sent_ns is not None:
                true_gap = (chunk.tokentop_sent_ns - self.sent_ns) / 1e3
                rec.itl_err.append(abs(gap - true_gap))
        self.sent_ns = chunk.tokentop_sent_ns
        self.k_total += k
        self.last = now
        if self.cancel_after_tokens is not None and self.k_total >= self.cancel_after_tokens:
            rec.error("cancelled", f"abandoned by the client after {self.k_total} tokens")
            return False
        return True

    def finish(self) -> None:
        """The body ended cleanly: count the request as ok, or say what was wrong."""
        rec = self.rec
        if not self.done:
            rec.error("stream_broken", f"stream ended without [DONE] ({self._tail()})")
            return
        if self.chunks == 0:
            rec.error("empty_response", "stream finished without any generated text")
            return
        c = rec.counters
        c.requests_ok += 1
        c.chunks += self.chunks
        out = self.usage_out if self.usage_out is not None else self.k_total
        c.output_tokens += out
        if self.usage_out is None:
            c.estimated_output_tokens += out
        # without usage the prompt's word count stands in (synthetic prompts are ~1 token a word)
        c.input_tokens += self.usage_in if self.usage_in is not None else self.prompt_words
        e2e = (self.last - self.t0) * US
        rec.e2e.append(e2e)
        if self.t_intended is not None:
            rec.e2e_co.append((self.last - self.t_intended) * US)
        tpot = None
        if out > 1:
            tpot = (self.last - self.first) * US / (out - 1)
            rec.tpot.append(tpot)
        if self.slo is not None and self.slo.met((self.first - self.t0) * US, tpot, e2e):
            c.requests_good += 1

    def _tail(self) -> str:
        pending = self.parser.pending
        return f"{len(pending)} bytes of an unfinished event" if pending else "no [DONE] line"

    @property
    def started(self) -> bool:
        return self.k_total > 0
