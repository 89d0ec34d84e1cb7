"""Before any load: is the target an OpenAI-compatible server, and which model?

Every failure here becomes one sentence a user can act on (TargetError),
never a traceback: a wrong URL, a dead server, a missing /v1, a wrong model.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp


class TargetError(Exception):
    """The target cannot be used; str(e) is the message for the user."""


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
    session: aiohttp.ClientSession, base_url: str, model: str | None, authorization: str | None
) -> str:
    """The model to use: the one asked for if served, else the server's first."""
    served = await list_models(session, base_url, authorization)
    if model is None:
        if not served:
            raise TargetError(f"{base_url} serves no models (GET /models returned an empty list)")
        return served[0]
    if model not in served:
        raise TargetError(
            f"model {model!r} is not served by {base_url}; it serves: {', '.join(served) or 'none'}"
        )
    return model


async def list_models(
    session: aiohttp.ClientSession, base_url: str, authorization: str | None
) -> list[str]:
    url = f"{base_url}/models"
    headers = {"Authorization": authorization} if authorization else {}
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
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
        reason = e.os_error.strerror.lower() if e.os_error and e.os_error.strerror else str(e)
        raise TargetError(f"cannot reach {base_url}: {reason}") from None
    except TimeoutError:
        raise TargetError(f"no answer from {base_url} within 10 s") from None
    except (aiohttp.ClientError, ValueError) as e:
        raise TargetError(f"{base_url} did not answer like an OpenAI server: {e}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise TargetError(
            f"{base_url} does not look like an OpenAI-compatible API: "
            "GET /models did not return a model list"
        )
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]
