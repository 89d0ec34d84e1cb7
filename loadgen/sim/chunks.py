"""The SSE bytes of one streamed completion, built from precomputed pieces.

Every generated token is one word, sent as one SSE chunk (or k words per chunk with
`tokens_per_chunk` k > 1; the first token always goes alone). Chunks are concatenations of
bytes prepared once per request (the head) and once per word (the tails, words.WordTable):
no JSON encoding per token, so one process streams over 100k chunks/s.

A reasoning model (`reasoning_tokens`, chat only) sends its first tokens as
`delta.reasoning_content`; the usage then says `completion_tokens_details.reasoning_tokens`.
"""

from __future__ import annotations

import json
import time
import uuid

from loadgen.sim.model import Sequence
from loadgen.sim.request import CompletionRequest
from loadgen.sim.words import CHAT_REST, PLAIN_WORDS, TEXT_REST, WordTable

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

_DONE = b"data: [DONE]\n\n"
_SPLIT_CHAR = "é".encode()  # two bytes: a malformed_kind "split_utf8" splits it


class ChunkWriter:
    """Builds one request's SSE bytes from precomputed pieces."""

    def __init__(self, req: CompletionRequest, seq: Sequence, *, chat: bool, model: str,
                 table: WordTable = PLAIN_WORDS) -> None:
        self.chat = chat
        self.words, self.mask = table.bytes, table.mask
        self.req = req
        self.seq = seq
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.prefix = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{int(time.time())},'
            f'"model":{json.dumps(model)},"choices":['
        ).encode()
        self.open_text = b'{"index":0,"delta":{"content":"' if chat else b'{"index":0,"text":"'
        self.head = self.prefix + self.open_text
        self.tails = table.chat_tails if chat else table.text_tails
        self.rest = CHAT_REST if chat else TEXT_REST
        self.multi = False  # k tokens in one chunk (tokens_per_chunk > 1)
        # a reasoning model (chat only): tokens 0..reasoning-1 go as delta.reasoning_content
        self.reasoning = 0
        self.think_open = b'{"index":0,"delta":{"reasoning_content":"'
        self.think_head = self.prefix + self.think_open

    def role(self) -> bytes:
        return self._with_usage(
            b'{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]',
            0,
        )

    def tokens(self, start: int, end: int) -> bytes:
        """Chunks for tokens start..end-1: one token each, or all in one chunk if multi.
        Reasoning tokens and answer tokens never share a chunk (as a reasoning parser
        splits them)."""
        r = self.reasoning
        if start < r < end:
            return self._tokens(start, r, True) + self._tokens(r, end, False)
        return self._tokens(start, end, start < r)

    def _tokens(self, start: int, end: int, think: bool) -> bytes:
        seq = self.seq
        if self.multi and end - start > 1:
            return self.one_chunk(start, end)
        if self.req.continuous_usage:
            return b"".join(self._usage_token(k) for k in range(start, end))
        head = self.think_head if think else self.head
        tails, offset, mask = self.tails, seq.offset, self.mask
        if end - start == 1:
            return head + tails[(offset + start) & mask]
        return b"".join(head + tails[(offset + k) & mask] for k in range(start, end))

    def one_chunk(self, start: int, end: int) -> bytes:
        """One chunk carrying tokens start..end-1."""
        offset, words, mask = self.seq.offset, self.words, self.mask
        text = b"".join(words[(offset + k) & mask] for k in range(start, end))
        opening = self.think_open if start < self.reasoning else self.open_text
        return self._with_usage(opening + text + self.rest, end)

    def empty(self, completion: int) -> bytes:
        """A chunk with no choices at all (the empty_choices fault)."""
        return self._with_usage(b"]", completion)

    def malformed(self, kind: str, k: int) -> bytes:
        """One broken chunk in place of token k (the malformed fault)."""
        word = self.words[(self.seq.offset + k) & self.mask]
        if kind == "bad_json":  # the JSON is cut short
            return self.head + word + b'"}\n\n'
        if kind == "missing_data":  # a whole chunk without the `data:` field name
            return self.tokens(k, k + 1).removeprefix(b"data: ")
        # split_utf8: one two-byte character split across two events
        first, second = _SPLIT_CHAR[:1], _SPLIT_CHAR[1:]
        return self.head + first + self.rest + b"}\n\n" + self.head + second + self.rest + b"}\n\n"

    def empty_ending(self) -> bytes:
        """The end of an empty_choices stream: the usage chunk if asked for, and [DONE]."""
        out = b""
        if self.req.include_usage:
            out = self.prefix + b"]" + self._usage(self.seq.generated, True) + b"}\n\n"
        return out + _DONE

    def _usage_token(self, k: int) -> bytes:
        word = self.words[(self.seq.offset + k) & self.mask]
        if self.chat:
            choice = (self.think_open if k < self.reasoning else
                      b'{"index":0,"delta":{"content":"') + word + CHAT_REST
        else:
            choice = b'{"index":0,"text":"' + word + TEXT_REST
        return self._with_usage(choice, k + 1)

    def ending(self) -> bytes:
        """The finish_reason chunk, the usage chunk if asked for, and [DONE]."""
        seq = self.seq
        reason = json.dumps(seq.finish_reason).encode()
        if self.chat:
            choice = b'{"index":0,"delta":{},"logprobs":null,"finish_reason":' + reason + b"}]"
        else:
            choice = b'{"index":0,"text":"","logprobs":null,"finish_reason":' + reason + b"}]"
        out = self._with_usage(choice, seq.generated)
        if self.req.include_usage:
            out += self.prefix + b"]" + self._usage(seq.generated, True) + b"}\n\n"
        return out + _DONE

    def _with_usage(self, choices_rest: bytes, completion: int) -> bytes:
        usage = self._usage(completion) if self.req.continuous_usage else b""
        return self.prefix + choices_rest + usage + b"}\n\n"

    def _usage(self, completion: int, final: bool = False) -> bytes:
        """The usage object; the final one also says the prompt's tokens the prefix cache
        served (not every chunk's: the per-chunk bytes stay what they were)."""
        prompt = self.seq.prompt_tokens
        usage = b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d' % (
            prompt,
            completion,
            prompt + completion,
        )
        if final and self.req.cached_tokens is not None:
            usage += b',"prompt_tokens_details":{"cached_tokens":%d}' % self.req.cached_tokens
        if self.reasoning:  # as OpenAI reports a reasoning model's share of the completion
            usage += b',"completion_tokens_details":{"reasoning_tokens":%d}' % min(
                completion, self.reasoning)
        return usage + b"}"


def completion_text(seq: Sequence, table: WordTable = PLAIN_WORDS) -> str:
    """A whole (non-streamed) answer's text: the same words a stream of it would carry."""
    return table.text(seq.offset, seq.generated)


def stamp(data: bytes, ns: int) -> bytes:
    """Every JSON event of `data` with "tokentop_sent_ns" added (exact-timing mode)."""
    return data.replace(b"}\n\n", b',"tokentop_sent_ns":%d}\n\n' % ns)
