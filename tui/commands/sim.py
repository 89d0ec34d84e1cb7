"""`tokentop sim`: the simulated OpenAI-compatible server alone, and the one reader of its flags.

    tokentop sim --port 8000 [--profile llama3-8b-h100] [--slots 16] [--fault-error-rate 0.01]

The same flags configure the console's embedded simulator (`--sim-profile NAME`,
`--sim-arg=--slots=16`): `embedded_sim_config` reads them with this parser, so a
flag means one thing wherever it is given, and the simulator process itself is
handed a typed SimConfig (loadgen/sim/launch.py), never flags.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Any, NoReturn

from loadgen.sim.faults import MALFORMED_KINDS, FaultConfig
from loadgen.sim.metrics import DIALECTS
from loadgen.sim.model import SimConfig
from loadgen.sim.presets import PROFILES, profile
from loadgen.sim.server import ANNOUNCE, serve_forever
from tui.commands.args import Parser

FAULT_HELP = {
    "error_rate": "fraction of requests answered HTTP 500",
    "rate_limit_rate": "fraction of requests answered HTTP 429",
    "retry_after_s": "Retry-After of the 429s, seconds",
    "slow_first_byte_ms": "delay before every response's first byte, ms",
    "stall_rate": "fraction of streams that stall mid-way",
    "stall_s": "length of a mid-stream stall, seconds",
    "drop_rate": "fraction of streams whose connection drops mid-way",
    "malformed_rate": "fraction of streams with one malformed chunk",
    "malformed_kind": "bad_json | missing_data | split_utf8",
    "empty_choices_rate": "fraction of streams with only empty choices",
    "outage_s": "one outage (restart) of this many seconds ...",
    "outage_after_s": "... this many seconds after start",
    "spike_every_s": "a latency spike (GC pause) every this many seconds ...",
    "spike_ms": "... this long, ms",
    "seed": "seed of the per-request fault draw",
}


def main(argv: list[str]) -> int:
    """Serve until SIGINT/SIGTERM (or stdin EOF with --exit-with-parent)."""
    args = sim_parser().parse_args(argv)
    try:
        cfg = sim_config(args)
    except ValueError as e:
        print(f"tokentop sim: {e}", file=sys.stderr)
        return 2
    return serve_forever(cfg, host=args.host, port=args.port, announce=args.announce,
                         exit_with_parent=args.exit_with_parent)


def sim_parser(prog: str = "tokentop sim") -> argparse.ArgumentParser:
    p = Parser(prog=prog, description="The simulated OpenAI-compatible server alone.")
    add_sim_arguments(p)
    return p


def add_sim_arguments(parser: argparse.ArgumentParser, *, listen: bool = True) -> None:
    """The simulator's options: where it listens (`listen`), what it models, its faults.

    Model options default to None so that `--profile` can fill them and any flag given
    still wins; sim_config resolves them (flag > profile > SimConfig default).
    """
    g = parser.add_argument_group("simulator")
    if listen:
        g.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default %(default)s)")
        g.add_argument("--port", type=int, default=8000,
                       help="port, 0 for a free one (default %(default)s)")
    g.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help="named settings modelled on a real deployment (loadgen/sim/presets.py); "
        "every other flag overrides it",
    )
    _add_model_arguments(g)
    if listen:
        g.add_argument("--announce", action="store_true",
                       help=f"print '{ANNOUNCE} <port>' on stdout once listening")
        g.add_argument("--exit-with-parent", action="store_true",
                       help="exit when stdin reaches EOF (the parent has gone)")
    _add_fault_arguments(parser)


def _add_model_arguments(g: argparse._ArgumentGroup) -> None:
    d = SimConfig()

    def opt(flag: str, dest: str, kind: type, doc: str, **kw: Any) -> None:
        g.add_argument(flag, dest=dest, type=kind, default=None,
                       help=f"{doc} (default {getattr(d, dest)})", **kw)

    opt("--model", "model_name", str, "served model name")
    opt("--slots", "slots", int, "max running sequences")
    opt("--kv-tokens", "kv_tokens", int, "KV-cache budget in tokens")
    opt("--step-overhead-ms", "step_overhead_ms", float, "fixed cost of every engine step, ms")
    opt("--decode-ms-per-seq", "decode_ms_per_seq", float, "step cost per decoding sequence, ms")
    opt("--prefill-ms-per-token", "prefill_ms_per_token", float,
        "step cost per prompt token prefilled, ms")
    opt("--prefill-chunk-tokens", "prefill_chunk_tokens", int,
        "prefill tokens per step (chunked prefill)")
    opt("--default-max-tokens", "default_max_tokens", int, "max_tokens when a request names none")
    opt("--mean-output-tokens", "mean_output_tokens", float,
        "mean natural output length when ignore_eos is false")
    opt("--seed", "seed", int, "seed for the natural output lengths")
    opt("--tokens-per-chunk", "tokens_per_chunk", int,
        "tokens per SSE chunk after the first (chunk batching)")
    opt("--exact-ttft-ms", "exact_ttft_ms", float,
        "exact-timing mode: every request's TTFT, ms (with --exact-itl-ms)")
    opt("--exact-itl-ms", "exact_itl_ms", float, "exact-timing mode: every inter-token gap, ms")
    opt("--metrics-dialect", "metrics_dialect", str, "the /metrics names to speak",
        choices=DIALECTS)
    opt("--gpu-name", "gpu_name", str, "the simulated GPU's name")
    opt("--gpu-count", "gpu_count", int, "simulated GPUs (tensor parallel)")
    opt("--gpu-memory-bytes", "gpu_memory_bytes", int, "memory per simulated GPU")
    opt("--weights-bytes", "weights_bytes", int, "model weights, all GPUs together")
    opt("--kv-bytes-per-token", "kv_bytes_per_token", int, "KV-cache bytes per token")
    opt("--idle-power-w", "idle_power_w", float, "simulated GPU idle power, W")
    opt("--power-limit-w", "power_limit_w", float, "simulated GPU power limit, W")


def _add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    """`--fault-<name>` for every FaultConfig field, typed as its default."""
    d = FaultConfig()
    g = parser.add_argument_group(
        "simulated faults (also changeable mid-run: POST /sim/faults, loopback only)"
    )
    for f in fields(FaultConfig):
        default = getattr(d, f.name)
        g.add_argument(
            "--fault-" + f.name.replace("_", "-"),
            dest="fault_" + f.name,
            type=type(default),
            default=None,
            choices=MALFORMED_KINDS if f.name == "malformed_kind" else None,
            help=f"{FAULT_HELP[f.name]} (default {default})",
        )


def sim_config(args: argparse.Namespace) -> SimConfig:
    """A SimConfig from parsed simulator arguments: flag > --profile > default.
    Raises ValueError in words (an unknown profile, a value the model refuses)."""
    values: dict[str, Any] = {}
    if getattr(args, "profile", None) is not None:
        try:
            values.update(profile(args.profile))
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
    for f in fields(SimConfig):
        value = getattr(args, f.name, None)
        if f.name != "faults" and value is not None:
            values[f.name] = value
    values["faults"] = FaultConfig().updated({
        f.name: getattr(args, "fault_" + f.name)
        for f in fields(FaultConfig)
        if getattr(args, "fault_" + f.name, None) is not None
    })
    return SimConfig(**values)


class _FlagError(ValueError):
    """A simulator flag argparse refused; the message is argparse's."""


class _EmbeddedParser(Parser):
    """The simulator's model and fault flags only (the embedded one picks its own address),
    raising instead of exiting so the caller can say where the flags came from."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise _FlagError(message)


def embedded_sim_config(flags: list[str]) -> SimConfig:
    """The embedded simulator's SimConfig from `--sim-profile`/`--sim-arg` flags, e.g.
    ["--profile", "tiny", "--slots=16"]. Raises ValueError in words."""
    parser = _EmbeddedParser(prog="tokentop sim", add_help=False)
    add_sim_arguments(parser, listen=False)
    return sim_config(parser.parse_args(flags))
