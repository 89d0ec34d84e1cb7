"""`tokentop eval compare`: evals side by side (loadgen.eval.compare).

    tokentop eval compare DIR_A DIR_B [DIR_C …]
"""

from __future__ import annotations

from pathlib import Path

from tui.commands.args import Parser, fail

PROG = "tokentop eval compare"


def compare_main(argv: list[str]) -> int:
    from loadgen.eval.compare import compare
    from loadgen.eval.results import read_eval

    p = Parser(prog=PROG,
               description="Evals side by side, per row, with the change in per cent against "
               "the first and which is better; says where the workloads differ.")
    p.add_argument("evals", nargs="+", type=Path, help="`tokentop eval --out` directories")
    args = p.parse_args(argv)
    if len(args.evals) < 2:
        fail("give two eval directories or more", prog=PROG)
    try:
        evals = [(str(d), read_eval(d)) for d in args.evals]
    except ValueError as e:
        fail(str(e), prog=PROG)
    print(compare(evals))
    return 0
