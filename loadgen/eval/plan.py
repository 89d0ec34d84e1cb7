"""The eval plan: what `tokentop eval` runs, read from TOML into typed Structs.

`DEFAULT_PLAN` is the default plan as commented TOML text, the one place its values
live: `tokentop eval --print-plan` prints it, and a user's plan (`--plan FILE`) is
laid over it key by key (tables merge, a list replaces the default's list), so a
plan file holds only what it changes. Its `[quick]` tables are laid over `[phases]`
the same way to make the `--quick` profile: `Plan.quick` is a complete `Phases`, as
`Plan.phases` is, and the battery runs whichever the command line picks.

Validation happens here, before any load, and every problem is one line naming the
file and the key path: "plan.toml: phases.faults[2].seconds: expected a number, got
"ten"". Types are msgspec's (unknown keys, wrong types, ranges); values with a form
of their own (times, fractions, lengths, datasets, SLOs, URLs) are read by the same
parsers as the command line's flags, through `_dec_hook`, so the path comes with
their words too.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import inspect as mi

from loadgen.eval.phases import PHASES as PHASES  # Phases has a table for each (test_plan)
from loadgen.model import units
from loadgen.model.slo import SloError, Slos, parse_slos
from loadgen.worker.dataset import Dataset, DatasetError
from loadgen.worker.distributions import LengthDist, WorkloadError
from loadgen.worker.mix import parse_class, parse_mix

PLAN_VERSION = 1
# Load goes on this long after the last fault ends, so the recovery is seen: an outage is
# only declared after OUTAGE_MIN_S (3 s) and MTTR ends at the first success after it (the
# plan's fault_settle; this is its default, and the plans' of the evals before the key).
FAULT_SETTLE_S = 15.0
MIN_FAULT_SETTLE_S = 5.0  # past OUTAGE_MIN_S, with a first success to end the MTTR after
# `tokentop eval --quick` against the embedded simulator must finish within this.
QUICK_BUDGET_S = 360.0


class PlanError(ValueError):
    """A plan that cannot be used; str(e) is the one line for the user."""


# ---- values with a form of their own (read by _dec_hook) ------------------------------------


class Seconds(float):
    """0 or more seconds: a number, or text with a unit ("90s", "5m", "24h")."""


class Duration(Seconds):
    """More than 0 seconds, in the same forms."""


class Fraction(float):
    """0..1, or a percentage as text ("5%"), as the command line's fractions."""


class Length(str):
    """A length distribution's text (128, "uniform:64:256", …), as --input-tokens."""


class OutputLength(Length):
    """A Length, or "dataset": a ShareGPT dataset's own reply lengths."""


class DatasetText(str):
    """A --dataset spec: synthetic, text:FILE, sharegpt:FILE or jsonl:FILE."""


class SloText(str):
    """SLOs as --slo text; "" for none."""


class Url(str):
    """An http:// or https:// base URL."""


class RowId(str):
    """A matrix row's id ("baseline.ttft.p99"), * matching any text ("faults.*.recovery")."""


class ClassText(str):
    """One class of a mix, as --mix takes it ("interactive 20% out=64 priority=0")."""


class StaggerText(str):
    """"auto", or the seconds closed-loop stream starts are spread over (0: all at once), as
    --stagger; `seconds` is RunConfig.stagger's (None for auto)."""

    @property
    def seconds(self) -> float | None:
        return None if self == "auto" else float(self)


def _units(parse, value: object, **options: object) -> float:
    """A value read by the command line's own parser (loadgen.model.units), so "24h" and
    "5%" mean here what they mean in --duration and --max-error-rate; its words, with the
    value as it was written in TOML ("ten", true)."""
    try:
        return parse(value, **options)
    except units.UnitError as e:
        raise ValueError(e.worded(_show)) from None


def _seconds(value: object) -> float:
    return _units(units.parse_seconds, value, zero=True)


def _duration(value: object) -> float:
    return _units(units.parse_seconds, value)


def _fraction(value: object) -> float:
    return _units(units.parse_fraction, value)


def _length(value: object, *, output: bool = False) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f'expected a length, e.g. 128 or "uniform:64:256", got {_show(value)}')
    text = str(value).strip()
    if output and text == "dataset":
        return text
    try:
        LengthDist.parse(text)
    except WorkloadError as e:
        raise ValueError(str(e)) from None
    return text


def _text_of(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected {what} as text, got {_show(value)}")
    return value.strip()


def _dataset(value: object) -> str:
    text = _text_of(value, "a dataset")
    try:
        Dataset.parse(text)  # the form only: the file is read when the battery starts
    except DatasetError as e:
        raise ValueError(str(e)) from None
    return text


def _slo(value: object) -> str:
    text = _text_of(value, "SLOs")
    try:
        parse_slos(text)
    except SloError as e:
        raise ValueError(str(e)) from None
    return text


def _class(value: object) -> str:
    text = _text_of(value, "a class (as --mix takes it)")
    try:
        parse_class(text)  # the classes together (their shares) are checked in _check
    except WorkloadError as e:
        raise ValueError(str(e)) from None
    return text


def _url(value: object) -> str:
    text = _text_of(value, "a URL")
    if not re.match(r"^https?://[^/\s]+", text):
        raise ValueError(f"expected an http:// or https:// URL, got {_show(value)}")
    return text


def _row_id(value: object) -> str:
    text = _text_of(value, "a matrix row id")
    if not text or any(c.isspace() for c in text):
        raise ValueError(f'expected a matrix row id, e.g. "baseline.ttft.p99", got {_show(value)}')
    return text


def _stagger(value: object) -> str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return f"{_seconds(value):g}"
    except ValueError as e:
        raise ValueError(f'"auto" or {e}'.replace('"auto" or expected', '"auto" or')) from None


_READERS = {
    Seconds: _seconds, Duration: _duration, Fraction: _fraction, Length: _length,
    OutputLength: lambda v: _length(v, output=True), DatasetText: _dataset, SloText: _slo,
    Url: _url, StaggerText: _stagger, RowId: _row_id, ClassText: _class,
}


def _dec_hook(kind: type, value: object) -> object:
    reader = _READERS.get(kind)
    if reader is None:
        raise NotImplementedError(kind)
    return kind(reader(value))


def _enc_hook(value: object) -> object:
    """The marker types as the plain float or str they are, for JSON."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    raise NotImplementedError(type(value))


# ---- the plan ---------------------------------------------------------------------------

Count = Annotated[int, msgspec.Meta(ge=1)]
Positive = Annotated[float, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class _Table(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A plan table: every key required (the default plan gives each), none unknown."""


class Conformance(_Table):
    """The API checks (loadgen.eval.conformance), before any load; a few short requests."""

    enabled: bool
    timeout: Duration  # each check's; a hang past it is "no answer"


# the plans of the evals before the conformance phase: it did not run there, nor on resume
_NO_CONFORMANCE = Conformance(enabled=False, timeout=Duration(10.0))


class Baseline(_Table):
    """A fixed load; its workload is every phase's, its load the faults phase's too."""

    enabled: bool
    mode: Literal["closed", "open"]
    concurrency: Count  # closed loop: streams
    rate: Positive  # open loop: requests/s
    duration: Duration
    warmup: Seconds
    dataset: DatasetText
    input_tokens: Length
    output_tokens: OutputLength


class Ramp(_Table):
    """A sweep (loadgen.analysis.sweep) in the baseline's mode, to the knee."""

    enabled: bool
    steps: list[Positive] | Literal["auto"]
    step_duration: Duration
    step_warmup: Seconds
    knee_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)]
    max_error_rate: Fraction
    slo: SloText  # "": the plan's


class Batch(_Table):
    """Static batching (loadgen.eval.batching): N requests at once, beside the baseline."""

    enabled: bool
    requests: Count  # submitted at once, one a stream, the baseline's workload
    timeout: Duration  # the batch is cut off here: its unfinished requests count as failed


# the plans of the evals before the batch phase
_NO_BATCH = Batch(enabled=False, requests=64, timeout=Duration(600.0))


Ladder = Annotated[list[Count], msgspec.Meta(min_length=1)]


class Context(_Table):
    """The input- and output-length ladders (loadgen.eval.context), at a fixed concurrency:
    each rung a run of step_warmup + step_duration."""

    enabled: bool
    concurrency: Count  # closed-loop streams on every rung
    input_ladder: Ladder  # input tokens, increasing; output fixed_output on each
    output_ladder: Ladder  # output tokens, increasing; input fixed_input on each
    fixed_output: Count  # output tokens on the input ladder
    fixed_input: Count  # input tokens on the output ladder
    step_duration: Duration  # measured, per rung
    step_warmup: Seconds  # not measured, per rung


# the plans of the evals before the context phase: it did not run there, nor on resume
_NO_CONTEXT = Context(enabled=False, concurrency=1, input_ladder=[128], output_ladder=[16],
                      fixed_output=16, fixed_input=128, step_duration=Duration(1.0),
                      step_warmup=Seconds(0.0))


Neighbor = Literal["cpu", "memory", "disk", "command"]


class Interference(_Table):
    """The baseline load alone, then beside each neighbour (loadgen.eval.interference):
    each a run of warmup + duration."""

    enabled: bool
    neighbors: Annotated[list[Neighbor], msgspec.Meta(min_length=1)]
    duration: Duration  # measured, per run
    warmup: Seconds  # not measured, per run (the neighbour already on)
    cpu_workers: Annotated[int, msgspec.Meta(ge=0)]  # 0: one per core not the client's
    memory_mb: Count  # each memory worker's array (it copies into a second one as big)
    disk_block_kb: Count  # each write's, fsync'd
    command: str  # "": none (--neighbor-cmd wins)

    def runs(self) -> int:
        """The runs it plans: alone, each neighbour, the command when one is given, and
        alone again after them."""
        extra = bool(self.command) and "command" not in self.neighbors
        return 2 + len(set(self.neighbors)) + extra


# the plans of the evals before the interference phase: it did not run there, nor on resume
_NO_INTERFERENCE = Interference(enabled=False, neighbors=["cpu", "memory", "disk"],
                                duration=Duration(60.0), warmup=Seconds(10.0), cpu_workers=0,
                                memory_mb=64, disk_block_kb=1024, command="")


class Priority(_Table):
    """The plan's classes (as --mix takes them) at `factor` × a load (loadgen.eval.priority):
    a run of warmup + duration with their priorities, then one without when `without`."""

    enabled: bool
    classes: Annotated[list[ClassText], msgspec.Meta(min_length=1)]
    load: Literal["knee", "baseline"]  # the ramp's knee load, or the baseline's
    factor: Positive  # times that load: past the knee, requests queue and priority decides
    duration: Duration  # measured, per run
    warmup: Seconds  # not measured, per run
    without: bool  # also the same mix without its priorities

    def runs(self) -> int:
        return 1 + self.without


# the plans of the evals before the priority phase: it did not run there, nor on resume
_NO_PRIORITY = Priority(enabled=False, classes=[ClassText("all 100%")], load="knee",
                        factor=2.0, duration=Duration(60.0), warmup=Seconds(10.0),
                        without=True)


class LongTail(_Table):
    """A soak at `fraction` of the knee's load (loadgen.analysis.soak reads it)."""

    enabled: bool
    fraction: Positive  # of the knee's load
    duration: Duration
    bucket: Duration  # drift buckets (SoakAnalysis bucket_s)
    tail_k: Annotated[float, msgspec.Meta(gt=1)]


class _Fault(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, tag_field="fault"):
    """One scheduled fault of the proxy; `fault` (the TOML key) names its kind."""

    at: Seconds  # from the faults phase's start

    @property
    def length(self) -> float:
        raise NotImplementedError

    @property
    def end(self) -> float:
        return self.at + self.length


class _Timed(_Fault):
    """A fault that lasts `for` seconds (a Python keyword: the attribute is for_)."""

    for_: Duration = msgspec.field(name="for")

    @property
    def length(self) -> float:
        return float(self.for_)


class Latency(_Timed, tag="latency"):
    ms: Positive
    jitter_ms: NonNegative = 0.0


class Reset(_Timed, tag="reset"):
    probability: Fraction


class Blackhole(_Fault, tag="blackhole"):
    seconds: Duration

    @property
    def length(self) -> float:
        return float(self.seconds)


class Bandwidth(_Timed, tag="bandwidth"):
    bytes_per_s: Positive


Fault = Latency | Reset | Blackhole | Bandwidth


class Leaks(_Table):
    """Memory slopes over the long tail's soak (no run of its own), judged in MB/h."""

    enabled: bool
    max_rss_mb_per_h: NonNegative
    max_gpu_mb_per_h: NonNegative  # the engine's KV cache in use, when it states its bytes
    min_soak: Seconds  # a shorter soak shows the slopes without judging them
    # the engine's KV cache in use, when it states its pool in tokens only (a default for
    # the plans of the evals before it)
    max_kv_tokens_per_h: NonNegative = 10_000.0


class Memory(_Table):
    """GPU memory per billion parameters and the KV cache's capacity (loadgen.eval.memory),
    from what the server states and the baseline's GPU samples (no run of its own)."""

    enabled: bool


_NO_MEMORY = Memory(enabled=False)  # the plans of the evals before the memory phase


class Efficiency(_Table):
    """Energy and GPU use at these points of other phases (no run of its own)."""

    enabled: bool
    at: Annotated[list[Literal["baseline", "knee"]], msgspec.Meta(min_length=1)]


class Scaling(_Table):
    """Throughput at 1..N targets against N x one; empty with a single target."""

    enabled: bool
    targets: list[Url]  # []: the command line's --url targets
    per_target: Literal["knee", "baseline"]
    duration: Duration
    warmup: Seconds


class Request(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What every request of every phase adds to its body, as the command line's
    --temperature, --top-p, --top-k, --sampling-seed, --response-format and --extra-body
    (a flag given wins over its key here). A key left out is not sent: the server's own
    default. Headers are not here: their values are secrets, and a plan is recorded whole
    (--header on the command line)."""

    temperature: Annotated[float, msgspec.Meta(ge=0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    seed: Annotated[int, msgspec.Meta(ge=0)] | None = None  # the body's seed (sampling)
    response_format: Literal["json"] | None = None
    extra_body: dict[str, Any] = msgspec.field(default_factory=dict)

    def run_fields(self) -> dict[str, Any]:
        """These keys as RunConfig's fields (None: not set here)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "sampling_seed": self.seed, "response_format": self.response_format,
                "extra_body": self.extra_body or None}


class Scenario(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A use the evals are compared for: `tokentop eval compare` ends with a verdict per
    scenario, judged on these matrix rows by compare's noise rule (loadgen.eval.scenarios).
    A row id may hold * ("faults.*.success_rate": every fault's)."""

    about: str  # what it is for, in a line
    rows: Annotated[list[RowId], msgspec.Meta(min_length=1)]
    # "no worse": the winner is better on a row and worse on none; "weighted": its weights
    # of the rows it is better on outweigh those it is worse on
    rule: Literal["no worse", "weighted"] = "no worse"
    weights: list[Positive] = []  # one per row, with rule = "weighted"
    slo: SloText = SloText("")  # goodput rows count within its per-request limits; its
    # whole-run thresholds judge the rows they apply to


class Phases(_Table, kw_only=True):  # kw_only: an optional field first
    conformance: Conformance = msgspec.field(default_factory=lambda: _NO_CONFORMANCE)
    baseline: Baseline
    ramp: Ramp
    batch: Batch = msgspec.field(default_factory=lambda: _NO_BATCH)
    context: Context = msgspec.field(default_factory=lambda: _NO_CONTEXT)
    interference: Interference = msgspec.field(default_factory=lambda: _NO_INTERFERENCE)
    priority: Priority = msgspec.field(default_factory=lambda: _NO_PRIORITY)
    long_tail: LongTail
    faults: list[Fault]  # []: no faults phase
    leaks: Leaks
    memory: Memory = msgspec.field(default_factory=lambda: _NO_MEMORY)
    efficiency: Efficiency
    scaling: Scaling


class Plan(_Table):
    version: int
    slo: SloText
    phases: Phases
    quick: Phases  # the --quick profile: phases with [quick] laid over them
    # defaults for the plans of the evals before these keys (eval.json keeps the plan)
    repeat: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1
    stagger: StaggerText = StaggerText("auto")
    fault_settle: Duration = Duration(FAULT_SETTLE_S)  # the faults phase, after its last
    request: Request = msgspec.field(default_factory=Request)
    scenarios: dict[str, Scenario] = msgspec.field(default_factory=dict)

    def profile(self, quick: bool) -> Phases:
        return self.quick if quick else self.phases

    def slos(self, ramp: Ramp | None = None) -> Slos:
        """The plan's SLOs; with a ramp, the ramp's own when it has some."""
        return parse_slos(ramp.slo if ramp is not None and ramp.slo else self.slo)


# ---- reading ----------------------------------------------------------------------------


def parse_plan(text: str, source: str = "plan.toml") -> Plan:
    """The Plan of a plan file's text laid over the default plan; PlanError names `source`
    and the key path."""
    return _build(_merge(_default_raw(), _toml(text, source)), source)


def read_plan(path: str | Path) -> Plan:
    """The Plan of a --plan FILE; PlanError (one line) when it cannot be read or used."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise PlanError(f"{path}: cannot read: {e.strerror or e}") from None
    return parse_plan(text, str(path))


def plan_to_builtins(plan: Plan) -> dict[str, Any]:
    """The Plan as JSON-able builtins (for an eval's results, and its resume), in the
    plan file's key names."""
    return msgspec.to_builtins(plan, enc_hook=_enc_hook)


def plan_from_builtins(data: dict[str, Any], source: str) -> Plan:
    """The Plan that plan_to_builtins wrote; PlanError names `source` when it is not one."""
    return _build(data, source)


def scenarios_from_builtins(data: dict[str, Any], source: str) -> dict[str, Scenario] | None:
    """The [scenarios] of a plan that plan_to_builtins wrote, read alone (an older eval's plan
    may lack keys of today's phases); None: a plan from before scenarios."""
    raw = data.get("scenarios") if isinstance(data, dict) else None
    if raw is None:
        return None
    try:
        scenarios = msgspec.convert(raw, dict[str, Scenario], dec_hook=_dec_hook)
    except msgspec.ValidationError as e:
        raise PlanError(f"{source}: scenarios: {e}") from None
    problem = _check_scenarios(scenarios)
    if problem:
        raise PlanError(f"{source}: {problem}")
    return scenarios


def default_plan() -> Plan:
    return _build(_default_raw(), "the default plan")


def _toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"{source}: not TOML: {e}") from None


def _default_raw() -> dict[str, Any]:
    return tomllib.loads(DEFAULT_PLAN)


def _merge(base: Any, over: Any) -> Any:
    """`over` laid over `base`: tables key by key, anything else (lists too) replaced."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    merged = copy.deepcopy(base)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if key in merged else copy.deepcopy(value)
    return merged


def _build(raw: dict[str, Any], source: str) -> Plan:
    # [quick] is validated as the complete Phases it makes, under its own name, so an error
    # in an override names quick.…, and one in an inherited value was already reported
    # under phases.… (the dict's order is the order msgspec checks in).
    shaped = {key: value for key, value in raw.items() if key != "quick"}
    shaped["quick"] = _merge(raw.get("phases"), raw.get("quick", {}))
    try:
        plan = msgspec.convert(shaped, Plan, dec_hook=_dec_hook)
    except msgspec.ValidationError as e:
        raise PlanError(f"{source}: {_explain(_named(str(e), shaped), shaped)}") from None
    problem = _check(plan)
    if problem:
        raise PlanError(f"{source}: {problem}")
    return plan


def _named(message: str, raw: dict[str, Any]) -> str:
    """msgspec's path with the scenario's name where it says only `scenarios[...]`."""
    if "$.scenarios[...]" not in message:
        return message
    for name, table in (raw.get("scenarios") or {}).items():
        try:
            msgspec.convert(table, Scenario, dec_hook=_dec_hook)
        except msgspec.ValidationError:
            return message.replace("$.scenarios[...]", f"$.scenarios.{name}")
    return message


# ---- checks across keys -----------------------------------------------------------------


def _check(plan: Plan) -> str | None:
    """The first problem that no single key's type can say, as 'path: words'; None: none."""
    if plan.version != PLAN_VERSION:
        return f"version: this tokentop reads plan version {PLAN_VERSION}, not {plan.version}"
    if plan.fault_settle < MIN_FAULT_SETTLE_S:
        return (f"fault_settle: expected at least {MIN_FAULT_SETTLE_S:g}s (an outage is seen "
                f"after 3 s), got {plan.fault_settle:g}s")
    for name in ("phases", "quick"):
        phases: Phases = getattr(plan, name)
        problem = (_check_steps(phases.ramp, f"{name}.ramp")
                   or _check_faults(phases.faults, name)
                   or _check_ladders(phases.context, f"{name}.context")
                   or _check_classes(phases.priority, f"{name}.priority"))
        if problem:
            return problem
    return _check_scenarios(plan.scenarios)


def _check_steps(ramp: Ramp, path: str) -> str | None:
    steps = ramp.steps
    if steps == "auto":
        return None
    if not steps or list(steps) != sorted(set(steps)):
        return f"{path}.steps: expected increasing loads, e.g. [1, 2, 4, 8], or \"auto\""
    return None


def _check_ladders(context: Context, path: str) -> str | None:
    for key in ("input_ladder", "output_ladder"):
        ladder = getattr(context, key)
        if list(ladder) != sorted(set(ladder)):
            return f"{path}.{key}: expected increasing lengths, e.g. [128, 512, 2048]"
    return None


def _check_classes(priority: Priority, path: str) -> str | None:
    """The classes as a mix: shares adding up to 100 %, each name once."""
    try:
        parse_mix(list(priority.classes))
    except WorkloadError as e:
        return f"{path}.classes: {str(e).removeprefix('--mix ')}"
    return None


def _check_faults(faults: list[Fault], name: str) -> str | None:
    """Faults must not overlap: each row is the success rate under one fault."""
    order = sorted(range(len(faults)), key=lambda i: faults[i].at)
    for before, after in itertools.pairwise(order):
        if faults[after].at < faults[before].end:
            a, b = faults[before], faults[after]
            return (f"{name}.faults[{after}].at: starts at {b.at:g} s, while "
                    f"{name}.faults[{before}] ({a.at:g} s to {a.end:g} s) is still on")
    return None


# rows made per fault, per target count, per threshold, per ladder rung and per class: their
# ids are not known before
_MADE_ROWS = ("faults.", "scaling.", "slo.", "context.input.", "context.output.", "priority.")


def _check_scenarios(scenarios: dict[str, Scenario]) -> str | None:
    """Each scenario's rows are the matrix's, and a weight is given for each with "weighted"."""
    from fnmatch import fnmatchcase

    from loadgen.eval.matrix import rows  # the matrix's module imports the results'
    from loadgen.eval.results import Results

    known = [r.id for r in rows(Results())]  # every row an eval has, its phases run or not
    for name, s in scenarios.items():
        path = f"scenarios.{name}"
        for i, id_ in enumerate(s.rows):
            if not id_.startswith(_MADE_ROWS) and not any(fnmatchcase(k, id_) for k in known):
                near = difflib.get_close_matches(id_, known, n=1)
                hint = f' (did you mean "{near[0]}"?)' if near else ""
                return f'{path}.rows[{i}]: "{id_}" is no row of the matrix{hint}'
        if s.rule == "weighted" and len(s.weights) != len(s.rows):
            return (f"{path}.weights: expected {len(s.rows)} (one per row, rule = "
                    f'"weighted"), got {len(s.weights)}')
        if s.rule != "weighted" and s.weights:
            return f'{path}.weights: read only with rule = "weighted", not "{s.rule}"'
    return None


# ---- planned time -----------------------------------------------------------------------


def faults_seconds(faults: list[Fault], settle: float = FAULT_SETTLE_S) -> float:
    """The faults phase's length: to the end of the last fault, and `settle` after (the
    plan's fault_settle)."""
    return max(f.end for f in faults) + settle if faults else 0.0


def planned_seconds(phases: Phases, targets: int = 1, settle: float = FAULT_SETTLE_S) -> float:
    """The load time the battery plans (an auto ramp counted at its most steps): leaks and
    efficiency are read from other phases, scaling runs 1..N targets when N > 1."""
    from loadgen.analysis.sweep import AUTO_MAX_STEPS  # the sweep's module is a heavy import

    b, r, t, s = phases.baseline, phases.ramp, phases.long_tail, phases.scaling
    steps = AUTO_MAX_STEPS if r.steps == "auto" else len(r.steps)
    total = (b.warmup + b.duration) * b.enabled
    total += steps * (r.step_warmup + r.step_duration) * r.enabled
    total += phases.batch.timeout * phases.batch.enabled  # at most: it ends with its last token
    total += t.duration * t.enabled + faults_seconds(phases.faults, settle)
    total += targets * (s.warmup + s.duration) * (s.enabled and targets > 1)
    c = phases.context
    rungs = len(c.input_ladder) + len(c.output_ladder)
    total += rungs * (c.step_warmup + c.step_duration) * c.enabled
    i = phases.interference
    total += i.runs() * (i.warmup + i.duration) * i.enabled
    p = phases.priority
    total += p.runs() * (p.warmup + p.duration) * p.enabled
    return float(total)


# ---- errors in words --------------------------------------------------------------------

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_EXPECTED = re.compile(r"^Expected `(?P<type>[^`]+)`(?P<rule>[^,]*)(?:, got `(?P<got>[^`]+)`)?$")
_TYPE_WORDS = {"float": "a number", "int": "a whole number", "str": "text", "bool": "true or false",
               "array": "a list", "object": "a table", "null": "nothing"}
_RULE_WORDS = {">=": "at least", ">": "above", "<=": "at most", "<": "below"}


def _explain(message: str, raw: dict[str, Any]) -> str:
    """A msgspec ValidationError's text as 'key.path: words', with the value found there."""
    m = _AT.match(message)
    assert m is not None  # the pattern matches any text
    msg, path = m["msg"], _segments(m["path"] or "")
    if unknown := re.match(r"Object contains unknown field `(.+)`", msg):
        return _unknown(path, unknown[1], raw)
    if missing := re.match(r"Object missing required field `(.+)`", msg):
        needs = ", ".join(_known_keys(path, raw, required=True))
        return f"{_dotted([*path, missing[1]])}: missing (this table needs {needs})"
    value = _value_at(raw, path)
    if expected := _EXPECTED.match(msg):
        return f"{_dotted(path)}: expected {_expected(expected)}, got {_show(value)}"
    if msg.startswith(("Invalid enum value", "Invalid value")):
        return f"{_dotted(path)}: expected {_either(_choices(path, raw))}, got {_show(value)}"
    return f"{_dotted(path)}: {msg}"  # a reader's own words (_dec_hook)


def _expected(m: re.Match) -> str:
    kinds = " or ".join(_TYPE_WORDS.get(k.strip(), k.strip()) for k in m["type"].split("|"))
    rule = m["rule"].strip()
    if rule.startswith("of length >="):
        return f"{kinds} of at least {rule.split()[-1]}"
    if rule:
        op, _, limit = rule.partition(" ")
        return f"{kinds}, {_RULE_WORDS.get(op, op)} {float(limit):g}"
    return kinds


def _either(words: list[str]) -> str:
    return " or ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} or {words[-1]}"


def _unknown(path: list, key: str, raw: dict[str, Any]) -> str:
    known = _known_keys(path, raw)
    near = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {near[0]}?)" if near else f"; known keys: {', '.join(known)}"
    return f"{_dotted([*path, key])}: unknown key{hint}"


def _segments(path: str) -> list[str | int]:
    """".phases.faults[2].at" -> ["phases", "faults", 2, "at"]"""
    return [int(index) if index else key
            for key, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path)]


def _dotted(segments: list[str | int]) -> str:
    out = ""
    for seg in segments:
        out += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if out else seg)
    return out or "the plan"


def _value_at(raw: Any, path: list[str | int]) -> Any:
    for seg in path:
        try:
            raw = raw[seg]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def _show(value: object) -> str:
    """A value as it was written in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return "nothing" if value is None else str(value)


def _type_at(path: list[str | int], raw: Any) -> mi.Type:
    """The plan's type at `path`, unions of faults resolved by the raw data's `fault`."""
    kind: mi.Type = mi.type_info(Plan)
    data = raw
    for seg in path:
        kind = _resolve(kind, data)
        if isinstance(kind, mi.StructType):
            kind = next((f.type for f in kind.fields if f.encode_name == seg), mi.AnyType())
        elif isinstance(kind, mi.ListType):
            kind = kind.item_type
        elif isinstance(kind, mi.DictType):  # a table of tables by name ([scenarios])
            kind = kind.value_type
        data = _value_at(data, [seg])
    return _resolve(kind, data)


def _resolve(kind: mi.Type, data: Any) -> mi.Type:
    if isinstance(kind, mi.UnionType) and isinstance(data, dict):
        for member in kind.types:
            if isinstance(member, mi.StructType) and data.get(member.tag_field) == member.tag:
                return member
    return kind


def _known_keys(path: list[str | int], raw: Any, *, required: bool = False) -> list[str]:
    """The keys of the table at `path` (a fault's kind first, then by name)."""
    kind = _type_at(path, raw)
    structs = kind.types if isinstance(kind, mi.UnionType) else (kind,)
    keys: list[str] = []
    for struct in structs:
        if isinstance(struct, mi.StructType):
            tag = [struct.tag_field] if struct.tag_field else []
            names = sorted(f.encode_name for f in struct.fields if f.required or not required)
            keys += [k for k in [*tag, *names] if k not in keys]
    return keys


def _choices(path: list[str | int], raw: Any) -> list[str]:
    """What is allowed at `path`, in words: a Literal's values (and the other types of its
    union, as a ramp's "auto" or a list), or the fault kinds at a fault's `fault` key."""
    parent = _type_at(path[:-1], raw)
    if isinstance(parent, mi.UnionType):  # a fault of an unknown kind
        return [_show(t.tag) for t in parent.types if isinstance(t, mi.StructType)]
    kind = _type_at(path, raw)
    members = kind.types if isinstance(kind, mi.UnionType) else (kind,)
    words = [_show(v) for t in members if isinstance(t, mi.LiteralType) for v in t.values]
    return words + ["a list" for t in members if isinstance(t, mi.ListType)]


# ---- the default plan (`tokentop eval --print-plan`) -------------------------------------

DEFAULT_PLAN = """\
# tokentop eval plan: what `tokentop eval` runs against one serving framework.
#
# Start yours from this one (tokentop eval --print-plan > plan.toml) and keep only what
# you change: --plan FILE is laid over this default key by key, and a list (steps,
# [[phases.faults]], targets) replaces the default's whole list.
# Times: seconds as a number (90) or text with a unit ("90s", "5m", "24h").
# --quick lays the [quick] tables below over [phases] the same way: the whole battery
# against the embedded simulator then takes under 5 minutes.

version = 1

# SLOs, as `tokentop run --slo`: per request (goodput: ttft<, tpot<, e2e<) and whole-run
# thresholds (ttft_p99<, itl_p99<, error_rate<, output_tok_s>), judged in every row where
# one applies.
slo = "ttft<2s,tpot<100ms,ttft_p99<4s,itl_p99<200ms,error_rate<1%"

# How often the baseline and each ramp step are run (--repeat N): with 2 or more, each row
# is the mean with a 95 % interval, and `tokentop eval compare` calls a difference better or
# worse only beyond it.
repeat = 1

# Closed-loop streams start spread out, not together (together, fixed lengths keep them in
# lock-step: every round prefills the whole batch at once). "auto": the first stream times
# one request and the others start at random moments within that time; seconds: spread over
# that window; 0: all at once.
stagger = "auto"

# The faults phase goes on this long after its last fault ends (and after a chaos restart's
# window), so the recovery is seen: an outage is declared only after 3 s without a success,
# and its MTTR ends at the first success after it. A server that takes long to recover
# wants more; at least 5 s.
fault_settle = "15s"

# What every request adds to its body, as the command line's --temperature, --top-p,
# --top-k, --sampling-seed, --response-format and --extra-body (a flag given wins over its
# key here). A key left out is not sent: the server's own default. Sampling and guided
# decoding are real costs, handled differently by each engine. Headers are not here: their
# values are secrets, and the plan is recorded whole (--header on the command line).
[request]
# temperature = 0.7
# top_p = 0.9
# top_k = 40
# seed = 1234              # the body's "seed", for the server's sampling
# response_format = "json" # {"type": "json_object"}: guided decoding
extra_body = {}            # merged into every body, e.g. { repetition_penalty = 1.1 }

# 0. API conformance: what the server supports of the OpenAI API, before any load (a few
#    short requests): /v1/models, chat and completions (streamed and not), usage, max_tokens,
#    stop, n, logprobs, seed, response_format, tools, ignore_eos / min_tokens, its 4xx
#    errors, /tokenize, /metrics, /health; each yes, no or partial with its evidence.
[phases.conformance]
enabled = true
timeout = "10s"          # each check's; no answer within it is a "no"

# 1. Baseline: a fixed load: req/s, output tok/s, TTFT / ITL / E2E P50 to P99.9.
#    Every phase sends this workload; the faults phase drives this load too.
[phases.baseline]
enabled = true
mode = "closed"          # closed: `concurrency` streams; open: `rate` requests per second
concurrency = 16
rate = 4.0
duration = "5m"
warmup = "30s"           # load before the measurement, left out of the results
dataset = "synthetic"    # synthetic, text:FILE, sharegpt:FILE or jsonl:FILE (as --dataset)
input_tokens = 512       # 512, "uniform:64:256", "normal:128:32", "lognormal:128:0.5"
output_tokens = 128      # the same forms; "dataset": a ShareGPT dataset's reply lengths

# 2. Pressure ramp: a sweep to the knee and the max goodput under the SLO, in the
#    baseline's mode (streams in closed loop, req/s in open loop).
[phases.ramp]
enabled = true
steps = "auto"           # "auto": doubling until the knee or saturation; or [1, 2, 4, 8, 16]
step_duration = "30s"    # measured, per step
step_warmup = "10s"      # not measured, per step
knee_fraction = 0.2      # the knee: the last step before scaling, ln(tok/s ratio) / ln(load
                         # ratio), falls below this (0.2: 2x the load for under +15 % tok/s)
max_error_rate = "5%"    # stop after a step with more errors than this
slo = ""                 # the sweep's goodput SLO; "": the plan's slo

# 3. Static batching: N requests submitted at once (the baseline's workload, one request a
#    stream, no stagger, no warm-up): their total output tok/s over the time from the first
#    send to the last token, beside the dynamic baseline's tok/s; and the latency
#    fluctuation under dynamic batching: ITL and TPOT P99 / P50 and P75 - P25 at each ramp
#    step (read from the ramp's recording: no load of its own).
[phases.batch]
enabled = true
requests = 64            # submitted at once
timeout = "10m"          # the batch is cut off after this; what did not finish counts failed

# 4. Strong scaling and context length (fixed resources, a growing problem): an input-length
#    ladder (TTFT and prefill tok/s against input length) and an output-length ladder (ITL
#    against context) at a fixed concurrency, and the longest prompt served. A rung whose
#    input + output passes the server's stated max context (vLLM's max_model_len, llama.cpp's
#    n_ctx) is not sent; past the longest rung served, a few single requests bisect up to the
#    first refusal or the stated max.
[phases.context]
enabled = true
concurrency = 4
input_ladder = [128, 512, 2048, 8192, 32768]  # input tokens; fixed_output out on each
output_ladder = [16, 64, 256, 1024]           # output tokens; fixed_input in on each
fixed_output = 32        # output tokens on the input ladder
fixed_input = 128        # input tokens on the output ladder
step_duration = "20s"    # measured, per rung
step_warmup = "5s"       # not measured, per rung

# 5. Interference: the baseline load with a neighbour on the same host, against the same
#    load alone, before the neighbours and again after them (a host that changed under the
#    phase flags their rows); each a run of warmup + duration, the neighbour on from the
#    warm-up to the end. tokentop's client (this process and its load workers) is pinned to
#    the first quarter of the cores (at least one), the neighbour to the others; the server
#    is left where it runs (its cores are recorded). On a 1-core machine nothing is pinned.
#      cpu      busy processes (cpu_workers; 0: one per neighbour core)
#      memory   as many processes, each copying a memory_mb array into another (memory
#               bandwidth: 2 x memory_mb resident each)
#      disk     disk_block_kb blocks written with fsync into a temp file under the eval's
#               out dir, removed after
#      command  `command` (or --neighbor-cmd CMD, which wins) through the shell in its own
#               process group, killed with the group at the end; with one given, it runs
#               after the others even when `neighbors` leaves it out
[phases.interference]
enabled = true
neighbors = ["cpu", "memory", "disk"]
duration = "1m"          # measured, per run
warmup = "10s"           # not measured, per run
cpu_workers = 0          # 0: one per core not the client's
memory_mb = 64           # each memory worker's array
disk_block_kb = 1024     # each fsync'd write
command = ""             # e.g. "python train.py"; the plan is recorded whole (eval.json):
                         # no secret here (--neighbor-cmd keeps it off the record)

# 6. Priority classes: a mix of named classes (each as --mix takes it: its share, lengths
#    where not the baseline's, the `priority` its requests carry, its own SLO) at `factor` x
#    a load, past the knee, where requests queue and the server's order decides who waits;
#    then, with `without`, the same mix sent without priorities: what the server does with
#    them. Rows: each class's TTFT / ITL / E2E, goodput within its SLO, its SLO's verdicts,
#    and its TTFT P99 with against without. vLLM reads `priority` only when started with
#    --scheduling-policy priority (without, it refuses a nonzero one: the rows say so).
[phases.priority]
enabled = true
classes = ["interactive 20% in=128 out=64 priority=0 slo=ttft<500ms,ttft_p99<1s",
           "batch 80% in=1024 out=256 priority=10"]
load = "knee"            # "knee": the ramp's knee load; "baseline": the baseline's
factor = 2.0             # times that load
duration = "1m"          # measured, per run
warmup = "10s"           # not measured, per run
without = true           # also the same mix without its priorities

# 7. Long tail: a soak at a fraction of the knee's load, listing every interval whose tail
#    breaks out.
[phases.long_tail]
enabled = true
fraction = 0.8           # of the knee's load
duration = "24h"
bucket = "1h"            # drift: each bucket compared with the first
tail_k = 5.0             # a tick whose P99.9 passes tail_k x the run's median P99 is listed

# 8. Stability under faults, from the fault-injecting proxy that tokentop runs between itself
#    and the server, at the baseline's load. `at` counts from the phase's start; faults must
#    not overlap (each row is the success rate under one fault), and the phase goes on
#    fault_settle (above) after the last one ends, to see the recovery. No faults phase:
#    phases.faults = [].
#    Killing and restarting the server is only ever asked on the command line
#    (--chaos-restart-cmd), never by a plan.
#      latency    delay of `ms` (plus or minus jitter_ms) on the traffic, for `for`
#      reset      each connection reset with `probability`, for `for`
#      blackhole  nothing passes for `seconds`: connections hang, as on a dead link
#      bandwidth  the traffic capped at bytes_per_s, for `for`
[[phases.faults]]
at = "1m"
fault = "latency"
ms = 200
jitter_ms = 50
for = "1m"

[[phases.faults]]
at = "3m"
fault = "reset"
probability = 0.05
for = "1m"

[[phases.faults]]
at = "5m"
fault = "blackhole"
seconds = 10

[[phases.faults]]
at = "6m"
fault = "bandwidth"
bytes_per_s = 65536
for = "1m"

# 9. Leaks: growth over the long tail's soak of the server process' RSS and, GPU-side, of
#    the engine's own KV cache in use (its usage x the pool it states): an engine preallocates
#    its GPU memory at start, so GPU memory used stays flat whatever leaks inside it.
[phases.leaks]
enabled = true
max_rss_mb_per_h = 50.0
max_gpu_mb_per_h = 50.0  # KV in use, where the engine states its pool's bytes
max_kv_tokens_per_h = 10000  # KV in use, where it states its pool in tokens only
min_soak = "30m"         # a shorter soak shows the slopes but does not judge them

# 10. Memory efficiency: GPU memory per billion parameters, the KV cache's capacity.
[phases.memory]
enabled = true

# 11. Efficiency: output tokens per joule, req/s per watt, GPU utilisation, GPU memory per
#     request in flight; with --dcgm-url, SM, tensor-pipe and DRAM activity too. Read from
#     these phases' load, not a run of its own ("knee": the ramp's knee step).
[phases.efficiency]
enabled = true
at = ["baseline", "knee"]

# 12. Scaling: throughput with 1, 2, ... N targets (replicas), each at `per_target` load,
#     against N x one. With a single target the row says why it is empty.
[phases.scaling]
enabled = true
targets = []             # base URLs, e.g. ["http://10.0.0.2:8000/v1"]; []: the --url targets
per_target = "knee"      # "knee": the ramp's knee load on each; "baseline": the baseline's
duration = "2m"
warmup = "20s"

# Scenarios: `tokentop eval compare A B ...` ends with a verdict per scenario, a use the
#    evals are compared for, judged on the matrix rows that matter to it (their ids: eval.json
#    "rows", or `compare --format csv`; * matches any text). A winner is better beyond the
#    noise on a row and worse on none (rule = "no worse"), or, with rule = "weighted" and a
#    weight per row, the weights it is better on outweigh those it is worse on; else "no clear
#    winner", and why. `slo`: goodput rows are judged where the evals counted goodput within
#    its per-request limits (the plan's slo above), and its whole-run thresholds judge the rows
#    they apply to: a winner must meet those the others meet. Yours add to these three; one of
#    the same name replaces their keys (a list, rows or weights, whole).
[scenarios.realtime]
about = "real-time interaction: a chat or an agent waiting on its first token"
rows = ["baseline.ttft.p50", "baseline.ttft.p99", "baseline.itl.p99", "baseline.goodput"]
slo = "ttft<100ms,ttft_p99<100ms"

[scenarios.batch]
about = "large batch work: the most tokens, per second and per joule"
rows = ["ramp.max_output_tok_s", "baseline.output_tok_s", "efficiency.baseline.tokens_per_joule",
        "efficiency.knee.tokens_per_joule", "context.longest_prompt"]
# rule = "weighted"
# weights = [2, 1, 1, 1, 1]

[scenarios.production]
about = "production: up, recovering fast, failing few requests under faults, not leaking"
rows = ["long_tail.availability", "faults.mttr", "faults.chaos.mttr", "faults.*.success_rate",
        "faults.*.recovery", "baseline.error_rate", "leaks.server_rss", "leaks.engine_kv"]

# --quick: these keys replace the ones above; the rest stays.
[quick.conformance]
timeout = "5s"

[quick.baseline]
duration = "20s"
warmup = "5s"

[quick.ramp]
steps = [1, 2, 4, 8, 16, 32, 64]  # past the default simulator's 32 slots: its knee
step_duration = "8s"
step_warmup = "2s"

[quick.context]
input_ladder = [128, 8192]
output_ladder = [256]
step_duration = "2s"
step_warmup = "1s"

[quick.batch]
requests = 32
timeout = "20s"

[quick.interference]
duration = "3s"
warmup = "1s"

[quick.priority]
# shorter requests: a few seconds past the knee must end enough of them in each class
classes = ["interactive 20% in=64 out=16 priority=0 slo=ttft<500ms,ttft_p99<1s",
           "batch 80% in=256 out=64 priority=10"]
duration = "4s"
warmup = "1s"

[quick.long_tail]
duration = "1m"
bucket = "20s"

[[quick.faults]]
at = "5s"
fault = "latency"
ms = 200
jitter_ms = 50
for = "8s"

[[quick.faults]]
at = "18s"
fault = "reset"
probability = 0.05
for = "6s"

[[quick.faults]]
at = "30s"
fault = "blackhole"
seconds = 3

[[quick.faults]]
at = "40s"
fault = "bandwidth"
bytes_per_s = 65536
for = "8s"

[quick.scaling]
duration = "8s"
warmup = "2s"
"""
