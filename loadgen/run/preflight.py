"""Before any load: is the target an OpenAI-compatible server, which model, and how are
token lengths known (--tokenizer)?

Every failure here becomes one sentence a user can act on (TargetError),
never a traceback: a wrong URL, a dead server, a missing /v1, a wrong model.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

import aiohttp

from loadgen.model.notice import Notice, Say
from loadgen.model.text import plain
from loadgen.worker.tokenizer import (
    TOKENIZER_CHOICES,
    Lengths,
    TokenizerError,
    one_token_words,
    path_lengths,
)
from loadgen.worker.workload import PROMPT_WORDS  # what synthetic prompts draw on


class TargetError(Exception):
    """The target cannot be used; str(e) is the message for the user."""


class Unreachable(TargetError):
    """Nothing answered at the target's address (refused, no route, no answer in time):
    a server that is not up yet looks like this, so it is worth waiting for."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # "connection refused", in words, for the waiting line


Headers = Sequence[tuple[str, str]]  # --header's (name, value) pairs


def target_headers(authorization: str | None, headers: Headers = ()) -> dict[str, str]:
    """The headers of a request to the target: its Authorization and --header's others."""
    out = dict(headers)
    if authorization:
        out["Authorization"] = authorization
    return out


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"not an http(s) URL: {url!r} (expected e.g. http://127.0.0.1:8000/v1)")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise TargetError(f"bad port in URL: {url!r}") from None
    return url.rstrip("/")


async def resolve_model(
    session: aiohttp.ClientSession, base_url: str, model: str | None, authorization: str | None,
    headers: Headers = (),
) -> str:
    """The model to use: the one asked for if served, else the server's first. `headers`:
    --header's others (Secrets.other_headers()), on every request to the target."""
    served = await list_models(session, base_url, authorization, headers=headers)
    if model is None:
        if not served:
            raise TargetError(f"{base_url} serves no models (GET /models returned an empty list)")
        return served[0]
    if model not in served:
        raise TargetError(
            f"model {model!r} is not served by {base_url}; it serves: {', '.join(served) or 'none'}"
        )
    return model


PROBE_TIMEOUT_S = 10.0  # how long GET /models may take before the target counts as silent
MODEL_ID_LIMIT = 200  # characters of a served model id kept (outside text, made plain)


async def list_models(
    session: aiohttp.ClientSession, base_url: str, authorization: str | None,
    timeout: float = PROBE_TIMEOUT_S, headers: Headers = (),
) -> list[str]:
    """The served model ids, made plain where they enter (a server's text: an escape
    sequence in one must not reach a terminal or a file)."""
    url = f"{base_url}/models"
    try:
        async with session.get(url, headers=target_headers(authorization, headers),
                               timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            if r.status in (401, 403):
                raise TargetError(
                    f"{base_url} refused the API key (HTTP {r.status}); "
                    "set OPENAI_API_KEY or use --api-key-file"
                )
            if r.status == 404:
                hint = "" if base_url.endswith("/v1") else " (did you forget the /v1 at the end?)"
                raise TargetError(
                    f"{base_url} does not look like an OpenAI-compatible API: "
                    f"GET /models returned 404{hint}"
                )
            if r.status != 200:
                raise TargetError(f"{base_url}: GET /models returned HTTP {r.status}")
            body = await r.json(content_type=None)
    except aiohttp.ClientConnectorError as e:
        reason = _why(e)
        raise Unreachable(f"cannot reach {base_url}: {reason}", reason) from None
    except TimeoutError:
        raise Unreachable(f"no answer from {base_url} within {timeout:.3g} s",
                          "no answer") from None
    except (aiohttp.ClientError, ValueError) as e:  # its words may quote the server's
        raise TargetError(f"{base_url} did not answer like an OpenAI server: "
                          f"{plain(e, MODEL_ID_LIMIT)}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise TargetError(
            f"{base_url} does not look like an OpenAI-compatible API: "
            "GET /models did not return a model list"
        )
    return [plain(m["id"], MODEL_ID_LIMIT) for m in data if isinstance(m, dict) and "id" in m]


def _why(e: aiohttp.ClientConnectorError) -> str:
    """Why a connection failed, in the same words on every event loop ("connection
    refused": asyncio's own strerror is "Connect call failed (...)", uvloop's the OS's)."""
    err = e.os_error
    if err is not None and err.errno:
        return os.strerror(err.errno).lower()
    return (err.strerror if err is not None and err.strerror else str(e)).lower()


PROBE_EVERY_S = 2.0  # while the target does not answer, how often to ask again
LAST_PROBE_S = 0.25  # the least a probe is given: how far past its bound a wait may end


async def wait_for_target(base_url: str, authorization: str | None, say: Say,
                          give_up_after: float | None, every: float = PROBE_EVERY_S,
                          headers: Headers = ()) -> None:
    """Return as soon as anything answers at `base_url` (whether it is the right server is
    resolve_model's to say). While nothing does, say so once and ask again every `every` s;
    after `give_up_after` s (None: never) raise TargetError, so a wrong URL in a script
    ends instead of hanging. Said again once it answers.

    The bound holds probes included: no probe outlives the wait (a listener that accepts
    and never answers gets what is left of it, at least LAST_PROBE_S), so the wait ends
    by `give_up_after` + LAST_PROBE_S."""
    started = time.monotonic()
    deadline = None if give_up_after is None else started + give_up_after
    waiting = False
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                await list_models(session, base_url, authorization,
                                  timeout=_probe_timeout(deadline), headers=headers)
            except Unreachable as e:
                waited = time.monotonic() - started
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TargetError(f"{e}; gave up after waiting {waited:.0f} s" if waiting
                                      else str(e)) from None
                if not waiting:
                    say(Notice("waiting", f"waiting for {base_url} ({e.reason}); retrying "
                               f"every {every:g} s"))
                    waiting = True
                # the last try falls at the end of the wait, not an interval before it
                await asyncio.sleep(every if left is None else min(every, left))
                continue
            except TargetError:
                pass  # it answered, but not as it should: the real check says how
            if waiting:
                say(Notice("up", f"{base_url} answers after {time.monotonic() - started:.0f} s; "
                           "starting the run"))
            return


def _probe_timeout(deadline: float | None) -> float:
    """A probe's time: PROBE_TIMEOUT_S, but never past the wait's deadline (LAST_PROBE_S at
    the least: a probe of no time would be no probe)."""
    if deadline is None:
        return PROBE_TIMEOUT_S
    return min(PROBE_TIMEOUT_S, max(deadline - time.monotonic(), LAST_PROBE_S))


# ---- --tokenizer: exact lengths by a local tokenizer or the server's /tokenize ---------------

TOKENIZE_TIMEOUT_S = 10.0
TOKENIZE_CONCURRENCY = 16  # the one-token-word search asks a few hundred times at most
TOKENIZE_PROBE = "hello world"


class TokenizeFailed(Exception):
    """The server's tokenize endpoint did not answer as it should; str(e) says how, `status`
    is the HTTP status when one came (None: no answer, or one that is not a count)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerTokenize:
    """One tokenize endpoint of the target and the body shape it takes: vLLM's and SGLang's
    {"model", "prompt", "add_special_tokens": false} → {"count", "tokens"}, llama.cpp's
    {"content", "add_special": false} → {"tokens"}, TGI's {"inputs"} → [tokens]."""

    SHAPES = ("vllm", "llama.cpp", "tgi")

    def __init__(self, session: aiohttp.ClientSession, url: str, shape: str, model: str,
                 authorization: str | None, headers: Headers = ()) -> None:
        self.session = session
        self.url = url
        self.shape = shape
        self.model = model
        self.headers = target_headers(authorization, headers)

    def body(self, text: str) -> dict:
        if self.shape == "vllm":
            return {"model": self.model, "prompt": text, "add_special_tokens": False}
        if self.shape == "llama.cpp":
            return {"content": text, "add_special": False}
        return {"inputs": text}

    async def one(self, text: str) -> int:
        """Tokens of `text`; raises TokenizeFailed (with the HTTP status, if one came)."""
        timeout = aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT_S)
        for attempt in (0, 1):
            try:
                async with self.session.post(self.url, json=self.body(text),
                                             headers=self.headers, timeout=timeout) as r:
                    if r.status != 200:
                        raise TokenizeFailed(f"HTTP {r.status}", r.status)
                    answer = await r.json(content_type=None)
                break
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                # a kept-alive connection the server had closed (llama.cpp's server closes
                # them unsaid): counting is idempotent, so once more on a new one
                if attempt:
                    raise TokenizeFailed(str(e) or type(e).__name__) from None
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                raise TokenizeFailed(str(e) or type(e).__name__) from None
        if isinstance(answer, dict) and isinstance(answer.get("count"), int):
            return answer["count"]
        if isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            return len(answer["tokens"])
        if isinstance(answer, list):
            return len(answer)
        raise TokenizeFailed("the answer holds no token list")

    async def count(self, texts: list[str]) -> list[int]:
        """Tokens of each text, TOKENIZE_CONCURRENCY requests at a time."""
        gate = asyncio.Semaphore(TOKENIZE_CONCURRENCY)

        async def gated(text: str) -> int:
            async with gate:
                return await self.one(text)

        return list(await asyncio.gather(*(gated(t) for t in texts)))

    def __str__(self) -> str:
        return f"POST {self.url} ({self.shape})"


async def find_tokenize(session: aiohttp.ClientSession, base_url: str, model: str,
                        authorization: str | None, headers: Headers = ()
                        ) -> ServerTokenize | None:
    """The target's tokenize endpoint, if it has one: POST /tokenize at its root (vLLM,
    llama.cpp, TGI) or under /v1 (SGLang), in each shape until one counts a probe text."""
    root = base_url.removesuffix("/v1")
    for url in dict.fromkeys((f"{root}/tokenize", f"{base_url}/tokenize")):
        for shape in ServerTokenize.SHAPES:
            endpoint = ServerTokenize(session, url, shape, model, authorization, headers)
            try:
                if await endpoint.one(TOKENIZE_PROBE) >= 1:
                    return endpoint
            except TokenizeFailed as e:
                if e.status in (None, 404, 405):
                    break  # nothing at this path (or no answer): no other shape will do
    return None


async def resolve_lengths(session: aiohttp.ClientSession, base_url: str, model: str,
                          choice: str, authorization: str | None,
                          headers: Headers = ()) -> Lengths:
    """--tokenizer as the run will use it (see loadgen.worker.tokenizer). A path that does
    not load, or `server` where the target has no usable tokenize endpoint, is TargetError;
    `auto` without one is approx., said in the note."""
    if choice == "none":
        return Lengths(note="lengths approx. (--tokenizer none: about one token a word)")
    if choice not in TOKENIZER_CHOICES:
        try:
            return await path_lengths(choice, PROMPT_WORDS)
        except TokenizerError as e:
            raise TargetError(str(e)) from None
    endpoint = await find_tokenize(session, base_url, model, authorization, headers)
    if endpoint is None:
        if choice == "server":
            raise TargetError(f"--tokenizer server: {base_url} has no tokenize endpoint "
                              "(POST /tokenize as vLLM, SGLang, llama.cpp or TGI serve it); "
                              "give a local one: --tokenizer PATH")
        return Lengths()
    try:
        words, why = await one_token_words(endpoint.count, PROMPT_WORDS, base=None)
    except TokenizeFailed as e:
        why = f"it failed ({e})"
        words = ()
    if not words:
        if choice == "server":
            raise TargetError(f"--tokenizer server: {endpoint}: {why}; give a local one: "
                              "--tokenizer PATH")
        return Lengths(note=f"lengths approx. (the server's {endpoint}: {why})")
    return Lengths(source="server", words=words, note=(
        f"lengths exact (the server's {endpoint}; asked lengths exclude the chat template and "
        "special tokens; tokens per chunk from the server's usage, else split by their text "
        "(est.): a local --tokenizer PATH counts them)"))
