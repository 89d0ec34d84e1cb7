"""A completion request, as the simulator reads it, and the errors it answers.

* prompt tokens = whitespace-separated words of the prompt (completions; a
  list of token ids counts its length) or of every message's text (chat, plus
  `chat_template_tokens`), at least 1; with a tokenizer, its count of those texts
  (see words.SimTokenizer), and the words written are those that are one token each in it;
* `max_tokens` (chat also `max_completion_tokens`), default 256, capped so
  that prompt + completion fits the KV budget; asking for more than fits is a
  400, as vLLM answers past max_model_len (the engine model decides both);
* `ignore_eos`: true generates exactly max_tokens; false draws a natural
  length (seeded), finish_reason "stop" when it ends first, else "length";
* `stream_options.include_usage` adds a last chunk with `"choices": []` and
  usage; `continuous_usage_stats` (with include_usage, as in vLLM) puts usage
  on every chunk;
* stop, n, seed / temperature 0, min_tokens, logprobs, response_format and tools: what
  they do is features.py's (`asked`), as is what a simulator told to break them ignores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from loadgen.sim.features import Asked, asked
from loadgen.sim.words import SimTokenizer, count_words


class RequestError(Exception):
    """A request the server refuses, with the OpenAI-style error it answers."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind

    def response(self) -> web.Response:
        return error_response(self.status, str(self), self.kind)


def error_response(status: int, message: str, kind: str) -> web.Response:
    """An error in OpenAI's shape, which clients (and tokentop) parse for its type."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


@dataclass
class CompletionRequest:
    model: str
    prompt_tokens: int
    max_tokens: int | None
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    cached_tokens: int | None = None  # served from the prefix cache (None: no cache)
    priority: int = 0  # vLLM's field: under the priority policy, the lowest goes first
    first_token_t: float | None = None  # loop.time() its first token was written (streams)
    asked: Asked = field(default_factory=Asked)  # stop, n, seed … (features.py)


def parse_request(body: Any, *, chat: bool, template_tokens: int = 0,
                  tokens: SimTokenizer | None = None) -> CompletionRequest:
    """Validate a completion body; raises RequestError(400) with a readable message.
    `template_tokens`: what a chat template adds to every chat prompt's count; `tokens`:
    the tokenizer that counts prompts (None: a token a word)."""
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str):
        raise RequestError(400, "`model` is required and must be a string.")
    prompt_tokens = _prompt_tokens(body, chat, template_tokens, tokens)
    max_tokens = _max_tokens(body, chat)
    stream = flag(body, "stream")
    ignore_eos = flag(body, "ignore_eos")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError(400, "`stream_options` must be an object.")
    include_usage = stream and flag(options, "include_usage")
    try:
        extras = asked(body, chat=chat, stream=stream)
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None
    return CompletionRequest(
        model=model,
        prompt_tokens=max(1, prompt_tokens),
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and flag(options, "continuous_usage_stats"),
        asked=extras,
        priority=_priority(body),
    )


def _priority(body: dict[str, Any]) -> int:
    value = body.get("priority")
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(400, "`priority` must be an integer.")
    return value


def _prompt_tokens(body: dict[str, Any], chat: bool, template_tokens: int,
                   tokens: SimTokenizer | None) -> int:
    # A completion prompt counts with the special tokens a server adds (a BOS); chat
    # contents without, the template's own tokens being `template_tokens`.
    count = count_words if tokens is None else (tokens.content if chat else tokens.prompt)
    if chat:
        return _count_messages(body.get("messages"), count) + template_tokens
    return _count_prompt(body, count)


def _max_tokens(body: dict[str, Any], chat: bool) -> int | None:
    max_tokens = body.get("max_tokens")
    if chat and body.get("max_completion_tokens") is not None:  # the newer name wins
        max_tokens = body["max_completion_tokens"]
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise RequestError(400, "`max_tokens` must be an integer of at least 1.")
    return max_tokens


def flag(obj: dict[str, Any], key: str, *, default: bool = False) -> bool:
    """A boolean field of a request body (null: the default); RequestError(400) if not one."""
    value = obj.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(400, f"`{key}` must be a boolean.")
    return value


def _count_messages(messages: Any, count: Callable[[str], int]) -> int:
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "`messages` is required and must be a non-empty list.")
    words = 0
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise RequestError(400, "Each message must be an object with a `role`.")
        content = message.get("content")
        if isinstance(content, str):
            words += count(content)
        elif isinstance(content, list):  # content parts: count the text ones
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words += count(part["text"])
        elif content is not None:
            raise RequestError(400, "A message's `content` must be a string or a list of parts.")
    return words


def _count_prompt(body: dict[str, Any], count: Callable[[str], int]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return count(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):  # token ids
            return len(prompt)
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return count(prompt[0])
        one = prompt[0] if len(prompt) == 1 else None
        if isinstance(one, list) and all(isinstance(t, int) for t in one):  # [[token ids]]
            return len(one)
        if len(prompt) > 1:
            raise RequestError(400, "The simulator serves one prompt per request.")
    raise RequestError(400, "`prompt` is required: a string or a list of token ids.")
