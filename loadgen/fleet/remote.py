"""Remote control of an agent from the fleet console, within the agent's own limits.

Remote control is off unless the agent is started with `--allow-remote-control`,
and then only within the caps it sets itself (`--max-concurrency`,
`--max-rate`). Each command gets one reply on
`tokentop/<fleet>/<agent>/control/reply`: `{"id", "agent", "op", "applied",
"reason", "load"}`. Applied commands go to the run as Control messages with
source "mqtt", so they show in its next Snapshot.

This module knows the run only through two callables (apply a Control, tell the
load now), so the fleet package depends on the shared model alone.
"""

from __future__ import annotations

import json
import math
import re
import socket
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from loadgen.model.kinds import REMOTE_OPS
from loadgen.model.snapshot import Control
from loadgen.model.text import plain

DEFAULT_MAX_CONCURRENCY = 64
DEFAULT_MAX_RATE = 50.0
REMOTE_OFF = "remote control is off on this agent (start it with --allow-remote-control)"
NOTE_LIMIT = 200  # characters of a command's note (a mark's words): a longer one is refused
ECHO_LIMIT = 80  # characters of a command's id, op or value echoed in a reply or a reason
_MAX = sys.float_info.max
ANSWERED_KEPT = 256  # command ids remembered, because QoS 1 may deliver a command twice


def default_name() -> str:
    """This host's name as one MQTT topic level."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0])[:64]
    return name.strip("-.") or "agent"


@dataclass(frozen=True)
class LoadNow:
    """The run's load as remote control judges a command against it."""

    mode: str
    concurrency: int
    rate: float
    state: str


@dataclass(frozen=True)
class RemoteCaps:
    """What remote control may set at most (the agent's own flags)."""

    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    max_rate: float = DEFAULT_MAX_RATE


def decode_command(payload: bytes) -> object:
    """A command's JSON; None when it is not JSON. A number too large for a float (1e309)
    is read as infinity, so the reply can say what is wrong with it instead of 'bad
    command' (msgspec refuses such a number outright)."""
    try:
        return msgspec.json.decode(payload)
    except msgspec.DecodeError:
        pass
    try:
        return json.loads(payload)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(n: float) -> str:
    """A number of streams in a reason: whole, or in powers of ten when it is huge."""
    return f"{n:.0f}" if abs(n) < 1e15 else f"{n:.3g}"


def _shown(value: object) -> str:
    """Something a command said, quoted in a reason: repr'd (controls escaped), plain, short."""
    return plain(repr(value), ECHO_LIMIT)


def _echo(value: object) -> object:
    """A field of a command as the reply gives it back: a string plain and short, a number
    or None as it is, anything else (a list, an object) as its short repr."""
    if value is None or (_is_number(value) and math.isfinite(value)):
        return value
    return plain(value if isinstance(value, str) else repr(value), ECHO_LIMIT)


class RemoteControl:
    """Checks each command against this agent's own rules, applies it, and answers."""

    def __init__(self, *, agent: str, caps: RemoteCaps | None,
                 apply: Callable[[Control], Awaitable[None]],
                 load: Callable[[], LoadNow]) -> None:
        self.agent = agent
        self.caps = caps  # None: remote control is off
        self._apply = apply
        self._load = load
        self.reply_to: Callable[[dict], None] | None = None
        self._answered: OrderedDict[str, dict] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.caps is not None

    async def handle(self, payload: bytes, _topic: str) -> None:
        cmd = decode_command(payload)
        cid = cmd.get("id") if isinstance(cmd, dict) else None
        if isinstance(cid, str) and cid in self._answered:
            self._send(self._answered[cid])
            return
        reply = await self.apply(cmd)
        if isinstance(cid, str) and len(cid) <= ECHO_LIMIT:  # a huge id is not kept
            self._answered[cid] = reply
            while len(self._answered) > ANSWERED_KEPT:
                self._answered.popitem(last=False)
        self._send(reply)

    def _send(self, reply: dict) -> None:
        if self.reply_to is not None:
            self.reply_to(reply)

    async def apply(self, cmd: object) -> dict:
        if not isinstance(cmd, dict):
            return self._reply({}, False, "bad command: expected a JSON object "
                               '{"id": …, "op": …, "value": …}')
        why = self.refusal(cmd)
        if why is not None:
            return self._reply(cmd, False, why)
        op, value = cmd["op"], cmd.get("value")
        raw = cmd.get("note") if isinstance(cmd.get("note"), str) else None
        # the note is recorded and shown: plain (its length was judged in refusal())
        note = None if raw is None else plain(raw)
        await self._apply(Control(op=op, value=None if value is None else float(value),
                                  note=note, source="mqtt"))
        said = "" if note == raw else \
            "; its note's control characters and escape sequences were left out"
        return self._reply(cmd, True, "applied" + said)

    def refusal(self, cmd: dict) -> str | None:
        """Why this command is refused, in words; None when it may be applied."""
        if self.caps is None:
            return REMOTE_OFF
        op, value = cmd.get("op"), cmd.get("value")
        if op not in REMOTE_OPS:
            return (f"unknown or not remotely allowed op {_shown(op)}: use one of "
                    f"{', '.join(REMOTE_OPS)}")
        note = cmd.get("note")
        if isinstance(note, str) and len(note) > NOTE_LIMIT:
            return (f"the note is {len(note)} characters long: at most {NOTE_LIMIT} are "
                    "taken")
        load = self._load()
        if load.state not in ("running", "paused"):
            return f"the run is {load.state}"
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if op in ("set_concurrency", "add_concurrency", "set_rate", "add_rate"):
            if not numeric:
                return f"{op} needs a number in 'value', got {_shown(value)}"
            if math.isnan(value):
                return f"{op} needs a number in 'value', got NaN"
            if not math.isfinite(value):
                return f"{op}: 'value' is too large a number (a float holds ±{_MAX:.1e})"
        if op in ("set_concurrency", "add_concurrency"):
            return self._streams_refusal(op, value, load)
        if op in ("set_rate", "add_rate"):
            return self._rate_refusal(op, value, load)
        if op == "set_mode" and cmd.get("note") not in ("closed", "open"):
            return "set_mode needs 'note': closed or open"
        return None

    def _streams_refusal(self, op: str, value: float, load: LoadNow) -> str | None:
        assert self.caps is not None
        if value != int(value):
            return f"{op} needs a whole number of streams, got {value!r}"
        # as a float: 1e308 streams must not become a 309-digit int in the reason
        n = float(value) + (load.concurrency if op == "add_concurrency" else 0)
        if n < 0:
            return f"{_count(n)} streams is below 0"
        if n > self.caps.max_concurrency:
            return (f"{_count(n)} streams is over this agent's --max-concurrency "
                    f"{self.caps.max_concurrency}")
        return None

    def _rate_refusal(self, op: str, value: float, load: LoadNow) -> str | None:
        assert self.caps is not None
        r = float(value) + (load.rate if op == "add_rate" else 0.0)
        if not math.isfinite(r):  # 1e308 + 1e308
            return f"{op}: the rate it asks for is too large a number"
        if r < 0:
            return f"{r:g} req/s is below 0"
        if r > self.caps.max_rate:
            return f"{r:g} req/s is over this agent's --max-rate {self.caps.max_rate:g}"
        return None

    def _reply(self, cmd: dict, applied: bool, reason: str) -> dict:
        load = self._load()
        value = cmd.get("value")
        return {  # what the command said is echoed plain and short: it came from outside
            "id": _echo(cmd.get("id")),
            "agent": self.agent,
            "op": _echo(cmd.get("op")),
            "value": value if _is_number(value) and math.isfinite(value) else _echo(value),
            "applied": applied,
            "reason": reason,
            "load": {"mode": load.mode, "concurrency": load.concurrency, "rate": load.rate,
                     "state": load.state},
        }
