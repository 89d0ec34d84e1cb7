"""`tokentop compare A B [C…]`: runs or sweeps side by side (loadgen/analysis/compare.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from tui.commands.args import Parser


def main(argv: list[str]) -> int:
    p = Parser(prog="tokentop compare",
               description="Runs or sweeps side by side (the first is the baseline).")
    p.add_argument("items", nargs="+", type=Path, metavar="RUN_OR_SWEEP",
                   help="two or more run directories, or sweeps (a sweep.json or its folder): "
                   "runs with runs, sweeps with sweeps; the first is the baseline")
    p.add_argument("--png", type=Path, help="write the overlaid curves (or bars) here")
    p.add_argument("--json", type=Path, help="write the comparison as JSON here")
    args = p.parse_args(argv)
    return _compare(args.items, png=args.png, json_path=args.json)


def _compare(items: list[Path], *, png: Path | None, json_path: Path | None) -> int:
    from loadgen.analysis.compare import CompareError, compare

    try:
        compare(items, png=png, json_path=json_path)
    except CompareError as e:
        print(f"tokentop compare: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"tokentop compare: cannot write {e.filename}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    return 0
