"""The Snapshot: one tick of one run, the record every consumer reads.

A live run, a replay of a run directory and a fleet agent over MQTT are all
sources of the same Snapshot, so the console, the recorder and the publisher
never know which one they are looking at. It is versioned (`v`) and
JSON-serialisable; readers refuse versions they do not know.

Conventions, so that nothing has to be guessed downstream:

* Latency histograms are *interval* histograms: only what completed during
  this tick, encoded the HdrHistogram way (V2, compressed, base64), values in
  microseconds. Windows (10 s, 1 min, whole run) are sums of intervals
  (see `loadgen.model.windows`).
* `counters` are cumulative since the run started, so a lost Snapshot (MQTT
  QoS 0) loses no totals; rates come from differences.
* Every gauge that can be unknown is `None` when unknown. A `None` is shown as
  "n/a"; a zero is a measured zero.
* `events` holds only the events raised during this tick.
* Secrets (API keys, broker passwords) never appear here.
"""

from __future__ import annotations

import msgspec

from loadgen.model.kinds import (
    ControlOp,
    ControlSource,
    ErrorKind,
    EventKind,
    Health,
    Level,
    LoadMode,
    RunState,
)

SNAPSHOT_VERSION = 1

# Latency metrics carried in `Snapshot.hist` (all in µs). Definitions: README, "What is measured".
# lag, ttft_co and e2e_co exist in open loop only (intended send time); ttft_err and
# itl_err in calibration only (|measured − true|); connect only for requests that had to
# open a connection; ttfa (time to the first answer token) only for streams that began by
# reasoning. A metric with no samples is left out.
METRICS = ("ttft", "itl", "tpot", "e2e", "icl", "lag", "ttft_co", "e2e_co", "ttft_err", "itl_err",
           "connect", "ttfa")

class Target(msgspec.Struct, kw_only=True):
    url: str  # base URL of the OpenAI API, e.g. http://127.0.0.1:8000/v1
    model: str
    api: str = "chat"  # chat | completions
    simulated: bool = False  # the embedded simulator, started by tokentop
    # how prompt lengths are known (--tokenizer): "path" (a local tokenizer), "server" (the
    # target's /tokenize): exact; "approx" (about one token a word); None: older recordings
    lengths: str | None = None
    # what the target is beyond its URL, in words: the embedded simulator's profile, slots,
    # KV budget and faults at start (None: a real server, or an older recording)
    about: str | None = None


class LoadState(msgspec.Struct, kw_only=True):
    mode: LoadMode = "closed"  # closed (N concurrent streams) | open (request rate)
    state: RunState = "starting"
    target_concurrency: int = 0
    target_rate: float | None = None  # open loop: requests/s
    arrival: str | None = None  # open loop: constant | poisson | gamma(k)
    max_in_flight: int | None = None  # open loop cap
    in_flight: int = 0  # requests sent and not yet finished, all workers
    backlog: int = 0  # requests due but not yet sent (open loop)
    warmup: bool = False  # this tick is warm-up: excluded from results
    # streams in flight that look frozen (loadgen.model.outage): streaming, then nothing for
    # STALL_AFTER_S; or still waiting for a first token far longer than any first token of
    # the run took (those are also in stalled_first: a long wait alone is no frozen server)
    stalled: int = 0
    stalled_first: int = 0
    health: Health = "up"  # up | degraded (errors, some success) | outage (loadgen.model.outage)
    outage_since: float | None = None  # unix time the current outage began (None: no outage)
    note: str | None = None  # e.g. "ramp 8→64, 30 s left"
    # --trace: entries sent of all the trace's, and where its own clock stands in its span
    # (target_rate is then the rate it sent at over the last 10 s: a trace has no --rate)
    trace_sent: int | None = None
    trace_total: int | None = None
    trace_time: float | None = None
    trace_span: float | None = None


# Multi-turn conversations (--turns): a row of TurnCounts per turn number, the last row
# holding every later turn too, so a long conversation costs a fixed size per Snapshot
MAX_TURN_ROWS = 16


class TurnCounts(msgspec.Struct, array_like=True):
    """The completed requests of one turn number of the conversations, summed (means per
    turn come from differences, as every counter's)."""

    requests: int = 0
    ttft_us: int = 0  # the sum of their TTFTs
    input_tokens: int = 0  # prompt tokens (the server's count, else the asked length)
    cached_tokens: int = 0  # of those, the server's prefix-cache hits where it reported any

    def add(self, other: TurnCounts) -> None:
        self.requests += other.requests
        self.ttft_us += other.ttft_us
        self.input_tokens += other.input_tokens
        self.cached_tokens += other.cached_tokens

    def since(self, earlier: TurnCounts) -> TurnCounts:
        return TurnCounts(self.requests - earlier.requests, self.ttft_us - earlier.ttft_us,
                          self.input_tokens - earlier.input_tokens,
                          self.cached_tokens - earlier.cached_tokens)


class Counters(msgspec.Struct, kw_only=True):
    """Cumulative since the run started."""

    requests_ok: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0  # abandoned by the client on purpose (also in errors)
    requests_good: int = 0  # ok and within every per-request SLO (goodput)
    # output tokens delivered, counted as they arrive (per-chunk usage where given, else one
    # a chunk, corrected by the final usage): streams that later failed or were cancelled
    # count too, since their tokens were delivered
    output_tokens: int = 0
    # output tokens of requests that completed (the basis of goodput and per-request figures)
    completed_output_tokens: int = 0
    # prompt tokens as the server counted them (usage), else the asked length
    input_tokens: int = 0
    chunks: int = 0
    # output tokens that were counted from chunks because the server sent no usage
    estimated_output_tokens: int = 0
    # prompt tokens that are the asked length because the server reported none
    estimated_input_tokens: int = 0
    # the asked prompt length, summed over the requests whose server reported its count,
    # so (input_tokens − estimated_input_tokens) / input_tokens_asked compares like with like
    input_tokens_asked: int = 0
    # token gaps in ITL whose per-token split was estimated (no per-chunk usage and no local
    # tokenizer: the final count split over the chunks in whole tokens by their text, or,
    # with no usage at all, one token a chunk)
    estimated_itl_tokens: int = 0
    # latency samples above the histogram's range (1 h), recorded at its top
    clipped_samples: int = 0
    # reasoning models, over the completed requests that reasoned: their output tokens split
    # into reasoning and answer (usage.completion_tokens_details where the server gives it,
    # else counted from the reasoning-only chunks: those are also in estimated_reasoning_tokens)
    reasoning_requests: int = 0
    reasoning_tokens: int = 0
    answer_tokens: int = 0
    estimated_reasoning_tokens: int = 0
    # prefix caching, over the completed requests whose server reported it
    # (usage.prompt_tokens_details.cached_tokens, llama.cpp's timings.cache_n): their prompt
    # tokens served from the cache, and all their prompt tokens (the hit rate's base)
    cached_tokens: int = 0
    cache_reported_input_tokens: int = 0
    # completed requests whose output length (the server's count) differs from the asked
    # max_tokens while an exact length was asked for (ignore_eos / min_tokens)
    output_differs: int = 0
    # closed loop, its pacing after failures (loadgen.worker.pacing): the waits streams made
    # after a failed request (a jittered back-off, or the server's Retry-After on 429/503),
    # those the server's Retry-After set, and the stream-µs spent waiting so; success rates
    # are per attempt, with this pacing known (open loop never waits: its schedule holds)
    backoffs: int = 0
    backoffs_retry_after: int = 0
    backoff_us: int = 0
    errors: dict[str, int] = msgspec.field(default_factory=dict)
    # multi-turn conversations only: turn number n's figures in row n − 1 (MAX_TURN_ROWS)
    turns: list[TurnCounts] = msgspec.field(default_factory=list)

    def add(self, other: Counters) -> None:
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for kind, n in other.errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + n
        if other.turns:
            while len(self.turns) < len(other.turns):
                self.turns.append(TurnCounts())
            for mine, theirs in zip(self.turns, other.turns, strict=False):
                mine.add(theirs)

    def since(self, earlier: Counters) -> Counters:
        """What was counted after `earlier` (a previous value of the same cumulative set)."""
        out = Counters(**{n: getattr(self, n) - getattr(earlier, n) for n in _COUNTS})
        errors = {k: n - earlier.errors.get(k, 0) for k, n in self.errors.items()}
        out.errors = {k: n for k, n in errors.items() if n}
        if self.turns:
            before = earlier.turns
            out.turns = [t.since(before[i] if i < len(before) else TurnCounts())
                         for i, t in enumerate(self.turns)]
        return out

    def turn(self, number: int) -> TurnCounts:
        """The row of turn `number` (1-based), made on first use."""
        i = min(number, MAX_TURN_ROWS) - 1
        while len(self.turns) <= i:
            self.turns.append(TurnCounts())
        return self.turns[i]


# every integer count of Counters (all its fields but the errors by kind and the turns)
_COUNTS = tuple(n for n in Counters.__struct_fields__ if n not in ("errors", "turns"))


class ServerMetrics(msgspec.Struct, kw_only=True):
    """What the server's own Prometheus /metrics says, mapped to a common view."""

    url: str
    ok: bool = False
    error: str | None = None  # why the scrape failed, in words
    engine: str | None = None  # vllm | sglang | tgi | trtllm | triton | llamacpp | unknown
    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    # the KV cache's pool as the engine states it (None: it does not): its size in tokens
    # (vLLM's cache_config_info, SGLang's max_total_num_tokens, Triton's max blocks × tokens
    # per block); its bytes per GPU where the engine states them (vLLM's
    # kv_cache_memory_bytes, when the operator set it); and the share of GPU memory the
    # engine preallocates at start (vLLM's gpu_memory_utilization), which is why the GPU's
    # memory used does not move with the load nor with a leak inside the pool
    kv_pool_tokens: int | None = None
    kv_pool_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    preemptions_total: float | None = None
    # rates from the counters between the last two scrapes (a counter reset is a restart,
    # never a negative rate)
    prompt_tok_s: float | None = None
    generation_tok_s: float | None = None
    # prefix caching as the server counts it: vLLM V1's cumulative token counters, and the
    # hit rate (0..1) between the last two scrapes from them, else the engine's own gauge
    # (vLLM V0's block hit rate, SGLang's cache_hit_rate)
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_hit_rate: float | None = None
    restarts: int = 0  # counter resets seen since the probe started
    # the server's own latency quantiles over the last ~10 s, from its histogram buckets:
    # {"ttft": {"p50": ms, "p90": ms, "p99": ms}, "itl": …, "e2e": …, "queue": …}
    latency_ms: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)
    # unknown engines: a few of the gauges that are there, by name
    generic: dict[str, float] = msgspec.field(default_factory=dict)
    scrape_ms: float | None = None


class GpuProcess(msgspec.Struct, kw_only=True):
    pid: int
    name: str | None = None
    used_bytes: int | None = None


class GpuSample(msgspec.Struct, kw_only=True):
    index: int
    name: str
    simulated: bool = False
    uuid: str | None = None
    lost: bool = False  # the GPU fell off the bus / stopped answering
    message: str | None = None  # why values are missing, in words
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    energy_j: float | None = None  # total energy counter since driver load (or sim start)
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle_reasons: list[str] | None = None  # decoded clock-event reasons, in words
    pcie_tx_kbs: float | None = None
    pcie_rx_kbs: float | None = None
    ecc_corrected: int | None = None  # volatile (since boot) ECC error counts
    ecc_uncorrected: int | None = None
    processes: list[GpuProcess] | None = None  # processes using this GPU (server's first)
    mig: list[str] | None = None  # MIG devices, where MIG is enabled


class GpuStatus(msgspec.Struct, kw_only=True):
    source: str = "none"  # nvml | simulated | none
    message: str | None = None  # e.g. "no NVIDIA driver found (libnvidia-ml.so.1 missing)"
    gpus: list[GpuSample] = msgspec.field(default_factory=list)
    poll_ms: float | None = None
    driver: str | None = None  # driver version, where known


class HostSample(msgspec.Struct, kw_only=True):
    cpu_pct: float | None = None  # whole host, 0..100
    cpu_count: int | None = None
    cpu_per_core: list[float] | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    load1: float | None = None
    net_rx_bps: float | None = None  # bytes per second, all interfaces
    net_tx_bps: float | None = None
    disk_read_bps: float | None = None
    disk_write_bps: float | None = None


class ProcessSample(msgspec.Struct, kw_only=True):
    """The inference server's process (and its children, summed), found by pid, port or name."""

    pid: int
    name: str | None = None
    found_by: str | None = None  # pid | port | name
    rss_bytes: int | None = None  # the process and its children
    cpu_pct: float | None = None  # 100 = one core
    threads: int | None = None
    open_files: int | None = None
    children: int | None = None
    rss_slope_mb_h: float | None = None  # least-squares slope over the recent window


class ClientSample(msgspec.Struct, kw_only=True):
    """The load generator's own health: if it saturates, its numbers are at risk."""

    workers: int = 0
    cpu_pct: float | None = None  # sum over worker processes, 100 = one core
    worker_cpu_pct: list[float] | None = None  # per worker, 100 = one core
    loop_lag_ms: float | None = None  # worst event-loop lag of any worker this tick


class Efficiency(msgspec.Struct, kw_only=True):
    """What the run derived from GPU energy (loadgen.run.watch), recorded with the tick."""

    tokens_per_joule: float | None = None  # output tokens per joule of GPU energy, last ~10 s


class Event(msgspec.Struct, kw_only=True):
    """Something that happened, in words for people and in a small typed payload for code:
    a reader counts, matches or dates events by the payload, never by the wording."""

    t: float  # unix seconds
    kind: EventKind
    level: Level = "info"
    message: str
    # error: how many requests failed this way since the last event of the kind (all of
    # them, however many messages were kept); stall: the streams stalled when it began
    count: int | None = None
    error: ErrorKind | None = None  # error: which kind of failure
    # outage, recovery: the outage's start (unix seconds), which names it; stall: its start
    since: float | None = None
    # recovery: how long the outage lasted (its MTTR); stall over: how long the stall did
    seconds: float | None = None


class ClassTick(msgspec.Struct, kw_only=True):
    """One class of a mix (--mix) in a tick: its counters (cumulative, as the Snapshot's)
    and its interval histograms, a part of the Snapshot's own, which are their sum."""

    counters: Counters
    hist: dict[str, str] = msgspec.field(default_factory=dict)


class Snapshot(msgspec.Struct, kw_only=True):
    v: int = SNAPSHOT_VERSION
    run_id: str
    seq: int  # 0, 1, 2 … per run
    t: float  # unix seconds at the end of the interval
    elapsed: float  # seconds since the run started
    interval: float  # seconds this tick's histograms cover
    target: Target
    load: LoadState
    counters: Counters
    hist: dict[str, str] = msgspec.field(default_factory=dict)  # metric -> encoded interval hist
    server: ServerMetrics | None = None
    gpu: GpuStatus = msgspec.field(default_factory=GpuStatus)
    host: HostSample | None = None
    process: ProcessSample | None = None
    client: ClientSample = msgspec.field(default_factory=ClientSample)
    efficiency: Efficiency | None = None  # None: no energy counter (or not derived yet)
    events: list[Event] = msgspec.field(default_factory=list)
    # --mix: each class by name, in the mix's order (empty: no mix, the run is one class)
    classes: dict[str, ClassTick] = msgspec.field(default_factory=dict)

    def of_class(self, name: str) -> Snapshot:
        """This tick as class `name` alone saw it: its counters and histograms in place of
        the run's, the rest as it is (no events: they are the run's), so that every reader
        of Snapshots (windows, summaries, verdicts) reads a class as it reads a run."""
        c = self.classes[name]
        return msgspec.structs.replace(self, counters=c.counters, hist=c.hist, events=[],
                                       classes={})


class SnapshotVersionError(ValueError):
    pass


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Snapshot)


def to_json(snapshot: Snapshot) -> bytes:
    return _encoder.encode(snapshot)


def from_json(data: bytes | str) -> Snapshot:
    """Decode one Snapshot; raises SnapshotVersionError or msgspec.DecodeError with a clear text."""
    snap = _decoder.decode(data)
    if snap.v != SNAPSHOT_VERSION:
        raise SnapshotVersionError(
            f"snapshot format version {snap.v} is not supported "
            f"(this tokentop reads {SNAPSHOT_VERSION})"
        )
    return snap


class Control(msgspec.Struct, kw_only=True):
    """A plain control message; the console, the CLI and MQTT all send these.

    op: set_concurrency (value) | add_concurrency (value, may be negative) |
        set_rate (value, req/s) | add_rate (value) | set_mode (note: closed | open) |
        auto_ramp (climb while the SLOs hold) | pause | resume | stop | mark (note)
    """

    op: ControlOp
    value: float | None = None
    note: str | None = None
    source: ControlSource = "cli"  # who asked
