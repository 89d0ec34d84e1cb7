"""`--mix` as the user writes it: each class read as given, every mistake refused in one
sentence that names what is wrong (at the command line: exit 2, no traceback), and the
settings a mix implies (each class's limits, the embedded simulator's policy)."""

from __future__ import annotations

import pytest
from support import tokentop

from loadgen.model.slo import Slo
from loadgen.run.config import ConfigError, RunConfig
from loadgen.worker.distributions import WorkloadError
from loadgen.worker.mix import class_limits, parse_mix


def test_a_class_is_read_as_written():
    fast, slow = parse_mix(["interactive 20% in=128 out=64 priority=0 slo=ttft<200ms",
                            "batch 0.8 out=512 priority=10"])
    assert (fast.name, fast.share, fast.priority, fast.slo) == ("interactive", 0.2, 0,
                                                               "ttft<200ms")
    assert fast.describe() == "interactive 20% in 128 out 64 priority 0 SLO ttft<200ms"
    assert (slow.share, slow.priority, slow.input_tokens, slow.slo) == (0.8, 10, None, None)
    assert parse_mix([]) == ()


@pytest.mark.parametrize(("texts", "words"), [
    (["a 20%", "b 70%"], "must add up to 100 %: 20.0% + 70.0% = 90.0%"),
    (["a"], "give a name and a share"),
    (["Fast 100%"], "bad --mix class name 'Fast'"),
    (["a 50%", "a 50%"], "names the class 'a' twice"),
    (["a 100% colour=red"], "bad --mix part 'colour=red' of class a"),
    (["a 100% priority=high"], "bad --mix priority 'high' of class a"),
    (["a lots"], "bad --mix share 'lots' of class a"),
    (["a 0%", "b 100%"], "share of class a must be above 0"),
    (["a 100% slo=ttft<fast"], "--mix class a:"),
    ([f"c{i} {100 / 9}%" for i in range(9)], "at most 8 classes, not 9"),
])
def test_each_mistake_is_named(texts, words):
    with pytest.raises(WorkloadError) as e:
        parse_mix(texts)
    assert words in str(e.value)


def test_a_class_is_judged_by_its_own_limits_else_the_runs():
    run = Slo(ttft_us=1_000_000)
    own, other = parse_mix(["a 50% slo=ttft<100ms", "b 50%"])
    assert class_limits((own, other), run) == [Slo(ttft_us=100_000), run]
    # with no run limits, a class without its own has nothing to miss: every request good
    assert class_limits((own, other), None) == [Slo(ttft_us=100_000), Slo()]
    assert class_limits(parse_mix(["a 50%", "b 50%"]), None) == [None, None]


def test_the_embedded_simulator_schedules_by_the_priorities_a_mix_sends():
    sent = RunConfig(mix=["a 50% priority=0", "b 50% priority=4"])
    assert sent.embedded_sim().scheduling_policy == "priority"
    assert RunConfig(mix=["a 50%", "b 50%"]).embedded_sim().scheduling_policy == "fcfs"
    chose = RunConfig(mix=sent.mix, sim_flags=["--scheduling-policy=fcfs"])
    assert chose.embedded_sim().scheduling_policy == "fcfs"  # the user's word stands


@pytest.mark.parametrize(("cfg", "words"), [
    (RunConfig(mix=["a 100% priority=1"], extra_body={"priority": 3}),
     "priority is given twice"),
    (RunConfig(mix=["a 100%"], turns=3), "not with --turns"),
])
def test_what_a_mix_cannot_go_with_is_refused(cfg, words):
    with pytest.raises(ConfigError) as e:
        cfg.parsed()
    assert words in str(e.value)


def test_the_command_line_refuses_a_bad_mix_in_one_line():
    done = tokentop("run", "--headless", "--requests=1", "--mix=a 60%", "--mix=b 60%")
    assert done.returncode == 2
    assert "must add up to 100 %" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
