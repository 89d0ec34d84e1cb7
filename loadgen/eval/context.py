"""Strong scaling and context length (the eval's `context` phase): an input-length and an
output-length ladder at a fixed concurrency; TTFT and prefill tok/s against input length,
ITL against context, the longest prompt served.

Fixed resources, a growing problem: each rung is one run through the Session (as the
baseline's, its lengths fixed, exact where the load's tokenizer makes them so), read with
soak_report. "As the model allows": the server's stated max context (vLLM's and SGLang's
/v1/models max_model_len, llama.cpp's /props n_ctx or its /v1/models meta) keeps a rung
whose input + output would not fit from being sent; its figures then say why. Where the
server states nothing, the rung is sent and its refusals (4xx) say it.

The longest prompt served is the longest input rung with a request served; when a longer
rung was refused, or the stated max lies past it, single requests (at most BISECT_MAX)
bisect up to the first refusal or the max, each prompt's length as the server's usage
counts it. Every string from the server is made plain before it is kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from loadgen.analysis.report import soak_report
from loadgen.eval.phase_run import Eval, phase_cfg, run_session
from loadgen.eval.plan import Context
from loadgen.eval.results import (
    ContextFigures,
    ContextRung,
    LongestPrompt,
    PhaseResult,
    done,
    skipped,
)
from loadgen.model.text import plain
from loadgen.worker.workload import PROMPT_WORDS
from probes.server_metrics import server_root

BISECT_MAX = 12  # single requests past the ladder: (hi − lo) / 4096 left unresolved at worst
ASK_TIMEOUT_S = 5.0  # each question about the max context
MESSAGE_CHARS = 120  # of a server's refusal, kept in a note
STOP_ERROR_RATE = 0.5  # a rung whose requests mostly fail (too long) stops early


async def run(ev: Eval) -> PhaseResult:
    """The context phase's result."""
    p = ev.phases.context
    if not p.enabled:
        return skipped("disabled in the plan")
    headers = ev.secrets.request_headers()
    async with aiohttp.ClientSession() as http:
        stated = await stated_max(http, ev.url, ev.cfg.model, headers)
    inputs = [await _rung(ev, p, n, p.fixed_output, stated) for n in p.input_ladder]
    outputs = [await _rung(ev, p, p.fixed_input, n, stated) for n in p.output_ladder]
    target = Target(url=ev.url, headers=headers, api=ev.cfg.api,
                    model=stated.model or ev.cfg.model or "",
                    timeout_s=min(ev.cfg.request_timeout, 600.0))
    longest = await longest_prompt(target, inputs, p.fixed_output, stated.tokens)
    return done(ContextFigures(
        concurrency=p.concurrency, max_context=stated.tokens, max_context_from=stated.source,
        input_ladder=inputs, output_ladder=outputs, longest=longest))


# ---- the server's stated max context --------------------------------------------------------


@dataclass(frozen=True)
class Stated:
    tokens: int | None  # the max context, tokens (prompt + output)
    source: str  # where it was read, or why there is none
    model: str | None = None  # the model it is of (the asked one, else the first served)


async def stated_max(http: aiohttp.ClientSession, url: str, model: str | None,
                     headers: dict[str, str]) -> Stated:
    """The max context the server states: vLLM's (and SGLang's) max_model_len in
    /v1/models, else llama.cpp's per-slot n_ctx in /props, else llama.cpp's /v1/models
    meta n_ctx_train (the model's, maybe more than the server gives a slot: a refusal
    then says so); Stated(None, why) when it states none."""
    models = await _json(http, url.rstrip("/") + "/models", headers)
    entries = models.get("data") if isinstance(models, dict) else None
    entries = [m for m in entries if isinstance(m, dict)] if isinstance(entries, list) else []
    entry = next((m for m in entries if m.get("id") == model), None) if model else None
    entry = entry or (entries[0] if entries else {})
    served = plain(entry["id"], 200) if isinstance(entry.get("id"), str) else model
    if (n := _tokens(entry.get("max_model_len"))) is not None:
        return Stated(n, "GET /models max_model_len", served)
    props = await _json(http, server_root(url) + "/props", headers)
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if isinstance(settings, dict) and (n := _tokens(settings.get("n_ctx"))) is not None:
        return Stated(n, "GET /props n_ctx", served)
    meta = entry.get("meta")
    if isinstance(meta, dict) and (n := _tokens(meta.get("n_ctx_train"))) is not None:
        return Stated(n, "GET /models meta n_ctx_train", served)
    return Stated(None, "the server states no max context (/models, /props)", served)


def _tokens(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


async def _json(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Any:
    """The JSON at `url`, or None (no answer, not 200, not JSON): a question, not a check."""
    try:
        async with http.get(url, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)) as r:
            if r.status != 200:
                return None
            return json.loads(await r.read())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


# ---- a rung ----------------------------------------------------------------------------------


def fits(input_tokens: int, output_tokens: int, stated: int | None) -> str:
    """Why the rung is not sent ("" when it is): input + output past the stated max."""
    if stated is None or input_tokens + output_tokens <= stated:
        return ""
    return (f"not sent: {input_tokens:,} in + {output_tokens:,} out > the server's max "
            f"context of {stated:,} tokens")


async def _rung(ev: Eval, p: Context, input_tokens: int, output_tokens: int,
                stated: Stated) -> ContextRung:
    why = fits(input_tokens, output_tokens, stated.tokens)
    if why:
        return ContextRung(input_tokens=input_tokens, output_tokens=output_tokens, sent=False,
                           why=why)
    name = f"context-in{input_tokens}-out{output_tokens}"
    # the rung's lengths exactly (synthetic prompts, every output to its max_tokens); a rung
    # the server refuses stops once most of its requests failed
    cfg = msgspec.structs.replace(
        phase_cfg(ev, name, mode="closed", concurrency=p.concurrency, rate=1.0,
                  duration=float(p.step_duration), warmup=float(p.step_warmup),
                  stop_error_rate=STOP_ERROR_RATE),
        dataset="synthetic", input_tokens=str(input_tokens), output_tokens=str(output_tokens),
        ignore_eos=True, turns=1, shared_prefix=0)
    run_dir = await run_session(ev, f"context {input_tokens} in, {output_tokens} out", cfg)
    return rung_of(run_dir, input_tokens, output_tokens)


def rung_of(run_dir, input_tokens: int, output_tokens: int) -> ContextRung:
    """What a rung's run measured."""
    r, _ = soak_report(run_dir, warnings=[])
    measured = r.measured_requests
    ok = measured.ok if measured is not None else r.requests.ok
    failed = measured.failed if measured is not None else r.requests.failed
    ttft, itl = r.latency_ms.get("ttft"), r.latency_ms.get("itl")
    p50 = ttft.get("p50") if ttft else None
    errors = dict(r.requests.errors)
    why = ""
    if not r.requests.ok:
        kinds = ", ".join(f"{n}× {k}" for k, n in sorted(errors.items()))
        why = f"no request served ({kinds or 'none ended'})"
    return ContextRung(
        input_tokens=input_tokens, output_tokens=output_tokens, sent=True, why=why,
        requests_ok=ok, requests_failed=failed, errors=errors,
        ttft_ms=ttft if ttft and ttft.get("count") else None,
        itl_ms=itl if itl and itl.get("count") else None,
        prefill_tok_s=input_tokens / (p50 / 1000.0) if p50 else None,
        output_tok_s=r.rates.output_tok_s, error_rate=r.rates.error_rate, run_dir=str(run_dir))


def refused(rung: ContextRung) -> bool:
    """The server said no to every request of the rung, and said it with a 4xx (too long)."""
    return rung.sent and not rung.requests_ok and rung.errors.get("http_4xx", 0) > 0


# ---- the longest prompt served ---------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    url: str  # the OpenAI base URL, …/v1
    headers: dict[str, str]
    api: str  # chat | completions
    model: str
    timeout_s: float


class Reply(msgspec.Struct, frozen=True):
    """One single request's outcome: served (its prompt as the server counted it), refused
    (a 4xx, its message), or neither (no answer, a 5xx: the bisection stops there)."""

    served: bool
    refused: bool
    prompt_tokens: int | None = None
    message: str = ""


async def ask(http: aiohttp.ClientSession, t: Target, words: int, output_tokens: int) -> Reply:
    """One whole (not streamed) request with a prompt of `words` words, one token each in
    most tokenizers; the server's usage says how many tokens it was."""
    text = " ".join(PROMPT_WORDS[i % len(PROMPT_WORDS)] for i in range(words))
    body: dict[str, Any] = {"model": t.model, "max_tokens": output_tokens, "stream": False}
    if t.api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    path = "/chat/completions" if t.api == "chat" else "/completions"
    try:
        async with http.post(t.url.rstrip("/") + path, json=body, headers=t.headers,
                             timeout=aiohttp.ClientTimeout(total=t.timeout_s)) as r:
            raw = await r.read()
            status = r.status
    except (aiohttp.ClientError, TimeoutError) as e:
        return Reply(served=False, refused=False,
                     message=plain(f"no answer: {type(e).__name__} {e}", MESSAGE_CHARS))
    answer = _decoded(raw)
    if status == 200:
        usage = answer.get("usage") if isinstance(answer, dict) else None
        counted = _tokens(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
        return Reply(served=True, refused=False, prompt_tokens=counted or words)
    err = answer.get("error") if isinstance(answer, dict) else None
    msg = err.get("message") if isinstance(err, dict) else err
    said = plain(msg if isinstance(msg, str) and msg else raw[:MESSAGE_CHARS].decode("utf-8",
                                                                                    "replace"),
                 MESSAGE_CHARS)
    return Reply(served=False, refused=400 <= status < 500, message=f"HTTP {status}: {said}")


def _decoded(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


async def longest_prompt(t: Target, inputs: list[ContextRung], output_tokens: int,
                         stated: int | None) -> LongestPrompt:
    """The longest prompt served with `output_tokens` out: the longest input rung served,
    then, past it, bisection by single requests up to the shortest rung refused or the
    stated max (its cap first: a server that serves it has its max exactly)."""
    served = [r.input_tokens for r in inputs if r.sent and r.requests_ok]
    if not served:
        whys = "; ".join(f"{r.input_tokens:,}: {r.why}" for r in inputs if r.why)
        return LongestPrompt(tokens=None, how=f"no input rung was served ({whys})")
    lo = max(served)
    above = [r for r in inputs if r.input_tokens > lo]
    no = [r.input_tokens for r in above if refused(r)]
    cap = stated - output_tokens if stated is not None else None
    # the stated max lies past the longest rung served (the ladder stops short of it, or its
    # next rung was not sent): asked, so the row is the server's max, not the ladder's
    past_ladder = cap is not None and cap > lo
    if not no and not past_ladder:
        if not above:
            states = "no max context" if stated is None else f"{stated:,} tokens at most"
            return LongestPrompt(tokens=lo, how=f"the ladder's longest rung (the server states "
                                                f"{states})")
        return LongestPrompt(tokens=lo, how=f"the longest rung served; {above[0].input_tokens:,}"
                                            f": {above[0].why or 'not served'}")
    async with aiohttp.ClientSession() as http:
        return await _bisect(http, t, lo, min(no) if no else None, cap, output_tokens)


async def _bisect(http: aiohttp.ClientSession, t: Target, lo: int, no: int | None,
                  cap: int | None, output_tokens: int) -> LongestPrompt:
    """Between `lo` (served) and the first refusal `no` or the stated cap: the cap asked
    first (served: that is the longest), then halves, at most BISECT_MAX requests."""
    best, probes, said = lo, 0, ""
    hi = no
    if cap is not None and cap > lo and (no is None or cap < no):
        reply = await ask(http, t, cap, output_tokens)
        probes += 1
        if reply.served:
            return LongestPrompt(tokens=reply.prompt_tokens, probes=probes, refused_at=no,
                                 how="the stated max context less the output, served")
        if not reply.refused:
            return LongestPrompt(tokens=best, probes=probes, refused_at=no,
                                 how=f"the longest rung served; asking past it: {reply.message}")
        hi, said = cap, reply.message
    assert hi is not None  # a refused rung or the refused cap
    while hi - lo > 1 and probes < BISECT_MAX:
        mid = (lo + hi) // 2
        reply = await ask(http, t, mid, output_tokens)
        probes += 1
        if reply.served:
            lo, best = mid, reply.prompt_tokens or mid
        elif reply.refused:
            hi, said = mid, reply.message
        else:
            return LongestPrompt(tokens=best, probes=probes, refused_at=hi,
                                 how=f"bisection stopped: {reply.message}")
    within = "exactly" if hi - lo <= 1 else f"within {hi - lo - 1:,} tokens"
    return LongestPrompt(tokens=best, probes=probes, refused_at=hi,
                         how=f"bisected by {probes} single requests, {within}; refused "
                             f"past it: {said}")
