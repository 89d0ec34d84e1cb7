"""A run's configuration: what the command line, the console and an agent all build.

It crosses process boundaries (console → engine process, manifest on disk),
so it is a plain msgspec struct of plain values; `parsed()` turns the text
forms (length distributions, ramps, SLOs) into objects and is where every bad
value becomes one clear sentence (ConfigError). Secrets are not here: the API
key travels in the environment.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import msgspec

from loadgen.load import Arrivals
from loadgen.ramp import Ramp, RampError
from loadgen.stream_measure import Slo
from loadgen.wire import Cancelling, LoadSpec
from loadgen.workload import LengthDist, Workload, WorkloadError, load_prompts


class ConfigError(ValueError):
    """A setting that cannot be used; str(e) is the message for the user."""


class RunConfig(msgspec.Struct, kw_only=True):
    url: str | None = None  # None: start the embedded simulator
    model: str | None = None  # None: the server's first model
    api: str = "chat"  # chat | completions
    metrics_url: str | None = None
    client: str = "raw"  # raw (fast, httptools) | openai (the official SDK)
    # load
    mode: str = "closed"  # closed | open
    concurrency: int = 8
    rate: float = 1.0  # open loop, requests/s
    arrival: str = "poisson"  # constant | poisson | gamma
    burstiness: float = 1.0  # gamma shape
    max_in_flight: int | None = None  # open loop cap
    ramp: str | None = None  # see loadgen.ramp
    # workload
    input_tokens: str = "128"
    output_tokens: str = "128"
    shared_prefix: int = 0
    prompts_file: str | None = None
    ignore_eos: bool = True
    continuous_usage: bool = True
    # limits
    duration: float | None = None  # seconds of load after warm-up; None: until stopped
    warmup: float = 0.0  # seconds excluded from results
    max_requests: int | None = None
    stop_error_rate: float | None = None  # stop when the 10 s error fraction passes this
    cancel_rate: float = 0.0
    cancel_at: str | None = None  # "20" tokens or "1.5s"
    slo: str | None = None  # goodput: "ttft=500ms,tpot=50ms,e2e=10s"
    # machinery
    workers: int = 0  # 0: cores - 1, at least 1
    tick: float = 0.5
    request_timeout: float = 600.0
    drain_grace: float = 10.0
    sim_args: list[str] = msgspec.field(default_factory=list)
    seed: int = 0
    exact_ttft_ms: float | None = None  # calibration: the simulator's exact TTFT

    def parsed(self) -> Parsed:
        return _parse(self)

    def load_spec(self) -> LoadSpec:
        return LoadSpec(
            mode=self.mode,
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
    slo: Slo | None
    cancelling: Cancelling

    def workload(self, cfg: RunConfig, model: str) -> Workload:
        return Workload(
            model=model,
            api=cfg.api,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            shared_prefix=cfg.shared_prefix,
            prompts_file=cfg.prompts_file,
            ignore_eos=cfg.ignore_eos,
            continuous_usage=cfg.continuous_usage,
            seed=cfg.seed,
        )


def default_workers() -> int:
    return max(1, (os.cpu_count() or 2) - 1)


def _parse(cfg: RunConfig) -> Parsed:
    _check_choices(cfg)
    try:
        inp = LengthDist.parse(cfg.input_tokens)
        out = LengthDist.parse(cfg.output_tokens)
        if cfg.prompts_file:
            load_prompts(cfg.prompts_file)  # fail now, in words, not in every worker
        ramp = Ramp.parse(cfg.ramp) if cfg.ramp else None
    except (WorkloadError, RampError) as e:
        raise ConfigError(str(e)) from None
    return Parsed(inp, out, ramp, parse_slo(cfg.slo), _cancelling(cfg))


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
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|µs|ms|s)?\s*$")
_SLO_PART = re.compile(r"^\s*(\w+)\s*(?:<=|<|=)\s*(.+)$")
_UNIT_US = {"us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6, None: 1e3}  # bare numbers are ms


def parse_us(text: str) -> float:
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"bad time {text!r}: use e.g. 500ms, 2s or 800us")
    return float(m.group(1)) * _UNIT_US[m.group(2)]


def parse_slo(text: str | None) -> Slo | None:
    """'ttft=500ms,tpot=50ms,e2e=10s' (or with <) → Slo; None when not given."""
    if not text:
        return None
    limits: dict[str, float] = {}
    for part in text.split(","):
        m = _SLO_PART.match(part)
        if not m or m.group(1).lower() not in ("ttft", "tpot", "e2e"):
            raise ConfigError(f"bad --slo part {part!r}: use ttft=500ms,tpot=50ms,e2e=10s")
        limits[f"{m.group(1).lower()}_us"] = parse_us(m.group(2))
    return Slo(**limits)


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
