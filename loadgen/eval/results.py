"""What an eval keeps (OUT/eval.json), typed: each phase's result and its figures, and the
state around them. The battery writes these, the matrix reads them; the JSON is what the
dicts before these Structs wrote (same keys, same nesting, same order), so an eval.json
of an older tokentop is still read, resumed and compared.

Two rules keep the JSON as it was: a key that was only sometimes written is a field whose
default is UNSET (left out when unset, unlike None, which is written as null), and a phase
with no figures (skipped, failed) has `figures: {}` on disk, None here (state_to_builtins,
state_from_builtins).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from loadgen.analysis.soak_result import (
    Drift,
    LongTail,
    Mttr,
    OutageRecord,
    Summary,
    ThresholdResult,
)
from loadgen.analysis.sweep import StepResult
from loadgen.eval.efficiency import EngineSlope, KvPerRequest
from loadgen.eval.phases import PHASES, Phase
from loadgen.eval.validity import Span

EVAL_FORMAT = "tokentop-eval/1"
Status = Literal["done", "skipped", "failed"]


class _Figures(msgspec.Struct):
    """A phase's figures. Each is kw_only (msgspec's setting is per class), so a required
    field may follow an optional one where the JSON's order has it so."""


# ---- conformance ------------------------------------------------------------------------------

Verdict = Literal["yes", "no", "partial"]


class Check(msgspec.Struct, kw_only=True):
    """One API conformance check (loadgen.eval.conformance): what the target did."""

    id: str  # "stop", "n", "errors.unknown_model": the same in every eval
    name: str  # in words, for the table
    verdict: Verdict
    evidence: str  # the status, the first bytes (plain, short), what differed


class ConformanceFigures(_Figures, kw_only=True):
    model: str | None  # the model the checks asked for
    checks: list[Check]


# ---- baseline and efficiency ------------------------------------------------------------------


class Dcgm(_Figures, kw_only=True):
    """--dcgm-url over the baseline: activity means (0–1) and DCGM's energy; only `why`
    when there was no sample (no --dcgm-url, the exporter not answering)."""

    sm_active: float | UnsetType | None = UNSET
    tensor_active: float | UnsetType | None = UNSET
    dram_active: float | UnsetType | None = UNSET
    tokens_per_joule: float | UnsetType | None = UNSET
    why: str


class BaselineFigures(_Figures, kw_only=True):
    load: str  # "4 streams", "10 req/s"
    req_s: float | None
    output_tok_s: float | None
    goodput_req_s: float | None  # None without a per-request SLO
    error_rate: float | None
    latency_ms: dict[str, Summary | None]  # ttft, itl, e2e
    thresholds: list[ThresholdResult]
    tokens_per_joule: float | None
    req_s_per_w: float | None
    gpu_util_pct: float | None
    gpu_memory_mb_per_in_flight: float | None
    gpu_source: str
    energy_why: str | None
    dcgm: Dcgm | UnsetType = UNSET  # not in the evals before --dcgm-url
    # not in the evals before round two:
    requests: int | UnsetType = UNSET  # requests that ended in the measured window
    input_tok_s: float | UnsetType | None = UNSET
    goodput_slo: str | UnsetType | None = UNSET  # the per-request SLO goodput counts against
    span: Span | UnsetType = UNSET  # what the recording shows about the window (validity)
    # with --repeat N: every run's value by row id (the first run's figures are the ones
    # above; the matrix's rows give the mean and its 95 % interval), and every run's dir
    repeats: dict[str, list[float | None]] | UnsetType = UNSET
    run_dirs: list[str] | UnsetType = UNSET
    kv_per_request: KvPerRequest | UnsetType = UNSET  # the engine's KV cache ÷ in flight


class EfficiencyAt(_Figures, kw_only=True):
    """Efficiency at one point: the baseline's (GpuUse's figures, as it found them) or the
    knee's (two figures, or only energy_why when the ramp found no knee)."""

    tokens_per_joule: float | UnsetType | None = UNSET
    req_s_per_w: float | UnsetType | None = UNSET
    gpu_util_pct: float | UnsetType | None = UNSET
    gpu_memory_mb_per_in_flight: float | UnsetType | None = UNSET
    energy_why: str | UnsetType | None = UNSET
    dcgm: Dcgm | UnsetType | None = UNSET  # None: the baseline did not run
    gpu_source: str | UnsetType | None = UNSET


class EfficiencyFigures(_Figures, kw_only=True):
    baseline: EfficiencyAt | UnsetType = UNSET  # only the points the plan's `at` names
    knee: EfficiencyAt | UnsetType = UNSET


# ---- ramp, long tail, leaks -------------------------------------------------------------------


class RampFigures(_Figures, kw_only=True):
    unit: str  # streams | req/s
    steps: list[StepResult]
    knee: StepResult | None
    best_goodput: StepResult | None
    max_output_tok_s: float | None
    plot: str  # its sweep.png
    # with --repeat N: every run's figure at the knee, best goodput and top, by row id
    repeats: dict[str, list[float | None]] | UnsetType = UNSET
    knee_scaling: float | UnsetType = UNSET  # the plan's knee_fraction it was judged by


class LongTailFigures(_Figures, kw_only=True):
    load: str
    seconds: float  # measured
    long_tail: LongTail
    drift: Drift
    availability: float | None
    outages: list[OutageRecord]
    latency_ms: dict[str, Summary]
    plots: list[str]  # its report's PNGs
    span: Span | UnsetType = UNSET  # not in the evals before round two
    engine_kv: EngineSlope | UnsetType = UNSET  # the KV cache in use through the soak


class LeakSlope(_Figures, kw_only=True):
    slope_mb_h: float | None
    limit_mb_h: float
    why: str  # why there is no slope ("" when there is one)
    passed: bool | None  # None: not judged (a soak shorter than min_soak, or no slope)


class LeaksFigures(_Figures, kw_only=True):
    soak_s: float
    judged: bool
    min_soak_s: float
    server_rss: LeakSlope
    gpu_memory: LeakSlope
    # GPU-side leaks judged on the engine's own KV cache in use (not in the evals before it)
    engine_kv: EngineLeak | UnsetType = UNSET


class EngineLeak(_Figures, kw_only=True):
    slope: EngineSlope
    limit: float  # in the slope's unit
    passed: bool | None  # None: not judged (a short soak, or no slope)


# ---- faults -----------------------------------------------------------------------------------


class UnderFault(_Figures, kw_only=True):
    """While one fault was on (loadgen.eval.under_fault)."""

    fault: str  # latency | reset | blackhole | bandwidth
    params: dict[str, Any]  # the fault's own, by kind (ms, probability, seconds …)
    start: float
    end: float | None
    requests_ok: int
    requests_failed: int
    errors: dict[str, int]
    success_rate: float | None
    silence_s: float | None
    recovery_s: float | None
    # what the load measured while it was on (loadgen.analysis.report.DuringSpan: the ticks
    # wholly inside the span); not in the evals before them
    output_tok_s: float | UnsetType | None = UNSET
    itl_p50_ms: float | UnsetType | None = UNSET
    itl_p99_ms: float | UnsetType | None = UNSET
    e2e_p50_ms: float | UnsetType | None = UNSET
    e2e_p90_ms: float | UnsetType | None = UNSET
    e2e_p99_ms: float | UnsetType | None = UNSET


class ChaosFigures(_Figures, kw_only=True):
    """--chaos-restart-cmd: the kill and the restart; only `killed` and `why` when nothing
    was killed."""

    killed: bool
    pid: int | UnsetType | None = UNSET
    killed_at: float | UnsetType = UNSET
    mttr_s: float | UnsetType | None = UNSET
    restart_exit: int | UnsetType | None = UNSET
    why: str


class ProxyCounts(_Figures, kw_only=True):
    resets: int
    accepted: int


class FaultsFigures(_Figures, kw_only=True):
    faults: list[UnderFault]
    chaos: ChaosFigures | None  # None: no --chaos-restart-cmd
    outages: list[OutageRecord]
    mttr_s: Mttr
    availability: float | None
    proxy: ProxyCounts
    plots: list[str]
    span: Span | UnsetType = UNSET  # not in the evals before round two


# ---- scaling ----------------------------------------------------------------------------------


class ScalingRow(_Figures, kw_only=True):
    targets: int
    output_tok_s: float
    req_s: float
    run_dirs: list[str]
    efficiency: float | None = None  # against N × one; set once every row is in
    # scaling across client machines (a fleet's agents, one target): how many loaded; unset
    # when the rows scale over targets
    agents: int | UnsetType = UNSET


class ScalingFigures(_Figures, kw_only=True):
    per_target_load: int | float  # streams (an int) or req/s
    rows: list[ScalingRow]
    kind: str


# ---- batch (loadgen.eval.batching) ------------------------------------------------------------


class Spread(_Figures, kw_only=True):
    """One latency's spread over a ramp step (ms, the recording's histograms): the
    fluctuation under dynamic batching is P99 ÷ P50 and the interquartile range."""

    count: int  # samples: tokens for ITL, requests for TPOT
    p25_ms: float | None
    p50_ms: float | None
    p75_ms: float | None
    p99_ms: float | None

    @property
    def p99_over_p50(self) -> float | None:
        p50, p99 = self.p50_ms, self.p99_ms
        return p99 / p50 if p50 and p99 is not None else None

    @property
    def iqr_ms(self) -> float | None:
        p25, p75 = self.p25_ms, self.p75_ms
        return p75 - p25 if p25 is not None and p75 is not None else None


class StepSpread(_Figures, kw_only=True):
    """The fluctuation at one ramp step: its measured ticks' ITL and TPOT."""

    load: float  # the step's (streams or req/s: the ramp's unit)
    ticks: int  # the ticks they are over
    itl: Spread
    tpot: Spread


class BatchFigures(_Figures, kw_only=True):
    """Static batching against the dynamic baseline, and the latency fluctuation per ramp
    step."""

    requests: int  # submitted at once
    requests_ok: int
    requests_failed: int  # failed, cancelled, or not ended within the timeout
    output_tokens: int  # delivered, all requests
    # the first send to the last token: every request is sent at once, so the longest
    # request's E2E (its send to its last token) ends the batch; None: why says why
    time_to_last_token_ms: float | None
    output_tok_s: float | None  # output_tokens ÷ time to the last token
    why: str  # why there is no time to the last token ("" when there is)
    ttft_ms: dict[str, float | None]  # p50, p99
    e2e_ms: dict[str, float | None]  # p50, max
    timeout_s: float
    dynamic_output_tok_s: float | None  # the baseline's, as the eval had it
    dynamic_load: str  # the baseline's load ("16 streams"); "" when it did not run
    dynamic_why: str  # why there is no baseline to compare with ("" when there is)
    steps: list[StepSpread]  # each ramp step's fluctuation, in the ramp's order
    steps_unit: str  # the ramp's: streams | req/s
    steps_why: str  # why there are none ("" when there are)

    @property
    def static_vs_dynamic(self) -> float | None:
        static, dynamic = self.output_tok_s, self.dynamic_output_tok_s
        return static / dynamic if static is not None and dynamic else None


# ---- context (loadgen.eval.context) ------------------------------------------------------------


class ContextRung(_Figures, kw_only=True):
    """One rung of a length ladder: its lengths and, when it was sent, what its run measured
    (or, when it was not, why)."""

    input_tokens: int
    output_tokens: int
    sent: bool  # False: input + output do not fit the server's stated max context
    why: str = ""  # why it was not sent, or why its requests all failed ("" when served)
    requests_ok: int | None = None  # measured (after warm-up)
    requests_failed: int | None = None
    errors: dict[str, int] = {}  # by kind (http_4xx …), the whole run's
    ttft_ms: Summary | None = None
    itl_ms: Summary | None = None
    # input tokens ÷ TTFT P50: the prefill speed one request sees, queueing at the phase's
    # concurrency included (not the server's prefill throughput summed over requests)
    prefill_tok_s: float | None = None
    output_tok_s: float | None = None
    error_rate: float | None = None
    run_dir: str | None = None


class LongestPrompt(_Figures, kw_only=True):
    """The longest prompt served (with the input ladder's output length), and how it was
    found: the ladder's rungs, then single requests bisecting up to a refusal or the max."""

    tokens: int | None  # None: no prompt was served
    how: str  # in words: where it came from
    refused_at: int | None = None  # the shortest prompt refused (words sent), None: none
    probes: int = 0  # single requests sent to find it


class ContextFigures(_Figures, kw_only=True):
    """The input- and output-length ladders at a fixed concurrency."""

    concurrency: int
    max_context: int | None  # the server's stated max context (tokens); None: none stated
    max_context_from: str  # where it was read ("GET /v1/models max_model_len"), or why not
    input_ladder: list[ContextRung]  # output_tokens fixed
    output_ladder: list[ContextRung]  # input_tokens fixed
    longest: LongestPrompt


# ---- interference (loadgen.eval.interference) --------------------------------------------------


class NeighborUse(_Figures, kw_only=True):
    """What a neighbour used, as the OS measured it (never its own report)."""

    cpu_s: float | None  # user + system: wait4's rusage of it and what it reaped
    disk_write_bytes: int | None  # /proc/PID/io write_bytes over its processes
    disk_why: str | None  # why there is no disk figure
    seconds: float  # from its start to its end
    ended: str  # "stopped", or how it ended early, in words


class InterferenceRun(_Figures, kw_only=True):
    """The baseline load once: alone, or beside one neighbour."""

    neighbor: str  # "alone", "cpu", "memory", "disk", "command", "alone_after" (alone again)
    what: str  # the neighbour in words ("2 busy processes"); "" alone
    why: str = ""  # why its figures are missing or partial ("" when it ran as planned)
    load: str = ""
    requests: int | None = None  # ended in the measured window
    ttft_ms: Summary | None = None
    itl_ms: Summary | None = None
    output_tok_s: float | None = None
    error_rate: float | None = None
    use: NeighborUse | None = None  # None: alone, or the neighbour did not start
    run_dir: str | None = None


class InterferenceFigures(_Figures, kw_only=True):
    """The baseline load alone and beside each neighbour, and where each process ran."""

    client_cores: list[int]  # this process and its load workers, during the phase
    neighbor_cores: list[int]
    server_cores: list[int] | None  # the server process' affinity; None: not seen here
    server_why: str  # how the server was found, or why not
    placement: str  # in words: "client on cores 0, neighbour on 1, server: any"
    runs: list[InterferenceRun]  # the alone run first, alone again last


# ---- priority classes (loadgen.eval.priority) -------------------------------------------------


class ClassThreshold(_Figures, kw_only=True):
    """One of a class's own whole-run limits (its `slo=`), judged on its requests alone."""

    shown: str  # "ttft_p99<200ms"
    passed: bool | None  # None: nothing to judge it on (no request of the class)
    measured: str  # the figure judged, in words ("measured 41.2 ms", "no data (fails)")


class ClassFigures(_Figures, kw_only=True):
    """One class of the mix over the run's measured window (the run's --json `classes`)."""

    name: str
    priority: int | None  # sent as the body's `priority`; None: not sent
    share_asked: float  # of all requests, 0..1
    share_sent: float | None  # as drawn; None: no request ended
    requests_ok: int
    requests_failed: int
    errors: dict[str, int]  # failed requests by kind
    ttft_ms: Summary | None
    itl_ms: Summary | None
    e2e_ms: Summary | None
    output_tok_s: float | None
    goodput_req_s: float | None  # within `limits`; None: no per-request limits
    limits: str | None  # the per-request limits its goodput counts within
    thresholds: list[ClassThreshold]
    why: str = ""  # why its figures are missing or partial ("" when it ran as asked)
    # its requests failed with their priority and succeeded without: the server does not
    # take the field, and the two runs are not alike (the other classes had it to themselves)
    refused: bool = False


class PriorityFigures(_Figures, kw_only=True):
    """The plan's mix of classes at one load, sent with their priorities; then, to see what
    the server does with them, the same mix sent without."""

    load: str  # "32 streams"
    load_why: str  # how the load was chosen ("2 × the ramp's knee, 16 streams")
    classes: list[ClassFigures]  # with the priorities, in the mix's order
    without: list[ClassFigures]  # the same mix without priorities ([]: not run)
    without_why: str  # why `without` is empty ("" when it ran)
    without_run_dir: str | None


# ---- memory (loadgen.eval.memory) --------------------------------------------------------------


class MemoryFigures(_Figures, kw_only=True):
    """GPU memory per billion parameters and the KV cache's capacity, as the server states
    (loadgen.eval.memory). A figure that is None has its `*_why`."""

    # the model's parameters, in billions: the server's stated figure, else --model-params
    params_b: float | None
    params_source: str  # where params_b is from, in words
    params_flag_b: float | None  # --model-params as given (None: not given)
    params_why: str | None
    # GPU memory used, summed over the GPUs, the mean over the baseline's measured window
    gpu_memory_gb: float | None
    gpu_count: int  # the GPUs the probes saw
    gpu_samples: int  # the ticks averaged
    gpu_source: str  # nvml | simulated | none
    gpu_why: str | None
    gb_per_b_params: float | None  # gpu_memory_gb ÷ params_b
    gb_per_b_why: str | None
    kv_tokens: int | None  # the KV pool's capacity in tokens
    kv_bytes: int | None  # the pool's bytes over all its GPUs
    kv_bytes_per_token: float | None  # kv_bytes ÷ kv_tokens
    kv_source: str
    kv_why: str | None  # why no capacity in tokens
    kv_bytes_why: str | None  # why no bytes


# ---- a phase, the phases, the eval ------------------------------------------------------------

F = TypeVar("F")


class PhaseResult(msgspec.Struct, Generic[F], kw_only=True, omit_defaults=True):
    """A phase's result. `why` only when it did not run (skipped, failed), `run_dir` only
    for a phase with a run of its own: left out of the JSON otherwise, as before."""

    status: Status
    why: str = ""
    run_dir: str | None = None
    figures: F | None  # None: skipped or failed ({} on disk)
    seconds: float | None = None  # set by the battery once it is over


class Results(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The phases that have a result, in PHASES' order (a test holds the fields to it)."""

    conformance: PhaseResult[ConformanceFigures] | None = None
    baseline: PhaseResult[BaselineFigures] | None = None
    ramp: PhaseResult[RampFigures] | None = None
    batch: PhaseResult[BatchFigures] | None = None
    context: PhaseResult[ContextFigures] | None = None
    interference: PhaseResult[InterferenceFigures] | None = None
    priority: PhaseResult[PriorityFigures] | None = None
    long_tail: PhaseResult[LongTailFigures] | None = None
    faults: PhaseResult[FaultsFigures] | None = None
    leaks: PhaseResult[LeaksFigures] | None = None
    memory: PhaseResult[MemoryFigures] | None = None
    efficiency: PhaseResult[EfficiencyFigures] | None = None
    scaling: PhaseResult[ScalingFigures] | None = None

    def of(self, name: Phase) -> PhaseResult | None:
        return getattr(self, name)

    def put(self, name: Phase, result: PhaseResult) -> None:
        setattr(self, name, result)

    def ran(self) -> list[Phase]:
        """The phases with a result, in order."""
        return [p for p in PHASES if self.of(p) is not None]

    def items(self) -> list[tuple[Phase, PhaseResult]]:
        return [(p, r) for p in PHASES if (r := self.of(p)) is not None]


class Workload(msgspec.Struct, kw_only=True):
    """What the load sends, for compare to say where two evals' workloads differ."""

    api: str
    model: str | None
    dataset: str
    input_tokens: str
    output_tokens: str
    tokenizer: str | None
    mode: str  # closed | open
    load: int | float  # streams (an int) or req/s


class GpuInfo(msgspec.Struct, kw_only=True):
    name: str | None
    memory_mb: float | None
    driver: str | None


class Header(msgspec.Struct, kw_only=True):
    """What was measured, on what, when, by which tokentop: eval.md's and eval.html's head,
    and what compare names when two evals differ in it (loadgen.eval.header makes it).
    None where it could not be found out (said in `why`)."""

    label: str | None = None  # --label
    meta: dict[str, str] = {}  # --meta key=value …
    engine: str | None = None  # as detected: vllm, sglang, llama.cpp, tgi, simulator …
    engine_version: str | None = None
    model: str | None = None  # the model the server serves
    gpus: list[GpuInfo] = []
    host_cpu: str | None = None
    host_cores: int | None = None
    host_memory_gb: float | None = None
    date: str = ""  # ISO 8601, when the eval started
    tokentop_version: str = ""
    plan_digest: str = ""  # sha256 of the plan as eval.json keeps it, first 12 hex digits
    # where the phases' load came from: None this machine; a fleet's agents (--broker)
    load_from: str | UnsetType = UNSET
    why: dict[str, str] = {}  # a field left None, and why ("engine": "no /version answered")


class EvalState(msgspec.Struct, kw_only=True):
    """OUT/eval.json."""

    format: str
    started: float
    finished: bool
    quick: bool
    target: str  # the URL, or "embedded simulator"
    workload: Workload
    # plan_to_builtins' Plan: read back with plan_from_builtins, whose checks and errors
    # in words are the plan file's
    plan: dict[str, Any]
    phases: Results
    # the matrix's rows (matrix.to_json), for readers of eval.json; tokentop computes them
    # again from `phases` rather than read them; written once the eval's outputs are
    rows: list[dict[str, Any]] | UnsetType = UNSET
    header: Header | UnsetType = UNSET  # not in the evals before it


def done(figures: Any, run_dir: str | None = None) -> PhaseResult:
    return PhaseResult(status="done", run_dir=run_dir, figures=figures)


def skipped(why: str) -> PhaseResult:
    return PhaseResult(status="skipped", why=why, figures=None)


def failed(why: str) -> PhaseResult:
    return PhaseResult(status="failed", why=why, figures=None)


# ---- JSON -------------------------------------------------------------------------------------


def state_to_builtins(state: EvalState) -> dict[str, Any]:
    """eval.json's content: a phase without figures has {} there."""
    out = msgspec.to_builtins(state)
    for result in out["phases"].values():
        if result["figures"] is None:
            result["figures"] = {}
    return out


def state_from_builtins(data: Any) -> EvalState:
    """The EvalState of eval.json's decoded JSON; msgspec.ValidationError when it is not one
    (the message names the key path)."""
    if isinstance(data, dict) and isinstance(data.get("phases"), dict):
        # {} (no figures) is None here: an empty dict is not a phase's figures
        data = {**data, "phases": {
            name: {**r, "figures": r.get("figures") or None} if isinstance(r, dict) else r
            for name, r in data["phases"].items()}}
    return msgspec.convert(data, EvalState)


def read_eval(path: Path) -> EvalState:
    """An eval directory's eval.json (or the file itself); ValueError in words."""
    f = path / "eval.json" if path.is_dir() else path
    try:
        return read_state(f.read_bytes())
    except FileNotFoundError:
        raise ValueError(f"{path}: no eval.json (is it a `tokentop eval --out` directory?)") \
            from None
    except msgspec.ValidationError as e:  # JSON, not an eval's (a DecodeError: caught first)
        raise ValueError(f"{f} is not a tokentop eval ({e})") from None
    except (OSError, msgspec.DecodeError) as e:
        raise ValueError(f"{f}: cannot be read ({e})") from None


def read_state(raw: bytes) -> EvalState:
    """eval.json's bytes; msgspec.DecodeError / ValidationError when not an eval."""
    return state_from_builtins(msgspec.json.decode(raw))
