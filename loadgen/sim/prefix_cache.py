"""The simulator's prefix cache: what a server with automatic prefix caching reuses.

As vLLM's, it works in whole blocks of `block_tokens`: a prompt's leading blocks that an
earlier prompt already had (the same tokens from the start, block by block: each block's
key chains the one before it) are served from the cache, and every whole block of the
prompt is cached after. Least recently used blocks go first once `capacity_tokens` is
full. A prompt's last token is always computed (the server needs its logits), so at most
all but one are cached.

Units are the prompt's tokens (a local tokenizer's ids where the simulator has one, else
its words, as it counts them), chat messages each opened by their role. Replies are not
cached as they are generated: a conversation's next turn reuses its earlier prompts'
blocks; a server that also caches what it generated would reuse a little more.

The hit is reported as `usage.prompt_tokens_details.cached_tokens` (the OpenAI field vLLM,
SGLang and llama.cpp fill), counted in /metrics as vLLM's prefix-cache queries and hits,
and the prefill skips the cached tokens, so the TTFT of a hit is shorter.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

Units = Callable[[str], Sequence[object]]


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_tokens: int = 16) -> None:
        self.block = block_tokens
        self.capacity = max(0, capacity_tokens // block_tokens)  # in blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
        self.hits = 0  # of those, served from the cache

    def lookup(self, units: Sequence[object]) -> int:
        """The tokens of `units` (a prompt) served from the cache; caches its blocks."""
        n = len(units)
        if not self.capacity or n == 0:
            return 0
        keys = self._keys(units)
        cached = 0
        for key in keys:
            if key not in self._blocks:
                break
            cached += self.block
        for key in keys:
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        cached = min(cached, n - 1)
        self.queries += n
        self.hits += cached
        return cached

    def _keys(self, units: Sequence[object]) -> list[int]:
        """A key per whole block, each chaining the one before (the same block after another
        prefix is another block)."""
        keys = []
        key = 0
        for start in range(0, len(units) - self.block + 1, self.block):
            key = hash((key, tuple(units[start:start + self.block])))
            keys.append(key)
        return keys


def prompt_units(body: dict[str, Any], chat: bool, units: Units) -> list[object]:
    """The units of a (validated) request's prompt: each chat message's role, then its
    text's units; a completion's prompt text (or its token ids)."""
    if not chat:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list):
            return list(prompt)  # token ids
        return list(units(prompt)) if isinstance(prompt, str) else []
    out: list[object] = []
    for message in body.get("messages") or []:
        out.append(f"<{message.get('role')}>")
        content = message.get("content")
        if isinstance(content, str):
            out += units(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    out += units(part["text"])
    return out
