"""Text from outside (a server's strings, a label, a note from the bus, a dataset) as it may
be shown in a terminal or a report: the one sanitiser. An escape sequence in a model name
must not recolour, retitle or move the cursor of the terminal reading a report."""

from __future__ import annotations

import re
import unicodedata

# ESC sequences: CSI (colours, cursor moves), OSC (titles, hyperlinks; ended by BEL or ST),
# and the two-character ones; what is left of the C0/C1 and format characters goes after
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?"
                      r"|\x9b[0-?]*[ -/]*[@-~]")


def plain(text: object, limit: int | None = None) -> str:
    """Untrusted text as it may be shown: escape sequences removed, every other control or
    format character (C0, C1, bidi overrides, zero-width) a space, blanks collapsed, at
    most `limit` characters (cut with "…")."""
    s = _ESCAPES.sub("", str(text))
    s = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in s)
    s = " ".join(s.split())
    return s if limit is None or len(s) <= limit else s[: limit - 1] + "…"
