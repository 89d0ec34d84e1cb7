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


def main(argv: list[str]) -> int:
    p = console_parser("tokentop sweep")
    p.description = "Raise the load step by step; find the knee and the max goodput."
    add_sweep_arguments(p)
    args = p.parse_args(argv)
    plan = sweep_plan(args)
    cfg, secrets = run_config(args), secrets_from(args)
    return _sweep(cfg, plan, secrets, record=args.record)


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sweep")
    g.add_argument("--steps", dest="sweep_steps", default="1,2,4,8,16,32,64",
                   help="loads to hold, comma-separated, or 'auto' (doubling until the knee "
                   "or saturation); streams in closed loop, req/s with --mode open")
    g.add_argument("--step-seconds", type=float, default=20.0, help="measured seconds per step")
    g.add_argument("--step-warmup", type=float, default=5.0, help="unmeasured seconds per step")
    g.add_argument("--knee-fraction", type=float, default=0.5,
                   help="knee: marginal throughput below this fraction of the initial")
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
