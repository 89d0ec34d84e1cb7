"""Text from outside (a server's strings, a label, a note from the bus, a dataset) as it may
be shown in a terminal or a report: the one sanitiser. An escape sequence in a model name
must not recolour, retitle or move the cursor of the terminal reading a report.

`plain` makes one string safe; `plain_all` every string inside a decoded message (a
Snapshot read back from a recording or from the bus, its events, a manifest), in place.
Both happen once, where the text enters tokentop; what is shown, logged, recorded or
written after that is already plain."""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

import msgspec
import msgspec.inspect as mi

# ESC sequences: CSI (colours, cursor moves), OSC (titles, hyperlinks; ended by BEL or ST),
# and the two-character ones; what is left of the C0/C1 and format characters goes after
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?"
                      r"|\x9b[0-?]*[ -/]*[@-~]")
# printable ASCII words with single blanks between them: plain() would give them back as they
# are, so the common case (tokentop's own words, a histogram's base64) skips the work
_ALREADY_PLAIN = re.compile(r"[!-~]+(?: [!-~]+)*|")


def plain(text: object, limit: int | None = None) -> str:
    """Untrusted text as it may be shown: escape sequences removed, every other control or
    format character (C0, C1, bidi overrides, zero-width) a space, blanks collapsed, at
    most `limit` characters (cut with "…")."""
    s = str(text)
    if not _ALREADY_PLAIN.fullmatch(s):
        s = _ESCAPES.sub("", s)
        s = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in s)
        s = " ".join(s.split())
    return s if limit is None or len(s) <= limit else s[: limit - 1] + "…"


def plain_all(value: Any, limit: int | None = None) -> Any:
    """`value` with every string inside it (dict keys too) made plain, each at most `limit`
    characters: msgspec Structs, dicts and lists in place; a string's plain copy is returned.
    For what is decoded from outside as a whole (a recording read back, a Snapshot or a
    status from the bus), where naming every text field would miss the next one added.
    (A Snapshot's histograms are long strings: no limit for those.)"""
    if isinstance(value, str):
        return plain(value, limit)
    if isinstance(value, msgspec.Struct):
        for name in _text_fields(type(value)):
            field = getattr(value, name)
            if field is not None:
                setattr(value, name, plain_all(field, limit))
        return value
    if isinstance(value, list):
        value[:] = [plain_all(v, limit) for v in value]
        return value
    if isinstance(value, dict):
        items = [(plain_all(k, limit), plain_all(v, limit)) for k, v in value.items()]
        value.clear()
        value.update(items)
        return value
    return value



_VISITING: set[type] = set()  # the Structs whose fields are being looked at (a cycle)


@functools.cache
def _text_fields(cls: type[msgspec.Struct]) -> tuple[str, ...]:
    """The fields of a Struct whose type may hold a string (its numbers, flags and Literals,
    which msgspec has checked on decoding, are left alone: a Snapshot is mostly numbers, and
    a 72-hour replay reads half a million of them)."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    _VISITING.add(cls)
    try:
        return tuple(f.name for f in info.fields if _may_hold_text(f.type))
    finally:
        _VISITING.discard(cls)


def _may_hold_text(t: mi.Type) -> bool:
    if isinstance(t, mi.StrType | mi.AnyType):
        return True
    if isinstance(t, mi.StructType):
        # a Struct inside itself (a tree) is walked: what it holds is still being looked at
        return t.cls in _VISITING or bool(_text_fields(t.cls))
    if isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        return _may_hold_text(t.item_type)
    if isinstance(t, mi.TupleType):
        return any(_may_hold_text(x) for x in t.item_types)
    if isinstance(t, mi.UnionType):
        return any(_may_hold_text(x) for x in t.types)
    if isinstance(t, mi.DictType):
        return _may_hold_text(t.key_type) or _may_hold_text(t.value_type)
    return False  # numbers, bools, None, Literals (checked by the decoder)
