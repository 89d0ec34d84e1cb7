"""Whether a row means what it says (loadgen.eval.validity): lock-step told from a real
recording against the simulator's own arrival stamps, a percentile from too few samples
against numpy over the samples, and the client-lag rule on the cases it was written for and
the ones it must not fire on (an idle busy host, a slow server)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support import running_sim, server_arrivals, tokentop

from loadgen.eval.validity import BEYOND_MIN, span_of, too_few
from loadgen.model import client_lag
from loadgen.model.client_lag import Lag


def rounds(arrivals: np.ndarray, within_s: float = 0.1) -> list[int]:
    """The arrivals grouped into bursts (each within `within_s` of the one before): their
    sizes. Streams in lock-step arrive in bursts of every stream."""
    sizes, size = [], 1
    for gap in np.diff(arrivals):
        if gap <= within_s:
            size += 1
        else:
            sizes.append(size)
            size = 1
    return [*sizes, size]


@pytest.mark.parametrize("stagger", ["0", "auto"])
async def test_lock_step_is_told_by_the_recording_as_the_server_saw_it(tmp_path, stagger):
    """8 streams of 150 tokens (about 0.7 s a request, some ticks of 0.25 s): started
    together they arrive at the server in bursts of most of the 8, round after round, and
    the span is flagged; staggered they arrive one by one and it is not."""
    out = tmp_path / "run"
    async with running_sim(decode_ms_per_seq=0.5, step_overhead_ms=4.0) as sim:
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", "--workers=1", "-c", "8",
            "--output-tokens=150", "--input-tokens=8", "--tokenizer=none", "--duration=8",
            "--tick=0.25", f"--stagger={stagger}", "--drain-grace=5", f"--out={out}")
        assert done.returncode == 0, done.stderr
        arrivals = await server_arrivals(sim)
    bursts = rounds(arrivals)
    in_step = sum(n for n in bursts if n >= 6) / len(arrivals)  # the server's truth
    span = span_of(out, None, None)
    if stagger == "0":
        assert in_step > 0.8, bursts
        assert span.lockstep_flag() is not None, span
    else:
        assert in_step < 0.2, bursts
        assert span.lockstep_flag() is None, span


@pytest.mark.parametrize("n", [208, 5_000, 20_000])
def test_a_percentile_from_too_few_samples_is_flagged_when_numpy_says_it_is_the_top(n):
    """The flag's rule: fewer than BEYOND_MIN samples beyond the percentile. numpy over the
    samples themselves: how many lie beyond their own P99.9."""
    rng = np.random.default_rng(n)
    samples = rng.lognormal(3.0, 0.6, n)
    # nearest rank, as HdrHistogram reads a percentile (loadgen.model.hdr)
    beyond = int((samples > np.percentile(samples, 99.9, method="inverted_cdf")).sum())
    flag = too_few(n, "p99.9")
    assert (flag is not None) == (beyond < BEYOND_MIN), (n, beyond, flag)
    if n == 208:  # the case: that "P99.9" is the maximum
        assert beyond == 0 and "the maximum" in flag
    assert too_few(n, "p50") is None  # a median from 208 is a median


@pytest.mark.parametrize(("lag", "in_flight", "itl", "want"), [
    (6.0, 0, None, Lag.FINE),  # an idle, busy host: nothing in flight to distort
    (6.0, 16, 40.0, Lag.FINE),  # 6 ms beside a 40 ms gap: under its quarter
    (6.0, 16, 8.0, Lag.MATTERS),  # … and most of an 8 ms one's quarter past
    (4.0, 16, 8.0, Lag.FINE),  # under the floor whatever the gaps
    (470.0, 16, 40.0, Lag.DOMINATES),  # the faults phase's saturated client
    (30.0, 4, None, Lag.MATTERS),  # no inter-token gap yet: the fallback limit
    (None, 4, 10.0, Lag.FINE),  # no worker reported this tick
])
def test_client_lag_matters_against_what_is_measured(lag, in_flight, itl, want):
    assert client_lag.judge(lag, in_flight, itl) is want


async def test_the_spans_prompt_tokens_are_the_servers(tmp_path):
    """The input tokens/s row's tokens: what the simulator's own counter says it was sent
    to prefill (the recording's input counter, over the span)."""
    out = tmp_path / "run"
    async with running_sim() as sim:
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", "--workers=1", "-c", "2",
            "--output-tokens=20", "--input-tokens=64", "--tokenizer=none", "--duration=4",
            "--drain-grace=5", f"--out={out}")
        assert done.returncode == 0, done.stderr
        from support import scrape

        prompt = (await scrape(sim.url.removesuffix("/v1") + "/metrics"))[
            "vllm:prompt_tokens_total"]
    span = span_of(out, None, None)
    assert span.input_tokens == pytest.approx(prompt, rel=0.02)


def test_the_live_warning_is_said_once_when_it_holds_and_once_more_when_it_dominates():
    watch = client_lag.ClientWatch()
    said = []
    # a spike, then 6 ms of lag on an idle busy host, then a lag that matters, held
    ticks = ([(Lag.MATTERS, 12.0)] * 2 + [(Lag.FINE, 6.0)] * 30 + [(Lag.MATTERS, 12.0)] * 10
             + [(Lag.DOMINATES, 470.0)] * 10 + [(Lag.MATTERS, 12.0)] * 10)
    for verdict, lag in ticks:
        got = watch.see(verdict, lag, busy=0, workers=1)
        if got:
            said.append(got)
    assert [level for level, _ in said] == ["warn", "error"]
    assert "12.0 ms" in said[0][1] and "470.0 ms" in said[1][1]
    # a pegged worker is a warning by itself, after as many ticks
    watch = client_lag.ClientWatch()
    assert [watch.see(Lag.FINE, 1.0, busy=1, workers=2) for _ in range(3)][-1][0] == "warn"


def test_the_faults_rows_carry_the_clients_flag_not_lock_step():
    """A blackhole holds every stream and lets them go together: completions bunch by the
    fault's design, so the faults rows do not call it lock-step; a saturated client they
    do flag. The baseline's rows carry both."""
    from pathlib import Path

    import msgspec

    from loadgen.eval import matrix
    from loadgen.eval.results import read_state
    from loadgen.eval.validity import Span

    state = read_state((Path(__file__).parent / "fixtures" / "eval.json").read_bytes())
    span = Span(ticks=100, client_ticks=20, client_worst_ms=40.0, client_dominated=0,
                client_at=[], input_tokens=0, seconds=50.0, dispersion=7.0, streams=16)
    assert span.client_flag() and span.lockstep_flag()
    faults, base = state.phases.faults, state.phases.baseline
    faults.figures = msgspec.structs.replace(faults.figures, span=span)
    base.figures = msgspec.structs.replace(base.figures, span=span)
    rows = matrix.state_rows(state)
    fault_rows = [r for r in rows if r.id.startswith("faults.") and "#" in r.id]
    assert fault_rows and all(r.flags == (span.client_flag(),) for r in fault_rows)
    ttft = next(r for r in rows if r.id == "baseline.ttft.p50")
    assert span.lockstep_flag() in ttft.flags and span.client_flag() in ttft.flags
