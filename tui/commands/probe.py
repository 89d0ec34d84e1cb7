"""`tokentop probe`: what every probe sees right now (GPUs, host, server), no load.

The key file is read here (a secret never travels as a flag value); the probing
is probes/oneshot.py's `run_probe`, with typed arguments. With `--api`, what the server
supports of the OpenAI API instead: loadgen/eval/conformance.py's checks, one line each
(✓ yes, ✗ no, ~ partial, with the evidence); a URL that does not answer is one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tui.commands.args import Parser, read_secret, seconds, whole


def main(argv: list[str]) -> int:
    p = Parser(prog="tokentop probe",
               description="What every probe sees right now (GPUs, host, server), no load.")
    add_probe_arguments(p)
    args = p.parse_args(argv)
    token = _token(args.api_key_file)
    if args.api:
        return _api(args, token)
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
    parser.add_argument("--api", action="store_true",
                        help="check what the --url server supports of the OpenAI API (stop, n, "
                        "seed, logprobs, JSON output, tools, errors …), a line per check")
    parser.add_argument("--model", default=None,
                        help="with --api: the model to ask for (default: the first of /v1/models)")
    parser.add_argument("--timeout", type=seconds, default=10.0,
                        help="with --api: each check's time limit; no answer within it is a no")
    parser.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="file holding a bearer token for /metrics, and with --api for every request "
        "(never printed)",
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


def _api(args: argparse.Namespace, token: str | None) -> int:
    """The conformance checks against --url, printed; exit 2 when it does not answer."""
    import msgspec

    from loadgen.eval.conformance import Target, Unreachable, run_checks, table
    from loadgen.model.urls import basic_credentials
    from loadgen.run.secrets import Secrets
    from loadgen.worker import eventloop

    if not args.url or not args.url.startswith(("http://", "https://")):
        print("tokentop probe: --api needs --url, the server's OpenAI base URL "
              "(e.g. http://127.0.0.1:8000/v1)", file=sys.stderr)
        return 2
    secrets = Secrets(api_key=token, basic_auth=basic_credentials(args.url))
    target = Target(url=args.url, headers=secrets.request_headers(), model=args.model,
                    timeout_s=args.timeout, metrics_url=args.metrics_url)

    async def checks():
        return await run_checks(target)

    try:
        figures = eventloop.run(checks)
    except Unreachable as e:
        print(f"tokentop probe: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(msgspec.json.encode(figures).decode())
    else:
        print("\n".join(table(figures)))
    return 0
