"""The run's secrets, kept apart from RunConfig (which is recorded, published and shown).

They reach the run from files or the environment at the command line, travel to
the console's run process on its stdin pipe (never its argv or environment), and
are used only to authenticate. `repr()` says whether each is set, never what it is.
"""

from __future__ import annotations

import msgspec


class Secrets(msgspec.Struct, kw_only=True, frozen=True):
    api_key: str | None = None  # the target's OpenAI API key (Bearer)
    metrics_token: str | None = None  # a bearer token of its own for --metrics-url
    mqtt_password: str | None = None  # the broker password (--publish, agent)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={'set' if getattr(self, f) else 'unset'}"
                          for f in self.__struct_fields__)
        return f"Secrets({shown})"

    __str__ = __repr__
