"""`tokentop fleet`: watch (and steer) a fleet of tokentop agents (tui/fleet_app.py)."""

from __future__ import annotations

import argparse
import asyncio

from tui.commands.args import Parser, add_broker_arguments, broker_settings, fail, seconds


def main(argv: list[str]) -> int:
    p = Parser(prog="tokentop fleet", description="Watch (and steer) a fleet of tokentop agents.")
    add_fleet_arguments(p)
    return _fleet(p.parse_args(argv))


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    add_broker_arguments(p)
    g = p.add_argument_group("console")
    g.add_argument("--theme", help="tokentop-dark (default), tokentop-light, "
                   "tokentop-high-contrast, tokentop-mono")
    g.add_argument("--refresh", type=seconds, default=1.0, help="seconds between redraws")
    g.add_argument("--stale-after", type=seconds, default=5.0,
                   help="an online agent with no Snapshot for this long shows as stale")


def _fleet(args: argparse.Namespace) -> int:
    """Bad broker settings are one line on stderr and exit code 2."""
    from loadgen.fleet.link import BrokerError, check_level
    from tui.fleet_app import run_fleet

    try:
        settings = broker_settings(args)
        fleet = check_level("fleet", args.fleet)
    except BrokerError as e:
        fail(str(e))
    return asyncio.run(run_fleet(settings, fleet, refresh=args.refresh, theme=args.theme,
                                 stale_after=args.stale_after))
