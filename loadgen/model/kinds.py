"""The kinds of things a run talks about, each defined once: errors, events, controls, states.

Every emitter and every reader uses these names, so a kind that nothing emits or
a reader that filters on a misspelt one is a type error, not a silent zero.
"""

from __future__ import annotations

from typing import Literal, get_args

# How a request failed (the client classifies every failure into one of these).
ErrorKind = Literal[
    "connect",  # no connection (refused, reset before a response, DNS, TLS)
    "timeout",  # no complete answer within --request-timeout
    "http_3xx",  # a redirect: tokentop does not follow one (give the final URL)
    "http_4xx",
    "http_429",  # rate limited (Retry-After honoured)
    "http_5xx",
    "stream_broken",  # the stream stopped before [DONE]
    "malformed_chunk",  # a chunk that is not an OpenAI stream chunk
    "empty_response",  # a stream with no text at all
    "cancelled",  # abandoned by the client on purpose (--cancel-rate), or at the drain
    "client_backlog_full",  # open loop: the client's own backlog overflowed
    "client_fd_limit",  # this machine's open-file limit (ulimit -n) stopped a connection
]
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)

# The errors that mean "the server cannot be reached" (as opposed to "it said no").
UNREACHABLE_ERRORS: tuple[ErrorKind, ...] = ("connect", "timeout", "stream_broken")
# The errors that are the server failing: outage evidence (loadgen.model.outage).
SERVER_ERRORS: tuple[ErrorKind, ...] = (*UNREACHABLE_ERRORS, "http_5xx", "malformed_chunk",
                                        "empty_response")

# What an Event is about.
EventKind = Literal[
    "run",  # started, warm-up over, ramp finished, stopping
    "resume",  # a resumed run's first Snapshot: the gap before it is not load
    "operator",  # a key, the CLI or MQTT changed the load, or a mark (`e`)
    "error",  # errors of one kind, counted, at most one event every few seconds, dated
    # when the last of them happened (before an outage change that followed them)
    "outage",  # the server cannot be reached, or nothing succeeds (loadgen.model.outage)
    "stall",  # streams in flight received no byte for a while (a frozen server)
    "recovery",  # the first success after an outage
    "probe",  # /metrics, the server process
    "restart",  # the server restarted (its /metrics counters went back to zero)
    "gpu",  # GPUs lost, Xid, throttling
    "slo",  # an --slo threshold breached or met again (loadgen.run.watch)
    "client",  # the load generator itself is saturated
    "record",  # the recording: where it goes, and when it fails
    "replay",  # replay's own news (end reached, following)
    "fault",  # a network fault the eval's proxy put on or took off (loadgen.eval.proxy)
    "recording",  # older runs' name for "record", still read
]
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)

Level = Literal["info", "warn", "error"]

# What a Control message asks for.
ControlOp = Literal[
    "set_concurrency", "add_concurrency", "set_rate", "add_rate", "set_mode", "auto_ramp",
    "pause", "resume", "stop", "mark",
    "replay_speed", "seek", "seek_by",  # a replay's own
]
CONTROL_OPS: tuple[ControlOp, ...] = get_args(ControlOp)
# What remote control (MQTT) may ask of an agent: the load, never stop or auto-ramp.
REMOTE_OPS: tuple[ControlOp, ...] = ("set_concurrency", "add_concurrency", "set_rate",
                                     "add_rate", "set_mode", "pause", "resume", "mark")
ControlSource = Literal["key", "cli", "mqtt"]

# How the target is doing, by loadgen.model.outage's one definition.
Health = Literal["up", "degraded", "outage"]

LoadMode = Literal["closed", "open"]
RunState = Literal["starting", "running", "paused", "draining", "stopped"]
RUNNING_STATES: tuple[RunState, ...] = ("starting", "running", "draining")

# Which kind of SnapshotSource a console is looking at.
SourceKind = Literal["live", "replay", "fleet", "eval"]
