"""`tokentop calibrate`: measure tokentop's own timing error on this machine.

The options are read into a CalibratePlan (loadgen/analysis/calibrate.py) here;
bad steps are one line and exit 2 before the simulator starts.
"""

from __future__ import annotations

import argparse

from tui.commands.args import Parser, fail, latency_ms, seconds, seconds_or_zero, whole


def main(argv: list[str]) -> int:
    p = Parser(prog="tokentop calibrate",
               description="Measure tokentop's own timing error on this machine.",
               epilog="Exit status: 0 when the lightest step kept the timing error p99 "
               "within 1 ms (the last line names the highest step with every lighter one "
               "within it too: a step past a failed one does not count); 3 when it did not "
               "(the lines before it say what limits this machine), so a script can refuse "
               "to trust millisecond numbers here; 2 for bad options or a simulator that "
               "cannot start. A step that drives under 90% of its intended chunks/s is "
               "marked 'short of rate': this machine cannot drive that load.")
    add_calibrate_arguments(p)
    plan = calibrate_plan(p.parse_args(argv))
    return _calibrate(plan)


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", default="1,10,100,500,1000,2000",
                   help="concurrent streams per step (default %(default)s)")
    p.add_argument("--step-seconds", type=seconds, default=8.0,
                   help="measured seconds per step (default %(default)s)")
    p.add_argument("--warmup", type=seconds_or_zero, default=2.0,
                   help="unmeasured seconds per step (default %(default)s)")
    p.add_argument("--ttft-ms", type=latency_ms, default=50.0,
                   help="the simulator's exact TTFT, ms (or 0.05s; default %(default)s)")
    p.add_argument("--itl-ms", type=latency_ms, default=20.0,
                   help="the simulator's exact gap, ms (default %(default)s)")
    p.add_argument("--output-tokens", type=whole(1), default=64,
                   help="tokens a request (default %(default)s)")
    p.add_argument("--client", choices=("raw", "openai"), default="raw",
                   help="the client to time: raw (tokentop's own) or openai (the SDK; "
                   "default %(default)s)")
    p.add_argument("--workers", type=whole(0), default=0,
                   help="load workers (default: cores - 1)")


def calibrate_plan(args: argparse.Namespace):
    """The CalibratePlan of parsed arguments; bad --steps is one line and exit 2."""
    from loadgen.analysis.calibrate import CalibratePlan, parse_streams
    from loadgen.run.config import ConfigError

    try:
        steps = parse_streams(args.steps)
    except ConfigError as e:
        fail(str(e), prog="tokentop calibrate")
    return CalibratePlan(steps=steps, step_seconds=args.step_seconds, warmup=args.warmup,
                         ttft_ms=args.ttft_ms, itl_ms=args.itl_ms,
                         output_tokens=args.output_tokens, client=args.client,
                         workers=args.workers)


def _calibrate(plan) -> int:
    from loadgen.analysis.calibrate import calibrate_main
    from loadgen.worker import eventloop

    return eventloop.run(lambda: calibrate_main(plan))
