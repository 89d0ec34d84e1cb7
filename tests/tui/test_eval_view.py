"""The console over a running eval (`tokentop eval` in a terminal): a real tiny eval against
the embedded simulator in its child process (loadgen.eval.eval_process), the real console
through Pilot. The truths: the plan's own seconds (written below), eval.json as the battery
wrote it, the run directories each phase left; the phase strip's wordings against widths;
`--headless` and a stdout that is not a terminal keep the lines (subprocesses)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from rich.cells import cell_len
from support import ROOT, only_phases

from loadgen.eval.eval_process import EvalProcess, EvalProgress, progress_now
from loadgen.eval.phases import ABOUT, PHASES
from tui.app import TokentopApp
from tui.commands.eval import after_console, built_eval, eval_parser, eval_start
from tui.widgets.phase_strip import PhaseStrip, strip_text, wordings

pytestmark = pytest.mark.timeout(300)

# the load seconds each phase plans (the truth the strip's times are held to)
BASELINE_S = 2.0 + 0.5  # duration + warm-up
RAMP_S = 2 * (1.5 + 0.25)  # two steps, each its duration and warm-up
PLAN = """
version = 1
slo = "ttft<2s,error_rate<50%"
[phases.conformance]
[phases.baseline]
concurrency = 2
duration = "2s"
warmup = "0.5s"
input_tokens = 16
output_tokens = 8
[phases.ramp]
steps = [1, 2]
step_duration = "1.5s"
step_warmup = "0.25s"
[phases.long_tail]
fraction = 0.5
duration = "{tail}s"
bucket = "1s"
[phases.leaks]
[phases.efficiency]
"""
DEADLINE_S = 120.0
# the phases that put load on the server in this plan (seconds each), by their number
LOADING = tuple(PHASES.index(p) + 1 for p in ("baseline", "ramp", "long_tail"))


def _plan(tmp: Path, tail: float = 3.0) -> Path:
    path = tmp / "plan.toml"
    path.write_text(only_phases(PLAN.format(tail=tail)))
    return path


def _source(tmp: Path, plan: Path, **kw) -> EvalProcess:
    args = eval_parser().parse_args([f"--plan={plan}", f"--out={tmp / 'out'}", "--workers=1"])
    ev, resume = built_eval(args)
    return EvalProcess(eval_start(ev, resume=resume), **kw)


def _phases(out: Path) -> dict:
    try:
        return json.loads((out / "eval.json").read_text())["phases"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return {}


async def _until(pilot, what: str, cond, deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await pilot.pause(0.05)


# ---- the strip's words ------------------------------------------------------------------


def _progress(**changes) -> EvalProgress:
    fields = {"index": 7, "count": 7, "name": "efficiency", "about": ABOUT["efficiency"].what,
              "phase_left_s": 359_999.0, "eval_left_s": 359_999.0, "rows_filled": 999,
              "rows_total": 999, "at": 0.0}
    return EvalProgress(**{**fields, **changes})


@pytest.mark.parametrize("state", ["running", "finished", "stopped", "failed"])
@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_the_strip_fits_its_width_and_cuts_no_word(state: str, width: int) -> None:
    """The widest figures a strip may hold (99:59:59 left, 999 rows) still fit 80 columns;
    every word shown is a whole word of its wording or of what the phase measures."""
    p = _progress(state=state)
    text = strip_text(p, width)
    assert cell_len(text) <= width, text
    words = {w for parts in wordings(p) for part in parts for w in part.split()}
    words |= set(p.about.split())
    shown = text.removesuffix("…").split()
    assert all(w in words or w == "·" for w in shown), text
    assert "phase" in text or state == "finished"


def test_time_left_counts_down_and_the_phases_after_wait() -> None:
    p = _progress(state="running", phase_left_s=10.0, eval_left_s=30.0, at=100.0)
    later = progress_now(p, 104.0)
    assert (later.phase_left_s, later.eval_left_s) == (6.0, 26.0)
    # past the plan (start-up, the drain): the phase shows 0, the eval the phases after it
    late = progress_now(p, 200.0)
    assert (late.phase_left_s, late.eval_left_s) == (0.0, 20.0)
    assert progress_now(msgspec.structs.replace(p, state="stopped"), 200.0).eval_left_s == 30.0


# ---- a real eval through the console ---------------------------------------------------


async def test_the_strip_follows_a_real_eval_phase_by_phase(tmp_path: Path, capsys) -> None:
    """Each phase that loads begins on the strip, in order, with the plan's seconds (the
    clock is held at 0, so the times are as planned) while eval.json holds the phases before
    it; at the end the matrix and the files, as a headless eval prints them."""
    source = _source(tmp_path, _plan(tmp_path), clock=lambda: 0.0)
    out = tmp_path / "out"
    app = TokentopApp(source, refresh=0.05)
    seen: dict[int, EvalProgress] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        strip = app.query_one(PhaseStrip)

        def note() -> bool:
            p = strip.progress
            if p is not None and p.state == "running" and p.index not in seen:
                assert p.index > max(seen, default=0), "the strip went back a phase"
                seen[p.index] = p
                # eval.json as this phase runs: the phases before it done, not this one (one
                # that loads nothing here may be over before the strip is next drawn)
                kept = set(_phases(out))
                assert set(PHASES[:p.index - 1]) <= kept
                assert p.name not in kept or p.index not in LOADING
                said = f"phase {p.index}/{len(PHASES)} {p.name.replace('_', ' ')}"
                assert said in strip_text(p, 120)
            return p is not None and p.state == "finished"

        await _until(pilot, "the eval finished on the strip", note)
        assert "finished" in str(strip.render())
        await pilot.press("q")  # the eval is over: q quits at once
        await _until(pilot, "the console exited", lambda: not app.is_running, 60)
    assert set(LOADING) <= set(seen)  # the others last milliseconds: the strip may skip them
    assert strip.progress is not None and strip.progress.index == len(PHASES)
    baseline, ramp, tail = (seen[i] for i in LOADING)
    assert baseline.phase_left_s == pytest.approx(BASELINE_S)
    assert ramp.phase_left_s == pytest.approx(RAMP_S)
    assert tail.phase_left_s == pytest.approx(3.0)
    assert baseline.eval_left_s == pytest.approx(BASELINE_S + RAMP_S + 3.0)
    assert ramp.eval_left_s == pytest.approx(RAMP_S + 3.0)
    assert ramp.rows_filled > baseline.rows_filled  # the baseline's rows came in between
    assert (out / "runs" / "baseline").is_dir() and (out / "runs" / "long_tail").is_dir()
    assert after_console(source, app.error) == 0
    printed = capsys.readouterr()
    assert "wrote " + str(out / "eval.md") in printed.out
    state = json.loads((out / "eval.json").read_text())
    assert state["finished"] and set(state["phases"]) == set(PHASES)
    assert source.proc is not None and source.proc.returncode == 0


async def test_quitting_mid_eval_leaves_it_resumable(tmp_path: Path, capsys) -> None:
    """q twice during the long tail: the eval stops as SIGINT stops it, eval.json keeps the
    phases done (the one under way is not kept), the resume line is printed, the child is
    gone."""
    source = _source(tmp_path, _plan(tmp_path, tail=60.0))
    out = tmp_path / "out"
    app = TokentopApp(source, refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        strip = app.query_one(PhaseStrip)

        def in_the_tail() -> bool:
            p = strip.progress
            return p is not None and p.name == "long_tail" and app.drawn_seq is not None \
                and app.drawn_seq >= 2
        await _until(pilot, "the long tail ran", in_the_tail)
        await pilot.press("q")  # asks first: the eval is running
        await pilot.pause(0.1)
        assert app.is_running
        await pilot.press("q")
        await _until(pilot, "the console exited", lambda: not app.is_running, 90)
    kept = _phases(out)
    assert set(kept) == set(PHASES[:PHASES.index("long_tail")])  # those before it
    assert after_console(source, app.error) == 130
    err = capsys.readouterr().err
    assert f"resume with: tokentop eval --out {out}" in err
    assert source.proc is not None and source.proc.returncode is not None
    assert source.eval_outcome().state == "stopped"


async def test_the_eval_stops_when_the_console_goes_away(tmp_path: Path) -> None:
    """The child's stdin closes (the SSH link dropped): it stops the eval resumably on its
    own and exits."""
    source = _source(tmp_path, _plan(tmp_path, tail=60.0))
    await source.start()
    deadline = time.monotonic() + DEADLINE_S
    async for _snap in source.snapshots():
        p = source.eval_progress()
        if p is not None and p.name == "long_tail":
            break
        assert time.monotonic() < deadline, "the long tail never began"
    assert source.proc is not None and source.proc.stdin is not None
    source.proc.stdin.close()
    async with asyncio.timeout(60):
        code = await source.proc.wait()
    assert code == 130
    assert set(_phases(tmp_path / "out")) == set(PHASES[:PHASES.index("long_tail")])
    await source.reap()


# ---- the lines --------------------------------------------------------------------------


def _only_baseline(tmp: Path) -> Path:
    text = only_phases(PLAN.format(tail=3.0))
    for phase in ("ramp", "long_tail"):
        text = text.replace(f"[phases.{phase}]\n", f"[phases.{phase}]\nenabled = false\n")
    path = tmp / "plan.toml"
    path.write_text(text)
    return path


def _in_a_pty(argv: list[str], *, stdout_too: bool) -> tuple[int, str, str]:
    """Run `argv` with stdin a terminal (and stdout, with `stdout_too`); its exit status,
    stdout, stderr. The terminal is read by a thread, so a full buffer never blocks it."""
    import os
    import pty
    import threading

    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the slave side closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave if stdout_too else subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT, text=True)
    os.close(slave)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    reader.join(10)
    os.close(master)
    shown = b"".join(chunks).decode(errors="replace") if stdout_too else out
    return proc.returncode, shown, err


@pytest.mark.parametrize("headless", [True, False], ids=["headless", "stdout-not-a-tty"])
def test_without_a_terminal_the_eval_prints_lines(tmp_path: Path, headless: bool) -> None:
    """stdin a terminal: with --headless (stdout a terminal too), or with stdout a pipe, the
    eval prints today's lines and its matrix; the console's alternate screen never opens."""
    argv = [sys.executable, "-m", "tui.cli", "eval", f"--plan={_only_baseline(tmp_path)}",
            f"--out={tmp_path / 'out'}", "--workers=1", *(["--headless"] if headless else [])]
    code, out, err = _in_a_pty(argv, stdout_too=headless)
    assert code == 0, err[-3000:]
    assert f"eval: phase 2/{len(PHASES)} baseline" in err
    assert "\x1b[?1049h" not in out  # no console: the alternate screen never opened
    assert f"wrote {tmp_path / 'out' / 'eval.md'}" in out
