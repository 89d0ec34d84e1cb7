"""What the soak analysis finds (loadgen.analysis.soak), typed: report.json's shape.

Values are as report.json has them: times in unix seconds, latencies in ms, memory in MB.
A field that is UNSET is left out of the JSON, as the dicts before these Structs left it
out; one with a default is one that a report.json of an older tokentop may not have. The
keys are the Structs' field names, in their order.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType


class _Part(msgspec.Struct):
    """A part of the result. Each is kw_only (msgspec's setting is per class): built by
    name, never by position."""


class OutageRecord(_Part, kw_only=True):
    kind: str  # client | server
    start: float
    end: float
    start_rel: float
    ongoing: bool  # still going at the last Snapshot
    failed: int  # requests that failed inside it (client)
    errors: dict[str, int]
    reason: str | None  # client: why, in words; server: the probe's words
    gap_s: float = 0.0  # recording gaps inside it: not counted in its duration
    duration_s: float
    # the outage event it is a view of: the client's and /metrics' views of one failure
    # (their spans overlap) share a number, counted once in `outage_events`
    event: int = 0


class Mttr(_Part, kw_only=True):
    """The mean duration of the closed outages, by kind and of their union (`any`)."""

    client: float | None
    server: float | None
    any: float | None


class Stall(_Part, kw_only=True):
    start: float
    start_rel: float
    end: float | None  # None: still stalled at the last Snapshot
    stalled: int
    in_flight: int
    message: str


class Stalls(_Part, kw_only=True):
    count: int  # every episode; `episodes` holds the first STALL_LIST_MAX
    episodes: list[Stall]


class Gap(_Part, kw_only=True):
    start: float
    end: float
    duration_s: float
    start_rel: float
    after_seq: int
    resumed_seq: int


class Rates(_Part, kw_only=True):
    """After warm-up (loadgen.model.slo.rates_from, rounded)."""

    error_rate: float | None
    req_s: float | None
    output_tok_s: float | None
    goodput_req_s: float | None


class ThresholdResult(_Part, kw_only=True):
    """One --slo threshold on the whole run (loadgen.model.slo.evaluate_thresholds)."""

    text: str
    metric: str
    stat: str | None
    op: str
    limit: float
    measured: int | float | None  # in `unit`: us for latencies (an HDR value: an int)
    unit: str  # us | fraction | per_s
    passed: bool
    shown: str


class Slope(_Part, kw_only=True):
    """A memory series' least-squares slope; withheld (None, with why) when too short."""

    slope_mb_h: float | None
    samples: int
    span_h: float
    trend: bool  # the span is long enough for a trend (loadgen.model.trend)
    first_mb: float | None
    last_mb: float | None
    peak_mb: float | None
    min_span_s: float | UnsetType = UNSET  # set with slope_withheld (loadgen.analysis.report)
    slope_withheld: str | UnsetType = UNSET


class TickStats(_Part, kw_only=True):
    """A metric's latency over a drift bucket."""

    count: int
    p50_ms: float | None
    p99_ms: float | None
    p99_9_ms: float | None = msgspec.field(name="p99.9_ms")
    max_ms: float | None


class Bucket(_Part, kw_only=True):
    """One drift bucket; its per-metric stats are fields named as TICK_METRICS."""

    index: int
    start_elapsed_s: float  # of load time: the first bucket starts at the end of warm-up
    seconds: float
    # true: it covers less than soak.FULL_BUCKET of its span (the run's last, cut by the
    # drain): listed, never compared (no vs_first, not in throughput_change); absent: whole
    partial: bool | UnsetType = UNSET
    ttft: TickStats
    itl: TickStats
    output_tok_s: float | None
    req_s: float | None
    error_rate: float | None
    server_rss_mb: float | None
    gpu_mem_mb: float | None
    # the first bucket has none: "ttft_p99", "ttft_p99.9", …, "output_tok_s" → ratio
    vs_first: dict[str, float | None] | UnsetType = UNSET


class Drift(_Part, kw_only=True):
    bucket_s: float
    buckets: list[Bucket]
    server_rss: Slope
    gpu_memory: Slope
    throughput_change: float | None  # the last whole bucket's throughput / the first's


class DrainCounts(_Part, kw_only=True):
    """What came after the drain began (the run summary's `drain`): left out of the rates,
    the measured seconds and the measured requests; its latencies are in latency_ms."""

    seconds: float
    errors: dict[str, int]
    requests_ok: int
    requests_failed: int
    requests_cancelled: int
    output_tokens: int
    input_tokens: int


class TailInterval(_Part, kw_only=True):
    """A tick whose P99.9 or max of a latency broke the long-tail limit."""

    t: float
    rel: float
    elapsed: float
    seq: int
    metric: str
    count: int
    p99_ms: float | None
    p99_9_ms: float | None = msgspec.field(name="p99.9_ms")
    max_ms: float | None
    in_flight: int
    server_waiting: float | None
    limit_ms: float | None = None  # set when the limit is known (at the end)
    x_limit: float = 0.0
    context: list[str] = msgspec.field(default_factory=list)


class LongTail(_Part, kw_only=True):
    limits_ms: dict[str, float | None]  # by metric (TICK_METRICS)
    rule: str
    counts: dict[str, int]  # ticks above the limit, by metric
    intervals: list[TailInterval]  # the worst TAIL_LIST_MAX, in time order


class EventLine(_Part, kw_only=True):
    """A warn/error event, or an info one of KEPT_INFO_EVENTS."""

    t: float
    rel: float
    kind: str
    level: str
    message: str


class RunTarget(_Part, kw_only=True):
    url: str | None
    model: str | None
    simulated: bool


class Requests(_Part, kw_only=True):
    """The whole run's counters (warm-up included)."""

    ok: int
    failed: int
    cancelled: int
    errors: dict[str, int]
    output_tokens: int
    input_tokens: int


class Measured(_Part, kw_only=True):
    """Requests after warm-up and before the drain: what the success rate is of."""

    ok: int
    failed: int


# a latency summary (loadgen.model.hdr.summarize, in ms): count, min, mean, p50 … p99.9, max;
# a mapping, not a Struct: its keys come from hdr.PERCENTILES, and their order from the data
Summary = dict[str, int | float | None]


class SoakResult(_Part, kw_only=True):
    run_id: str | None
    start_time: float | None
    last_t: float | None
    wall_s: float
    elapsed_s: float
    # the measured window: after warm-up, before the drain (the run summary's duration_s),
    # and its ends in unix time (None: an analysis from before them, or nothing measured)
    measured_s: float
    measured_from: float | None = None
    measured_to: float | None = None
    ticks: int
    state: str | None
    target: RunTarget | None
    requests: Requests
    measured_requests: Measured | None = None  # None: an analysis before it (the whole run's)
    drain: DrainCounts | None = None  # None: no drain (yet), or an analysis from before it
    success_rate: float | None
    success_rate_during_outages: float | None
    outages: list[OutageRecord]  # each view of each outage: the client's, /metrics'
    outage_events: int | None = None  # outages, each counted once whatever saw it
    mttr_s: Mttr
    outage_s: float | None = None  # None: an analysis from before these three
    availability: float | None = None
    stalls: Stalls | None = None
    server_metrics_never_answered: str | None
    gaps: list[Gap]
    latency_ms: dict[str, Summary]  # by metric (RUN_METRICS)
    rates: Rates
    thresholds: list[ThresholdResult]
    thresholds_passed: bool | None
    drift: Drift
    long_tail: LongTail
    event_counts: dict[str, int]
    events: list[EventLine]  # the last 200
