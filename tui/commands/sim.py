"""`tokentop sim`: the simulated OpenAI-compatible server alone.

    tokentop sim --port 8000 [--profile llama3-8b-h100] [--slots 16] [--fault-error-rate 0.01]

Once listening it prints one line: the URL (the real port when --port 0), then the
simulator in words (loadgen.sim.presets.describe: profile, slots, KV budget, the fault
settings given) and the served model name.

Its flags are built and read in tui/commands/args.py (add_sim_arguments, sim_config),
where the console's `--sim-profile` / `--sim-arg` are read by the same parser.
"""

from __future__ import annotations

import argparse
import sys

from tui.commands.args import (
    ListingFormatter,
    Parser,
    add_sim_arguments,
    profiles_listing,
    sim_config,
)


def main(argv: list[str]) -> int:
    """Serve until SIGINT/SIGTERM (or stdin EOF with --exit-with-parent)."""
    args = sim_parser().parse_args(argv)
    try:
        cfg = sim_config(args)
    except ValueError as e:
        print(f"tokentop sim: {e}", file=sys.stderr)
        return 2
    return _serve(cfg, args)


def sim_parser() -> argparse.ArgumentParser:
    p = Parser(prog="tokentop sim", description="The simulated OpenAI-compatible server alone.",
               formatter_class=ListingFormatter, epilog=profiles_listing())
    add_sim_arguments(p)
    return p


def _serve(cfg, args: argparse.Namespace) -> int:
    from loadgen.sim.program import serve_forever

    return serve_forever(cfg, host=args.host, port=args.port, announce=args.announce,
                         exit_with_parent=args.exit_with_parent, profile=args.profile)
