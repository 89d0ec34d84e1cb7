"""URLs as they may be shown: never with the credentials some carry.

`http://user:pass@host:8000/v1` authenticates with HTTP Basic; the user:pass part
belongs in the run's Secrets, and every URL that is recorded, shown or published
is the public one: no userinfo, and no query parameter whose name says it holds a
credential (`?api_key=…`, `?token=…`, `?sig=…`).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

# query parameter names that carry credentials (Azure SAS `sig`, `code` of function apps …)
_SECRET_PARAM = re.compile(r"^(.*key|.*token|.*secret|password|passwd|pwd|sig|signature|"
                           r"auth.*|code|credential.*)$", re.I)


def public_url(url: str) -> str:
    """`url` without userinfo and without credential-bearing query parameters."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                       if not _SECRET_PARAM.match(k)])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def basic_credentials(url: str) -> str | None:
    """"user:password" from the URL's userinfo (decoded), or None when it has none."""
    parts = urlsplit(url)
    if parts.username is None:
        return None
    return f"{unquote(parts.username)}:{unquote(parts.password or '')}"
