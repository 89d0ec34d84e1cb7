"""`tokentop eval compare`: evals side by side (loadgen.eval.compare).

    tokentop eval compare DIR_A DIR_B [DIR_C …] [--format text|md|csv|json] [--output FILE]
                          [--fail-on-regression PCT]

Exit codes: 0, 2 (bad input: one line), 3 (--fail-on-regression: a judged row of a later
eval worse than the first's by more than PCT % and beyond the noise).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tui.commands.args import Parser, fail

PROG = "tokentop eval compare"
EXIT_REGRESSION = 3


def _percent(text: str) -> float:
    """--fail-on-regression: per cent, 0 or more ("10" or "10%")."""
    number = text.strip().removesuffix("%")
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a per cent, e.g. 10, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more per cent, got {text!r}")
    return value


def _parser() -> Parser:
    from loadgen.eval.compare import FORMATS, NOISE_BAND_PCT

    p = Parser(prog=PROG, description=(
        "Evals side by side, rows matched by what they measure, each later eval judged "
        "against the first: better or worse only beyond the noise (non-overlapping 95 % "
        f"intervals with --repeat on both sides, else a ±{NOISE_BAND_PCT:g} % band); says "
        "where the evals differ (engine, model, GPUs, plan, workload, profile); ends with a "
        "verdict per scenario of the first eval's plan ([scenarios]: realtime, batch, "
        "production, or yours), or no clear winner and why."))
    p.add_argument("evals", nargs="+", type=Path, help="`tokentop eval --out` directories "
                   "(or their eval.json); the first is the baseline")
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="text (the terminal), md (a GitHub table), csv, json (every row, every "
                   "eval's value, interval, samples, flags and load, the judgements)")
    p.add_argument("--output", type=Path, metavar="FILE", help="write it to FILE (default: "
                   "stdout)")
    p.add_argument("--fail-on-regression", type=_percent, metavar="PCT",
                   help="exit 3 when a judged row of a later eval is worse than the first's by "
                   "more than PCT %% and beyond the noise (for CI)")
    return p


def compare_main(argv: list[str]) -> int:
    from loadgen.eval.compare import comparison, gate, render
    from loadgen.eval.results import read_eval

    args = _parser().parse_args(argv)
    if len(args.evals) < 2:
        fail("give two eval directories or more", prog=PROG)
    try:
        evals = [(str(d), read_eval(d)) for d in args.evals]
    except ValueError as e:
        fail(str(e), prog=PROG)
    c = comparison(evals)
    judged = None if args.fail_on_regression is None else gate(c, args.fail_on_regression)
    text = render(c, args.format, judged)
    if args.output is None:
        print(text)
    else:
        _write(args.output, text)
    if args.output is not None or args.format in ("csv", "json"):
        for line in judged.lines() if judged else []:  # the CI log says why, whatever the format
            print(f"{PROG}: {line}", file=sys.stderr)
    return EXIT_REGRESSION if judged and judged.failed else 0


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror or e}", prog=PROG)
