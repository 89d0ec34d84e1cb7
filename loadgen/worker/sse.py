"""Server-sent events as OpenAI-compatible servers stream them, parsed cheaply.

The client feeds raw bytes as they arrive (timestamps are taken before this
runs) and gets back the `data:` payloads of complete events. Chunk payloads
are decoded with msgspec into the few fields we need (unknown fields are
skipped in C), which is both faster than `json.loads` and strict enough to
tell a malformed chunk from a good one.
"""

from __future__ import annotations

import msgspec

DONE = b"[DONE]"


class SseParser:
    """Incremental SSE framing: bytes in, complete `data` payloads out."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        # bytes.find, not `in`: `b"x" in data` first tries the needle as an int, and the
        # TypeError it formats and drops cost ~2 µs a chunk (perf, issue 28)
        end = len(data) - 2
        if (not self._buf and data.startswith(b"data: ") and data.find(b"\n", 6) == end
                and data[end + 1] == 10):  # ends "\n\n"
            # the common case on the hot path: exactly one whole one-line event
            return [data[6:end]]
        return self._feed(data)

    def _feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        if buf.find(b"\r") >= 0:
            buf = buf.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            payload = _event_data(buf[start:end])
            if payload is not None:
                out.append(payload)
            start = end + 2
        self._buf = buf[start:]
        return out

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet terminated (non-empty at stream end = truncated)."""
        return self._buf


_FIELDS = (b"event:", b"id:", b"retry:")


def _event_data(event: bytes) -> bytes | None:
    if event.startswith(b"data:") and event.find(b"\n") < 0:
        # the common case: one line, one payload
        return event[6:] if event[5:6] == b" " else event[5:]
    parts = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            parts.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line and not line.startswith(b":") and not line.startswith(_FIELDS):
            # The SSE spec would ignore an unknown field, but no inference server sends
            # one: a line like `{"choices": …}` is a chunk that lost its `data:` prefix,
            # and silently dropping it would lose a token. Call it what it is.
            raise ValueError(f"not an SSE line: {line[:60]!r}")
    return b"\n".join(parts) if parts else None


# gc=False: a chunk's structs cannot form a cycle, and untracked they do not push the
# collector's count (a collection every ~100 chunks otherwise)
class Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class Choice(msgspec.Struct, gc=False):
    delta: Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class CompletionDetails(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None  # of completion_tokens, those the model reasoned


class PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None  # of prompt_tokens, those served from the prefix cache


class Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    completion_tokens_details: CompletionDetails | None = None
    prompt_tokens_details: PromptDetails | None = None


class Timings(msgspec.Struct, gc=False):
    cache_n: int | None = None  # llama.cpp: prompt tokens reused from its cache


class ErrorBody(msgspec.Struct, gc=False):
    message: str | None = None


class Chunk(msgspec.Struct, gc=False):
    choices: list[Choice] = []
    usage: Usage | None = None
    error: ErrorBody | None = None
    timings: Timings | None = None  # llama.cpp's, on the last chunk
    tokentop_sent_ns: int | None = None  # the simulator's send time in exact-timing mode

    def has_text(self) -> bool:
        """True when this chunk carries generated text (content or reasoning)."""
        for c in self.choices:
            if c.text:
                return True
            d = c.delta
            if d is not None and (d.content or d.reasoning_content or d.reasoning):
                return True
        return False

    def has_answer(self) -> bool:
        """True when this chunk carries answer text (content, or a completion's text), not
        reasoning only. Called on the first text chunk and, in a stream that began by
        reasoning, until the answer starts: never per chunk of a stream without reasoning."""
        for c in self.choices:
            if c.text:
                return True
            d = c.delta
            if d is not None and d.content:
                return True
        return False

    def text(self) -> str:
        """The generated text this chunk carries ("" for none): a completion's text, the
        answer and the reasoning. The reasoning is one field's: a server that keeps the old
        `reasoning` as an alias of `reasoning_content` sends the same text in both, and it
        was generated once (`reasoning_content` is taken when both are there)."""
        choices = self.choices
        if len(choices) == 1:  # the common case: one choice, one field
            c = choices[0]
            d = c.delta
            if d is None:
                return c.text or ""
            if c.text is None and (d.reasoning_content or d.reasoning) is None:
                return d.content or ""
        return "".join(_choice_text(c) for c in choices)


def _choice_text(c: Choice) -> str:
    d = c.delta
    if d is None:
        return c.text or ""
    return (c.text or "") + (d.reasoning_content or d.reasoning or "") + (d.content or "")


chunk_decoder = msgspec.json.Decoder(Chunk)
