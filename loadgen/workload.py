"""What each request asks for: the prompt, the lengths, the API shape.

Synthetic prompts are words from a fixed vocabulary, seeded so a run is
reproducible; most tokenizers give about one token per such word, and the
server's `usage` gives the true count. A per-request serial number leads each
prompt so that prefix caching does not turn the benchmark into a cache test.
"""

from __future__ import annotations

import random

import msgspec

_VOCAB = (
    "the of and to in is was for on that with as by at from his her they this which are "
    "be or had an were but not have one all their there been has when who will more no if "
    "out so said what up its about into than them can only other new some could time "
    "these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down "
    "should because each just those people"
).split()


class Workload(msgspec.Struct, kw_only=True, frozen=True):
    model: str
    api: str = "chat"  # chat | completions
    input_tokens: int = 128
    output_tokens: int = 128
    ignore_eos: bool = True  # vLLM/SGLang/llama.cpp extension: generate exactly output_tokens
    continuous_usage: bool = True  # ask for usage on every chunk (exact tokens per chunk)
    seed: int = 0

    @property
    def path(self) -> str:
        return "/chat/completions" if self.api == "chat" else "/completions"


class RequestFactory:
    """Builds request bodies (bytes, ready to send) for one worker."""

    def __init__(self, workload: Workload, worker_index: int = 0) -> None:
        self.w = workload
        self.rng = random.Random(workload.seed * 1000 + worker_index)
        self.serial = 0
        self.worker_index = worker_index
        self._encode = msgspec.json.Encoder().encode

    def next(self) -> tuple[bytes, int]:
        """(body, prompt word count) of the next request."""
        w = self.w
        self.serial += 1
        words = [f"r{self.worker_index}-{self.serial}"]
        words += self.rng.choices(_VOCAB, k=max(0, w.input_tokens - 1))
        prompt = " ".join(words)
        body: dict = {"model": w.model, "max_tokens": w.output_tokens, "stream": True}
        options = {"include_usage": True}
        if w.continuous_usage:
            options["continuous_usage_stats"] = True
        body["stream_options"] = options
        if w.ignore_eos:
            body["ignore_eos"] = True
        if w.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return self._encode(body), len(words)
