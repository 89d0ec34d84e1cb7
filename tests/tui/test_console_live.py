"""The console on the real engine: a child engine process, real workers, the real simulator."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.pilot import Pilot

from loadgen.run.config import RunConfig
from loadgen.run.run_process import RunProcess
from tui.app import TokentopApp


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


async def until(pilot: Pilot, cond: Callable[[], bool], seconds: float = 20.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError("condition not reached in time")


async def test_keys_drive_the_real_engine_and_metrics_reach_the_load_panel(sim):
    # long answers, so streams stay in flight while we look
    cfg = RunConfig(url=sim.url, concurrency=2, output_tokens="2000", workers=1, tick=0.25,
                    drain_grace=1.0)
    app = TokentopApp(RunProcess(cfg), refresh=0.1)
    engine = sim.model
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: engine.num_running == 2)
        await pilot.press("plus")
        await until(pilot, lambda: engine.num_running == 3)
        await pilot.press("right_square_bracket")
        # 13 streams against 8 slots: the server runs 8 and queues 5, and says so in /metrics
        await until(pilot, lambda: engine.num_running + engine.num_waiting == 13)
        last = lambda: app.windows.last  # noqa: E731
        await until(pilot, lambda: last() is not None and last().load.in_flight == 13)
        await until(pilot, lambda: last().server is not None and last().server.waiting == 5)
        await until(pilot, lambda: "waiting 5" in app.query_one("#load").plain)
        assert "running 8" in app.query_one("#load").plain
        await pilot.press("minus")
        await until(pilot, lambda: last().load.target_concurrency == 12)
        source = app.source
        await pilot.press("q")  # load is running: asks first
        await pilot.pause(0.2)
        assert source.proc.returncode is None
        await pilot.press("q")
        await until(pilot, lambda: source.proc is not None and source.proc.returncode is not None)
    # the load stopped with the console: nothing is left running on the server
    await until_plain(lambda: engine.num_running + engine.num_waiting == 0)


async def quit_and_wait(pilot: Pilot, source) -> None:
    """q twice (the load is running: it asks once), then the run process is gone."""
    await pilot.press("q", "q")
    await until(pilot, lambda: source.proc is not None and source.proc.returncode is not None)


async def until_plain(cond: Callable[[], bool], seconds: float = 10.0) -> None:
    import asyncio

    for _ in range(int(seconds / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")


async def test_unreachable_target_is_shown_in_the_console():
    # --wait 0: no waiting for it (the console waits by default: tests/run/test_wait_for_target)
    cfg = RunConfig(url="http://127.0.0.1:9/v1", workers=1, wait=0.0)
    app = TokentopApp(RunProcess(cfg), refresh=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.error is not None)
        assert "cannot reach http://127.0.0.1:9/v1" in app.error
        await until(pilot, lambda: "cannot reach" in str(app.query_one("#header").render()))
        await pilot.press("q")


async def test_brackets_raise_in_flight_to_20_and_p_pauses_and_resumes(sim):
    cfg = RunConfig(url=sim.url, concurrency=0, output_tokens="64", workers=1, tick=0.25,
                    drain_grace=1.0)
    app = TokentopApp(RunProcess(cfg), refresh=0.1)
    last = lambda: app.windows.last  # noqa: E731
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: last() is not None)
        await pilot.press("]", "]")
        await until(pilot, lambda: last().load.target_concurrency == 20)
        await until(pilot, lambda: last().load.in_flight == 20)
        await until(pilot, lambda: "in flight 20" in app.query_one("#load").plain)
        await pilot.press("p")
        await until(pilot, lambda: last().load.state == "paused")
        await until(pilot, lambda: last().load.in_flight == 0)
        await until(pilot, lambda: "paused" in str(app.query_one("#header").render()))
        await pilot.press("p")
        await until(pilot, lambda: last().load.state == "running")
        await until(pilot, lambda: last().load.in_flight == 20)
        source = app.source
        await quit_and_wait(pilot, source)


async def test_a_auto_ramps_to_the_slo_boundary_and_a_key_takes_over():
    """4 slots: past 4 streams a request waits a whole request for its first token, so
    ttft_p99<100ms holds at 4 (a few ms) and not at 8 (about a whole 32-token request, ~200
    ms); the wide margin keeps a busy 2-core machine's hiccups at 4 streams under the limit.
    `a` climbs and settles at 4 in bounded time."""
    from loadgen.sim import SimConfig, start_sim

    sim = await start_sim(SimConfig(slots=4), host="127.0.0.1", port=0)
    cfg = RunConfig(url=sim.url, concurrency=1, output_tokens="32", slo="ttft_p99<100ms",
                    workers=1, tick=0.25, drain_grace=1.0, auto_ramp_hold=1.5,
                    auto_ramp_warmup=1.0)
    app = TokentopApp(RunProcess(cfg), refresh=0.1, slo=cfg.slo)
    last = lambda: app.windows.last  # noqa: E731
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: last() is not None)
            await pilot.press("a")
            await until(pilot, lambda: (last().load.note or "").startswith(
                "auto-ramp trying") and "(the SLOs)" in last().load.note)
            await until(pilot, lambda: (last().load.note or "").startswith(
                "auto-ramp settled at 4 streams"), seconds=45)
            await until(pilot, lambda: "auto-ramp settled at 4" in app.query_one("#load").plain)
            assert last().load.target_concurrency == 4
            await pilot.press("plus")  # a manual key takes control back
            await until(pilot, lambda: last().load.target_concurrency == 5)
            await until(pilot, lambda: last().load.note is None)
            source = app.source
            await quit_and_wait(pilot, source)
    finally:
        await sim.close()


async def test_a_without_slo_climbs_while_throughput_rises_and_says_why_it_settled():
    """No --slo: the knee of the throughput curve decides, and the note says so. 16 slots:
    throughput still rises from 8 to 16 streams (fewer tokens per stream, more in all), so
    the ramp must pass 8 (the old rule, "half the first stream's tokens per stream",
    settled there) and stop short of 32, where more streams only queue."""
    from loadgen.sim import SimConfig, start_sim

    sim = await start_sim(SimConfig(slots=16), host="127.0.0.1", port=0)
    cfg = RunConfig(url=sim.url, concurrency=1, output_tokens="32", workers=1, tick=0.25,
                    drain_grace=1.0, auto_ramp_hold=1.5, auto_ramp_warmup=1.0)
    app = TokentopApp(RunProcess(cfg), refresh=0.1)
    last = lambda: app.windows.last  # noqa: E731
    note = lambda: last().load.note or ""  # noqa: E731
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: last() is not None)
            await pilot.press("a")
            await until(pilot, lambda: note().startswith("auto-ramp trying")
                        and "(throughput knee, no --slo)" in note())
            await until(pilot, lambda: note().startswith("auto-ramp settled at"), seconds=60)
            settled = last().load.target_concurrency
            # past 8 (the old rule's stop); at most a step past twice the slots (only queueing
            # there, though a 1.5 s hold on a shared machine can show a few % more)
            assert 12 <= settled <= 40, note()
            assert "before throughput stopped rising" in note()
            assert "failed:" in note() and "tok/s" in note(), "the failed step gives no reason"
            source = app.source
            await quit_and_wait(pilot, source)
    finally:
        await sim.close()


async def test_conversations_show_the_prefix_cache_and_ttft_by_turn():
    """--turns against the simulator's prefix cache: the load panel says how much of the
    prompts the cache served (the server's own counter is the truth for the run's total)
    and the mean TTFT of each turn (read where the panel has room for its whole words)."""
    from loadgen.sim import SimConfig, start_sim

    sim = await start_sim(SimConfig(step_overhead_ms=1.0), host="127.0.0.1", port=0)
    cfg = RunConfig(url=sim.url, concurrency=2, turns=3, input_tokens="40",
                    output_tokens="8", workers=1, tick=0.25, drain_grace=1.0,
                    tokenizer="none")
    app = TokentopApp(RunProcess(cfg), refresh=0.1)
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            plain = lambda: app.query_one("#load").plain  # noqa: E731
            await until(pilot, lambda: "prefix cache" in plain() and " 3:" in plain())
            last = app.windows.last
            assert 0 < last.counters.cached_tokens <= sim.server.prefix_cache.hits
            assert "TTFT ms by turn 1:" in plain()
            source = app.source
            await quit_and_wait(pilot, source)
    finally:
        await sim.close()
