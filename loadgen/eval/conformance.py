"""API conformance: what a target really supports of the OpenAI API, each check a verdict
(yes / no / partial) with its evidence: the status, the first bytes (made plain, short) and
what differed. `tokentop probe --api` prints the table; the eval's `conformance` phase keeps
it (results.ConformanceFigures) and `eval compare` shows evals side by side
(conformance_table).

Each check is a small async function on one aiohttp session, bounded by a timeout (a hang is
"no answer in 10 s"); the checks run concurrently, a few at a time. Nothing is taken on
trust: a limit is judged by the usage the server reports, a stop by the text it sent, a JSON
answer by parsing it and checking the schema's required keys and types here (no jsonschema
dependency). Greedy decoding (temperature 0) gives the stop and min_tokens checks a text to
compare against; a server whose greedy text is not deterministic shows as "partial".

Headers (Authorization and --header's) come from the run's Secrets and are never printed;
every string from the server passes through loadgen.model.text.plain before it is kept.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from loadgen.eval.results import Check, ConformanceFigures, EvalState, Verdict
from loadgen.model.text import plain
from loadgen.run.preflight import TOKENIZE_PROBE, TokenizeFailed, find_tokenize
from probes.server_metrics import metrics_url_for, server_root

TIMEOUT_S = 10.0  # a check's requests together
PARALLEL = 4  # checks at once: a few short requests, not a load
EVIDENCE_CHARS = 80  # of a server's text, in evidence
PROMPT = "Count from one to twenty in words, separated by spaces."
MARKS = {"yes": "✓", "no": "✗", "partial": "~"}
NOT_RUN = "–"


class Unreachable(Exception):
    """The target cannot be reached at all; str(e) says why, in words."""


@dataclass
class Target:
    """Where the checks go, and what every request carries (never printed)."""

    url: str  # the OpenAI base URL, …/v1
    headers: dict[str, str] = field(default_factory=dict)
    model: str | None = None  # None: the first of /v1/models
    timeout_s: float = TIMEOUT_S
    metrics_url: str | None = None

    @property
    def base(self) -> str:
        return self.url.rstrip("/")

    @property
    def root(self) -> str:
        return server_root(self.url)


@dataclass
class Answer:
    """One HTTP answer: its status, its body's text and, when JSON, the decoded body."""

    status: int
    text: str
    body: Any = None

    def head(self) -> str:
        return short(self.text)

    def message(self) -> str:
        """The error's message, else the first bytes."""
        err = self.body.get("error") if isinstance(self.body, dict) else None
        msg = err.get("message") if isinstance(err, dict) else err
        return short(msg if isinstance(msg, str) and msg else self.text)


def short(text: object) -> str:
    return plain(text, EVIDENCE_CHARS)


class Failed(Exception):
    """A check that cannot go on: its verdict (no, partial) and evidence."""

    def __init__(self, evidence: str, verdict: Verdict = "no") -> None:
        super().__init__(evidence)
        self.verdict = verdict


class Probe:
    """One session's requests to the target, each answer checked for the basics."""

    def __init__(self, session: aiohttp.ClientSession, target: Target, model: str) -> None:
        self.session, self.target, self.model = session, target, model

    async def get(self, url: str) -> Answer:
        async with self.session.get(url, headers=self.target.headers) as r:
            return await _answer(r)

    async def post(self, url: str, body: Any, *, raw: bytes | None = None) -> Answer:
        headers = {"Content-Type": "application/json", **self.target.headers}
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(url, data=data, headers=headers) as r:
            if r.content_type == "text/event-stream":
                return Answer(r.status, (await r.read()).decode("utf-8", "replace"))
            return await _answer(r)

    async def chat(self, **extra: Any) -> Answer:
        body = {"model": self.model, "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 16, **extra}
        return await self.post(f"{self.target.base}/chat/completions", body)

    async def completion(self, **extra: Any) -> Answer:
        body = {"model": self.model, "prompt": PROMPT, "max_tokens": 16, **extra}
        return await self.post(f"{self.target.base}/completions", body)

    async def ok_chat(self, **extra: Any) -> tuple[dict, dict]:
        """A whole chat answer that is 200 with one choice at least: (body, its first choice)."""
        a = await self.chat(**extra)
        return ok(a), first_choice(a)


async def _answer(r: aiohttp.ClientResponse) -> Answer:
    raw = await r.read()
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = None
    return Answer(r.status, text, body)


def ok(a: Answer) -> dict:
    """The body of a 200 JSON object answer; Failed with the status and message if not."""
    if a.status != 200:
        raise Failed(f"HTTP {a.status}: {a.message()}")
    if not isinstance(a.body, dict):
        raise Failed(f"HTTP 200, not a JSON object: {a.head()}")
    return a.body


def first_choice(a: Answer) -> dict:
    choices = ok(a).get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise Failed(f"HTTP 200, no choices: {a.head()}")
    return choices[0]


def text_of(choice: dict) -> str:
    """A choice's text: a chat message's content, or a completion's text ("" if none)."""
    message = choice.get("message")
    value = message.get("content") if isinstance(message, dict) else choice.get("text")
    return value if isinstance(value, str) else ""


def completion_tokens(body: dict) -> int | None:
    usage = body.get("usage")
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def events(text: str) -> tuple[list[dict], bool]:
    """A stream's JSON events and whether it ended with [DONE]."""
    out, done = [], False
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out, done


def streamed_text(evs: list[dict], chat: bool) -> str:
    parts = []
    for e in evs:
        for c in e.get("choices") or []:
            if not isinstance(c, dict):
                continue
            piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
            if isinstance(piece, str):
                parts.append(piece)
    return "".join(parts)


# ---- the checks ---------------------------------------------------------------------------

Outcome = tuple[Verdict, str]
CheckFn = Callable[[Probe], Awaitable[Outcome]]


async def _models(p: Probe) -> Outcome:
    body = ok(await p.get(f"{p.target.base}/models"))
    data = body.get("data")
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if not ids:
        return "partial", f"HTTP 200 without a model list: {short(json.dumps(body))}"
    if p.model not in ids:
        return "partial", f"HTTP 200, {len(ids)} models, not {short(p.model)}"
    return "yes", f"HTTP 200: {short(', '.join(map(str, ids)))}"


async def _chat(p: Probe) -> Outcome:
    body, choice = await p.ok_chat()
    text = text_of(choice)
    if not text:
        return "partial", f"HTTP 200, no message content: {short(json.dumps(choice))}"
    return "yes", f"HTTP 200, {completion_tokens(body)} tokens: {short(text)}"


async def _completions(p: Probe) -> Outcome:
    a = await p.completion()
    body, choice = ok(a), first_choice(a)
    text = text_of(choice)
    if not text:
        return "partial", f"HTTP 200, no text: {short(json.dumps(choice))}"
    return "yes", f"HTTP 200, {completion_tokens(body)} tokens: {short(text)}"


async def _stream(p: Probe, *, chat: bool, **extra: Any) -> tuple[list[dict], bool, Answer]:
    a = await (p.chat if chat else p.completion)(stream=True, **extra)
    if a.status != 200:
        raise Failed(f"HTTP {a.status}: {a.message()}")
    evs, done = events(a.text)
    if not evs:
        raise Failed(f"HTTP 200, no SSE events: {a.head()}")
    return evs, done, a


def _streamed(chat: bool) -> CheckFn:
    async def check(p: Probe) -> Outcome:
        evs, done, _ = await _stream(p, chat=chat)
        text = streamed_text(evs, chat)
        if not text:
            return "partial", f"{len(evs)} events, no text in them"
        if not done:
            return "partial", f"{len(evs)} events, no data: [DONE] at the end: {short(text)}"
        return "yes", f"HTTP 200, {len(evs)} events and [DONE]: {short(text)}"
    return check


async def _include_usage(p: Probe) -> Outcome:
    evs, _, _ = await _stream(p, chat=True, stream_options={"include_usage": True})
    last = evs[-1]
    if isinstance(last.get("usage"), dict) and completion_tokens(last) is not None:
        empty = last.get("choices") == []
        return ("yes" if empty else "partial",
                f"the last event's usage: {completion_tokens(last)} completion tokens"
                + ("" if empty else " (on a chunk with choices, not its own)"))
    return "no", f"no usage in the last event: {short(json.dumps(last))}"


async def _continuous_usage(p: Probe) -> Outcome:
    evs, _, _ = await _stream(p, chat=True, stream_options={
        "include_usage": True, "continuous_usage_stats": True})
    content = [e for e in evs if e.get("choices")]
    with_usage = [e for e in content if isinstance(e.get("usage"), dict)]
    if content and len(with_usage) == len(content):
        return "yes", f"usage on all {len(content)} chunks with choices"
    if with_usage:
        return "partial", f"usage on {len(with_usage)} of {len(content)} chunks with choices"
    return "no", f"usage on none of {len(content)} chunks with choices (only at the end)"


def _limit(key: str) -> CheckFn:
    async def check(p: Probe) -> Outcome:
        limit = 6
        extra = {key: limit, "ignore_eos": True}
        if key != "max_tokens":
            extra["max_tokens"] = None  # only the newer name limits
        body, _ = await p.ok_chat(**extra)
        n = completion_tokens(body)
        if n is None:
            return "partial", "HTTP 200 without usage.completion_tokens: cannot judge"
        if n > limit:
            return "no", f"completion_tokens {n} > {key} {limit}"
        return "yes", f"completion_tokens {n} ≤ {key} {limit}"
    return check


async def _ignore_eos(p: Probe) -> Outcome:
    want = 24
    body, choice = await p.ok_chat(max_tokens=want, ignore_eos=True)
    n = completion_tokens(body)
    if n == want:
        return "yes", f"completion_tokens {n} = max_tokens {want}"
    return "no", (f"completion_tokens {n} < max_tokens {want} "
                  f"(finish_reason {short(choice.get('finish_reason'))})")


async def _greedy(p: Probe) -> str:
    """The greedy answer a stop is picked from: 16 tokens, ignore_eos."""
    _, choice = await p.ok_chat(temperature=0, ignore_eos=True)
    text = text_of(choice)
    if len(text.split()) < 4:
        raise Failed(f"the greedy answer is too short to pick a stop in: {short(text)}",
                     "partial")
    return text


def pick_stop(text: str, at: int) -> str:
    """A word of `text` from its `at`-th on (with its leading space) whose first match is
    there, not inside an earlier word: the server must stop before it."""
    words = text.split(" ")
    for i in range(max(1, at), len(words)):
        stop = " " + words[i]
        if words[i] and text.find(stop) == len(" ".join(words[:i])):
            return stop
    raise Failed(f"no word of the greedy answer fits as a stop: {short(text)}", "partial")


async def _stop(p: Probe) -> Outcome:
    text = await _greedy(p)
    stop = pick_stop(text, 3)
    _, choice = await p.ok_chat(temperature=0, ignore_eos=True, stop=[stop])
    got = text_of(choice)
    if stop in got:
        return "no", f"the text went past the stop {stop.strip()!r}: {short(got)}"
    if not text.startswith(got.rstrip()):
        return "partial", f"stopped, but not on the greedy text: {short(got)}"
    return "yes", (f"stopped before {stop.strip()!r} (finish_reason "
                   f"{short(choice.get('finish_reason'))}): {short(got)}")


async def _min_tokens(p: Probe) -> Outcome:
    text = await _greedy(p)
    stop, want = pick_stop(text, 1), 8
    body, _ = await p.ok_chat(temperature=0, stop=[stop], min_tokens=want)
    n = completion_tokens(body)
    if n is None:
        return "partial", "HTTP 200 without usage.completion_tokens: cannot judge"
    if n < want:
        return "no", f"completion_tokens {n} < min_tokens {want} (a stop at {stop.strip()!r})"
    return "yes", f"completion_tokens {n} ≥ min_tokens {want}, a stop at {stop.strip()!r} aside"


async def _n(p: Probe) -> Outcome:
    body = ok(await p.chat(n=2))
    choices = body.get("choices") or []
    indexes = sorted(c.get("index") for c in choices if isinstance(c, dict))
    if indexes == [0, 1]:
        return "yes", "2 choices, index 0 and 1"
    return "no", f"{len(choices)} choice{'s' if len(choices) != 1 else ''} of n = 2"


async def _logprobs(p: Probe) -> Outcome:
    _, choice = await p.ok_chat(logprobs=True, top_logprobs=2)
    lp = choice.get("logprobs")
    tokens = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(tokens, list) or not tokens:
        return "no", f"no logprobs.content: {short(json.dumps(lp))}"
    good = [t for t in tokens if isinstance(t, dict) and isinstance(t.get("logprob"), int | float)
            and t["logprob"] <= 0]
    tops = [t for t in good if isinstance(t.get("top_logprobs"), list)
            and len(t["top_logprobs"]) == 2]
    if len(good) < len(tokens):
        return "partial", f"{len(tokens) - len(good)} of {len(tokens)} tokens without a logprob ≤ 0"
    if len(tops) < len(tokens):
        return "partial", f"logprobs, but top_logprobs of 2 on {len(tops)} of {len(tokens)} tokens"
    return "yes", f"{len(tokens)} tokens, each a logprob ≤ 0 and 2 top_logprobs"


async def _seed(p: Probe) -> Outcome:
    # three, not two: a sampler that ignores the seed may still repeat itself once
    args = {"temperature": 0.9, "seed": 1234, "max_tokens": 12, "ignore_eos": True}
    answers = await asyncio.gather(*(p.ok_chat(**args) for _ in range(3)))
    texts = [text_of(choice) for _, choice in answers]
    if len(set(texts)) == 1:
        return "yes", f"the same text three times at temperature 0.9: {short(texts[0])}"
    other = next(t for t in texts if t != texts[0])
    return "no", f"{len(set(texts))} texts of 3 at seed 1234: {texts[0][:36]} | {other[:36]}"


async def _json_object(p: Probe) -> Outcome:
    _, choice = await p.ok_chat(response_format={"type": "json_object"}, max_tokens=48,
                                messages=[{"role": "user", "content": "Answer in JSON: " + PROMPT}])
    text = text_of(choice)
    try:
        value = json.loads(text)
    except ValueError:
        return _not_json(text, choice)
    if not isinstance(value, dict):
        return "partial", f"JSON, not an object: {short(text)}"
    return "yes", f"a JSON object: {short(text)}"


def _not_json(text: str, choice: dict) -> Outcome:
    """A text that does not parse: an object cut off at max_tokens is the model's length, not
    the server ignoring the format (a constrained small model may ramble inside a string)."""
    if text.lstrip().startswith("{") and choice.get("finish_reason") == "length":
        return "partial", f"an object cut off at max_tokens before it closed: {short(text)}"
    return "no", f"not JSON: {short(text)}"


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "count": {"type": "integer"}},
          "required": ["name", "count"]}
_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,),
                                       "number": (int, float), "boolean": (bool,),
                                       "object": (dict,), "array": (list,)}


def misfits(value: Any, schema: dict) -> list[str]:
    """What of `schema`'s required keys and their types `value` lacks (top level)."""
    if not isinstance(value, dict):
        return ["not an object"]
    out = []
    for key in schema.get("required", []):
        if key not in value:
            out.append(f"no {key!r}")
            continue
        kind = schema["properties"][key].get("type")
        v = value[key]
        wrong = not isinstance(v, _TYPES.get(kind, (object,))) or (
            kind in ("integer", "number") and isinstance(v, bool))
        if wrong:
            out.append(f"{key!r} not {kind}")
    return out


async def _json_schema(p: Probe) -> Outcome:
    fmt = {"type": "json_schema", "json_schema": {"name": "counted", "schema": SCHEMA}}
    _, choice = await p.ok_chat(response_format=fmt, max_tokens=48)
    text = text_of(choice)
    try:
        value = json.loads(text)
    except ValueError:
        return _not_json(text, choice)
    wrong = misfits(value, SCHEMA)
    if wrong:
        return "partial", f"JSON that does not fit the schema ({', '.join(wrong)}): {short(text)}"
    return "yes", f"fits the schema: {short(text)}"


TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


async def _tools(p: Probe) -> Outcome:
    choice_of = {"type": "function", "function": {"name": "get_weather"}}
    _, choice = await p.ok_chat(tools=[TOOL], tool_choice=choice_of, max_tokens=48,
                                messages=[{"role": "user", "content": "The weather in Oslo?"}])
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return "no", f"no tool_calls: {short(text_of(choice) or json.dumps(choice))}"
    fn = calls[0].get("function") if isinstance(calls[0], dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    args = fn.get("arguments") if isinstance(fn, dict) else None
    if name != "get_weather" or not isinstance(args, str):
        return "partial", f"a tool call of another shape: {short(json.dumps(calls[0]))}"
    try:
        parsed = json.loads(args)
    except ValueError:
        return "partial", f"get_weather, its arguments not JSON: {short(args)}"
    if not isinstance(parsed, dict):
        return "partial", f"get_weather, its arguments not an object: {short(args)}"
    return "yes", f"get_weather({short(args)}), finish_reason {short(choice.get('finish_reason'))}"


def _refused(a: Answer, what: str) -> Outcome:
    if 400 <= a.status < 500:
        msg = a.message()
        return ("yes" if msg else "partial"), f"HTTP {a.status}: {msg or 'no message'}"
    return "no", f"HTTP {a.status} for {what}: {a.message()}"


async def _too_long(p: Probe) -> Outcome:
    limit = await _context_length(p)
    words = (limit or 200_000) + 64
    body = {"model": p.model, "messages": [{"role": "user", "content": "hi " * words}],
            "max_tokens": 4}
    return _refused(await p.post(f"{p.target.base}/chat/completions", body),
                    f"a prompt of {words:,} words")


async def _context_length(p: Probe) -> int | None:
    """The model's context from /v1/models (vLLM's max_model_len, llama.cpp's meta)."""
    try:
        body = (await p.get(f"{p.target.base}/models")).body
        for m in body.get("data", []):
            if m.get("id") == p.model:
                n = m.get("max_model_len") or (m.get("meta") or {}).get("n_ctx_train")
                return n if isinstance(n, int) and n > 0 else None
    except (AttributeError, TypeError, aiohttp.ClientError):
        return None
    return None


async def _unknown_model(p: Probe) -> Outcome:
    body = {"model": "tokentop-no-such-model", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}
    return _refused(await p.post(f"{p.target.base}/chat/completions", body), "an unknown model")


async def _malformed(p: Probe) -> Outcome:
    return _refused(await p.post(f"{p.target.base}/chat/completions", None,
                                 raw=b'{"model": "x", "messages": [}'), "a malformed body")


async def _tokenize(p: Probe) -> Outcome:
    """Whether `--tokenizer server` can count with the target: its endpoint found as the run
    finds it, in whichever shape the server takes (llama.cpp answers vLLM's shape with 200
    and no tokens, so a first answer's status says nothing)."""
    found = await find_tokenize(p.session, p.target.base, p.model, None,
                                tuple(p.target.headers.items()))
    if found is None:
        return "no", (f"no POST /tokenize that counts {TOKENIZE_PROBE!r} in vLLM's, "
                      "llama.cpp's or TGI's shape")
    try:
        tokens = await found.one(TOKENIZE_PROBE)
    except TokenizeFailed as e:  # it counted a moment ago
        return "no", f"{found}: {e}"
    path = found.url.removeprefix(p.target.root)
    return "yes", (f"HTTP 200, {tokens} tokens for {TOKENIZE_PROBE!r} ({found.shape}'s "
                   f"shape, {path})")


async def _metrics(p: Probe) -> Outcome:
    a = await p.get(p.target.metrics_url or metrics_url_for(p.target.url))
    if a.status != 200:
        return "no", f"HTTP {a.status}: {a.message()}"
    samples = [ln for ln in a.text.splitlines() if ln and not ln.startswith("#")]
    if not samples:
        return "partial", f"HTTP 200 without a sample: {a.head()}"
    return "yes", f"HTTP 200, {len(samples)} samples: {short(samples[0])}"


async def _health(p: Probe) -> Outcome:
    a = await p.get(f"{p.target.root}/health")
    return ("yes", f"HTTP {a.status}") if a.status == 200 else (
        "no", f"HTTP {a.status}: {a.message()}")


@dataclass(frozen=True)
class Spec:
    id: str
    name: str
    run: CheckFn


# the checks, in the table's order
CHECKS: tuple[Spec, ...] = (
    Spec("models", "/v1/models lists the model", _models),
    Spec("chat", "chat completions", _chat),
    Spec("chat.stream", "chat completions, streamed", _streamed(chat=True)),
    Spec("completions", "completions", _completions),
    Spec("completions.stream", "completions, streamed", _streamed(chat=False)),
    Spec("usage", "stream_options.include_usage", _include_usage),
    Spec("usage.continuous", "usage on every chunk (continuous_usage_stats)", _continuous_usage),
    Spec("max_tokens", "max_tokens", _limit("max_tokens")),
    Spec("max_completion_tokens", "max_completion_tokens", _limit("max_completion_tokens")),
    Spec("stop", "stop sequences", _stop),
    Spec("n", "n > 1 choices", _n),
    Spec("logprobs", "logprobs and top_logprobs", _logprobs),
    Spec("seed", "seed: the same text at temperature > 0", _seed),
    Spec("json_object", "response_format json_object", _json_object),
    Spec("json_schema", "response_format json_schema", _json_schema),
    Spec("tools", "tools and tool_choice", _tools),
    Spec("ignore_eos", "ignore_eos", _ignore_eos),
    Spec("min_tokens", "min_tokens", _min_tokens),
    Spec("errors.too_long", "an over-long prompt: a 4xx", _too_long),
    Spec("errors.unknown_model", "an unknown model: a 4xx", _unknown_model),
    Spec("errors.malformed", "a malformed body: a 4xx", _malformed),
    Spec("tokenize", "/tokenize", _tokenize),
    Spec("metrics", "/metrics", _metrics),
    Spec("health", "/health", _health),
)
NAMES = {s.id: s.name for s in CHECKS}


# ---- running ------------------------------------------------------------------------------


async def run_checks(target: Target) -> ConformanceFigures:
    """Every check against `target`; Unreachable when it cannot be reached at all."""
    timeout = aiohttp.ClientTimeout(total=target.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        model = target.model or await _first_model(session, target)
        probe = Probe(session, target, model or "default")
        gate = asyncio.Semaphore(PARALLEL)
        checks = await asyncio.gather(*(_one(probe, spec, gate) for spec in CHECKS))
    return ConformanceFigures(model=None if model is None else short(model), checks=checks)


async def _first_model(session: aiohttp.ClientSession, target: Target) -> str | None:
    """The first model /v1/models names (None: it names none); Unreachable when the
    target does not answer at all."""
    try:
        async with session.get(f"{target.base}/models", headers=target.headers) as r:
            body = await r.json(content_type=None) if r.status == 200 else None
    except (aiohttp.ClientConnectionError, TimeoutError) as e:
        raise Unreachable(f"{target.url} does not answer ({_why(e)})") from None
    except ValueError:
        return None
    data = body.get("data") if isinstance(body, dict) else None
    ids = [m.get("id") for m in data or [] if isinstance(m, dict)]
    return next((i for i in ids if isinstance(i, str)), None)


def _why(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return short(getattr(e, "os_error", None) or e) or type(e).__name__


async def _one(probe: Probe, spec: Spec, gate: asyncio.Semaphore) -> Check:
    """One check, bounded by the timeout; whatever goes wrong is its evidence."""
    async with gate:
        try:
            verdict, evidence = await asyncio.wait_for(spec.run(probe), probe.target.timeout_s)
        except Failed as e:
            verdict, evidence = e.verdict, str(e)
        except TimeoutError:
            verdict, evidence = "no", f"no answer in {probe.target.timeout_s:g} s"
        except aiohttp.ClientError as e:
            verdict, evidence = "no", f"the request failed: {_why(e)}"
        except (ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
            # a body of a shape no check expected: said, never a traceback
            verdict, evidence = "no", f"an answer of an unexpected shape ({type(e).__name__})"
    return Check(id=spec.id, name=spec.name, verdict=verdict, evidence=plain(evidence, 160))


# ---- tables -------------------------------------------------------------------------------


def table(figures: ConformanceFigures) -> list[str]:
    """The checks as text lines: the mark, the check, its evidence."""
    width = max(len(c.name) for c in figures.checks) if figures.checks else 0
    head = f"API conformance ({figures.model or 'no model named'}): ✓ yes  ✗ no  ~ partial"
    return [head, *(f"{MARKS[c.verdict]} {c.name:<{width}}  {c.evidence}"
                    for c in figures.checks)]


def conformance_table(evals: Sequence[tuple[str, EvalState]]) -> list[str]:
    """`eval compare`'s feature table: a row per check, a column per eval (✓ ✗ ~, and –
    where the eval has no such check: the phase did not run, or an older eval)."""
    verdicts = [_verdicts(state) for _, state in evals]
    ids = [s.id for s in CHECKS]
    ids += sorted({i for v in verdicts for i in v} - set(ids))  # a later tokentop's checks
    ids = [i for i in ids if any(i in v for v in verdicts)]
    if not ids:
        return []
    names = [NAMES.get(i, i) for i in ids]
    width = max(map(len, names))
    labels = [plain(label, 24) for label, _ in evals]
    cols = [max(len(label), 1) for label in labels]
    lines = ["API conformance: ✓ yes  ✗ no  ~ partial  – not checked",
             " ".join([" " * width, *(f"{lab:^{w}}" for lab, w in zip(labels, cols, strict=True))])]
    for i, name in zip(ids, names, strict=True):
        marks = [MARKS.get(v.get(i, ""), NOT_RUN) for v in verdicts]
        lines.append(" ".join([f"{name:<{width}}",
                               *(f"{m:^{w}}" for m, w in zip(marks, cols, strict=True))]))
    return lines


def _verdicts(state: EvalState) -> dict[str, str]:
    r = state.phases.conformance
    if r is None or r.figures is None:
        return {}
    return {c.id: c.verdict for c in r.figures.checks}
