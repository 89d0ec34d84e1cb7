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
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from time import perf_counter

import msgspec
import openai

from loadgen.model.outage import STALL_AFTER_S
from loadgen.model.slo import Slo
from loadgen.worker.client import http_error
from loadgen.worker.conversation import ConversationMeasure, Turn
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.sse import Choice, Chunk, Delta, Usage
from loadgen.worker.stream_measure import StreamMeasure

# fields the SDK does not know; they travel in extra_body as the servers expect
_EXTRA = ("ignore_eos", "min_tokens")  # not the SDK's own parameters: sent in extra_body


class OpenAIClient:
    def __init__(
        self,
        url: str,
        rec: IntervalRecorder,
        *,
        authorization: str | None = None,
        timeout: float = 600.0,
        slo: Slo | None = None,
        chunk_tokens: Callable[[Chunk], int] | None = None,
    ) -> None:
        self.chunk_tokens = chunk_tokens  # a local tokenizer's count (no per-chunk usage)
        self.chat = url.endswith("/chat/completions")
        base = url.rsplit("/chat/completions" if self.chat else "/completions", 1)[0]
        self.url = url
        # the SDK sends "Bearer <api_key>"; any other scheme (Basic) goes as a header of its own
        scheme, _, credential = (authorization or "").partition(" ")
        bearer = scheme == "Bearer"
        self.sdk = openai.AsyncOpenAI(
            base_url=base, api_key=credential if bearer else "not-needed", timeout=timeout,
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(follow_redirects=False),
            default_headers=None if bearer or not authorization
            else {"Authorization": authorization},
        )
        self.rec = rec
        self.slo = slo
        self.timeout = timeout
        self.in_flight = 0
        self._live: set[StreamMeasure] = set()  # the streams in flight, for stalled()

    async def request(
        self,
        body: bytes,
        prompt_words: int,
        t_intended: float | None = None,
        cancel_after_tokens: int | None = None,
        cancel_after_s: float | None = None,
        asked_out: int = 0,
        turn: Turn | None = None,
    ) -> bool:
        """As StreamingClient.request: False when the server could not be reached."""
        params = msgspec.json.decode(body)
        extra = {k: params.pop(k) for k in _EXTRA if k in params}
        create = self.sdk.chat.completions.create if self.chat else self.sdk.completions.create
        self.in_flight += 1
        limit = self.timeout if cancel_after_s is None else min(self.timeout, cancel_after_s)
        t0 = perf_counter()
        if t_intended is not None:
            self.rec.lag.append(max(0.0, (t0 - t_intended) * 1e6))
        m = (StreamMeasure if turn is None else ConversationMeasure)(
            self.rec, t0, prompt_words, t_intended=t_intended, slo=self.slo,
            cancel_after_tokens=cancel_after_tokens, chunk_tokens=self.chunk_tokens,
            asked_out=asked_out, turn=turn)
        self._live.add(m)
        try:
            async with asyncio.timeout(limit):
                stream = await create(**params, extra_body=extra or None)
                try:
                    async for chunk in stream:
                        if not m.chunk(_as_chunk(chunk), perf_counter()):
                            # abandoned by the client (already counted): the server was
                            # reached, so a closed-loop user must not back off
                            return True
                finally:
                    await stream.close()
            m.done = True  # the SDK swallows [DONE]; a normal end of iteration means it came
            m.finish()
        except asyncio.CancelledError:
            self.rec.error("cancelled", "request cancelled before it finished")
            raise
        except TimeoutError:
            if limit < self.timeout:
                self.rec.error("cancelled", f"abandoned by the client after {limit:g} s")
            else:
                self.rec.error("timeout", f"no complete answer within {self.timeout:g} s")
        except openai.APIStatusError as e:
            headers = {k.lower().encode(): v.encode() for k, v in e.response.headers.items()}
            self.rec.error(*http_error(e.status_code, headers, e.response.content))
        except openai.APITimeoutError:
            self.rec.error("timeout", f"no complete answer within {self.timeout:g} s")
        except openai.APIConnectionError as e:
            kind = "stream_broken" if m.started else "connect"
            self.rec.error(kind, f"{type(e).__name__}: {e.__cause__ or e}")
            return m.started
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            self.rec.error("malformed_chunk", f"bad chunk: {e}")
        except Exception as e:
            # the SDK's transport raises its own exception types mid-stream (they change
            # between releases); whatever it is, it is a counted error, never a dead worker
            kind = "stream_broken" if m.started else "connect"
            self.rec.error(kind, f"{type(e).__name__}: {e}")
            return m.started
        finally:
            self.in_flight -= 1
            self._live.discard(m)
            m.end()  # however it ended, what it had measured counts (idempotent)
        return True

    def stalled(self, now: float) -> int:
        """As StreamingClient.stalled: streams in flight with no chunk for STALL_AFTER_S."""
        return sum(1 for m in self._live if now - m.seen >= STALL_AFTER_S)

    def close(self) -> None:
        # the SDK's httpx client closes with the process; nothing is kept per request
        pass


def _as_chunk(sdk_chunk) -> Chunk:
    """The SDK's chunk object as our Chunk (the fields the measurement needs)."""
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
    u = sdk_chunk.usage
    usage = None
    if u is not None:
        usage = Usage(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens)
    sent = (getattr(sdk_chunk, "model_extra", None) or {}).get("tokentop_sent_ns")
    return Chunk(choices=choices, usage=usage, tokentop_sent_ns=sent)
