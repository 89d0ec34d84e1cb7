"""`tokentop probe`: what every probe sees right now (GPUs, host, server), no load.

The key file is read here (a secret never travels as a flag value); the probing
is probes/oneshot.py's `run_probe`, with typed arguments.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tui.commands.args import Parser, read_secret, whole


def main(argv: list[str]) -> int:
    p = Parser(prog="tokentop probe",
               description="What every probe sees right now (GPUs, host, server), no load.")
    add_probe_arguments(p)
    args = p.parse_args(argv)
    token = _token(args.api_key_file)
    return _probe(args, token)


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=None,
        help="the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1 "
        "(without it: GPUs, host and a server process found by name)",
    )
    parser.add_argument(
        "--metrics-url",
        default=None,
        help="where the server's Prometheus metrics are (default: /metrics at the URL's root)",
    )
    parser.add_argument("--server-pid", type=whole(1), default=None, help="the server's process id")
    parser.add_argument(
        "--server-name",
        default=None,
        help="find the server's process by this name (default: the engines' usual names)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="file holding a bearer token for /metrics (never printed)",
    )


def _token(path: Path | None) -> str | None:
    """The bearer token for /metrics; an unreadable file is one line and exit 2."""
    return None if path is None else read_secret(path, "--api-key-file", "tokentop probe")


def _probe(args: argparse.Namespace, token: str | None) -> int:
    from loadgen.worker import eventloop
    from probes.oneshot import run_probe

    return eventloop.run(lambda: run_probe(
        url=args.url, metrics_url=args.metrics_url, server_pid=args.server_pid,
        server_name=args.server_name, token=token, as_json=args.json))
