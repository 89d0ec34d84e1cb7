"""`tokentop sweep`: raise the load step by step; find the knee and the max goodput.

Takes the run's option groups a sweep uses (the target, how load is sent, the workload,
what is measured, the recording) plus the sweep's own, read into a SweepPlan
(loadgen/analysis/sweep.py) here. How much load and for how long are the steps': those
flags, and the console's, are refused in words. Bad steps are one line and exit 2 before
any load starts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadgen.model.knee import KNEE_SCALING
from tui.commands.args import (
    DefaultsFormatter,
    Parser,
    add_console_arguments,
    add_fleet_load_arguments,
    add_judging_arguments,
    add_length_arguments,
    add_load_level_arguments,
    add_machinery_arguments,
    add_mode_argument,
    add_open_loop_arguments,
    add_prompt_arguments,
    add_recording_arguments,
    add_request_arguments,
    add_shaping_arguments,
    add_target_arguments,
    add_trace_arguments,
    fail,
    fleet_from,
    fraction,
    parse_refusing,
    run_config,
    seconds,
    seconds_or_zero,
    secrets_from,
)

PROG = "tokentop sweep"
# the run's flags a sweep does not take, and why: said in words when given anyway
NOT_FOR_A_SWEEP = {
    "it is set by the sweep's --steps, --step-seconds and --step-warmup":
        (add_load_level_arguments, add_length_arguments),
    "it is the console's": (add_console_arguments,),
}


def main(argv: list[str]) -> int:
    p = sweep_parser()
    args = parse_refusing(p, argv, "a sweep", NOT_FOR_A_SWEEP)
    plan = sweep_plan(args)
    fleet, password = fleet_from(args, PROG)
    cfg, secrets = run_config(args), secrets_from(args, mqtt_password=password)
    return _sweep(cfg, plan, secrets, record=args.record, fleet=fleet)


def sweep_parser() -> argparse.ArgumentParser:
    """The run's groups a sweep uses (the target, how load is sent, the workload, what is
    measured, the recording) and the sweep's own, every default shown. How much load and
    for how long are the steps'."""
    p = Parser(prog=PROG, formatter_class=DefaultsFormatter,
               description="Raise the load step by step; find the knee and the max goodput.")
    add_target_arguments(p)
    load = p.add_argument_group("load (how much: the sweep's --steps)")
    add_mode_argument(load)
    add_open_loop_arguments(load)
    add_trace_arguments(load)
    workload = p.add_argument_group("workload")
    add_prompt_arguments(workload)
    add_request_arguments(workload)
    add_shaping_arguments(p.add_argument_group("requests as you shape them"))
    measured = p.add_argument_group("measurement")
    add_judging_arguments(measured)
    add_machinery_arguments(measured)
    add_recording_arguments(p)
    add_sweep_arguments(p)
    add_fleet_load_arguments(p)
    return p


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sweep")
    g.add_argument("--steps", dest="sweep_steps", default="1,2,4,8,16,32,64",
                   help="loads to hold, comma-separated, or 'auto' (doubling until the knee "
                   "or saturation); streams in closed loop, req/s with --mode open")
    g.add_argument("--step-seconds", type=seconds, default=20.0, help="measured seconds per step")
    g.add_argument("--step-warmup", type=seconds_or_zero, default=5.0,
                   help="unmeasured seconds per step")
    g.add_argument("--knee-fraction", type=fraction, default=KNEE_SCALING,
                   help="knee: the last step before the scaling between steps, "
                   "ln(tok/s ratio) / ln(load ratio), falls below this (1 = linear; 0.2: "
                   "2x the load for under +15%% tok/s is past the knee)")
    g.add_argument("--max-error-rate", type=fraction, default=0.05,
                   help="stop the sweep after a step with more errors than this (0.05 or 5%%)")
    g.add_argument("--sweep-out", type=Path, help="write sweep.json, sweep.csv, sweep.png here")


def sweep_plan(args: argparse.Namespace):
    """The SweepPlan of parsed sweep arguments; bad --steps is one line and exit 2."""
    from loadgen.analysis.sweep import SweepPlan, parse_steps
    from loadgen.run.config import ConfigError

    try:
        steps = parse_steps(args.sweep_steps)
    except ConfigError as e:
        fail(str(e), prog=PROG)
    return SweepPlan(steps=steps, step_seconds=args.step_seconds, step_warmup=args.step_warmup,
                     knee_fraction=args.knee_fraction, max_error_rate=args.max_error_rate,
                     out=args.sweep_out)


def _sweep(cfg, plan, secrets, *, record: bool, fleet) -> int:
    from loadgen.analysis.sweep import sweep_main
    from loadgen.worker import eventloop

    return eventloop.run(lambda: sweep_main(cfg, plan, secrets, record=record, fleet=fleet))
