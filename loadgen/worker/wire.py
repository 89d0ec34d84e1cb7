"""Messages between the coordinator and its worker processes, over stdin/stdout pipes.

Each message is a 4-byte big-endian length and a msgpack body (tagged msgspec
structs). A worker reads its commands from stdin and writes reports to stdout;
stdin reaching EOF means the coordinator is gone, and the worker stops its
load at once rather than hammer a server for nobody.
"""

from __future__ import annotations

import asyncio
import struct

import msgspec

from loadgen.model.slo import Slo
from loadgen.model.snapshot import Counters
from loadgen.worker.interval import SparseHist
from loadgen.worker.workload import Workload


class LoadSpec(msgspec.Struct, kw_only=True):
    """The load one worker (or, in the coordinator, the whole run) should apply now."""

    mode: str = "closed"  # closed: `concurrency` streams | open: `rate` requests/s
    concurrency: int = 0
    rate: float = 0.0
    arrival: str = "poisson"  # constant | poisson | gamma
    shape: float = 1.0  # gamma shape (burstiness: < 1 burstier than Poisson)
    max_in_flight: int | None = None  # open loop: cap on in-flight requests; the rest wait
    # Open loop, set by the pool for each worker (loadgen.worker.load explains the split):
    # the global schedule started at `epoch`, the coordinator's time.perf_counter() (Linux:
    # CLOCK_MONOTONIC, one clock for every process on the host), and this worker sends its
    # arrivals number share, share + of, share + 2·of …
    epoch: float = 0.0
    share: int = 0
    of: int = 1
    # --requests: this worker's part of the run's limit for the load's current placement
    # (a count of everything it has sent; the pool sets it); None: Configure.max_requests
    max_requests: int | None = None
    # --trace: open-loop arrivals (and lengths) from the trace each worker read at start
    # (Configure.trace) instead of `rate`/`arrival`, its time compressed by `trace_speed`
    trace: bool = False
    trace_speed: float = 1.0


class Cancelling(msgspec.Struct, kw_only=True, frozen=True):
    """Users who abandon streams: a fraction of requests, cut after N tokens or S seconds."""

    rate: float = 0.0
    after_tokens: int | None = None
    after_s: float | None = None


class Configure(msgspec.Struct, tag="configure", kw_only=True):
    index: int
    base_url: str
    workload: Workload
    request_timeout: float = 600.0
    client: str = "raw"  # raw (httptools, the fast path) | openai (the official SDK)
    slo: Slo | None = None
    cancelling: Cancelling = Cancelling()
    max_requests: int | None = None  # this worker's share of a request-count limit
    calibrate: bool = False  # measure timing error against the exact-timing simulator
    # the target's Authorization header value (a secret: this pipe is the only way it travels)
    authorization: str | None = None
    # --header's other headers, (name, value) as given: secrets too (Secrets.headers), so
    # they travel here alone, as the Authorization header does
    headers: list[tuple[str, str]] = msgspec.field(default_factory=list)
    trace: str | None = None  # --trace FILE: read once at start (loadgen.worker.trace)
    # closed loop: the spread of streams started together (loadgen.worker.load.Stagger):
    # seconds, 0 for all at once, None for one request's time as measured
    stagger: float | None = None


class SetLoad(msgspec.Struct, tag="set_load"):
    spec: LoadSpec


class Pause(msgspec.Struct, tag="pause"):
    paused: bool
    # the coordinator's perf_counter() at the pause or resume, the same for every worker: a
    # backlog kept across the pause moves later by exactly its length (0: the worker's now)
    at: float = 0.0


class Flush(msgspec.Struct, tag="flush"):
    seq: int


class Stop(msgspec.Struct, tag="stop"):
    grace: float  # seconds in-flight requests may take to finish before they are cancelled


class ClassReport(msgspec.Struct, array_like=True):
    """One class of a mix (--mix) in a worker's report: what its requests counted and
    measured this interval, a part of the report's own totals."""

    counters: Counters
    hists: dict[str, SparseHist]


class Report(msgspec.Struct, tag="report", kw_only=True):
    index: int
    seq: int
    in_flight: int
    backlog: int
    counters: Counters
    hists: dict[str, SparseHist]
    last_errors: dict[str, str]  # each kind's last message this interval, made plain
    loop_lag_ms: float
    cpu_s: float  # process CPU seconds since the previous report
    # streams in flight that look frozen, and of those the ones still waiting for their first
    # token (loadgen.model.outage, LoadState.stalled)
    stalled: int = 0
    stalled_first: int = 0
    # --trace: this worker's entries sent so far, and the entries in the whole trace (each
    # worker holds all of it): how far the replay is, and when it is done
    trace_sent: int = 0
    trace_total: int = 0
    # unix time of each kind's last error this interval (the one last_errors quotes): the
    # error's event is dated when it happened, not when the coordinator made the event
    error_at: dict[str, float] = msgspec.field(default_factory=dict)
    # --mix: each class's part of counters and hists, in the workload's class order (empty:
    # no mix)
    classes: list[ClassReport] = msgspec.field(default_factory=list)


class Stopped(msgspec.Struct, tag="stopped"):
    index: int


class Failed(msgspec.Struct, tag="failed"):
    index: int
    message: str


ToWorker = Configure | SetLoad | Pause | Flush | Stop
FromWorker = Report | Stopped | Failed

_HEADER = struct.Struct(">I")
_encoder = msgspec.msgpack.Encoder()
to_worker_decoder = msgspec.msgpack.Decoder(ToWorker)
from_worker_decoder = msgspec.msgpack.Decoder(FromWorker)


def frame(msg: msgspec.Struct) -> bytes:
    body = _encoder.encode(msg)
    return _HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next message body, or None at a clean EOF."""
    try:
        head = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError:
        return None
    (n,) = _HEADER.unpack(head)
    return await reader.readexactly(n)
