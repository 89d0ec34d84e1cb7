"""The run's secrets, kept apart from RunConfig (which is recorded, published and shown).

They reach the run from files or the environment at the command line, travel to
the console's run process on its stdin pipe (never its argv or environment), and
are used only to authenticate. `repr()` says whether each is set, never what it is.

Every --header's value is one of them, whatever its name: a header is where a credential
goes when it is not the API key (X-Api-Key, Azure's api-key, Cookie, a gateway's own
token), and no list of names would catch them all. What is recorded and shown is the
header's name alone (RunConfig.headers).
"""

from __future__ import annotations

import base64

import msgspec

HEADER_SCRUB_MIN = 8  # characters: a shorter header value is no credential


class Secrets(msgspec.Struct, kw_only=True, frozen=True):
    api_key: str | None = None  # the target's OpenAI API key (Bearer)
    basic_auth: str | None = None  # "user:password" from the --url's userinfo (HTTP Basic)
    metrics_token: str | None = None  # a bearer token of its own for --metrics-url
    mqtt_password: str | None = None  # the broker password (--publish, agent)
    # --header: (name, value) as given, for every request to the target
    headers: tuple[tuple[str, str], ...] = ()

    def authorization(self) -> str | None:
        """The target's Authorization header: --header Authorization as given, else the API
        key as a Bearer token, else the URL's user:password as HTTP Basic (a proxy in front
        of the server), else none."""
        for name, value in self.headers:
            if name.lower() == "authorization":
                return value
        if self.api_key:
            return f"Bearer {self.api_key}"
        if self.basic_auth:
            return "Basic " + base64.b64encode(self.basic_auth.encode()).decode()
        return None

    def request_headers(self) -> dict[str, str]:
        """Every header a request to the target carries: Authorization and --header's."""
        auth = self.authorization()
        return {**({"Authorization": auth} if auth else {}), **dict(self.other_headers())}

    def other_headers(self) -> list[tuple[str, str]]:
        """--header's headers but Authorization (authorization() carries that one)."""
        return [(n, v) for n, v in self.headers if n.lower() != "authorization"]

    def values(self) -> list[str]:
        """Every secret string, for scrubbing whatever is written (defence in depth)."""
        out = [v for v in (self.api_key, self.metrics_token, self.mqtt_password) if v]
        # a header's value is cut out of whatever is written where it could be a credential
        # at all: "1" or "prod" would cut every such figure and word
        out += [v for _, v in self.headers if len(v) >= HEADER_SCRUB_MIN]
        if self.basic_auth:
            out.append(self.basic_auth)
            password = self.basic_auth.partition(":")[2]
            if len(password) >= 4:  # a one-letter password would scrub every such letter
                out.append(password)
        auth = self.authorization()
        credential = auth.split(" ", 1)[-1] if auth else ""
        return [*out, credential] if len(credential) >= 4 else out

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={'set' if getattr(self, f) else 'unset'}"
                          for f in self.__struct_fields__)
        return f"Secrets({shown})"

    __str__ = __repr__
