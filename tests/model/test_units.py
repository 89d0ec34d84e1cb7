"""One units vocabulary: a figure means the same at every front door (the command line's
flags, the eval plan's TOML, the SLO grammar), a bad one is refused at each in one line,
and a figure is printed the same by the console and by the reports."""

from __future__ import annotations

import pytest
from textual.content import Content

from loadgen.eval.plan import PlanError, parse_plan
from loadgen.model import units
from loadgen.model.slo import SloError, parse_slos
from tui.commands.console import run_parser
from tui.commands.sweep import sweep_parser


def flag(parser, *argv: str):
    return parser.parse_args(list(argv))


def refused(parser, capsys, *argv: str) -> str:
    """The one line a bad flag gets (exit code 2, no traceback)."""
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(list(argv))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def plan_error(toml: str) -> str:
    with pytest.raises(PlanError) as caught:
        parse_plan(toml)
    assert "\n" not in str(caught.value)
    return str(caught.value)


# ---- the same value, every front door -----------------------------------------------------


@pytest.mark.parametrize(("written", "seconds"), [
    ("90", 90.0), ("0.5", 0.5), ("20s", 20.0), ("500ms", 0.5), ("5m", 300.0), ("1.5h", 5400.0),
    ("24h", 86400.0), ("2d", 172800.0), ("24H", 86400.0),
])
def test_seconds_mean_the_same_in_a_flag_and_in_the_plan(written, seconds):
    assert flag(run_parser(), "--duration", written).duration == seconds
    assert flag(sweep_parser(), "--step-seconds", written).step_seconds == seconds
    plan = parse_plan(f'[phases.long_tail]\nduration = "{written}"\n')
    assert plan.phases.long_tail.duration == seconds


def test_a_fraction_means_the_same_in_a_flag_the_plan_and_an_slo():
    assert flag(sweep_parser(), "--max-error-rate", "5%").max_error_rate == 0.05
    assert flag(run_parser(), "--stop-error-rate", "5%").stop_error_rate == 0.05
    assert parse_plan('[phases.ramp]\nmax_error_rate = "5%"\n').phases.ramp.max_error_rate \
        == 0.05
    (threshold,) = parse_slos("error_rate<5%").thresholds
    assert threshold.value == 0.05
    assert flag(sweep_parser(), "--max-error-rate", "0.05").max_error_rate == 0.05


def test_a_latency_means_the_same_in_an_slo_and_in_every_flag_taking_one():
    from loadgen.run.config import RunConfig, _cancelling
    from tui.commands.args import Parser
    from tui.commands.calibrate import add_calibrate_arguments
    from tui.commands.report import report_parser

    slo = parse_slos("ttft<500ms").per_request
    assert slo is not None and slo.ttft_us == 500_000
    calibrate = Parser(prog="tokentop calibrate")
    add_calibrate_arguments(calibrate)
    assert flag(calibrate, "--ttft-ms", "500ms").ttft_ms * 1e3 == slo.ttft_us
    assert flag(calibrate, "--ttft-ms", "500").ttft_ms * 1e3 == slo.ttft_us  # the flag says ms
    tail = flag(report_parser(), "DIR", "--tail-ms", "ttft=500ms,itl=0.2s").tail_ms
    assert tail == {"ttft": slo.ttft_us, "itl": 200_000}
    at = flag(run_parser(), "--cancel-at", "500ms", "--cancel-rate", "5%").cancel_at
    cancelling = _cancelling(RunConfig(cancel_at=at, cancel_rate=0.05))
    assert cancelling.after_s * 1e6 == slo.ttft_us
    assert flag(run_parser(), "--cancel-at", "20").cancel_at == "20"  # tokens stay tokens


def test_rates_sizes_and_counts():
    assert flag(run_parser(), "--rate", "300/m").rate == 5.0
    assert (parse_slos("req_s>5/s").thresholds[0].value, units.parse_rate("5")) == (5.0, 5.0)
    assert [units.parse_size(t) for t in ("512", "4KiB", "1.5GB", "64MiB", "8G", "8Gi")] == \
        [512, 4096, 1_500_000_000, 64 * 2**20, 8 * 10**9, 8 * 2**30]
    assert units.parse_whole("16", minimum=1) == 16 and units.parse_positive("0.5") == 0.5


# ---- a bad value: refused everywhere, in one line, in the same words ------------------------


def test_bad_seconds_are_refused_in_the_same_words_at_each_door(capsys):
    said = 'expected seconds, e.g. 90, "90s", "5m" or "24h"'
    assert f"argument --duration: {said}, got '5 minutes'" in refused(
        run_parser(), capsys, "--duration", "5 minutes")
    assert plan_error('[phases.long_tail]\nduration = "5 minutes"') == \
        f'plan.toml: phases.long_tail.duration: {said}, got "5 minutes"'
    assert "must be more than 0 seconds, got '0'" in refused(
        run_parser(), capsys, "--duration", "0")
    assert plan_error('[quick.baseline]\nduration = "0s"').endswith(
        'must be more than 0 seconds, got "0s"')
    for nonsense in ("inf", "nan", "1e999", "-5"):
        refused(run_parser(), capsys, "--duration", nonsense)


def test_bad_fractions_are_refused_at_each_door(capsys):
    assert "must be between 0 and 1, got '150%'" in refused(
        sweep_parser(), capsys, "--max-error-rate", "150%")
    assert plan_error('[phases.ramp]\nmax_error_rate = "150%"').endswith(
        'must be between 0 and 1, got "150%"')
    with pytest.raises(SloError, match="must be between 0 and 1, got '150%'"):
        parse_slos("error_rate<150%")
    assert 'expected a fraction, e.g. 0.05 or "5%"' in refused(
        sweep_parser(), capsys, "--max-error-rate", "lots")


def test_a_time_without_its_unit_is_refused_where_nothing_names_one(capsys):
    with pytest.raises(SloError, match=r"^time '20' has no unit: write 20ms or 20s"):
        parse_slos("ttft<20")
    assert "expected tokens (20) or a time (1.5s)" in refused(
        run_parser(), capsys, "--cancel-at", "soon")
    assert "expected a whole number, got 'lots'" in refused(run_parser(), capsys, "-c", "lots")


# ---- printing: one way, and nothing after a missing figure ----------------------------------

FORMATTERS = [units.ms, units.duration, units.elapsed, units.clock, units.bytes_, units.rate,
              units.pct, units.count, units.number, units.si]


@pytest.mark.parametrize("fmt", FORMATTERS, ids=lambda f: f.__name__)
def test_a_missing_figure_is_na_without_a_unit(fmt):
    assert fmt(None) == "n/a" == units.NA


def test_a_missing_rate_has_no_unit_after_it():
    assert units.rate(None, "tok/s") == "n/a"
    assert units.bytes_pair(None, None) == "n/a/n/a"


LATENCIES_MS = [
    (0.42, "0.42 ms"), (0.999, "1.00 ms"), (9.99, "9.99 ms"), (9.996, "10.0 ms"),
    (99.9, "99.9 ms"), (99.96, "100 ms"), (999.0, "999 ms"), (999.6, "1.00 s"),
    (1000.0, "1.00 s"), (1240.0, "1.24 s"), (12_345.0, "12.3 s"), (123_456.0, "123 s"),
]


@pytest.mark.parametrize(("ms", "shown"), LATENCIES_MS)
def test_a_latency_is_printed_alike_by_the_console_and_the_reports(ms, shown):
    from loadgen.analysis import compare, report, sweep
    from tui.widgets.latency_panel import cell

    assert units.ms(ms * 1e3) == shown
    console = Content.from_markup(cell({"p50": ms * 1e3}, "ttft", "p50", None)).plain.strip()
    assert console == shown
    assert report._ms(ms) == shown  # the soak report keeps ms
    assert sweep._ms(ms) == shown
    assert compare._fmt(ms, ("latency_ms", "ttft", "p99")) == shown


def test_durations_rates_and_percentages():
    assert [units.duration(s) for s in (0.5, 12.34, 90, 119.97, 150, 600, 86400)] == \
        ["0.5 s", "12.3 s", "90.0 s", "2.0 min", "2.5 min", "10.0 min", "24.0 h"]
    assert units.elapsed(72 * 3600 + 62) == "72:01:02"
    assert [units.rate(x, "tok/s") for x in (0.25, 12.34, 1234.4, 12_345_678)] == \
        ["0.25 tok/s", "12.3 tok/s", "1,234 tok/s", "12.3M tok/s"]
    # a success rate just short of 1 is not rounded up to a clean 100%
    assert [units.pct(f) for f in (0.0, 0.125, 0.9995, 1.0)] == \
        ["0.0%", "12.5%", "99.95%", "100%"]
    assert units.pct(45.2, whole=100) == "45.2%"
    assert [units.bytes_(n) for n in (512, 4096, 80 * 1024**3)] == ["512 B", "4.0 KiB",
                                                                     "80.0 GiB"]
