"""plain_all: every string inside a decoded message made plain, whatever Struct holds it.

Its walk skips the fields whose type holds no text (a Snapshot is mostly numbers); the truth
here is a separate walk over the builtins msgspec makes of the result."""

from __future__ import annotations

import msgspec

from loadgen.model.snapshot import Snapshot
from loadgen.model.text import plain_all
from loadgen.record.rundir import iter_snapshots

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\u202e\x9b31m\x00"
FIXTURE = "tests/fixtures/formats/run-v1"


def _is_hostile(s: str) -> bool:
    return any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c == "\u202e" for c in s)


def _strings(v: object, path: tuple = ()) -> list[tuple[tuple, str]]:
    """(path, text) of every string in builtins, dict keys too (as a path ending in a key)."""
    if isinstance(v, str):
        return [(path, v)]
    out: list[tuple[tuple, str]] = []
    if isinstance(v, dict):
        for k, x in v.items():
            out += [((*path, ("key", k)), k)] if isinstance(k, str) else []
            out += _strings(x, (*path, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += _strings(x, (*path, i))
    return out


def _poisoned(raw: dict, path: tuple) -> dict:
    """A deep copy of raw with HOSTILE appended to the string at path."""
    copy = msgspec.json.decode(msgspec.json.encode(raw))
    node = copy
    for step in path[:-1]:
        node = node[step]
    last = path[-1]
    if isinstance(last, tuple):  # a dict key
        node[last[1] + HOSTILE] = node.pop(last[1])
    else:
        node[last] = node[last] + HOSTILE
    return copy


class Leaf(msgspec.Struct):
    n: int = 0
    s: str = ""


class Tree(msgspec.Struct):
    left: Leaf
    right: Leaf  # a second field of the same Struct type is walked too
    weight: float = 0.0
    kids: list[Tree] = []
    tags: dict[str, int] = {}


def test_every_string_of_a_tree_is_plain_the_same_struct_twice_and_nested() -> None:
    tree = Tree(left=Leaf(s="a" + HOSTILE), right=Leaf(s="b" + HOSTILE), tags={HOSTILE: 1},
                kids=[Tree(left=Leaf(), right=Leaf(s="c" + HOSTILE), kids=[
                    Tree(left=Leaf(s="d" + HOSTILE), right=Leaf())])])  # fmt: skip
    before = [s for _, s in _strings(msgspec.to_builtins(tree)) if _is_hostile(s)]
    assert len(before) == 5
    plain_all(tree)
    after = _strings(msgspec.to_builtins(tree))
    assert [s for _, s in after if _is_hostile(s)] == []
    assert (tree.left.s, tree.right.s, tree.kids[0].right.s, tree.kids[0].kids[0].left.s) == (
        "a", "b", "c", "d")


def test_each_string_of_a_recorded_snapshot_that_decodes_hostile_comes_out_plain() -> None:
    snap = next(iter(iter_snapshots(FIXTURE)))
    raw = msgspec.to_builtins(snap)
    decoded = 0
    for path, _ in _strings(raw):
        try:  # a Literal (a mode, an event kind) refuses other text: the decoder guards it
            hostile = msgspec.convert(_poisoned(raw, path), Snapshot)
        except msgspec.ValidationError:
            continue
        decoded += 1
        plain_all(hostile)
        left = [(p, s) for p, s in _strings(msgspec.to_builtins(hostile)) if _is_hostile(s)]
        assert left == [], f"{path}: {left}"
    assert decoded >= 10  # the run id, the target's url and model, the GPU's name, …


def test_a_recorded_line_comes_out_plain_in_every_form_a_control_can_take_in_json() -> None:
    """decode_line, the one reader of a Snapshot line, cleans a line that may hold a control
    (an escape, DEL, a C1 or bidi character as UTF-8) and passes the others as they are."""
    from loadgen.model.snapshot import from_json
    from loadgen.record.rundir import decode_line

    snap = next(iter(iter_snapshots(FIXTURE)))
    snap.events = []  # a tick without news: its line is plain ASCII, the common case
    clean = msgspec.json.encode(snap)
    assert clean.isascii() and b"\\" not in clean
    assert msgspec.to_builtins(decode_line(clean)) == msgspec.to_builtins(from_json(clean))
    for form in ("\x1b]0;x\x07", "\x7f", "\u009b31m", "\u202e", "\u200b", "\t\n"):
        raw = msgspec.to_builtins(snap)
        raw["run_id"] = "run" + form
        raw["target"]["model"] = "m" + form + "odel"
        line = msgspec.json.encode(raw)
        got = decode_line(line)
        left = [s for _, s in _strings(msgspec.to_builtins(got))
                if _is_hostile(s) or "\u200b" in s or "\t" in s or "\x7f" in s]
        assert left == [], (repr(form), left)
        assert got.run_id.startswith("run") and got.target.model.startswith("m")
