"""The handover to a simulator child process: one JSON line on its stdin, no flags.

`tokentop` starts its embedded simulator as `python -m loadgen.sim` and writes a
`SimLaunch` (the typed SimConfig, already resolved from `--sim-profile` and
`--sim-arg` at the command line, plus where to listen) as the first line of the
child's stdin. The child answers `TOKENTOP_SIM_LISTENING <port>` on stdout once it
listens, and exits when stdin reaches EOF (its parent is gone, even after kill -9).

Why JSON on stdin and not flags: the command line is parsed once, at the edge
(tui/commands/), into typed values; a second parser here would be a second place
where the same flags could mean something else. Why stdin and not argv: stdin
is already the child's lifeline to its parent, and a config there never shows
in `ps`.
"""

from __future__ import annotations

import os

import msgspec

from loadgen.sim.model import SimConfig

MAX_LINE = 1 << 20  # far more than any SimConfig; a parent that sends no newline is an error


class LaunchError(ValueError):
    """The launch line cannot be used; str(e) is the message for the parent's user."""


class SimLaunch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a simulator child is told: its settings and its address (port 0: a free one)."""

    config: SimConfig = msgspec.field(default_factory=SimConfig)
    host: str = "127.0.0.1"
    port: int = 0


def encode_launch(launch: SimLaunch) -> bytes:
    """The launch as the one line the child reads (newline included)."""
    return msgspec.json.encode(launch) + b"\n"


def read_launch(fd: int = 0) -> SimLaunch:
    """Read exactly one line from `fd` and decode it; raises LaunchError in words.

    Byte by byte on the raw descriptor, so that nothing after the newline is taken from
    the stream: what follows (nothing, then EOF) is the exit-with-parent watch's to read.
    """
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
        if len(line) > MAX_LINE:
            raise LaunchError("the launch line on stdin is too long")
    if not line.strip():
        raise LaunchError("no launch line on stdin: `python -m loadgen.sim` is started by "
                          "tokentop; to run the simulator yourself, use `tokentop sim`")
    try:
        return msgspec.json.decode(bytes(line), type=SimLaunch)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise LaunchError(f"bad launch line on stdin: {e}") from None
