"""`tokentop sweep`: raise the load step by step; find the knee and the max goodput.

Takes every `tokentop` run option (the load, the target, the workload) plus the
sweep's own, read into a SweepPlan (loadgen/analysis/sweep.py) here; bad steps
are one line and exit 2 before any load starts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tui.commands.args import fail, run_config, secrets_from
from tui.commands.console import console_parser

# console_parser's options a sweep has no use for: the console's own (theme, redraws,
# publishing to a fleet), and the load and the run's length, which the steps set
CONSOLE_ONLY = ("theme", "refresh", "broker", "fleet", "mqtt_password_file", "mqtt_ca_file",
                "mqtt_cert_file", "mqtt_key_file", "mqtt_keepalive", "name")
SET_BY_STEPS = ("concurrency", "rate", "ramp", "auto_ramp", "auto_ramp_hold", "duration",
                "max_requests")
NOT_FOR_A_SWEEP = CONSOLE_ONLY + SET_BY_STEPS


def main(argv: list[str]) -> int:
    p = sweep_parser()
    args = p.parse_args(argv)
    refuse_unused(p, args)
    plan = sweep_plan(args)
    cfg, secrets = run_config(args), secrets_from(args)
    return _sweep(cfg, plan, secrets, record=args.record)


def sweep_parser() -> argparse.ArgumentParser:
    """The run's options less those a sweep does not use (hidden), plus the sweep's own,
    every default shown."""
    p = console_parser("tokentop sweep")
    p.description = "Raise the load step by step; find the knee and the max goodput."
    p.formatter_class = DefaultsFormatter
    for action in p._actions:
        if action.dest in NOT_FOR_A_SWEEP:
            action.help = argparse.SUPPRESS
        elif action.help is None and not _no_default(action):
            action.help = "default: %(default)s"  # argparse shows nothing for no help (--seed)
    add_sweep_arguments(p)
    return p


class DefaultsFormatter(argparse.HelpFormatter):
    """Each option's default after its help, unless the help says it already or there is
    nothing to say (no default, or an on/off flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or "").strip()
        if _no_default(action) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def _no_default(action: argparse.Action) -> bool:
    d = action.default
    return d is None or d is argparse.SUPPRESS or isinstance(d, bool | list)


def refuse_unused(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A hidden option given anyway is one line and exit 2, not silently ignored."""
    for action in p._actions:
        if action.dest in NOT_FOR_A_SWEEP and getattr(args, action.dest) != action.default:
            why = ("the console's" if action.dest in CONSOLE_ONLY else
                   "set by the sweep's --steps, --step-seconds and --step-warmup")
            fail(f"{action.option_strings[-1]} is not for a sweep: it is {why}",
                 prog="tokentop sweep")


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sweep")
    g.add_argument("--steps", dest="sweep_steps", default="1,2,4,8,16,32,64",
                   help="loads to hold, comma-separated, or 'auto' (doubling until the knee "
                   "or saturation); streams in closed loop, req/s with --mode open")
    g.add_argument("--step-seconds", type=float, default=20.0, help="measured seconds per step")
    g.add_argument("--step-warmup", type=float, default=5.0, help="unmeasured seconds per step")
    g.add_argument("--knee-fraction", type=float, default=0.5,
                   help="knee: the last step before the scaling between steps, "
                   "ln(tok/s ratio) / ln(load ratio), falls below this (1 = linear)")
    g.add_argument("--max-error-rate", type=float, default=0.05,
                   help="stop the sweep after a step with more errors than this")
    g.add_argument("--sweep-out", type=Path, help="write sweep.json, sweep.csv, sweep.png here")


def sweep_plan(args: argparse.Namespace):
    """The SweepPlan of parsed sweep arguments; bad --steps is one line and exit 2."""
    from loadgen.analysis.sweep import SweepPlan, parse_steps
    from loadgen.run.config import ConfigError

    try:
        steps = parse_steps(args.sweep_steps)
    except ConfigError as e:
        fail(str(e), prog="tokentop sweep")
    return SweepPlan(steps=steps, step_seconds=args.step_seconds, step_warmup=args.step_warmup,
                     knee_fraction=args.knee_fraction, max_error_rate=args.max_error_rate,
                     out=args.sweep_out)


def _sweep(cfg, plan, secrets, *, record: bool) -> int:
    from loadgen.analysis.sweep import sweep_main
    from loadgen.worker import eventloop

    return eventloop.run(lambda: sweep_main(cfg, plan, secrets, record=record))
