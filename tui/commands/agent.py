"""`tokentop agent`: headless load + probes on a load machine, published over MQTT.

    tokentop agent --broker mqtt://broker:1883 --name gpu-07 --url http://127.0.0.1:8000/v1

Takes every `tokentop run` option, the broker's, and the agent's own (its name,
whether the fleet console may steer it, and the caps on that). Everything is
read and checked here; bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from loadgen.fleet.publisher import DEFAULT_BACKLOG
from loadgen.fleet.remote import DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_RATE
from loadgen.model.notice import Notice
from tui.commands.args import (
    Parser,
    add_broker_arguments,
    add_run_arguments,
    broker_settings,
    fail,
    positive,
    run_config,
    seconds,
    secrets_from,
    whole,
)


def main(argv: list[str]) -> int:
    p = Parser(prog="tokentop agent", description="Headless load + probes, published over MQTT.")
    add_agent_arguments(p)
    args = p.parse_args(argv)
    _quiet_logging()
    return _agent(args)


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    """Everything `tokentop agent` takes: the run's arguments (as `tokentop run`), the broker's,
    and the agent's own."""
    add_run_arguments(p)
    add_broker_arguments(p)
    g = p.add_argument_group("agent")
    g.add_argument("--name", default=None,
                   help="this agent's name in the fleet (default: the host name)")
    g.add_argument("--allow-remote-control", action="store_true",
                   help="accept concurrency / rate / pause commands from the fleet console")
    g.add_argument("--max-concurrency", type=whole(1), default=DEFAULT_MAX_CONCURRENCY,
                   help="remote control never sets more streams than this "
                   f"(default {DEFAULT_MAX_CONCURRENCY})")
    g.add_argument("--max-rate", type=positive, default=DEFAULT_MAX_RATE,
                   help=f"remote control never sets more req/s than this "
                   f"(default {DEFAULT_MAX_RATE:g})")
    g.add_argument("--mqtt-backlog", type=whole(1), default=DEFAULT_BACKLOG,
                   help="Snapshots held while the broker is unreachable (oldest dropped "
                   f"first; default {DEFAULT_BACKLOG}, 10 min at 2 Hz)")
    g.add_argument("--mqtt-max-backoff", type=seconds, default=30.0,
                   help=argparse.SUPPRESS)
    g.add_argument("--json", type=Path, help="write the final summary here")
    g.add_argument("--accept-jobs", action="store_true",
                   help="start no load of its own: run the load jobs that `tokentop eval "
                   "--broker` and `tokentop sweep --broker` send (at this agent's --url, "
                   "within --max-concurrency / --max-rate), each recorded under --out")


def _quiet_logging() -> None:
    """Warnings (broker lost, retrying) as one line each on stderr; no library chatter."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("tokentop: %(message)s"))
    for name in ("tokentop.mqtt", "tokentop.publisher", "tokentop.jobs"):
        lg = logging.getLogger(name)
        lg.addHandler(handler)
        lg.setLevel(logging.WARNING)
        lg.propagate = False
    logging.getLogger("tokentop.mqtt.paho").setLevel(logging.ERROR)


def _agent(args: argparse.Namespace) -> int:
    """Read and check everything (one line and exit 2 if bad), then run the agent."""
    from loadgen.fleet.link import BrokerError, check_level
    from loadgen.fleet.remote import default_name

    # the same arguments as `tokentop run`, read the same way
    cfg = run_config(args)
    try:
        settings = broker_settings(args)
        name = check_level("agent", args.name or default_name())
        fleet = check_level("fleet", args.fleet)
    except BrokerError as e:
        fail(str(e))
    if args.allow_remote_control and cfg.concurrency > args.max_concurrency:
        fail(f"--concurrency {cfg.concurrency} is over --max-concurrency {args.max_concurrency}")
    cfg.publish = _publish_to(args, fleet=fleet, name=name)
    secrets = secrets_from(args, mqtt_password=settings.password)
    if args.accept_jobs:
        return _take_jobs(cfg, secrets, settings, args)
    return _run_agent(cfg, secrets, args)


def _publish_to(args: argparse.Namespace, *, fleet: str, name: str):
    """Where the agent's run publishes, and how far the fleet console may steer it."""
    from loadgen.run.config import PublishTo

    return PublishTo(broker=args.broker, fleet=fleet, name=name, keepalive=args.mqtt_keepalive,
                     ca_file=args.mqtt_ca_file, cert_file=args.mqtt_cert_file,
                     key_file=args.mqtt_key_file, backlog=args.mqtt_backlog,
                     max_backoff=args.mqtt_max_backoff,
                     remote_control=args.allow_remote_control,
                     max_concurrency=args.max_concurrency, max_rate=args.max_rate)


def _take_jobs(cfg, secrets, settings, args: argparse.Namespace) -> int:
    """The job loop until Ctrl-C / SIGTERM (a second one cancels a job's requests)."""
    from loadgen.run.headless import line_say
    from loadgen.run.job_agent import JobAgent
    from loadgen.worker import eventloop

    async def serve() -> int:
        say = line_say(sys.stderr)
        agent = JobAgent(cfg, secrets, settings, cfg.publish, say=say, record=args.record)
        signals = 0

        def stop() -> None:
            nonlocal signals
            signals += 1
            agent.stop(now=signals > 1)

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop)
        say(Notice("run", f"agent {cfg.publish.name} of fleet {cfg.publish.fleet}: waiting "
                   f"for jobs on {settings.display}"))
        await agent.run()
        return 0

    return eventloop.run(serve)


def _run_agent(cfg, secrets, args: argparse.Namespace) -> int:
    """The run itself: a headless run whose config says where to publish."""
    from loadgen.run.headless import run_headless
    from loadgen.worker import eventloop

    return eventloop.run(
        lambda: run_headless(cfg, secrets, json_path=args.json, record=args.record))
