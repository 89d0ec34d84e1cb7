"""`--client openai`: the same load through the official openai SDK.

Slower per chunk than the raw client (the SDK builds pydantic objects for
every chunk), and that is the point: it shows what an SDK-based application
experiences, and `tokentop calibrate` can set the two side by side. The
measurements and error kinds are the same as the raw client's.

The TTFT clock starts before the SDK call, so it includes any connection the
SDK's pool has to open, as the raw client's does (both clients agree). The SDK
opens its connections out of sight, so `connect` (connection setup time) is not
recorded by this client. Redirects are not followed (the SDK would, turning the
POST into a GET): a 3xx is http_3xx, as in the raw client.

The clock (with `calibrate`, the wall stamp beside it), the limit, the cancel and timeout
endings and `stalled()` are the request envelope's (loadgen.worker.envelope), the same as
the raw client's; this module keeps the SDK's own: the create call, the chunk iteration
and the mapping of the SDK's exceptions.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from time import perf_counter
from typing import TYPE_CHECKING

import msgspec
import openai

from loadgen.model.slo import Slo
from loadgen.worker.client import http_error
from loadgen.worker.envelope import RequestEnvelope
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.pacing import retry_after
from loadgen.worker.sse import (
    Choice,
    Chunk,
    CompletionDetails,
    Delta,
    PromptDetails,
    Timings,
    Usage,
)
from loadgen.worker.stream_measure import StreamMeasure

if TYPE_CHECKING:
    from loadgen.worker.tokenizer import ChunkTokens

# the create call's parameters that are not body fields: a body key of such a name (from
# --extra-body) is a body field all the same, in extra_body
_NOT_BODY = frozenset({"extra_body", "extra_headers", "extra_query", "timeout"})


class OpenAIClient(RequestEnvelope[tuple[dict, dict | None]]):
    """The request envelope (loadgen.worker.envelope) around the SDK's streamed create."""

    def __init__(
        self,
        url: str,
        rec: IntervalRecorder,
        *,
        authorization: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
        timeout: float = 600.0,
        slo: Slo | None = None,
        calibrate: bool = False,
        chunk_tokens: ChunkTokens | None = None,
    ) -> None:
        super().__init__(rec, timeout=timeout, slo=slo, calibrate=calibrate,
                         chunk_tokens=chunk_tokens)
        self.chat = url.endswith("/chat/completions")
        base = url.rsplit("/chat/completions" if self.chat else "/completions", 1)[0]
        self.url = url
        # the SDK sends "Bearer <api_key>"; any other scheme (Basic) goes as a header of its own
        scheme, _, credential = (authorization or "").partition(" ")
        bearer = scheme == "Bearer"
        # --header's headers as the SDK's default headers: one the SDK writes itself
        # (User-Agent) is the user's then, as in the raw client
        extra_headers = dict(headers)
        if authorization and not bearer:
            extra_headers["Authorization"] = authorization
        self.sdk = openai.AsyncOpenAI(
            base_url=base, api_key=credential if bearer else "not-needed", timeout=timeout,
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(follow_redirects=False),
            default_headers=extra_headers or None,
        )
        self._create = self.sdk.chat.completions.create if self.chat \
            else self.sdk.completions.create
        # the create call's own parameters; every other field of our body (ignore_eos,
        # min_tokens, top_k, --extra-body's) travels in extra_body, as the servers expect
        self._known = frozenset(inspect.signature(self._create).parameters) - _NOT_BODY

    def _prepare(self, body: bytes) -> tuple[dict, dict | None]:
        """(the SDK's parameters, extra_body): our body's fields the SDK does not know."""
        params = msgspec.json.decode(body)
        extra = {k: params.pop(k) for k in list(params) if k not in self._known}
        return params, extra or None

    async def _send(self, payload: tuple[dict, dict | None], m: StreamMeasure) -> bool:
        params, extra = payload
        try:
            stream = await self._create(**params, extra_body=extra)
            try:
                async for chunk in stream:
                    if not m.chunk(_as_chunk(chunk), perf_counter()):
                        # abandoned by the client (already counted): the server was
                        # reached, so a closed-loop user must not back off
                        return True
            finally:
                await stream.close()
        except TimeoutError:
            raise  # the envelope's limit to count, not a transport error
        except openai.APIStatusError as e:
            headers = {k.lower().encode(): v.encode() for k, v in e.response.headers.items()}
            m.retry_after = retry_after(e.status_code, headers)
            m.rec.error(*http_error(e.status_code, headers, e.response.content))
            return True
        except openai.APITimeoutError:
            m.rec.error("timeout", f"no complete answer within {self.timeout:g} s")
            return True
        except openai.APIConnectionError as e:
            return self._transport_error(m, f"{type(e).__name__}: {e.__cause__ or e}")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            m.rec.error("malformed_chunk", f"bad chunk: {e}")
            return True
        except Exception as e:
            # the SDK's transport raises its own exception types mid-stream (they change
            # between releases); whatever it is, it is a counted error, never a dead worker
            return self._transport_error(m, f"{type(e).__name__}: {e}")
        m.done = True  # the SDK swallows [DONE]; a normal end of iteration means it came
        m.finish()
        return True

    def _transport_error(self, m: StreamMeasure, message: str) -> bool:
        """A transport error: the stream broke if it had begun, else no connection (False:
        the server was not reached)."""
        m.rec.error("stream_broken" if m.started else "connect", message)
        return m.started

    def close(self) -> None:
        # the SDK's httpx client closes with the process; nothing is kept per request
        pass


def _as_chunk(sdk_chunk) -> Chunk:
    """The SDK's chunk object as our Chunk: every field the raw client's decoder takes
    (loadgen.worker.sse.Chunk), so that both clients measure the same. The SDK keeps the
    fields it does not know (`reasoning_content`, llama.cpp's `timings`, the simulator's
    stamp) in model_extra; a chunk with an `error` never comes here (the SDK raises)."""
    choices = []
    for c in sdk_chunk.choices or ():
        delta = getattr(c, "delta", None)
        d = None
        if delta is not None:
            extra = getattr(delta, "model_extra", None) or {}
            d = Delta(content=delta.content, reasoning_content=extra.get("reasoning_content"),
                      reasoning=extra.get("reasoning"))
        choices.append(Choice(delta=d, text=getattr(c, "text", None),
                              finish_reason=c.finish_reason))
    extra = getattr(sdk_chunk, "model_extra", None) or {}
    timings = extra.get("timings")
    return Chunk(choices=choices, usage=_as_usage(sdk_chunk.usage),
                 timings=Timings(cache_n=timings.get("cache_n"))
                 if isinstance(timings, dict) else None,
                 tokentop_sent_ns=extra.get("tokentop_sent_ns"))


def _as_usage(u) -> Usage | None:
    """The SDK's CompletionUsage as our Usage, its details included (cached prompt tokens,
    reasoning tokens)."""
    if u is None:
        return None
    prompt = getattr(u, "prompt_tokens_details", None)
    completion = getattr(u, "completion_tokens_details", None)
    return Usage(
        prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
        prompt_tokens_details=None if prompt is None
        else PromptDetails(cached_tokens=getattr(prompt, "cached_tokens", None)),
        completion_tokens_details=None if completion is None
        else CompletionDetails(reasoning_tokens=getattr(completion, "reasoning_tokens", None)))
