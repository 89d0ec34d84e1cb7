"""`tokentop sweep` as a user sees it: progress within a step, plain redirected output, a
--help that shows defaults and only the options a sweep uses."""

from __future__ import annotations

import re

import pytest
from support import tokentop

from loadgen.analysis.sweep import PROGRESS_EVERY_S, SweepPlan, run_sweep
from loadgen.run.config import RunConfig
from loadgen.sim import SimConfig, start_sim

# the figures as tokentop prints them (loadgen.model.units): 1,234 tok/s, 12.3 ms or 1.52 s
PROGRESS = re.compile(r"^  step (\d+) streams: (\d+)/(\d+) s, ([\d.]+) req/s, ([\d,.]+) tok/s, "
                      r"TTFT p99 [\d.]+ m?s so far$")


async def test_progress_within_a_step_reads_what_the_server_model_gives():
    """A step longer than PROGRESS_EVERY_S says how far it is and its tok/s so far; with
    fewer streams than slots that is one token per stream per engine step."""
    sim = await start_sim(SimConfig(slots=8), host="127.0.0.1", port=0)
    try:
        streams = 4
        cfg = RunConfig(url=sim.url, output_tokens="64", input_tokens="8", workers=1,
                        tick=0.25, drain_grace=2.0)
        plan = SweepPlan(steps=[streams], step_seconds=PROGRESS_EVERY_S + 1.0, step_warmup=1.0)
        lines: list[str] = []
        await run_sweep(cfg, plan, echo=lambda _: None, record=False, progress=lines.append)
        m = sim.model.cfg
        model_tok_s = streams / ((m.step_overhead_ms + m.decode_ms_per_seq * streams) / 1000)
    finally:
        await sim.close()
    assert len(lines) == 1, lines
    got = PROGRESS.match(lines[0])
    assert got, lines[0]
    assert int(got.group(2)) == PROGRESS_EVERY_S and int(got.group(3)) == PROGRESS_EVERY_S + 2
    assert float(got.group(5).replace(",", "")) == pytest.approx(model_tok_s, rel=0.15)


def test_redirected_output_is_plain_text_with_progress_on_stderr():
    proc = tokentop("sweep", "--steps", "1,2", "--step-seconds", str(PROGRESS_EVERY_S),
                    "--step-warmup", "1", "--no-record", "--tick", "0.25",
                    "--output-tokens", "16", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x1b" not in proc.stderr
    assert "knee rule: " in proc.stdout
    progress = [line for line in proc.stderr.splitlines() if PROGRESS.match(line)]
    assert [PROGRESS.match(line).group(1) for line in progress] == ["1", "2"]


def test_help_shows_defaults_and_hides_what_a_sweep_does_not_use():
    proc = tokentop("sweep", "--help", timeout=30)
    assert proc.returncode == 0
    text = proc.stdout
    assert "--step-seconds STEP_SECONDS" in text and "(default: 20.0)" in text
    assert "(default: 1,2,4,8,16,32,64)" in text
    for hidden in ("--theme", "--refresh", "--publish", "--concurrency",
                   "--auto-ramp", "--rate RATE", "--duration"):
        assert hidden not in text, hidden
    assert "--broker URL" in text and "--fleet-agents" in text  # the load from a fleet


@pytest.mark.parametrize("flag", [["--theme", "x"], ["--publish", "mqtt://h"], ["-c", "4"],
                                  ["--duration", "10"]])
def test_an_option_a_sweep_does_not_use_is_refused_in_one_line(flag):
    proc = tokentop("sweep", *flag, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "is not for a sweep" in proc.stderr
