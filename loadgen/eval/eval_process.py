"""The eval in its own process, for the console: each phase run's Snapshots and the eval's
progress out, a stop in.

Like the console's run (loadgen.run.run_process), and for the same reasons: a slow frame
must not delay a tick of a phase's run, and when the terminal goes away (SSH drops) the
eval sees its stdin close and stops by itself, resumably, as SIGINT stops a headless one.

Protocol, one JSON object per line:
  console → eval: EvalStart (the run settings, the Secrets, the plan, where it is written,
                  whether it resumes), then Control messages: a stop stops the eval (the
                  phase under way is not kept, the same --out resumes it); the load's keys
                  are refused, the plan sets the load.
  eval → console: Ready (the eval is built) or Fatal (why not); then, in any order, Said
                  (the eval's own lines), Progress (as each phase begins: phase i of N,
                  what it measures, its planned seconds, the eval's seconds left, the
                  matrix's rows filled so far) and one Snapshot message per tick of each
                  phase's runs; and Finished (the eval's outcome: the matrix and the files
                  written, or the command that resumes it) once it has ended.
Secrets travel on this pipe only, never in the argv or the environment.

Every line the eval says (the phases' own, indented, too) goes to OUT/eval-lines.log: what
a headless eval would have printed. The console gets the eval's own lines only; a phase
run's events reach it in its Snapshots already.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from loadgen.eval.phases import ABOUT, PHASES, Phase
from loadgen.model.notice import Notice
from loadgen.model.snapshot import Control
from loadgen.model.source import RunOutcome, SourceError, SourceStatus
from loadgen.run.child import (
    Fatal,
    PipedChild,
    Said,
    SnapshotMsg,
    ToConsole,
    encode,
    run_child,
)
from loadgen.run.config import FleetFrom, RunConfig
from loadgen.run.secrets import Secrets
from loadgen.run.session import asked_stop

log = logging.getLogger("tokentop.eval_process")

START_SILENCE_S = 60.0  # the child builds the Eval (reads the plan, eval.json) well within this
# a stop cancels the phase under way (its requests are cut, not drained): seconds; within
# the console's own wait for a close (tui.app CLOSE_TIMEOUT_S, 30 s), then the child is killed
STOP_WAIT_S = 20.0
MAX_SAID = 1000  # the eval's own lines kept for status(): a handful a phase
LINES_LOG = "eval-lines.log"  # in OUT: every line the eval said, as a headless eval prints


class EvalStart(msgspec.Struct, tag="start"):
    config: RunConfig
    secrets: Secrets
    out: str
    plan: dict[str, Any]  # plan_to_builtins (a resumed eval: the plan eval.json holds)
    quick: bool = False
    resume: bool = False  # OUT holds an eval: resume it (the parent checked it reads)
    label: str | None = None
    meta: dict[str, str] = {}
    dcgm_url: str | None = None
    chaos_restart_cmd: str | None = None
    model_params: float | None = None  # --model-params, in billions
    neighbor_cmd: str | None = None  # --neighbor-cmd: the interference phase's neighbour
    fleet: FleetFrom | None = None  # --broker: the phases' load from a fleet's agents


class Ready(msgspec.Struct, tag="ready"):
    target: str  # the --url, or "the embedded simulator"
    done_before: int = 0  # phases a resumed eval keeps


EvalStanding = Literal["running", "finished", "stopped", "failed"]


class EvalProgress(msgspec.Struct, frozen=True, kw_only=True, tag="progress"):
    """Where the eval stands, for the phase strip: phase `index` of `count` (from 1), what
    it measures, the load seconds left in it and in the whole eval as of `at` (unix
    seconds: the plan's, so a phase's start-up and drain are not counted), the rows of the
    matrix filled so far of those it has."""

    index: int
    count: int
    name: Phase
    about: str
    phase_left_s: float
    eval_left_s: float
    rows_filled: int
    rows_total: int
    at: float
    state: EvalStanding = "running"


class EvalOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How the eval ended, with what a terminal keeps of it after the console."""

    state: EvalStanding | Literal["died"]
    code: int  # the command's exit status: 0 finished, 130 stopped, 2 failed, 1 died
    message: str  # one line: "eval: finished: 52 rows", the resume line, why it failed
    table: str = ""  # the matrix as text (finished)
    written: list[str] = []  # the files written (finished)
    rows_filled: int = 0
    rows_total: int = 0


class Finished(msgspec.Struct, tag="finished"):
    outcome: EvalOutcome


EvalMsg = Ready | Fatal | Said | EvalProgress | SnapshotMsg | Finished
_decode_msg = msgspec.json.Decoder(EvalMsg).decode


@runtime_checkable
class WatchesEval(Protocol):
    """A source whose Snapshots are an eval's phase runs: the console adds the phase strip."""

    def eval_progress(self) -> EvalProgress | None:
        """Where the eval stands now (None before its first phase begins)."""


def resume_command(out: str | Path, url: str | None) -> str:
    """The command that resumes a stopped eval: its --out, and its --url (without it the
    resumed eval would load the embedded simulator)."""
    return "tokentop eval" + (f" --url {url}" if url else "") + f" --out {out}"


def stopped_line(out: str | Path, url: str | None) -> str:
    return f"eval: stopped; resume with: {resume_command(out, url)}"


def progress_now(p: EvalProgress, now: float) -> EvalProgress:
    """`p` as of `now`: the time gone since `p.at` off the phase's time left, and off the
    eval's only as far as this phase's (the phases after it have not begun)."""
    if p.state != "running":
        return p
    gone = max(0.0, now - p.at)
    phase_left = max(0.0, p.phase_left_s - gone)
    after = max(0.0, p.eval_left_s - p.phase_left_s)
    return msgspec.structs.replace(p, phase_left_s=phase_left, eval_left_s=after + phase_left,
                                   at=now)


class EvalProcess(PipedChild):
    """A SnapshotSource backed by an eval in a child process (`tokentop eval` in a
    terminal): the phase runs' Snapshots, and eval_progress() for the phase strip."""

    program = "loadgen.eval.eval_process"
    decode = staticmethod(_decode_msg)

    def __init__(self, start: EvalStart, *, clock: Callable[[], float] = time.time):
        super().__init__(Path(start.out) / LINES_LOG)
        self.start_msg = start
        self.out = Path(start.out)
        self.clock = clock
        self._description = f"eval: {start.config.url or 'the embedded simulator'} → {start.out}"
        self._said: list[Notice] = []
        self._progress: EvalProgress | None = None
        self._outcome: EvalOutcome | None = None

    # ---- what the console asks

    def status(self) -> SourceStatus:
        return SourceStatus(kind="eval", description=self._description, run_dir=str(self.out),
                            outcome=self._run_outcome(), said=tuple(self._said))

    def eval_progress(self) -> EvalProgress | None:
        p = self._progress
        return progress_now(p, self.clock()) if p is not None else None

    def eval_outcome(self) -> EvalOutcome | None:
        return self._outcome

    def _run_outcome(self) -> RunOutcome | None:
        o = self._outcome
        if o is None:
            return None
        return RunOutcome(code=o.code, reason=o.message, line=o.message, run_dir=str(self.out),
                          ending="died" if o.state == "died" else "finished")

    # ---- the child

    async def start(self) -> None:
        await self.spawn(self.start_msg)
        msg = await self.next_message(timeout=START_SILENCE_S)
        if not isinstance(msg, Ready):
            await self.reap()
            raise SourceError(msg.message if isinstance(msg, Fatal) else
                              f"the eval did not start; see {self.log_path}")
        self._description = f"eval: {msg.target} → {self.out}"
        self.read_on()

    def took(self, msg: EvalMsg) -> None:
        if isinstance(msg, SnapshotMsg):
            self.queue(msg.snapshot)
        elif isinstance(msg, EvalProgress):
            self._progress = msg
        elif isinstance(msg, Said):
            if len(self._said) < MAX_SAID:
                self._said.append(msg.notice)
        elif isinstance(msg, Finished):
            self._outcome = msg.outcome
            self._finished_progress(msg.outcome)
        elif isinstance(msg, Fatal):
            self.queue(SourceError(msg.message))

    def finished(self) -> bool:
        return self._outcome is not None

    async def died(self, how: str) -> None:
        cmd = resume_command(self.out, self.start_msg.config.url)
        self._outcome = EvalOutcome(state="died", code=1, message=(
            f"eval: the eval process died ({how}); its lines are in {self.log_path}; "
            f"resume with: {cmd}"))

    def _finished_progress(self, o: EvalOutcome) -> None:
        """The strip's last word: the eval's end, with its rows."""
        p = self._progress
        if p is None or o.state == "died":
            return
        self._progress = msgspec.structs.replace(
            p, state=o.state, rows_filled=o.rows_filled or p.rows_filled,
            rows_total=o.rows_total or p.rows_total,
            phase_left_s=p.phase_left_s if o.state != "finished" else 0.0,
            eval_left_s=0.0 if o.state == "finished" else p.eval_left_s)

    async def close(self) -> None:
        """Stop the eval as SIGINT does (resumably), wait for its outcome, and make sure the
        child is gone."""
        await self.stop(wait=STOP_WAIT_S)


# ---- the child side ---------------------------------------------------------------------


class _Pipe:
    """The child's stdout: one message a line; once the console is gone (a broken pipe),
    silent, so a phase's tick never fails for it (stdin's close stops the eval)."""

    def __init__(self) -> None:
        self.gone = False

    def send(self, msg: msgspec.Struct) -> None:
        if self.gone:
            return
        try:
            sys.stdout.buffer.write(encode(msg) + b"\n")
            sys.stdout.buffer.flush()
        except (BrokenPipeError, ValueError):
            self.gone = True


def _say_to(pipe: _Pipe) -> Callable[[str], None]:
    """The Eval's `say`: every line to the log (stderr); the eval's own lines to the
    console too (a phase run's lines are indented by the battery, and its events reach the
    console in its Snapshots)."""

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        if not line.startswith(" "):
            pipe.send(Said(Notice("event", line)))

    return say


def _build(start: EvalStart, say: Callable[[str], None]):
    """The Eval EvalStart describes (resumed from OUT's eval.json when it says so)."""
    from loadgen.eval.battery import load_state, resumed
    from loadgen.eval.phase_run import Eval
    from loadgen.eval.plan import plan_from_builtins

    out = Path(start.out)
    kw = {"secrets": start.secrets, "chaos_restart_cmd": start.chaos_restart_cmd,
          "dcgm_url": start.dcgm_url, "label": start.label, "meta": dict(start.meta),
          "model_params": start.model_params, "neighbor_cmd": start.neighbor_cmd,
          "fleet": start.fleet}
    state = load_state(out) if start.resume else None
    if state is not None:
        return resumed(state, start.config, out, say, **kw)
    plan = plan_from_builtins(start.plan, "the console's plan")
    return Eval(cfg=start.config, plan=plan, quick=start.quick, out=out, say=say, **kw)


def phase_progress(ev, index: int, name: Phase, now: float) -> EvalProgress:
    """The strip's data as phase `index` (from 1) begins: the plan's seconds of this phase
    (its load time less that of the phases after it) and of the eval, the rows so far."""
    from loadgen.eval.battery import time_left
    from loadgen.eval.matrix import rows

    left = time_left(ev, name)
    after = time_left(ev, PHASES[index]) if index < len(PHASES) else 0.0
    filled, total = rows_filled(rows(ev.results))
    return EvalProgress(index=index, count=len(PHASES), name=name, about=ABOUT[name].what,
                        phase_left_s=max(0.0, left - after), eval_left_s=left,
                        rows_filled=filled, rows_total=total, at=now)


def rows_filled(rows: list) -> tuple[int, int]:
    """(rows with a value, all rows): a row whose value is None is not filled."""
    return sum(r.value is not None for r in rows), len(rows)


async def _read_controls(reader: asyncio.StreamReader, stop: Callable[[str], None]) -> None:
    while line := await reader.readline():
        try:
            msg = msgspec.json.decode(line, type=Control)
        except msgspec.DecodeError as e:
            log.warning("ignored a bad control line: %s", e)
            continue
        if msg.op == "stop":
            stop(asked_stop(msg)[0])
        else:  # the plan sets the load; the console's load keys are off in an eval anyway
            log.info("ignored %s: an eval's load is the plan's", msg.op)
    stop("the console went away")  # stdin closed: SSH dropped, nobody is watching


async def _run_to_outcome(ev, task: asyncio.Task, stopped: list[str]) -> EvalOutcome:
    """Wait for the eval; its outcome, the outputs written when it finished."""
    from loadgen.eval.matrix import rows
    from loadgen.eval.output import write_outputs
    from loadgen.eval.phase_run import EvalError

    try:
        await task
    except asyncio.CancelledError:
        if not stopped:
            raise
        filled, total = rows_filled(rows(ev.results))
        line = stopped_line(ev.out, ev.cfg.url)
        ev.say(f"eval: {stopped[0]}; {len(ev.results.ran())} phase(s) kept")
        ev.say(line)
        return EvalOutcome(state="stopped", code=130, message=line, rows_filled=filled,
                           rows_total=total)
    except EvalError as e:
        ev.say(f"tokentop eval: {e}")
        return EvalOutcome(state="failed", code=2, message=f"tokentop eval: {e}")
    table, written = write_outputs(ev)
    print(table, file=sys.stderr, flush=True)
    all_rows = rows(ev.results)
    filled, total = rows_filled(all_rows)
    return EvalOutcome(state="finished", code=0, message=f"eval: finished: {filled}/{total} "
                       f"rows filled, in {ev.out}", table=table,
                       written=[str(p) for p in written], rows_filled=filled,
                       rows_total=total)


async def _child() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    pipe = _Pipe()
    try:
        start = msgspec.json.decode(await reader.readline(), type=EvalStart)
    except msgspec.DecodeError as e:
        pipe.send(Fatal(f"bad eval settings: {e}"))
        return 2
    from loadgen.eval.battery import run_eval
    from loadgen.eval.phase_run import EvalError
    from loadgen.eval.plan import PlanError

    say = _say_to(pipe)
    try:
        ev = _build(start, say)
    except (EvalError, PlanError) as e:
        pipe.send(Fatal(str(e)))
        return 2
    ev.sinks_for = lambda name: [ToConsole(pipe.send)]
    ev.on_phase = lambda i, name: pipe.send(phase_progress(ev, i, name, time.time()))
    pipe.send(Ready(target=start.config.url or "the embedded simulator",
                    done_before=len(ev.results.ran())))
    task = asyncio.create_task(run_eval(ev))
    stopped: list[str] = []

    def stop(why: str) -> None:  # the phase under way is not kept: resuming runs it again
        if not stopped and not task.done():
            stopped.append(why)
            task.cancel()

    controls = asyncio.create_task(_read_controls(reader, stop))
    try:
        outcome = await _run_to_outcome(ev, task, stopped)
    finally:
        controls.cancel()
    pipe.send(Finished(outcome))
    log.info("%s", outcome.message)
    return outcome.code


def main() -> int:
    return run_child(_child)


if __name__ == "__main__":
    sys.exit(main())
