"""Every front end goes through one Session: what one does, all do.

Through the real command line (`tokentop agent`, `tokentop run --headless`,
`tokentop report`, `tokentop replay --slo`) against the real simulator. The agent
is given a broker where nothing listens: it must run and record all the same.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import fsize_limit
from textual.pilot import Pilot

from loadgen.model.snapshot import Snapshot
from loadgen.record.rundir import iter_snapshots, read_manifest
from loadgen.run.config import RunConfig
from loadgen.run.run_process import RunProcess
from tui.app import TokentopApp
from tui.commands.replay import replay_source

SMALL = ["--workers", "1", "-c", "3", "--input-tokens", "16", "--output-tokens", "12",
         "--tick", "0.25", "--drain-grace", "1"]


def dead_broker() -> str:
    """A loopback port with no broker behind it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"mqtt://127.0.0.1:{s.getsockname()[1]}"


def agent_args(sim_url: str, *more: str) -> list[str]:
    return ["agent", "--broker", dead_broker(), "--fleet", "t", "--name", "a", "--url", sim_url,
            *SMALL, *more]


async def cli(*args: str, preexec=None) -> tuple[int, str]:
    """`tokentop ARGS` as a real process, off the event loop (the simulator runs on it)."""
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "tui.cli", *args],
                                   capture_output=True, text=True, timeout=90,
                                   stdin=subprocess.DEVNULL, preexec_fn=preexec)
    return done.returncode, done.stderr


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


async def test_agent_resume_continues_the_same_run(sim, tmp_path):
    out = tmp_path / "run"
    code, err = await cli(*agent_args(sim.url, "--duration", "1.5", "--out", str(out)))
    assert code == 0, err
    first = list(iter_snapshots(out))
    summary = tmp_path / "summary.json"
    code, err = await cli(*agent_args(sim.url, "--resume", str(out), "--duration", "1.5",
                                      "--json", str(summary)))
    assert code == 0, err
    assert f"resuming {out}" in err
    every = list(iter_snapshots(out))
    assert len(every) > len(first) + 3
    assert {s.run_id for s in every} == {first[0].run_id}  # one run, not two
    assert [s.seq for s in every] == list(range(len(every)))  # numbering goes on
    resumed_at = every[len(first)]
    assert any(e.kind == "resume" for e in resumed_at.events)  # the gap is marked
    assert resumed_at.counters.requests_ok >= first[-1].counters.requests_ok
    assert len(read_manifest(out)["resumes"]) == 1
    # the summary covers the whole run's load, not the time tokentop was not running
    dead = resumed_at.t - resumed_at.interval - first[-1].t
    assert dead > 0.3  # a new process started in between
    s = json.loads(summary.read_text())
    # … up to where the resumed run's drain began (the drain is reported apart): the tick in
    # which the stop came, the first draining one, still measured load
    last = max(i for i, x in enumerate(every) if x.load.state not in ("draining", "stopped"))
    load_end = every[min(last + 1, len(every) - 1)]
    assert s["duration_s"] == pytest.approx(load_end.elapsed, abs=0.05)
    assert s["throughput"]["output_tok_s"] == pytest.approx(
        load_end.counters.output_tokens / s["duration_s"], rel=0.01)


async def test_agent_exit_codes_are_headless_ones(sim, tmp_path):
    failing = ["--duration", "1.5", "--slo", "ttft_p99<1us", "--no-record"]
    agent_code, agent_err = await cli(*agent_args(sim.url, *failing))
    run_code, run_err = await cli("run", "--headless", "--url", sim.url, *SMALL, *failing)
    assert (agent_code, run_code) == (3, 3), (agent_err, run_err)
    assert "threshold failed: ttft_p99<1us" in agent_err


async def test_agent_stops_and_exits_4_when_recording_fails(sim, tmp_path):
    code, err = await cli(*agent_args(sim.url, "--duration", "20", "--tick", "0.1",
                                      "--out", str(tmp_path / "run")),
                          preexec=fsize_limit(40_000))
    assert code == 4, err
    assert "file size limit reached while writing" in err
    assert "Traceback" not in err


async def test_an_slo_breach_is_in_the_recording_the_report_and_a_replay(sim, tmp_path):
    out = tmp_path / "run"
    code, err = await cli("run", "--headless", "--url", sim.url, *SMALL, "--duration", "2.5",
                          "--slo", "ttft_p99<1us", "--out", str(out))
    assert code == 3, err
    breach = [e for e in events(out) if e["kind"] == "slo"]
    assert breach and breach[0]["message"].startswith("SLO breach: ttft_p99<1us")
    assert "SLO breach: ttft_p99<1us" in err  # a warning line as it happened

    code, err = await cli("report", str(out))
    assert code in (0, 3), err
    assert "SLO breach: ttft_p99<1us" in (out / "report.md").read_text()

    # replay judges the recording by the SLOs given now: none for 5 s, a breach for ITL
    seen = await replayed(out, "ttft_p99<5s")
    assert not [e for s in seen for e in s.events if e.kind == "slo"]
    seen = await replayed(out, "itl_p99<1us")
    assert any(e.message.startswith("SLO breach: itl_p99<1us")
               for s in seen for e in s.events if e.kind == "slo")
    seen = await replayed(out, None)  # without --slo: as recorded
    assert any(e.message.startswith("SLO breach: ttft_p99<1us")
               for s in seen for e in s.events if e.kind == "slo")


async def replayed(run_dir: Path, slo: str | None) -> list[Snapshot]:
    """What `tokentop replay DIR [--slo S]` would show (the same source the command builds)."""
    # not held at the end (the console's is): the recording read through to its end
    source, _ = replay_source(run_dir, speed=100.0, follow=False, slo=slo, hold=False)
    await source.start()
    try:
        return [s async for s in source.snapshots()]
    finally:
        await source.close()


@pytest.fixture
def _no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


async def until(pilot: Pilot, cond, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError("condition not reached in time")


@pytest.mark.usefixtures("_no_user_config")
async def test_the_console_excludes_warm_up_from_every_window(fast_sim):
    cfg = RunConfig(url=fast_sim.url, concurrency=2, output_tokens="8", input_tokens="8",
                    workers=1, tick=0.25, warmup=1.5, drain_grace=1.0)
    seen: list[Snapshot] = []
    source = RunProcess(cfg, record=False)
    app = TokentopApp(source, refresh=0.1)
    app_take = app._take

    def take(snap: Snapshot) -> None:  # keep what arrives, for the truth below
        seen.append(snap)
        app_take(snap)

    app._take = take  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: sum(not s.load.warmup for s in seen) >= 6)
        boundary = next(s for s in seen if not s.load.warmup)  # warm-up ended in this tick
        last = app.windows.last
        assert last is not None
        measured = [s for s in seen if s.seq > boundary.seq and s.seq <= last.seq]
        want_ok = last.counters.requests_ok - boundary.counters.requests_ok
        want_ttft = sum(_count(s, "ttft") for s in measured)
        warm_ttft = sum(_count(s, "ttft") for s in seen if s.load.warmup)
        assert want_ok > 0 and want_ttft > 0 and warm_ttft > 0  # both parts had requests
        for name in ("10s", "1m", "10m", "run"):
            stats = app.windows.stats(name)
            assert stats.requests_ok == want_ok, name
            assert stats.latency["ttft"]["count"] == want_ttft, name
        await pilot.press("q")
        await pilot.press("q")


def _count(snap: Snapshot, metric: str) -> int:
    from loadgen.model import hdr

    blob = snap.hist.get(metric)
    return 0 if blob is None else int(hdr.decode(blob).sum())
