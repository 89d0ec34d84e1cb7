"""A run's configuration: what the command line, the console and an agent all build.

It crosses process boundaries (console → run process, manifest on disk),
so it is a plain msgspec struct of plain values; `parsed()` turns the text
forms (length distributions, ramps, SLOs) into objects and is where every bad
value becomes one clear sentence (ConfigError). Secrets are not here: they travel
apart, as loadgen.run.secrets.Secrets (the API key, every --header's value); a header's
name is here, its value never.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import msgspec

from loadgen.model.slo import Slo, SloError, Slos, parse_slos, parse_us
from loadgen.run.ramp import Ramp, RampError
from loadgen.sim.model import SimConfig
from loadgen.worker.dataset import Dataset, DatasetError, check, longest_words
from loadgen.worker.distributions import LengthDist, ThinkTime, WorkloadError
from loadgen.worker.load import Arrivals
from loadgen.worker.mix import TrafficClass, parse_mix
from loadgen.worker.tokenizer import TOKENIZER_CHOICES, Lengths, TokenizerError, load_tokenizer
from loadgen.worker.trace import TraceError, read_trace
from loadgen.worker.wire import Cancelling, LoadSpec
from loadgen.worker.workload import OWN_BODY_KEYS, Workload


class ConfigError(ValueError):
    """A setting that cannot be used; str(e) is the message for the user."""


class PublishTo(msgspec.Struct, kw_only=True):
    """Where the run also sends its Snapshots over MQTT (`tokentop agent`, the console's
    `--publish`). No password here: it travels with the run's Secrets."""

    broker: str  # mqtt://[user@]host[:port] or mqtts://…
    fleet: str
    name: str
    keepalive: int = 10
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    backlog: int = 1200  # Snapshots held while the broker is away (10 min at 2 Hz)
    max_backoff: float = 30.0  # seconds between reconnect attempts, at most
    # remote control from the fleet console: off unless the agent allows it, then capped
    remote_control: bool = False
    max_concurrency: int = 64
    max_rate: float = 50.0


class FleetFrom(msgspec.Struct, kw_only=True):
    """Where an eval's load comes from when it is not this machine: the agents of `fleet`
    that take jobs (`tokentop agent --accept-jobs`; loadgen.run.fleet_load), all of them or
    those named. No password here: it travels with the Secrets."""

    broker: str  # mqtt://[user@]host[:port] or mqtts://…
    fleet: str
    agents: list[str] = msgspec.field(default_factory=list)  # empty: every one ready
    keepalive: int = 10
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


class RunConfig(msgspec.Struct, kw_only=True):
    url: str | None = None  # None: start the embedded simulator
    model: str | None = None  # None: the server's first model
    api: str = "chat"  # chat | completions
    metrics_url: str | None = None
    server_pid: int | None = None  # the server's process, when it cannot be found by port
    server_name: str | None = None
    # seconds to wait for a --url that does not answer yet; None: the front end's default
    # (headless 60 s, the console for ever)
    wait: float | None = None
    client: str = "raw"  # raw (fast, httptools) | openai (the official SDK)
    # load
    mode: str = "closed"  # closed | open
    concurrency: int = 8
    # closed loop: streams started together start spread out (loadgen.worker.load.Stagger):
    # over this many seconds, 0 all at once, None (auto) over one request's time
    stagger: float | None = None
    rate: float = 1.0  # open loop, requests/s
    arrival: str = "poisson"  # constant | poisson | gamma
    burstiness: float = 1.0  # gamma shape
    max_in_flight: int | None = None  # open loop cap
    ramp: str | None = None  # see loadgen.run.ramp
    # replay a request trace (loadgen.worker.trace): open loop at its times / trace_speed,
    # each request its entry's lengths; the run stops when the trace is done
    trace: str | None = None
    trace_speed: float = 1.0
    trace_block_tokens: int = 512  # tokens a prefix block of the trace's hash_ids (Mooncake's)
    auto_ramp: bool = False  # start climbing at once (the console's `a` key does it later)
    auto_ramp_hold: float = 10.0  # measured seconds per auto-ramp step
    auto_ramp_warmup: float = 3.0  # unmeasured seconds per auto-ramp step
    auto_ramp_max: int = 4096  # the most streams (req/s in open loop) auto-ramp tries
    # workload
    input_tokens: str = "128"
    output_tokens: str = "128"
    shared_prefix: int = 0
    # multi-turn conversations (loadgen.worker.conversation): user turns per conversation,
    # each closed-loop stream a user; the think time between turns, a distribution in s
    turns: int = 1
    think_time: str = "0"
    # where prompts come from: synthetic | text:FILE | sharegpt:FILE | jsonl:FILE
    # (loadgen.worker.dataset); prompts_file is the older `--prompts FILE`, jsonl:FILE
    dataset: str = "synthetic"
    prompts_file: str | None = None
    ignore_eos: bool = True
    continuous_usage: bool = True
    # the request as the user shapes it (body_fields): the common sampling parameters (None:
    # not sent, the server's default), --response-format json, and --extra-body (any JSON
    # object, merged into every body); --header's names (their values are the Secrets')
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    sampling_seed: int | None = None  # the body's "seed" (--seed is the workload's draws)
    response_format: str | None = None  # json: {"type": "json_object"}
    extra_body: dict[str, Any] | None = None
    headers: list[str] = msgspec.field(default_factory=list)
    # exact token lengths (loadgen.worker.tokenizer): a local tokenizer.json or a folder
    # holding one | server (the target's /tokenize) | auto (the server's when it has one)
    # | none (about one token a word)
    tokenizer: str = "auto"
    # limits
    duration: float | None = None  # seconds of load after warm-up; None: until stopped
    warmup: float = 0.0  # seconds excluded from results
    max_requests: int | None = None
    stop_error_rate: float | None = None  # stop when the 10 s error fraction passes this
    cancel_rate: float = 0.0
    cancel_at: str | None = None  # "20" tokens or "1.5s"
    slo: str | None = None  # "ttft<500ms,ttft_p99<1s,error_rate<1%": see parse_slos
    # priority classes, one text a class as --mix takes it (loadgen.worker.mix); empty: none
    mix: list[str] = msgspec.field(default_factory=list)
    # machinery
    workers: int = 0  # 0: cores - 1, at least 1
    tick: float = 0.5
    request_timeout: float = 600.0
    drain_grace: float = 10.0
    # the embedded simulator (with url None): its settings, typed, as the command line
    # resolved them from --sim-profile / --sim-arg (None: SimConfig's defaults).
    # sim_flags: those flags as given, for the record.
    sim: SimConfig | None = None
    sim_flags: list[str] = msgspec.field(default_factory=list)
    seed: int = 0
    publish: PublishTo | None = None
    # tokentop's own live figures for Prometheus (loadgen.run.prometheus): None, not served
    prometheus_port: int | None = None
    prometheus_host: str = "127.0.0.1"
    calibrate: bool = False  # timing error against the exact-timing simulator's stamps

    # recording (loadgen.record.recorder): the run directory (None: the default under
    # $XDG_DATA_HOME/tokentop/runs), what to do when it cannot be written (stop | continue),
    # and the run directory to continue (--resume)
    out: str | None = None
    on_disk_full: str = "stop"
    resume: str | None = None

    def sim_profile(self) -> str | None:
        """The embedded simulator's --profile, as given (None: its defaults)."""
        flags = self.sim_flags
        return flags[flags.index("--profile") + 1] if "--profile" in flags[:-1] else None

    def embedded_sim(self, mix: list[str] | None = None) -> SimConfig:
        """The embedded simulator's settings. A mix (--mix, else `mix`: an eval's classes)
        that sends priorities gets one that schedules by them, as vLLM is started for such
        a load (an fcfs server refuses a nonzero priority), unless --sim-arg chose."""
        sim = self.sim or SimConfig()
        chose = any(f.startswith("--scheduling-policy") for f in self.sim_flags)
        if chose or not any(c.priority for c in parse_mix(self.mix or mix or [])):
            return sim
        return dataclasses.replace(sim, scheduling_policy="priority")

    def parsed(self) -> Parsed:
        return _parse(self)

    def load_spec(self) -> LoadSpec:
        return LoadSpec(
            mode="open" if self.trace else self.mode,
            trace=self.trace is not None,
            trace_speed=self.trace_speed,
            concurrency=self.concurrency,
            rate=self.rate,
            arrival=self.arrival,
            shape=self.burstiness,
            max_in_flight=self.max_in_flight,
        )


@dataclass(frozen=True)
class Parsed:
    input_tokens: LengthDist
    output_tokens: LengthDist
    ramp: Ramp | None
    slos: Slos
    cancelling: Cancelling
    dataset: Dataset  # checked, with its note (what to say once)
    think_time: ThinkTime
    trace_span: float | None = None  # --trace: seconds from its first request to its last
    body_fields: dict[str, Any] | None = None  # what the user adds to every body
    mix: tuple[TrafficClass, ...] = ()  # --mix's classes (none: every request the run's)

    @property
    def slo(self) -> Slo | None:
        """The per-request limits (goodput)."""
        return self.slos.per_request

    def workload(self, cfg: RunConfig, model: str, lengths: Lengths | None = None) -> Workload:
        """The workers' workload; `lengths`: --tokenizer as resolved at start (none: approx)."""
        lengths = lengths or Lengths()
        return Workload(
            tokenizer=lengths.tokenizer,
            one_token_words=lengths.words,
            model=model,
            api=cfg.api,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            shared_prefix=cfg.shared_prefix,
            dataset=self.dataset,
            ignore_eos=cfg.ignore_eos,
            continuous_usage=cfg.continuous_usage,
            seed=cfg.seed,
            turns=cfg.turns,
            think_time=self.think_time,
            trace_block_tokens=cfg.trace_block_tokens,
            output_from_dataset=_output_from_dataset(cfg),
            body_fields=dict(self.body_fields or {}),
            classes=self.mix,
        )


def default_workers() -> int:
    return max(1, (os.cpu_count() or 2) - 1)


def _parse(cfg: RunConfig) -> Parsed:
    _check_choices(cfg)
    try:
        inp = LengthDist.parse(cfg.input_tokens)
        # "dataset": the replies' lengths of a ShareGPT dataset (128 where one has none)
        out = LengthDist() if _output_from_dataset(cfg) else LengthDist.parse(cfg.output_tokens)
        think = ThinkTime.parse(cfg.think_time)
        ramp = Ramp.parse(cfg.ramp) if cfg.ramp else None
        slos = parse_slos(cfg.slo)
        cancelling = _cancelling(cfg)
        if cfg.tokenizer not in TOKENIZER_CHOICES:
            load_tokenizer(cfg.tokenizer)  # a path that does not load fails now, in words
        # the file is read through now: a broken one fails here, in words, not in every worker
        mix = parse_mix(cfg.mix)
        longest = max([inp, *(c.input_tokens for c in mix if c.input_tokens)],
                      key=longest_words)
        dataset = check(Dataset.parse(cfg.dataset, cfg.prompts_file),
                        window_words=longest_words(longest) - 1 - cfg.shared_prefix)
    except (WorkloadError, DatasetError, RampError, SloError, TokenizerError) as e:
        raise ConfigError(str(e)) from None
    if _output_from_dataset(cfg) and dataset.kind != "sharegpt":
        raise ConfigError("--output-tokens dataset takes the reply lengths of a ShareGPT "
                          "dataset: give --dataset sharegpt:FILE")
    fields = body_fields(cfg)
    _check_mix(cfg, mix, fields)
    return Parsed(inp, out, ramp, slos, cancelling, dataset, think, _trace_span(cfg),
                  fields, mix)


def _check_mix(cfg: RunConfig, mix: tuple[TrafficClass, ...], fields: dict[str, Any]) -> None:
    """A mix with what it cannot go with, refused in words."""
    if not mix:
        return
    if cfg.turns > 1 or cfg.trace is not None:
        raise ConfigError("--mix draws each request's class: not with --turns (a "
                          "conversation's turns) or --trace (its entries' own lengths)")
    if "priority" in fields and any(c.priority is not None for c in mix):
        raise ConfigError("priority is given twice: by --mix and in --extra-body; give it "
                          "in --mix, each class its own")


# the sampling parameters as flags: RunConfig's field, the body's key, the flag
SAMPLING = (("temperature", "temperature", "--temperature"), ("top_p", "top_p", "--top-p"),
            ("top_k", "top_k", "--top-k"), ("sampling_seed", "seed", "--sampling-seed"))
RESPONSE_FORMATS = {"json": {"type": "json_object"}}


def body_fields(cfg: RunConfig) -> dict[str, Any]:
    """What the user adds to every request's body: the sampling flags, --response-format,
    --extra-body. A key given twice (a flag and --extra-body), or one that tokentop writes
    itself (the prompt, the lengths, the stream), is refused in words: it would change
    what is measured without a word, or say one thing and send another."""
    fields: dict[str, Any] = {}
    for name, key, _ in SAMPLING:
        if getattr(cfg, name) is not None:
            fields[key] = getattr(cfg, name)
    if cfg.response_format is not None:
        if cfg.response_format not in RESPONSE_FORMATS:
            raise ConfigError(f"--response-format must be one of {', '.join(RESPONSE_FORMATS)}"
                              f", not {cfg.response_format!r} (a schema: --extra-body)")
        fields["response_format"] = RESPONSE_FORMATS[cfg.response_format]
    extra = cfg.extra_body or {}  # a JSON object: the command line and the plan check it
    own = sorted(OWN_BODY_KEYS & extra.keys())
    if own:
        raise ConfigError(f"--extra-body may not set {', '.join(own)}: tokentop writes it "
                          "itself (--model, --input-tokens, --output-tokens, --no-ignore-eos)")
    twice = sorted(fields.keys() & extra.keys())
    if twice:
        flags = {key: flag for _, key, flag in SAMPLING} | {"response_format":
                                                             "--response-format"}
        raise ConfigError(f"{twice[0]} is given twice: by {flags[twice[0]]} and in "
                          "--extra-body; give it once")
    return {**fields, **extra}


def _output_from_dataset(cfg: RunConfig) -> bool:
    return cfg.output_tokens.strip() == "dataset"


def _trace_span(cfg: RunConfig) -> float | None:
    """--trace read through now (a broken one fails here, naming its line), and refused
    with the flags whose load it would replace."""
    if cfg.trace is None:
        return None
    conflicts = [
        (cfg.trace_speed > 0, "--trace-speed must be more than 0"),
        (cfg.ramp is None and not cfg.auto_ramp, "--trace sets the load: no --ramp or --auto-ramp"),
        (cfg.rate == 1.0 and cfg.arrival == "poisson" and cfg.burstiness == 1.0,
         "--trace sets the arrivals: no --rate, --arrival or --burstiness"),
        (cfg.dataset == "synthetic" and cfg.prompts_file is None,
         "--trace sets the lengths of synthetic prompts: no --dataset or --prompts"),
    ]
    for ok, message in conflicts:
        if not ok:
            raise ConfigError(message)
    try:
        return read_trace(cfg.trace).span
    except TraceError as e:
        raise ConfigError(str(e)) from None


def _check_choices(cfg: RunConfig) -> None:
    checks = [
        (cfg.api in ("chat", "completions"), f"--api must be chat or completions, not {cfg.api!r}"),
        (cfg.mode in ("closed", "open"), f"--mode must be closed or open, not {cfg.mode!r}"),
        (cfg.client in ("raw", "openai"), f"--client must be raw or openai, not {cfg.client!r}"),
        (cfg.arrival in Arrivals.KINDS, f"--arrival must be one of {', '.join(Arrivals.KINDS)}"),
        (cfg.burstiness > 0, "--burstiness must be more than 0"),
        (cfg.rate >= 0, "--rate must not be negative"),
        (0 <= cfg.cancel_rate <= 1, "--cancel-rate is a fraction between 0 and 1"),
        (cfg.stop_error_rate is None or 0 < cfg.stop_error_rate <= 1,
         "--stop-error-rate is a fraction between 0 and 1"),
        (cfg.shared_prefix >= 0, "--shared-prefix must not be negative"),
        (cfg.turns >= 1, "--turns must be at least 1"),
        (cfg.trace_block_tokens >= 1, "--trace-block-tokens must be at least 1"),
        (cfg.turns == 1 or cfg.api == "chat",
         "--turns needs the chat API: a conversation is its messages"),
        (cfg.turns == 1 or (cfg.mode == "closed" and cfg.trace is None),
         "--turns runs in closed loop (each stream is a user holding a conversation): "
         "no --mode open or --trace"),
        (cfg.temperature is None or cfg.temperature >= 0,
         "--temperature must not be negative"),
        (cfg.top_p is None or 0 < cfg.top_p <= 1, "--top-p is a fraction above 0, at most 1"),
        (cfg.top_k is None or cfg.top_k >= -1,
         "--top-k is a count of tokens (-1 or 0: all, as the engines read it)"),
        (cfg.turns > 1 or cfg.think_time in ("0", "0s"),
         "--think-time is the wait between a conversation's turns: give --turns too"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def _cancelling(cfg: RunConfig) -> Cancelling:
    if cfg.cancel_rate == 0:
        return Cancelling()
    at = (cfg.cancel_at or "").strip()
    if not at:
        raise ConfigError("--cancel-rate needs --cancel-at: tokens (20) or seconds (1.5s)")
    if at.endswith("s"):
        return Cancelling(rate=cfg.cancel_rate, after_s=parse_us(at) / 1e6)
    try:
        return Cancelling(rate=cfg.cancel_rate, after_tokens=max(1, int(at)))
    except ValueError:
        raise ConfigError(f"bad --cancel-at {at!r}: tokens (20) or seconds (1.5s)") from None
