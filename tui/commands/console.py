"""`tokentop [options]` (the live console) and `tokentop run` (the same, or `--headless`).

    tokentop [--url URL] [--model M] [-c N] …   the live console (embedded simulator without --url)
    tokentop run --headless --duration S …     the same run without a screen

The run itself is a RunConfig plus its Secrets; the two functions that start one
(`_console`, `_headless`) are the only places here that know how.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import socket
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen import __version__
from tui.commands import COMMANDS
from tui.commands.args import (
    Parser,
    add_broker_arguments,
    add_run_arguments,
    broker_settings,
    fail,
    run_config,
    seconds,
    secrets_from,
)

if TYPE_CHECKING:
    from loadgen.run.config import PublishTo, RunConfig
    from loadgen.sim.model import SimConfig
    from tui.app import TokentopApp


def console_parser(prog: str = "tokentop") -> argparse.ArgumentParser:
    """The run's arguments, the console's own, and `--publish` (the broker's arguments)."""
    p = Parser(prog=prog, description="Live console for LLM inference servers. "
               f"Subcommands: {', '.join(COMMANDS)} (tokentop SUB --help).")
    p.add_argument("--version", action="version", version=f"tokentop {__version__}")
    add_run_arguments(p)
    ui = p.add_argument_group("console")
    ui.add_argument("--theme", help="tokentop-dark (default), tokentop-light, "
                    "tokentop-high-contrast, tokentop-mono; `t` cycles them in the console "
                    "and the choice is remembered in ~/.config/tokentop/config.toml")
    ui.add_argument("--refresh", type=seconds, default=0.5, help="seconds between redraws")
    add_broker_arguments(p, required=False, url_flag="--publish")
    p.add_argument("--name", default=socket.gethostname(),
                   help="this machine's name in the fleet (with --publish)")
    return p


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
    from loadgen.run.headless import run_headless
    from loadgen.worker import eventloop

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
                      run_dir=partial(find_run_dir, cfg.out, args.record),
                      target_note=sim_note(cfg))
    app.run()
    # the alternate screen is gone with the app: what the run did and where it lies must
    # stay in the terminal (at 80x24 the events panel cuts the path)
    for line in farewell(cfg, app):
        print(line)
    return app.return_code or 0


def find_run_dir(out: str | None, record: bool, run_id: str) -> Path | None:
    """The run directory of `run_id`: --out, else the one default_run_dir made for it."""
    if not record:
        return None
    if out:
        return Path(out)
    from loadgen.record.rundir import data_home

    found = sorted((data_home() / "tokentop" / "runs").glob(f"*-{run_id}"))
    return found[-1] if found else None


def farewell(cfg: RunConfig, app: TokentopApp) -> list[str]:
    """The run's one-line summary (the line a headless run ends with) and its directory."""
    if app.windows.last is None:
        return [f"tokentop: {app.error}"] if app.error else []
    lines = [f"tokentop: {exit_reason(cfg, app)}"]
    run_dir = app.run_dir
    if run_dir is not None:
        lines.append(f"tokentop: run directory {run_dir}")
    return lines


def exit_reason(cfg: RunConfig, app: TokentopApp) -> str:
    """The run's own verdict from its manifest when it wrote one; else the same verdict
    judged on the console's windows (no recording, or the run was cut short)."""
    run_dir = app.run_dir
    if run_dir is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            manifest = json.loads((run_dir / "manifest.json").read_text())
            return str(manifest["summary"]["exit"]["reason"])
    from loadgen.run.summary import build_summary, exit_status, thresholds

    summary = build_summary(cfg, app.windows)
    summary["thresholds"] = thresholds(cfg, app.windows)
    return exit_status(summary)[1]


def sim_note(cfg: RunConfig) -> str | None:
    """What the embedded simulator is (profile, slots, KV budget, faults at start); None
    when the target is a real server."""
    if cfg.url is not None:
        return None
    from loadgen.sim.model import SimConfig

    sim = cfg.sim or SimConfig()
    flags = cfg.sim_flags
    profile = flags[flags.index("--profile") + 1] if "--profile" in flags[:-1] else "default"
    faults = active_faults(sim)
    return (f"simulator, {profile} profile: {sim.slots} slots, KV {sim.kv_tokens:,} tokens, "
            f"{'faults ' + ', '.join(faults) if faults else 'no faults'}")


def active_faults(sim: SimConfig) -> list[str]:
    """The fault settings that differ from none at all, as `name=value`."""
    from loadgen.sim.faults import FaultConfig

    defaults = FaultConfig()
    out = []
    for f in dataclasses.fields(FaultConfig):
        value = getattr(sim.faults, f.name)
        if f.name != "seed" and value != getattr(defaults, f.name):
            out.append(f"{f.name}={value:g}" if isinstance(value, float) else
                       f"{f.name}={value}")
    return out
