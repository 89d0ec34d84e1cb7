"""Measuring one streamed response from its body bytes, as they arrive.

Whatever transport delivers the bytes (the raw HTTP protocol or the openai
SDK) hands them here with the arrival time it took before doing anything
else. Metric definitions are the README's ("What is measured"):

* TTFT: request sent → first chunk that carries text (a role-only chunk does not count);
* ITL: per token; a chunk that carried k tokens is k gaps of gap/k (k from continuous usage,
  else from a local tokenizer, else the final usage split over the chunks in proportion to
  their text's pieces, else one a chunk, marked estimated: see StreamMeasure);
* ICL: the raw gap between text-bearing chunks;
* TPOT: (last token − first token) / (output tokens − 1), per request;
* E2E: request sent → last text-bearing chunk;
* TTFA (reasoning models): request sent → first chunk with answer text (`content`, or a
  completion's `text`) in a stream whose first text chunk was reasoning only
  (`reasoning_content` / `reasoning`). TTFT stays the first text of any kind and ITL spans
  both phases. A stream that does not begin by reasoning records no TTFA: it would be its
  TTFT counted twice.

In open loop the same request is also measured from its *intended* send time
(coordinated-omission corrected, as wrk2 does): `ttft_co`, `e2e_co`, and the
lag between intended and actual send is `lag`; goodput (the SLO) is judged on
those.

What a request measured is all here: StreamMeasure, and for a conversation's turn
(loadgen.worker.conversation) the Turn it fills in (the reply's text, whether it completed,
its output tokens) through ConversationMeasure. Both clients build their measure in
loadgen.worker.envelope.
"""

from __future__ import annotations

import re
from array import array
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from loadgen.model.slo import Slo
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.sse import DONE, SseParser, chunk_decoder

if TYPE_CHECKING:  # the tokenizers library loads only where a tokenizer is asked for
    from loadgen.worker.tokenizer import ChunkTokens

US = 1e6


class Turn:
    """One turn of a conversation in flight: its number (1 for a conversation's first), and
    what its measure filled in: the reply's text (its answer: the reasoning does not go back
    into the history), whether it completed, and that answer's tokens (the output tokens
    less the reasoning tokens)."""

    __slots__ = ("answer_tokens", "number", "ok", "reply")

    def __init__(self, number: int) -> None:
        self.number = number
        self.reply: list[str] = []
        self.ok = False
        self.answer_tokens = 0


class StreamMeasure:
    """One request's stream. `feed` returns False once the stream is judged broken.

    Output tokens are counted as they arrive (the per-chunk usage delta where the server
    sends continuous usage, else one a text chunk, on the recorder's `usage_tokens` /
    `chunk_tokens`, which its take() turns into `output_tokens`), so a tick counts what
    arrived in it whatever becomes of the request; the final usage corrects the count.

    The stream has continuous usage iff its first text chunk carries
    `usage.completion_tokens`; then ITL is recorded live, k gaps of gap/k. Without it, and
    with a local tokenizer (`chunk_tokens`, loadgen.worker.tokenizer), k is the tokens the
    chunk's text adds to the stream's text by the tokenizer's count (so they add up to its
    count of the whole text), and ITL is recorded live as well (counted, not estimated).
    Without either a chunk may still carry several tokens (and a usage that shows up on a
    later chunk is the final count, not that chunk's share), so the chunk gaps and the
    pieces of their text (`pieces`) are buffered and ITL is recorded when the stream ends:
    the final count split over the chunks in proportion to their pieces, in whole tokens
    (`split_tokens`), estimated; with no final count, one token a chunk, estimated too.

    `end()` records what was measured, however the stream ended (idempotent): the buffered
    ITL and the correction by the usage, if any came. `finish()` calls it; the client must
    call it on every other ending (error, timeout, cancel); the measure calls it itself
    when it judges the stream broken or abandons it.

    `seen` is the perf_counter time of the last bytes or chunk received (t0 before any):
    the client judges a stall by it (loadgen.worker.envelope.RequestEnvelope.stalled).
    """

    __slots__ = (
        "answer_at",
        "asked_out",
        "cancel_after_tokens",
        "chunks",
        "continuous",
        "count_tokens",
        "counted",
        "debt",
        "done",
        "ended",
        "first",
        "gaps",
        "held",
        "k_total",
        "last",
        "lens",
        "ok",
        "parser",
        "prompt_words",
        "reasoning_k",
        "rec",
        "retry_after",
        "seen",
        "sent_ns",
        "slo",
        "t0",
        "t0_wall_ns",
        "t_intended",
        "thinking",
        "turn",
        "usage_cached",
        "usage_in",
        "usage_out",
        "usage_reasoning",
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
        chunk_tokens: ChunkTokens | None = None,
        asked_out: int = 0,
        turn: Turn | None = None,
    ) -> None:
        self.rec = rec
        self.asked_out = asked_out  # the output length asked exactly (0: none asked)
        self.turn = turn  # a conversation's turn (ConversationMeasure fills it), else None
        # a local tokenizer's count of the tokens each chunk adds to this stream's text (None:
        # none loaded, or one that cannot count chunks); used only when the stream turns
        # out to have no per-chunk usage (`counted`)
        self.count_tokens = chunk_tokens.stream() if chunk_tokens is not None else None
        self.counted = False
        # counted: tokens a chunk's text took back (a count below one, carried to the next
        # chunk) and the gap µs of such chunks, which runs on to the next one's
        self.debt = 0
        self.held = 0.0
        self.cancel_after_tokens = cancel_after_tokens  # a user who stops reading
        self.t0 = t0
        self.seen = t0
        self.t_intended = t_intended
        self.prompt_words = prompt_words
        self.slo = slo
        # calibration: the wall-clock send time, to compare with the server's send stamps
        self.t0_wall_ns = t0_wall_ns
        self.parser = SseParser()
        self.first = self.last = 0.0
        # tokens counted so far (continuous usage, else the tokenizer's, else one a text chunk)
        self.k_total = 0
        self.chunks = 0
        self.continuous = False  # decided by the first text chunk
        # without continuous usage or a tokenizer: the gaps after the first text chunk (µs)
        # and the pieces of every text chunk's text, the first's included
        self.gaps = array("d")
        self.lens = array("d")
        self.usage_out: int | None = None
        self.usage_in: int | None = None
        self.usage_cached: int | None = None  # prompt tokens the server's cache served
        self.done = False
        self.ended = False
        # how it ended, for its stream's pacing (loadgen.worker.pacing): ok when it completed
        # or its user abandoned it on purpose, else a failure; and the wait a 429 or 503
        # asked for (its Retry-After, seconds), set by the client
        self.ok = False
        self.retry_after: float | None = None
        self.sent_ns: int | None = None
        # reasoning: set by the first text chunk when it carries reasoning only, cleared by
        # the first answer chunk; the only per-chunk cost a stream without reasoning pays is
        # the test of this flag
        self.thinking = False
        self.reasoning_k = 0  # tokens of the reasoning-only chunks (counted, not the server's)
        self.answer_at = 0  # index of the first answer chunk (0: none came after reasoning)
        self.usage_reasoning: int | None = None  # usage.completion_tokens_details, if given

    def feed(self, data: bytes, now: float) -> bool:
        self.seen = now
        try:
            payloads = self.parser.feed(data)
        except ValueError as e:
            return self._broken("malformed_chunk", str(e))
        for payload in payloads:
            if payload == DONE:
                self.done = True
                continue
            try:
                chunk = chunk_decoder.decode(payload)
            except msgspec.DecodeError as e:
                return self._broken("malformed_chunk", f"bad chunk ({e}): {payload[:80]!r}")
            if chunk.error is not None:
                return self._broken("stream_broken",
                                    f"server error in stream: {chunk.error.message}")
            if not self._chunk(chunk, now):
                return False
        return True

    def _broken(self, kind: str, message: str) -> bool:
        self.rec.error(kind, message)
        self.end()
        return False

    def chunk(self, chunk, now: float) -> bool:
        """Measure one decoded chunk; False when the client abandons the stream here."""
        self.seen = now
        return self._chunk(chunk, now)

    def _chunk(self, chunk, now: float) -> bool:
        # size: whether there is text (continuous usage), else the text's length (its tokens
        # are the tokenizer's count, or its pieces for the split at the end)
        if self.continuous:
            size = chunk.has_text()
            text = ""
        else:
            text = chunk.text()
            size = len(text)
        k = 1
        usage = chunk.usage
        if usage is not None:
            if usage.prompt_tokens is not None:
                self.usage_in = usage.prompt_tokens
                details = usage.prompt_tokens_details
                if details is not None and details.cached_tokens is not None:
                    self.usage_cached = details.cached_tokens
                elif chunk.timings is not None and chunk.timings.cache_n is not None:
                    self.usage_cached = chunk.timings.cache_n  # llama.cpp's own figure
            out = usage.completion_tokens
            if out is not None:
                if size and (self.continuous or not self.chunks):
                    # continuous usage: this chunk carried the difference
                    k = out - (self.usage_out or 0)
                    if k < 1:
                        k = 1
                # else the final count (on a later chunk only): the end corrects by it
                self.usage_out = out
                details = usage.completion_tokens_details
                if details is not None:
                    self.usage_reasoning = details.reasoning_tokens
        if not size:
            return True
        rec = self.rec
        if self.chunks:
            gap = (now - self.last) * US
            rec.icl.append(gap)
            if self.continuous:
                rec.itl_v.append(gap / k)
                rec.itl_w.append(k)
                rec.usage_tokens += k
            elif self.counted:
                k = self._counted(text, gap)
            else:  # how many tokens it carried is known at the end only
                self.gaps.append(gap)
                self.lens.append(pieces(text))
                rec.chunk_tokens += 1
            if chunk.tokentop_sent_ns is not None and self.sent_ns is not None:
                true_gap = (chunk.tokentop_sent_ns - self.sent_ns) / 1e3
                rec.itl_err.append(abs(gap - true_gap))
        else:
            k = self._first(chunk, now, text, k)
        if self.thinking:
            self._reasoning(chunk, now, k)
        self.chunks += 1
        self.sent_ns = chunk.tokentop_sent_ns
        self.k_total += k
        self.last = now
        if self.cancel_after_tokens is not None and self.k_total >= self.cancel_after_tokens:
            rec.error("cancelled", f"abandoned by the client after {self.k_total} tokens")
            self.ok = True  # on purpose: no failure to pace
            self.end()
            return False
        return True

    def _counted(self, text: str, gap: float) -> int:
        """A chunk's tokens by the tokenizer (what its text adds to the stream's count) and
        its ITL, k gaps of gap/k. A count below one (the text merged into the tokens before
        it) records no gap: it is carried, and its gap runs on to the next chunk's."""
        k = self.count_tokens(text) + self.debt
        if k < 1:
            self.debt = k
            self.held += gap
            return 0
        self.debt = 0
        if self.held:
            gap += self.held
            self.held = 0.0
        rec = self.rec
        rec.itl_v.append(gap / k)
        rec.itl_w.append(k)
        rec.usage_tokens += k
        return k

    def _first(self, chunk, now: float, text: str, k: int) -> int:
        """The first text chunk (k tokens): TTFT, and whether the stream has continuous
        usage, else whether a tokenizer counts its chunks. Returns the chunk's tokens."""
        rec = self.rec
        usage = chunk.usage
        self.continuous = usage is not None and usage.completion_tokens is not None
        self.counted = not self.continuous and self.count_tokens is not None
        if self.counted:
            # the tokenizer's count; at least one (the server sent the first token), what it
            # counted less carried to the next chunk
            counted = self.count_tokens(text)
            k = max(1, counted)
            self.debt = counted - k
        # once a request, not per chunk: does the stream begin by reasoning?
        self.thinking = not chunk.has_answer()
        self.first = now
        ttft = (now - self.t0) * US
        rec.ttft.append(ttft)
        if self.t_intended is not None:
            rec.ttft_co.append((now - self.t_intended) * US)
        sent = chunk.tokentop_sent_ns
        if self.t0_wall_ns is not None and sent is not None:
            # truth: the server wrote it (sent − t0) after we sent; the rest is our error
            rec.ttft_err.append(abs(ttft - (sent - self.t0_wall_ns) / 1e3))
        if self.continuous or self.counted:
            rec.usage_tokens += k
        else:
            self.lens.append(pieces(text))
            rec.chunk_tokens += k
        return k

    def _reasoning(self, chunk, now: float, k: int) -> None:
        """A text chunk of a stream that began by reasoning, before its answer: a reasoning
        chunk's k tokens count as reasoning; the first answer chunk gives the TTFA."""
        if not chunk.has_answer():
            self.reasoning_k += k
            return
        self.thinking = False
        self.answer_at = self.chunks
        self.rec.ttfa.append((now - self.t0) * US)

    def _reasoning_tokens(self, out: int) -> tuple[int, bool] | None:
        """(reasoning tokens of `out` output tokens, whether counted by us rather than the
        server's completion_tokens_details); None: neither saw any reasoning."""
        if self.usage_reasoning is not None:
            return (min(self.usage_reasoning, out), False) if self.usage_reasoning else None
        if not self.reasoning_k:
            return None
        if self.continuous or self.counted or self.usage_out is None or not self.lens:
            return min(self.reasoning_k, out), True
        # one a chunk, corrected by a final count: the reasoning chunks' tokens of its split
        cut = self.answer_at or len(self.lens)
        return min(out, int(self._split(out)[:cut].sum())), True

    def _count_reasoning(self, out: int) -> int:
        """The reasoning / answer split of `out` output tokens, counted; returns the
        reasoning tokens (0: none)."""
        split = self._reasoning_tokens(out)
        if split is None:
            return 0
        reasoning, counted = split
        c = self.rec.counters
        c.reasoning_requests += 1
        c.reasoning_tokens += reasoning
        c.answer_tokens += out - reasoning
        if counted:
            c.estimated_reasoning_tokens += reasoning
        return reasoning

    def end(self) -> None:
        """The stream is over, however it ended: correct the token count by the usage if
        one came, and record the buffered ITL. Idempotent."""
        if self.ended:
            return
        self.ended = True
        n = self.usage_out
        if n is not None and self.chunks:
            c = self.rec.counters
            c.output_tokens += n - self.k_total  # the server's count replaces ours
            if not self.continuous and not self.counted:
                c.estimated_output_tokens -= self.k_total
        if self.gaps:
            self._buffered_itl(n)

    def _buffered_itl(self, n: int | None) -> None:
        """ITL of a stream without per-chunk usage, from its final count `n` (None: none
        came): one token a chunk where the count says so, and, estimated, where there is
        none; else the count split over the chunks by their pieces (`split_tokens`)."""
        rec = self.rec
        gaps = self.gaps
        chunks = len(self.lens)
        if n is None or n < 1 or n == chunks:
            rec.itl_v.extend(gaps)
            rec.itl_w.extend(_ONE * len(gaps))
            if n != chunks:  # no count: one a chunk is a guess (ITL too high if it is wrong)
                rec.counters.estimated_itl_tokens += len(gaps)
            return
        k = self._split(n)[1:]  # the first chunk's tokens are the TTFT chunk's, not a gap
        g = np.frombuffer(gaps, np.float64)
        if k.min() < 1:
            # fewer tokens than chunks: a chunk given none passes its gap on to the next one
            # that has a token (so time is neither lost nor counted twice)
            has = k >= 1
            g = np.diff(np.cumsum(g)[has], prepend=0.0)
            k = k[has]
        rec.itl_v.frombytes((g / k).tobytes())
        rec.itl_w.frombytes(k.tobytes())
        rec.counters.estimated_itl_tokens += int(k.sum())

    def _split(self, n: int) -> np.ndarray:
        return split_tokens(n, np.frombuffer(self.lens, np.float64))

    def finish(self) -> None:
        """The body ended cleanly: count the request as ok, or say what was wrong."""
        self.end()
        rec = self.rec
        if not self.done:
            rec.error("stream_broken", f"stream ended without [DONE] ({self._tail()})")
            return
        if self.chunks == 0:
            rec.error("empty_response", "stream finished without any generated text")
            return
        self.ok = True
        c = rec.counters
        c.requests_ok += 1
        c.chunks += self.chunks
        out = self.usage_out if self.usage_out is not None else self.k_total
        c.completed_output_tokens += out
        reasoning = 0
        if self.reasoning_k or self.usage_reasoning:
            reasoning = self._count_reasoning(out)
        prompt = self.usage_in
        if prompt is not None:
            c.input_tokens += prompt
            c.input_tokens_asked += self.prompt_words
        else:
            # without usage the prompt's word count stands in (synthetic prompts are ~1
            # token a word)
            prompt = self.prompt_words
            c.input_tokens += prompt
            c.estimated_input_tokens += prompt
        if self.usage_cached is not None:
            c.cached_tokens += self.usage_cached
            c.cache_reported_input_tokens += prompt
        if self.asked_out and self.usage_out is not None and self.usage_out != self.asked_out:
            c.output_differs += 1
        e2e = (self.last - self.t0) * US
        rec.e2e.append(e2e)
        ttft = (self.first - self.t0) * US
        if self.turn is not None:
            self._count_turn(ttft, prompt, out - reasoning)
        if self.t_intended is not None:
            # open loop: the user waited from the intended send time (coordinated omission)
            e2e = (self.last - self.t_intended) * US
            rec.e2e_co.append(e2e)
            ttft = (self.first - self.t_intended) * US
        tpot = None
        if out > 1:
            tpot = (self.last - self.first) * US / (out - 1)
            rec.tpot.append(tpot)
        if self.slo is not None and self.slo.met(ttft, tpot, e2e):
            c.requests_good += 1

    def _count_turn(self, ttft: float, prompt: int, answer: int) -> None:
        """A conversation's turn completed: its row of the per-turn counters, and what the
        conversation needs to go on (the tokens of the reply that goes back: its answer)."""
        turn = self.turn
        row = self.rec.counters.turn(turn.number)
        row.requests += 1
        row.ttft_us += round(ttft)
        row.input_tokens += prompt
        row.cached_tokens += self.usage_cached or 0
        turn.ok = True
        turn.answer_tokens = answer

    def _tail(self) -> str:
        pending = self.parser.pending
        return f"{len(pending)} bytes of an unfinished event" if pending else "no [DONE] line"

    @property
    def started(self) -> bool:
        return self.k_total > 0


class ConversationMeasure(StreamMeasure):
    """A StreamMeasure that also keeps the answer's text (the history of the next turn):
    a subclass, so that single requests pay nothing for it."""

    __slots__ = ()

    def _chunk(self, chunk, now: float) -> bool:
        reply = self.turn.reply
        for c in chunk.choices:
            d = c.delta
            if d is not None and d.content:
                reply.append(d.content)
            elif c.text:
                reply.append(c.text)
        return super()._chunk(chunk, now)


_ONE = array("d", [1.0])

# A text's pieces, as a byte-level BPE pre-splits it (GPT-2's pattern, digits in threes as
# Llama 3 groups them): a run of letters, of up to three digits or of other symbols, each
# with the space before it, or a run of whitespace. A token almost never spans two pieces,
# and most words are one token, so pieces follow a chunk's tokens far closer than its
# characters do (a chunk of one long word is one token, of two short ones two).
_PIECE = re.compile(r" ?(?:[^\W\d_]+|\d{1,3}|[^\w\s]+|_+)|\s+")


# A chunk's text is most often one token's, and a model has a vocabulary's worth of those:
# the count of a short text is kept by text, a dict lookup a chunk against ~200 ns for the
# regex (perf, issue 28). Bounded: at most PIECES_KEPT texts of PIECES_TEXT characters (a
# few MB), emptied when full; a longer text is rarely sent twice and is counted each time.
_PIECES: dict[str, int] = {}
PIECES_KEPT = 1 << 16
PIECES_TEXT = 32


def pieces(text: str) -> int:
    """Pieces of a chunk's text (at least one: a text chunk carries a token)."""
    n = _PIECES.get(text)
    if n is None:
        n = len(_PIECE.findall(text)) or 1
        if len(text) <= PIECES_TEXT:
            if len(_PIECES) >= PIECES_KEPT:
                _PIECES.clear()
            _PIECES[text] = n
    return n


def split_tokens(n: int, sizes: np.ndarray) -> np.ndarray:
    """`n` tokens split over chunks in proportion to their sizes, in whole tokens that add
    up to n exactly (each chunk its quota's floor, the tokens left to the largest
    remainders): no chunk is pulled toward the mean, and whole tokens record no fraction a
    histogram bucket would round. Every chunk carries at least one where n allows (a text
    chunk carries a token), the first always (the first token); a chunk raised to that
    minimum is paid for by the chunks furthest over their quota."""
    quota = n * sizes / sizes.sum()
    k = np.floor(quota)
    least = np.full(len(k), 1.0 if n >= len(k) else 0.0)
    least[0] = 1.0
    np.maximum(k, least, out=k)
    left = n - int(k.sum())
    rem = quota - k
    if left > 0:
        k[np.argsort(-rem, kind="stable")[:left]] += 1
    while left < 0:
        over = np.flatnonzero(k > least)
        take = over[np.argsort(rem[over], kind="stable")[:-left]]
        k[take] -= 1
        rem[take] += 1
        left += len(take)
    return k
