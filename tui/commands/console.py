"""`tokentop [options]` (the live console) and `tokentop run` (the same, or `--headless`).

    tokentop [--url URL] [--model M] [-c N] …   the live console (embedded simulator without --url)
    tokentop run --headless --duration S …     the same run without a screen

The run itself is a RunConfig plus its Secrets; the two functions that start one
(`_console`, `_headless`) are the only places here that know how.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen import __version__
from tui.commands import COMMANDS
from tui.commands.args import (
    ListingFormatter,
    Parser,
    add_console_arguments,
    add_run_arguments,
    broker_settings,
    fail,
    run_config,
    secrets_from,
)

if TYPE_CHECKING:
    from loadgen.run.config import PublishTo
    from tui.app import TokentopApp


def console_parser(prog: str = "tokentop") -> argparse.ArgumentParser:
    """The run's arguments, the console's own, and `--publish` (the broker's arguments)."""
    if prog == "tokentop":  # git's way: the commands first, then the console's options
        p = Parser(prog=prog, formatter_class=ListingFormatter, description=listing(),
                   usage="tokentop [options]            the live console\n"
                   "       tokentop COMMAND [options]    one of the commands below")
    else:
        p = Parser(prog=prog, description="One run: the console, or with --headless progress "
                   "lines on stderr and the summary at the end.")
    p.add_argument("--version", action="version", version=f"tokentop {__version__}")
    add_run_arguments(p)
    add_console_arguments(p)
    return p


def listing() -> str:
    """`tokentop --help`'s opening: what tokentop is, its subcommands one a line (git's
    way), then that the options below are the console's."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.about}" for name, command in COMMANDS.items()]
    return ("Live console for LLM inference servers.\n\ncommands:\n" + "\n".join(lines)
            + "\n\n`tokentop COMMAND --help` for each; the options below are the console's "
            "(and `tokentop run`'s).")


def run_parser() -> argparse.ArgumentParser:
    p = console_parser("tokentop run")
    p.add_argument("--headless", action="store_true", help="no console: progress lines on stderr")
    p.add_argument("--json", type=Path, help="write the final summary here (headless)")
    return p


def main(argv: list[str]) -> int:
    """`tokentop [options]`: the live console."""
    return _console(console_parser().parse_args(argv))


def run_main(argv: list[str]) -> int:
    """`tokentop run [--headless] [options]`."""
    args = run_parser().parse_args(argv)
    return _headless(args) if args.headless else _console(args)


def _publish_to(args: argparse.Namespace) -> tuple[PublishTo, str | None]:
    """`--publish`: where the console's run also sends its Snapshots, and the broker password
    (which travels with the Secrets, never in the RunConfig). The broker settings are
    checked now, so a bad one is one clear line before anything starts."""
    from loadgen.fleet.link import BrokerError, check_level
    from loadgen.run.config import PublishTo

    try:
        settings = broker_settings(args)
        check_level("fleet", args.fleet)
        check_level("agent", args.name)
    except BrokerError as e:
        fail(str(e))
    publish = PublishTo(broker=args.broker, fleet=args.fleet, name=args.name,
                        keepalive=args.mqtt_keepalive, ca_file=args.mqtt_ca_file,
                        cert_file=args.mqtt_cert_file, key_file=args.mqtt_key_file)
    return publish, settings.password


def _headless(args: argparse.Namespace) -> int:
    from loadgen.worker.limits import one_blas_thread

    one_blas_thread(os.environ)  # before numpy loads: its idle BLAS threads cost CPU
    # No collection while the run's modules load: they allocate tens of thousands of objects,
    # none garbage, and the collections that set off were ~60 ms of a headless start-up's
    # CPU. What is loaded is frozen (later collections pass it by), then collection resumes.
    gc.disable()
    try:
        from loadgen.run.headless import run_headless
        from loadgen.worker import eventloop
    finally:
        gc.freeze()
        gc.enable()

    if args.broker:
        fail("--publish is for the console; a headless run that publishes is `tokentop agent`")
    cfg = run_config(args)
    secrets = secrets_from(args)
    return eventloop.run(
        lambda: run_headless(cfg, secrets, json_path=args.json, record=args.record)
    )


def _console(args: argparse.Namespace) -> int:
    from loadgen.run.run_process import RunProcess
    from tui.app import TokentopApp

    if getattr(args, "json", None) is not None:
        fail("--json is written by headless runs; add --headless")
    cfg = run_config(args)
    password = None
    if args.broker:
        cfg.publish, password = _publish_to(args)
    source = RunProcess(cfg, secrets_from(args, mqtt_password=password), record=args.record)
    app = TokentopApp(source, theme=args.theme, refresh=args.refresh, slo=args.slo,
                      mix=args.mix)
    app.run()
    # the alternate screen is gone with the app: what the run did and where it lies must
    # stay in the terminal (at 80x24 the events panel cuts the path)
    for line in farewell(app):
        print(line)
    return app.return_code or 0


def farewell(app: TokentopApp) -> list[str]:
    """The run's outcome as the run said it (the line a headless run ends with, or how its
    process died) and its directory; else why it never started."""
    outcome = app.source.status().outcome
    if outcome is None:
        return [f"tokentop: {app.error}"] if app.error else []
    lines = [f"tokentop: {outcome.line}"]
    if outcome.run_dir is not None:
        lines.append(f"tokentop: run directory {outcome.run_dir}")
    return lines
