"""`tokentop report DIR`: a soak report of a run directory (loadgen/analysis/report.py).

It prints the summary, then `wrote PATH` for each file written (report.md, report.json,
the PNGs).

Exit codes: 0 report written (thresholds passed or none); 3 a threshold failed;
2 not a readable run directory, a bad option, or the report cannot be written (the
summary is printed all the same, and one line on stderr says which files are missing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tui.commands.args import Parser, latency_ms, positive, seconds


def main(argv: list[str]) -> int:
    args = report_parser().parse_args(argv)
    return _report(args)


def report_parser() -> argparse.ArgumentParser:
    p = Parser(prog="tokentop report", description="A soak report of a run directory.",
               epilog="exit codes: 0 report written; 3 a threshold failed; 2 not a readable "
               "run directory, a bad option, or part of the report could not be written "
               "(a full disk: the summary is still printed)")
    p.add_argument("run_dir", type=Path, help="the run directory to report on (a run's --out; "
                   "one still being written too)")
    p.add_argument("--out-dir", type=Path, help="where to write (default: the run directory)")
    p.add_argument("--slo", help="thresholds to judge (default: the run's own --slo)")
    p.add_argument("--bucket", type=seconds, help="drift bucket, seconds (1h, 600, 10m; "
                   "default: 3600 for soaks, shorter for short runs)")
    p.add_argument("--tail-k", type=positive, default=5.0,
                   help="long tail: k × the run's median per-tick P99")
    p.add_argument("--tail-ms", type=tail_limits_us,
                   help="long tail: absolute limits, ms or with a unit, e.g. "
                   "ttft=2000,itl=200 or ttft=2s")
    p.add_argument("--no-plots", action="store_true",
                   help="write report.md and report.json only, no PNGs (quicker)")
    return p


def tail_limits_us(text: str) -> dict[str, float]:
    """`--tail-ms ttft=2000,itl=200ms,e2e=2s` as {metric: µs} (a bare number is ms)."""
    out = {}
    for part in text.split(","):
        metric, eq, limit = part.partition("=")
        if not eq or not metric.strip():
            raise argparse.ArgumentTypeError(
                f"expected metric=ms pairs, e.g. ttft=2000,itl=200, got {text!r}")
        out[metric.strip()] = latency_ms(limit) * 1e3
    return out


def _report(args: argparse.Namespace) -> int:
    from loadgen.analysis.report import write_report
    from loadgen.model.snapshot import SnapshotVersionError
    from loadgen.record.rundir import RunDirError

    try:
        code, r = write_report(
            args.run_dir, out_dir=args.out_dir, slo=args.slo, plots=not args.no_plots,
            bucket_s=args.bucket, tail_k=args.tail_k, tail_abs_us=args.tail_ms,
            out=sys.stdout)  # now: a reader that stops reading is tui.cli's ReaderGone
    except (RunDirError, SnapshotVersionError, ValueError) as e:  # ValueError: a bad --slo
        print(f"tokentop: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"tokentop: cannot write the report: {e.strerror or e}", file=sys.stderr)
        return 2
    if r.get("not_written"):
        where = args.out_dir or args.run_dir
        print(f"tokentop report: {not_written_line(r['not_written'], where)}", file=sys.stderr)
    return code


def not_written_line(missing: list[dict], where: Path) -> str:
    """One line for every file the report could not write (a full disk fails them all)."""
    whys = sorted({m["why"] for m in missing})
    return (f"could not write {', '.join(m['file'] for m in missing)} in {where} "
            f"({'; '.join(whys)}); nothing partial was left")
