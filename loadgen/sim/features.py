"""What a request may ask of the simulator beyond its load, and the features it can be told to
break (`SimConfig.broken`, `tokentop sim --break stop,n`), so that a conformance check
(loadgen.eval.conformance) has a truth to find a server wrong against.

Served (the known subset):
* `stop` (a string or up to 4): the answer ends before the first match, finish_reason
  "stop" (the token the match starts in is dropped whole: the words are precomputed bytes);
  not searched within the first `min_tokens` tokens, as vLLM's stop checker skips them;
* `n` 1..8 choices, whole answers only (each its own sequence in the engine);
* deterministic decoding: `temperature` 0 (greedy: by the prompt) or a `seed` give the same
  text and natural length for the same prompt (the engine's own draws still happen, so the
  lengths of the other requests are as they were);
* `min_tokens`: the natural length is at least this;
* `logprobs` (chat: true, with `top_logprobs` 0..20; completions: 0..5), whole answers only:
  made-up values, each ≤ 0, the token itself first among its alternatives;
* `response_format` json_object and json_schema, whole answers: the text is a JSON object
  (a schema's every property, of its type);
* `tools` with `tool_choice` auto, required or a named function (whole chat answers): a
  call of that function (auto, required: the first), its arguments a JSON string fitting
  its parameters, finish_reason "tool_calls".
Streamed answers ignore logprobs, response_format and tools (as before).

Broken (each name of BREAKABLE): the server ignores the body's keys of BREAKS[name] (as a
server that does not know them), does not serve the route of ROUTES[name] (404), or, for
"errors", answers its 4xx refusals with a 500.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from typing import Any

from loadgen.sim.words import WordTable

# a broken feature: the body keys the server then ignores
BREAKS: dict[str, tuple[str, ...]] = {
    "usage": ("stream_options",),
    "max_completion_tokens": ("max_completion_tokens",),
    "stop": ("stop",),
    "n": ("n",),
    "logprobs": ("logprobs", "top_logprobs"),
    "seed": ("seed",),
    "json": ("response_format",),
    "tools": ("tools", "tool_choice"),
    "ignore_eos": ("ignore_eos",),
    "min_tokens": ("min_tokens",),
}
# a broken feature: the route the server then does not serve
ROUTES: dict[str, str] = {
    "models": "/v1/models", "completions": "/v1/completions", "tokenize": "/tokenize",
    "metrics": "/metrics", "health": "/health",
}
BREAKABLE: tuple[str, ...] = (*BREAKS, *ROUTES, "errors")

MAX_N = 8
MAX_STOPS = 4
_SCHEMA_DEPTH = 8  # a schema nested deeper is filled with its text


def check_broken(names: list[str] | tuple[str, ...]) -> None:
    """ValueError in words for a name that is not a breakable feature."""
    unknown = [n for n in names if n not in BREAKABLE]
    if unknown:
        raise ValueError(f"--break {', '.join(unknown)}: not a feature the simulator can "
                         f"break (one of {', '.join(BREAKABLE)})")


def strip_broken(body: dict[str, Any], broken: frozenset[str]) -> dict[str, Any]:
    """The body as a server without the broken features reads it: their keys dropped."""
    drop = {key for name in broken for key in BREAKS.get(name, ())}
    return {k: v for k, v in body.items() if k not in drop} if drop & body.keys() else body


@dataclass
class Tool:
    name: str
    parameters: dict[str, Any]


@dataclass
class Asked:
    """What one request asks beyond its lengths (the defaults: nothing)."""

    stop: tuple[str, ...] = ()
    n: int = 1
    key: int | None = None  # deterministic decoding: the text and length follow from it
    min_tokens: int = 0
    logprobs: int | None = None  # alternatives per token (0: the token's own); None: not asked
    response_format: str | None = None  # json_object | json_schema (None: text)
    schema: dict[str, Any] | None = None  # json_schema's schema
    tool: Tool | None = None  # the function the answer calls


def asked(body: dict[str, Any], *, chat: bool, stream: bool) -> Asked:
    """What `body` asks; ValueError in words for a value the simulator refuses."""
    out = Asked(stop=_stop(body.get("stop")), n=_n(body.get("n"), stream),
                min_tokens=_count(body, "min_tokens", 0, 1 << 20) or 0)
    out.key = _key(body, chat)
    out.logprobs = _logprobs(body, chat)
    out.response_format, out.schema = _format(body.get("response_format"))
    if chat:
        out.tool = _tool(body.get("tools"), body.get("tool_choice"))
    return out


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ValueError("`stop` must be a string or a list of non-empty strings.")
    if len(stops) > MAX_STOPS:
        raise ValueError(f"`stop` holds at most {MAX_STOPS} sequences.")
    return tuple(stops)


def _n(value: Any, stream: bool) -> int:
    if value is None:
        return 1
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_N:
        raise ValueError(f"`n` must be an integer from 1 to {MAX_N}.")
    if value > 1 and stream:
        raise ValueError("The simulator serves `n` > 1 only in whole (non-streamed) answers.")
    return value


def _count(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"`{key}` must be an integer from {low} to {high}.")
    return value


def _key(body: dict[str, Any], chat: bool) -> int | None:
    """The key of a deterministic answer: greedy (temperature 0) by the prompt alone, seeded
    by the prompt and the seed; None: sampled."""
    temperature = body.get("temperature")
    seed = _count(body, "seed", -(1 << 63), (1 << 64) - 1)
    greedy = isinstance(temperature, int | float) and not isinstance(temperature, bool) \
        and temperature == 0
    if not greedy and seed is None:
        return None
    prompt = json.dumps(body.get("messages" if chat else "prompt"), sort_keys=True)
    return zlib.crc32(f"{'greedy' if greedy else seed}|{prompt}".encode())


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if chat:
        value = body.get("logprobs")
        if value is not None and not isinstance(value, bool):
            raise ValueError("`logprobs` must be a boolean (chat).")
        top = _count(body, "top_logprobs", 0, 20)
        return (top or 0) if value else None
    return _count(body, "logprobs", 0, 5)


def _format(value: Any) -> tuple[str | None, dict[str, Any] | None]:
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None, None
    if kind == "json_object":
        return kind, None
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ValueError("`response_format.json_schema.schema` must be an object.")
        return kind, schema
    raise ValueError("`response_format.type` must be text, json_object or json_schema.")


def _tool(tools: Any, choice: Any) -> Tool | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not tools:
        raise ValueError("`tools` must be a non-empty list of functions.")
    functions: dict[str, Tool] = {}
    for t in tools:
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise ValueError("Each tool must be {\"type\": \"function\", \"function\": "
                             "{\"name\": …}}.")
        params = f.get("parameters")
        functions[f["name"]] = Tool(f["name"], params if isinstance(params, dict) else {})
    if choice in (None, "auto", "required"):
        return next(iter(functions.values()))
    if choice == "none":
        return None
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if name not in functions:
        raise ValueError("`tool_choice` must be none, auto, required or a function of `tools`.")
    return functions[name]


# ---- what the answer becomes ------------------------------------------------------------


def natural_length(key: int, mean: float) -> int:
    """A deterministic request's natural length (the engine's draw, from its key)."""
    return 1 + int(random.Random(key).expovariate(1.0 / mean))


def offset_of(key: int, i: int = 0) -> int:
    """Where a deterministic request's `i`-th choice starts in the word list."""
    return random.Random(key * 31 + i + 1).randrange(1 << 16)


def cut_at_stop(target: int, offset: int, stops: tuple[str, ...], min_tokens: int,
                table: WordTable) -> int | None:
    """The tokens an answer of `target` tokens keeps when it ends before its first stop
    match (searched after `min_tokens`), or None when no stop matches."""
    if not stops or target <= min_tokens:
        return None
    text, ends = "", []
    for k in range(target):
        text += table.words[(offset + k) & table.mask]
        ends.append(len(text))
    start = ends[min_tokens - 1] if min_tokens else 0
    found = [p for s in stops if (p := text.find(s, start)) >= 0]
    if not found:
        return None
    first = min(found)
    return max(1, min_tokens, sum(1 for e in ends if e <= first))


def content(text: str, a: Asked) -> str:
    """The answer's content: the text, or a JSON object of it (response_format)."""
    if a.response_format == "json_schema" and a.schema is not None:
        return json.dumps(fit(a.schema, text))
    if a.response_format == "json_object":
        return json.dumps({"text": text.strip()})
    return text


def fit(schema: Any, text: str, depth: int = 0) -> Any:
    """A value of JSON Schema `schema` (its type, every property), made of `text`."""
    if not isinstance(schema, dict) or depth > _SCHEMA_DEPTH:
        return text.strip()
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    props = schema.get("properties")
    if kind == "object" or isinstance(props, dict):
        return {k: fit(v, text, depth + 1) for k, v in (props or {}).items()}
    if kind == "array":
        items = schema.get("items")
        return [fit(items, text, depth + 1)] if isinstance(items, dict) else []
    return {"integer": len(text.split()), "number": float(len(text.split())), "boolean": True,
            "null": None}.get(str(kind), text.strip())


def tool_call(tool: Tool, text: str, rid: str) -> dict[str, Any]:
    return {"id": f"call_{rid[-24:]}", "type": "function",
            "function": {"name": tool.name, "arguments": json.dumps(fit(tool.parameters, text))}}


def logprobs(offset: int, n: int, top: int, table: WordTable, *, chat: bool) -> dict[str, Any]:
    """Made-up logprobs of the answer's `n` tokens, `top` alternatives each (the token first)."""
    words = [table.words[(offset + k) & table.mask] for k in range(n)]
    lps = [-round(0.01 + ((offset + k) * 37 % 100) / 200, 4) for k in range(n)]

    def alternatives(k: int) -> list[tuple[str, float]]:
        return [(table.words[(offset + k + j) & table.mask], round(lps[k] - j, 4))
                for j in range(top)]

    if chat:
        return {"content": [
            {"token": w, "logprob": lp, "bytes": list(w.encode()),
             "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}
                              for t, v in alternatives(k)]}
            for k, (w, lp) in enumerate(zip(words, lps, strict=True))]}
    offsets, at = [], 0
    for w in words:
        offsets.append(at)
        at += len(w)
    return {"tokens": words, "token_logprobs": lps, "text_offset": offsets,
            "top_logprobs": [dict(alternatives(k)) for k in range(n)] if top else None}
