"""The eval plan: the default plan's text is the truth for the defaults, a user's plan is laid
over it, and every bad plan is one line naming the key path."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import msgspec
import pytest

from loadgen.eval.plan import (
    DEFAULT_PLAN,
    FAULT_SETTLE_S,
    PHASES,
    QUICK_BUDGET_S,
    Bandwidth,
    Blackhole,
    Latency,
    PlanError,
    Reset,
    default_plan,
    faults_seconds,
    parse_plan,
    plan_from_builtins,
    plan_to_builtins,
    planned_seconds,
    read_plan,
)
from loadgen.worker.mix import parse_mix

BLACKHOLE_TEN = """
[[phases.faults]]
at = 0
fault = "latency"
ms = 10
for = 5
[[phases.faults]]
at = 10
fault = "reset"
probability = 0.1
for = 5
[[phases.faults]]
at = 20
fault = "blackhole"
seconds = "ten"
"""


def test_default_plan_has_every_phase_with_the_values_its_text_gives() -> None:
    plan = default_plan()
    p = plan.phases
    assert [f for f in p.__struct_fields__] == list(PHASES)
    assert (p.baseline.mode, p.baseline.concurrency, p.baseline.duration) == ("closed", 16, 300)
    assert (p.baseline.input_tokens, p.baseline.output_tokens) == ("512", "128")
    assert (p.ramp.steps, p.ramp.step_duration, p.ramp.max_error_rate) == ("auto", 30, 0.05)
    assert (p.long_tail.fraction, p.long_tail.duration, p.long_tail.bucket) == (0.8, 86400, 3600)
    assert p.faults == [
        Latency(at=60, ms=200, jitter_ms=50, for_=60), Reset(at=180, probability=0.05, for_=60),
        Blackhole(at=300, seconds=10), Bandwidth(at=360, bytes_per_s=65536, for_=60),
    ]
    assert (p.leaks.max_rss_mb_per_h, p.leaks.min_soak) == (50, 1800)
    assert p.efficiency.at == ["baseline", "knee"]
    assert (p.scaling.targets, p.scaling.per_target, p.scaling.duration) == ([], "knee", 120)
    fast, slow = parse_mix(list(p.priority.classes))
    assert (fast.name, fast.share, fast.priority, slow.name, slow.priority) == (
        "interactive", 0.2, 0, "batch", 10)
    assert (p.priority.load, p.priority.factor, p.priority.without) == ("knee", 2.0, True)
    assert all(getattr(p, name).enabled for name in PHASES if name != "faults")
    per_request = plan.slos().per_request
    assert per_request is not None and per_request.ttft_us == 2_000_000


def test_print_plan_text_round_trips_through_a_file(tmp_path: Path) -> None:
    """What --print-plan writes, read back with --plan, is the default plan."""
    path = tmp_path / "plan.toml"
    path.write_text(DEFAULT_PLAN, encoding="utf-8")
    assert read_plan(path) == default_plan() == parse_plan("")
    for name in PHASES:
        assert getattr(read_plan(path).quick, name) is not None


def test_a_plan_goes_to_json_and_back() -> None:
    """An eval records its plan in its results, and a resume reads that back."""
    plan = parse_plan('[phases.baseline]\nmode = "open"\nrate = 3\n')
    data = json.loads(json.dumps(plan_to_builtins(plan)))
    assert data["phases"]["faults"][2] == {"fault": "blackhole", "at": 300.0, "seconds": 10.0}
    assert data["phases"]["faults"][0]["for"] == 60.0
    assert plan_from_builtins(data, "eval.json") == plan


def test_print_plan_text_is_commented_at_every_phase() -> None:
    """--print-plan gives a file to start from: each phase's table says what it is."""
    lines = DEFAULT_PLAN.splitlines()
    for name in PHASES:
        header = "[[phases.faults]]" if name == "faults" else f"[phases.{name}]"
        above = lines[lines.index(header) - 1]  # the first of the faults
        assert above.startswith("#"), f"no comment above {header}"


def test_a_plan_holds_only_what_it_changes() -> None:
    plan = parse_plan('[phases.long_tail]\nduration = "2h"\n')
    default = default_plan()
    expected = msgspec.structs.replace(default.phases.long_tail, duration=7200.0)
    assert plan.phases == msgspec.structs.replace(default.phases, long_tail=expected)
    assert plan.quick == default.quick  # [quick] still replaces the soak's duration


def test_a_list_replaces_the_defaults_list() -> None:
    plan = parse_plan('[[phases.faults]]\nat = "10s"\nfault = "blackhole"\nseconds = 3\n')
    assert plan.phases.faults == [Blackhole(at=10, seconds=3)]
    assert faults_seconds(plan.phases.faults) == 13 + FAULT_SETTLE_S
    assert faults_seconds(plan.phases.faults, plan.fault_settle) == 13 + FAULT_SETTLE_S
    none = parse_plan("[phases]\nfaults = []\n")
    assert none.phases.faults == [] and faults_seconds(none.phases.faults) == 0


def test_the_settle_after_the_last_fault_is_the_plans_and_long_enough_to_see_an_outage():
    plan = parse_plan('fault_settle = "40s"\n[[phases.faults]]\nat = "10s"\nfault = "blackhole"\n'
                      'seconds = 3\n')
    assert plan.fault_settle == 40.0
    assert faults_seconds(plan.phases.faults, plan.fault_settle) == 13 + 40
    assert planned_seconds(plan.phases, settle=plan.fault_settle) - planned_seconds(
        plan.phases) == 40 - FAULT_SETTLE_S
    with pytest.raises(PlanError,
                       match=r"^plan\.toml: fault_settle: expected at least 5s .* got 3s$"):
        parse_plan('fault_settle = "3s"\n')


def test_quick_profile_shortens_every_timed_phase_and_fits_six_minutes() -> None:
    plan = default_plan()
    full, quick = plan.phases, plan.quick
    assert quick.baseline.duration < full.baseline.duration
    assert quick.ramp.step_duration < full.ramp.step_duration and quick.ramp.steps != "auto"
    assert quick.long_tail.duration < full.long_tail.duration
    assert faults_seconds(quick.faults) < faults_seconds(full.faults)
    assert quick.scaling.duration < full.scaling.duration
    assert quick.batch.timeout < full.batch.timeout
    assert quick.context.step_duration < full.context.step_duration
    assert quick.interference.duration < full.interference.duration
    assert quick.priority.duration < full.priority.duration
    # planned load time with two replicas for the scaling row, leaving a sixth of the budget
    # for starting each phase's session and writing the report
    assert planned_seconds(quick, targets=2) <= QUICK_BUDGET_S * 5 / 6
    assert planned_seconds(full, targets=2) > 24 * 3600


def test_planned_seconds_adds_up_the_phases() -> None:
    quick = default_plan().quick
    # 5+20 baseline, 7 steps x (2+8), the batch's 20 s timeout, 3 context rungs x (1+2),
    # interference alone, beside 3 neighbours and alone again, 5 x (1+3), the priority
    # classes with and without, 2 x (1+4), 60 soak, faults to 48 s + settle, 2 x (2+8)
    # scaling
    once = 25 + 70 + 20 + 9 + 20 + 10 + 60 + 48 + FAULT_SETTLE_S
    assert planned_seconds(quick, targets=2) == once + 20
    assert planned_seconds(quick, targets=1) == once


@pytest.mark.parametrize(("written", "seconds"), [
    ("90", 90.0), ('"90"', 90.0), ('"90s"', 90.0), ('"5m"', 300.0), ('"1.5h"', 5400.0),
    ('"24h"', 86400.0), ("0.5", 0.5),
])
def test_times_are_seconds_or_text_with_a_unit(written: str, seconds: float) -> None:
    plan = parse_plan(f"[phases.long_tail]\nduration = {written}\n")
    assert plan.phases.long_tail.duration == seconds


def test_fractions_take_percentages() -> None:
    plan = parse_plan('[phases.ramp]\nmax_error_rate = "2.5%"\n')
    assert plan.phases.ramp.max_error_rate == pytest.approx(0.025)


def test_open_loop_and_a_ramp_slo_of_its_own() -> None:
    plan = parse_plan('[phases.baseline]\nmode = "open"\nrate = 2.5\n'
                      '[phases.ramp]\nslo = "ttft<1s"\nsteps = [0.5, 1, 2]\n')
    assert (plan.phases.baseline.mode, plan.phases.baseline.rate) == ("open", 2.5)
    assert plan.phases.ramp.steps == [0.5, 1.0, 2.0]
    ramp_slo = plan.slos(plan.phases.ramp).per_request
    assert ramp_slo is not None and ramp_slo.ttft_us == 1_000_000 and ramp_slo.tpot_us is None


ERRORS = [
    (BLACKHOLE_TEN, 'phases.faults[2].seconds: expected seconds, e.g. 90, "90s", "5m" or '
     '"24h", got "ten"'),
    ('[[phases.faults]]\nat = 1\nfault = "latency"\nms = "fast"\nfor = 2',
     'phases.faults[0].ms: expected a number, got "fast"'),
    ('[[phases.faults]]\nat = 1\nfault = "latency"\nms = 3',
     "phases.faults[0].for: missing (this table needs fault, at, for, ms)"),
    ('[[phases.faults]]\nat = 1\nfault = "latency"\nms = 3\nfor = 2\nmsec = 1',
     "phases.faults[0].msec: unknown key (did you mean ms?)"),
    ('[[phases.faults]]\nat = 1\nfault = "drop"',
     'phases.faults[0].fault: expected "latency", "reset", "blackhole" or "bandwidth", '
     'got "drop"'),
    ('[[phases.faults]]\nat = 1\nfault = "reset"\nprobability = 2\nfor = 1',
     "phases.faults[0].probability: must be between 0 and 1, got 2"),
    ('[[phases.faults]]\nat = 0\nfault = "blackhole"\nseconds = 5\n'
     '[[phases.faults]]\nat = 3\nfault = "blackhole"\nseconds = 5',
     "phases.faults[1].at: starts at 3 s, while phases.faults[0] (0 s to 5 s) is still on"),
    ('[[phases.faults]]\nat = -1\nfault = "blackhole"\nseconds = 3',
     "phases.faults[0].at: must be 0 or more seconds, got -1"),
    ('[[phases.faults]]\nat = 1\nfault = "blackhole"\nseconds = true',
     'phases.faults[0].seconds: expected seconds, e.g. 90, "90s", "5m" or "24h", got true'),
    ("[phases.baseline]\ndurtion = 3", "phases.baseline.durtion: unknown key (did you mean "
     "duration?)"),
    ('[phases.baseline]\nmode = "half"', 'phases.baseline.mode: expected "closed" or "open", '
     'got "half"'),
    ("[phases.baseline]\nconcurrency = 0",
     "phases.baseline.concurrency: expected a whole number, at least 1, got 0"),
    ("[phases.baseline]\nconcurrency = 2.5",
     "phases.baseline.concurrency: expected a whole number, got 2.5"),
    ("[phases.baseline]\nrate = -1", "phases.baseline.rate: expected a number, above 0, got -1"),
    ("[phases.baseline]\nenabled = 1", "phases.baseline.enabled: expected true or false, got 1"),
    ('[phases.baseline]\ninput_tokens = "uniform:5"', "phases.baseline.input_tokens: bad length "
     "'uniform:5': kinds are fixed, uniform, normal, lognormal"),
    ('[phases.baseline]\ndataset = "csv:x.csv"', "phases.baseline.dataset: bad --dataset "
     "'csv:x.csv'"),
    ('[phases.ramp]\nsteps = "x"', 'phases.ramp.steps: expected "auto" or a list, got "x"'),
    ("[phases.ramp]\nsteps = [4, 2]",
     'phases.ramp.steps: expected increasing loads, e.g. [1, 2, 4, 8], or "auto"'),
    ('[phases.ramp]\nmax_error_rate = "150%"',
     'phases.ramp.max_error_rate: must be between 0 and 1, got "150%"'),
    ("[phases.ramp]\nknee_fraction = 2",
     "phases.ramp.knee_fraction: expected a number, at most 1, got 2"),
    ("[phases.long_tail]\ntail_k = 1", "phases.long_tail.tail_k: expected a number, above 1, "
     "got 1"),
    ('[phases.long_tail]\nduration = "5 minutes"', 'phases.long_tail.duration: expected '
     'seconds, e.g. 90, "90s", "5m" or "24h", got "5 minutes"'),
    ("[phases.efficiency]\nat = []",
     "phases.efficiency.at: expected a list of at least 1, got an empty list"),
    ('[phases.scaling]\ntargets = ["ftp://x"]',
     'phases.scaling.targets[0]: expected an http:// or https:// URL, got "ftp://x"'),
    ('[quick.baseline]\nduration = "0s"', 'quick.baseline.duration: must be more than 0 '
     'seconds, got "0s"'),
    ('[quick.baselin]\nduration = "1s"', "quick.baselin: unknown key (did you mean baseline?)"),
    ('slo = "ttft<20"', "slo: time '20' has no unit: write 20ms or 20s (units: ms, s, us)"),
    ('[phases.priority]\nclasses = ["a 20%", "b 20%"]', "phases.priority.classes: shares "
     "must add up to 100 %: 20.0% + 20.0% = 40.0%"),
    ('[phases.priority]\nclasses = ["a 100% urgency=1"]', "phases.priority.classes[0]: bad "
     "--mix part 'urgency=1' of class a"),
    ('[phases.priority]\nclasses = []',
     "phases.priority.classes: expected a list of at least 1, got an empty list"),
    ('[phases.priority]\nload = "peak"',
     'phases.priority.load: expected "baseline" or "knee", got "peak"'),
    ("version = 2", "version: this tokentop reads plan version 1, not 2"),
    ("verson = 1", "verson: unknown key (did you mean version?)"),
    ("phases = 3", "phases: expected a table, got 3"),
]


@pytest.mark.parametrize(("text", "message"), ERRORS, ids=[m.split(":")[0] for _, m in ERRORS])
def test_a_bad_plan_is_one_line_naming_the_key_path(text: str, message: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan(text)
    assert str(caught.value).startswith(f"plan.toml: {message}")
    assert "\n" not in str(caught.value)


def test_bad_toml_names_the_line() -> None:
    with pytest.raises(PlanError, match=r"^plan\.toml: not TOML: .*line 3"):
        parse_plan("version = 1\n\n[phases.baseline\n")


def test_a_file_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(PlanError, match=rf"^{missing}: cannot read: No such file"):
        read_plan(missing)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'slo = "caf\xe9"\n')
    with pytest.raises(PlanError, match=rf"^{latin}: not UTF-8 text$"):
        read_plan(latin)


def test_errors_in_a_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(BLACKHOLE_TEN, encoding="utf-8")
    with pytest.raises(PlanError, match=rf"^{path}: phases\.faults\[2\]\.seconds: "):
        read_plan(path)


def test_default_text_is_plain_toml_a_reader_can_edit() -> None:
    """Every key the plan knows is written in the default text (none only in code)."""
    raw = tomllib.loads(DEFAULT_PLAN)
    assert set(raw) == {"version", "slo", "repeat", "stagger", "fault_settle", "request",
                        "phases", "quick", "scenarios"}
    assert set(raw["phases"]) == set(PHASES)
