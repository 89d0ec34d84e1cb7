"""The `tokentop` command: the console by default, and its subcommands.

    tokentop [--url URL] [--model M] [-c N] …   the live console (embedded simulator without --url)
    tokentop run --headless --duration S …     the same engine without a screen
    tokentop sim --port 8000                    the simulator alone

Bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from loadgen import __version__


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line that says what to do."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _whole(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text.rstrip("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, e.g. 20 or 0.5, got {text!r}") \
            from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.05 or 5%, got {text!r}") \
            from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected requests per second, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("target")
    t.add_argument("--url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 "
                   "(default: start the embedded simulator)")
    t.add_argument("--model", help="model name (default: the server's first model)")
    t.add_argument("--api", choices=("chat", "completions"), default="chat")
    t.add_argument("--api-key-file", type=Path,
                   help="file holding the API key (default: $OPENAI_API_KEY); never on the "
                   "command line, so it stays out of shell history and `ps`")
    t.add_argument("--metrics-url", help="the server's Prometheus /metrics, when not at URL root")
    t.add_argument("--metrics-token-file", type=Path,
                   help="file holding a bearer token for --metrics-url (default: "
                   "$TOKENTOP_METRICS_TOKEN, else the API key when /metrics is on the same host)")
    t.add_argument("--sim-profile", help="embedded simulator: a named deployment "
                   "(see tokentop sim --help)")
    t.add_argument("--sim-arg", action="append", default=[], metavar="FLAG",
                   help="embedded simulator: one more flag, e.g. --sim-arg=--slots=16 "
                   "(repeatable)")
    t.add_argument("--server-pid", type=_whole(1),
                   help="the server's process id (default: found by the URL's port or by name)")
    t.add_argument("--server-name", help="find the server's process by this name")
    t.add_argument("--client", choices=("raw", "openai"), default="raw",
                   help="raw: tokentop's own fast HTTP client (default); openai: the official "
                   "SDK, to see what SDK-based applications see")
    w = p.add_argument_group("load")
    w.add_argument("--mode", choices=("closed", "open"), default="closed",
                   help="closed: N concurrent streams; open: a request rate")
    w.add_argument("-c", "--concurrency", type=_whole(0), default=8, help="concurrent streams")
    w.add_argument("--rate", type=_rate, default=1.0, help="open loop: requests per second")
    w.add_argument("--arrival", choices=("constant", "poisson", "gamma"), default="poisson",
                   help="open loop arrival process")
    w.add_argument("--burstiness", type=_seconds, default=1.0,
                   help="gamma shape: < 1 burstier than Poisson, > 1 more regular")
    w.add_argument("--max-in-flight", type=_whole(1),
                   help="open loop: cap on requests in flight; the rest wait in a backlog")
    w.add_argument("--ramp", help="linear:FROM:TO:SECONDS or step:START:STEP:SECONDS[:MAX]")
    w.add_argument("--auto-ramp", action="store_true",
                   help="double the streams while the --slo holds, settle at the boundary")
    w.add_argument("--auto-ramp-hold", type=_seconds, default=10.0,
                   help="measured seconds per auto-ramp step")
    k = p.add_argument_group("workload")
    k.add_argument("--input-tokens", default="128",
                   help="prompt length: 128, uniform:64:256, normal:128:32, lognormal:128:0.5")
    k.add_argument("--output-tokens", default="128", help="max_tokens, same forms")
    k.add_argument("--shared-prefix", type=_whole(0), default=0,
                   help="words every prompt shares at the start (prefix-cache studies)")
    k.add_argument("--prompts", dest="prompts_file",
                   help="JSONL prompts ({\"prompt\": …} or ShareGPT conversations)")
    k.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let the model stop early (default: ask for exactly max_tokens)")
    k.add_argument("--no-continuous-usage", dest="continuous_usage", action="store_false",
                   help="do not ask for usage on every chunk (for servers that reject it)")
    m = p.add_argument_group("limits and measurement")
    m.add_argument("--duration", type=_seconds, help="seconds of load after warm-up, then stop")
    m.add_argument("--warmup", type=_seconds, help="seconds of load excluded from the results")
    m.add_argument("--requests", dest="max_requests", type=_whole(1),
                   help="stop after this many requests")
    m.add_argument("--stop-error-rate", type=_fraction,
                   help="stop when errors over the last 10 s pass this fraction")
    m.add_argument("--cancel-rate", type=_fraction, default=0.0,
                   help="fraction of requests the client abandons (users who leave)")
    m.add_argument("--cancel-at", help="abandon after this many tokens (20) or seconds (1.5s)")
    m.add_argument("--slo", help="per request (goodput): ttft<500ms,tpot<50ms,e2e<10s; whole run "
                   "(pass/fail): ttft_p99<1s,error_rate<1%%,output_tok_s>500")
    r = p.add_argument_group("recording")
    r.add_argument("--out", help="run directory (default: a new one under "
                   "~/.local/share/tokentop/runs)")
    r.add_argument("--resume", help="continue the run recorded in this directory")
    r.add_argument("--on-disk-full", choices=("stop", "continue"), default="stop",
                   help="when recording fails: stop the load (default) or keep it running")
    r.add_argument("--no-record", dest="record", action="store_false",
                   help="do not record this run")
    m.add_argument("--workers", type=_whole(0), default=0,
                   help="load worker processes (default: cores - 1, at least 1)")
    m.add_argument("--request-timeout", type=_seconds, default=600.0)
    m.add_argument("--drain-grace", type=_seconds, default=10.0,
                   help="on stop, seconds in-flight requests may take before they are cancelled")
    m.add_argument("--tick", type=_seconds, default=0.5, help="seconds per Snapshot")
    m.add_argument("--seed", type=int, default=0)


def _fail(message: str) -> None:
    """Bad input: one line, exit code 2."""
    print(f"tokentop: {message}", file=sys.stderr)
    sys.exit(2)


def api_key_from(args: argparse.Namespace) -> str | None:
    """The API key (from its file or $OPENAI_API_KEY); a metrics token file is read here
    too and handed on in the environment, like every secret."""
    token_file = getattr(args, "metrics_token_file", None)
    if token_file is not None:
        try:
            os.environ["TOKENTOP_METRICS_TOKEN"] = token_file.read_text().strip()
        except OSError as e:
            _fail(f"cannot read --metrics-token-file {token_file}: {e.strerror}")
    if args.api_key_file is not None:
        try:
            return args.api_key_file.read_text().strip() or None
        except OSError as e:
            _fail(f"cannot read --api-key-file {args.api_key_file}: {e.strerror}")
    return os.environ.get("OPENAI_API_KEY") or None


def run_config(args: argparse.Namespace):
    """The RunConfig of parsed arguments; exits with one line when a value cannot be used."""
    from loadgen.run.config import ConfigError, RunConfig

    fields = set(RunConfig.__struct_fields__)
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    sim_args = list(getattr(args, "sim_arg", []) or [])
    if getattr(args, "sim_profile", None):
        sim_args = ["--profile", args.sim_profile, *sim_args]
    if sim_args and args.url:
        _fail("--sim-profile and --sim-arg are for the embedded simulator; drop them with --url")
    cfg = RunConfig(**values, sim_args=sim_args)
    try:
        cfg.parsed()
    except ConfigError as e:
        _fail(str(e))
    return cfg


def console_parser(prog: str = "tokentop") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Live console for LLM inference servers. "
                f"Subcommands: {', '.join(SUBCOMMANDS)} (tokentop SUB --help).")
    p.add_argument("--version", action="version", version=f"tokentop {__version__}")
    add_run_arguments(p)
    ui = p.add_argument_group("console")
    ui.add_argument("--theme", help="tokentop-dark (default), tokentop-light, "
                    "tokentop-high-contrast, tokentop-mono; `t` cycles them in the console "
                    "and the choice is remembered in ~/.config/tokentop/config.toml")
    ui.add_argument("--refresh", type=_seconds, default=0.5, help="seconds between redraws")
    from loadgen.fleet.link import add_broker_arguments

    add_broker_arguments(p, required=False, url_flag="--publish")
    p.add_argument("--name", default=socket.gethostname(),
                   help="this machine's name in the fleet (with --publish)")
    return p


def run_parser() -> argparse.ArgumentParser:
    p = console_parser("tokentop run")
    p.add_argument("--headless", action="store_true", help="no console: progress lines on stderr")
    p.add_argument("--json", type=Path, help="write the final summary here (headless)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        if argv and not argv[0].startswith("-"):
            _fail(f"unknown command {argv[0]!r}; the commands are: {', '.join(SUBCOMMANDS)} "
                  "(or options alone for the console)")
        return _console(console_parser().parse_args(argv))
    except KeyboardInterrupt:
        return 130


def _run(argv: list[str]) -> int:
    args = run_parser().parse_args(argv)
    return _headless(args) if args.headless else _console(args)


def _report(argv: list[str]) -> int:
    from loadgen.analysis.report import main as report_main

    return report_main(argv)


def _compare(argv: list[str]) -> int:
    from loadgen.analysis.compare import main as compare_main

    return compare_main(argv)


def _publish_to(args: argparse.Namespace):
    """Check the broker settings now (one clear line), and hand the password to the engine
    process in its environment, never in its configuration."""
    from loadgen.fleet.link import PASSWORD_ENV, BrokerError, broker_from_args, check_level
    from loadgen.run.config import PublishTo

    try:
        settings = broker_from_args(args)
        check_level("fleet", args.fleet)
        check_level("agent", args.name)
    except (BrokerError, ValueError) as e:
        _fail(str(e))
    if settings.password:
        os.environ[PASSWORD_ENV] = settings.password
    return PublishTo(broker=args.broker, fleet=args.fleet, name=args.name,
                     keepalive=args.mqtt_keepalive, ca_file=args.mqtt_ca_file,
                     cert_file=args.mqtt_cert_file, key_file=args.mqtt_key_file)


def _headless(args: argparse.Namespace) -> int:
    from loadgen.run.headless import run_headless
    from loadgen.worker import eventloop

    if args.broker:
        _fail("--publish is for the console; a headless run that publishes is `tokentop agent`")
    cfg = run_config(args)
    key = api_key_from(args)
    return eventloop.run(
        lambda: run_headless(cfg, api_key=key, json_path=args.json, record=args.record)
    )


def _console(args: argparse.Namespace) -> int:
    from loadgen.run.run_process import EngineProcess
    from tui.app import TokentopApp

    if getattr(args, "json", None) is not None:
        print("tokentop: --json is written by headless runs; add --headless", file=sys.stderr)
        return 2
    if not args.record:
        os.environ["TOKENTOP_NO_RECORD"] = "1"  # read by the engine process
    cfg = run_config(args)
    if args.broker:
        cfg.publish = _publish_to(args)
    source = EngineProcess(cfg, api_key_from(args))
    app = TokentopApp(source, theme=args.theme, refresh=args.refresh, slo=args.slo)
    app.run()
    return app.return_code or 0


def _calibrate(argv: list[str]) -> int:
    from loadgen.analysis.calibrate import add_calibrate_arguments, calibrate_main
    from loadgen.worker import eventloop

    p = _Parser(prog="tokentop calibrate",
                description="Measure tokentop's own timing error on this machine.")
    add_calibrate_arguments(p)
    args = p.parse_args(argv)
    return eventloop.run(lambda: calibrate_main(args))


def _sweep(argv: list[str]) -> int:
    from loadgen.analysis.sweep import add_sweep_arguments, sweep_main
    from loadgen.worker import eventloop

    p = console_parser("tokentop sweep")
    p.description = "Raise the load step by step; find the knee and the max goodput."
    add_sweep_arguments(p)
    args = p.parse_args(argv)
    cfg, key = run_config(args), api_key_from(args)
    return eventloop.run(lambda: sweep_main(cfg, args, key))


def _replay(argv: list[str]) -> int:
    from loadgen.record.replay import ReplaySource
    from tui.app import TokentopApp

    p = _Parser(prog="tokentop replay",
                description="The console, fed from a run directory (also while it is written). "
                "Keys: 1/2/3 speed ×1/×10/×100, ←/→ 30 s back/forward, p pause.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--no-follow", action="store_true",
                   help="stop at the end even if the run is still being written")
    p.add_argument("--theme")
    args = p.parse_args(argv)
    if not (args.run_dir / "manifest.json").exists() and not args.run_dir.is_dir():
        _fail(f"{args.run_dir} is not a run directory")
    source = ReplaySource(args.run_dir, speed=args.speed, follow=False if args.no_follow else None)
    app = TokentopApp(source, theme=args.theme)
    app.run()
    return app.return_code or 0


def _agent(argv: list[str]) -> int:
    from loadgen.fleet.agent import add_agent_arguments, agent_main
    from loadgen.worker import eventloop

    p = _Parser(prog="tokentop agent", description="Headless load + probes, published over MQTT.")
    add_agent_arguments(p)
    args = p.parse_args(argv)
    return eventloop.run(lambda: agent_main(args))


def _fleet(argv: list[str]) -> int:
    from tui.fleet_app import add_fleet_arguments, fleet_main

    p = _Parser(prog="tokentop fleet", description="Watch (and steer) a fleet of tokentop agents.")
    add_fleet_arguments(p)
    return fleet_main(p.parse_args(argv))


def _probe(argv: list[str]) -> int:
    from loadgen.worker import eventloop
    from probes.oneshot import add_probe_arguments, probe_main

    p = _Parser(prog="tokentop probe",
                description="What every probe sees right now (GPUs, host, server), no load.")
    add_probe_arguments(p)
    args = p.parse_args(argv)
    return eventloop.run(lambda: probe_main(args))


def _sim(argv: list[str]) -> int:
    from loadgen.sim import add_sim_arguments, run_sim_forever

    p = _Parser(prog="tokentop sim", description="The simulated OpenAI-compatible server alone.")
    add_sim_arguments(p)
    return run_sim_forever(p.parse_args(argv))


COMMANDS = {
    "run": _run, "sweep": _sweep, "replay": _replay, "report": _report, "compare": _compare,
    "agent": _agent, "fleet": _fleet, "sim": _sim, "calibrate": _calibrate, "probe": _probe,
}
SUBCOMMANDS = tuple(COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
