"""What every phase of an eval runs with: the Eval it belongs to (its settings, plan, output
and results so far) and one run of a phase's load through the one Session, in a run
directory of its own. The battery (loadgen.eval.battery) runs the phases in order; the
phases with a module of their own (loadgen.eval.batching, context, interference, memory)
build on this, not on the battery.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from loadgen.analysis import plot_style
from loadgen.eval.phases import Phase
from loadgen.eval.plan import Phases, Plan, plan_to_builtins
from loadgen.eval.results import (
    EVAL_FORMAT,
    EvalState,
    Header,
    Results,
    Workload,
    state_to_builtins,
)
from loadgen.model.notice import Notice
from loadgen.record.rundir import write_json_atomic
from loadgen.run.config import FleetFrom, RunConfig
from loadgen.run.fleet_load import FleetLoad, FleetLoadError
from loadgen.run.secrets import Secrets
from loadgen.run.session import Session
from loadgen.run.sinks import ProgressLines, Sink
from loadgen.run.summary import EXIT_UNUSABLE

Say = Callable[[str], None]


class EvalError(Exception):
    """An eval that cannot start or go on; str(e) says why, for the user."""



@dataclass
class Eval:
    """One eval: the command line's run settings (target, workload), the plan, where it is
    written, and what its phases found so far (eval.json's `phases`)."""

    cfg: RunConfig
    plan: Plan
    quick: bool
    out: Path
    secrets: Secrets = field(default_factory=Secrets)
    say: Say = print
    chaos_restart_cmd: str | None = None
    dcgm_url: str | None = None  # a dcgm-exporter's /metrics: SM, tensor and DRAM activity
    results: Results = field(default_factory=Results)
    started: float = field(default_factory=time.time)
    url: str = ""  # the target every phase loads (the embedded simulator's when no --url)
    label: str | None = None  # --label: the header's
    meta: dict[str, str] = field(default_factory=dict)  # --meta key=value: the header's
    # a front end watching the eval (the live view): the sinks each phase's runs get too,
    # by the run's name, and a call as each phase begins (its number from 1, its name)
    sinks_for: Callable[[str], list[Sink]] = field(default=lambda name: [])
    on_phase: Callable[[int, Phase], None] = field(default=lambda i, name: None)
    header: Header | None = None  # what was measured: found once, when the eval starts
    neighbor_cmd: str | None = None  # --neighbor-cmd: the interference phase's own neighbour
    model_params: float | None = None  # --model-params: the model's parameters, where the
    # server does not say (the memory phase's GB per billion)
    fleet: FleetFrom | None = None  # --broker: the phases' load from a fleet's agents
    fleet_load: FleetLoad | None = None  # its agents, found when the eval starts

    @property
    def phases(self) -> Phases:
        return self.plan.profile(self.quick)

    @property
    def state_path(self) -> Path:
        return self.out / "eval.json"

    def state(self, finished: bool = False, rows: list[dict] | None = None) -> EvalState:
        return EvalState(
            format=EVAL_FORMAT, started=self.started, finished=finished, quick=self.quick,
            target=self.cfg.url or "embedded simulator",
            workload=workload_of(self.cfg, self.phases), plan=plan_to_builtins(self.plan),
            phases=self.results, rows=msgspec.UNSET if rows is None else rows,
            header=msgspec.UNSET if self.header is None else self.header)

    def save(self, finished: bool = False, rows: list[dict] | None = None) -> None:
        write_json_atomic(self.state_path, state_to_builtins(self.state(finished, rows)))


def target_of(ev: Eval) -> str:
    """The eval's target as it names it in plots: the embedded simulator, or the server's
    model and engine (the header's) at the --url's host."""
    header = ev.header
    return plot_style.target_name(ev.cfg.url, header.model if header else None,
                                  header.engine if header else None)


def workload_of(cfg: RunConfig, phases: Phases) -> Workload:
    b = phases.baseline
    return Workload(api=cfg.api, model=cfg.model, dataset=str(b.dataset),
                    input_tokens=str(b.input_tokens), output_tokens=str(b.output_tokens),
                    tokenizer=cfg.tokenizer, mode=b.mode,
                    load=b.concurrency if b.mode == "closed" else b.rate)


def run_dir(ev: Eval, name: str) -> Path:
    """A fresh run directory for the phase (a try killed before is left as it was)."""
    base = ev.out / "runs" / name
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{name}.try{n}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def phase_cfg(ev: Eval, name: str, **load: Any) -> RunConfig:
    """The command line's settings with the phase's load, SLOs and run directory."""
    b = ev.phases.baseline
    return msgspec.structs.replace(
        ev.cfg, url=load.pop("url", ev.url), out=str(run_dir(ev, name)), resume=None,
        dataset=str(b.dataset), input_tokens=str(b.input_tokens),
        output_tokens=str(b.output_tokens), slo=str(ev.plan.slo) or None,
        ramp=None, auto_ramp=False, max_requests=None, stagger=ev.plan.stagger.seconds, **load)


async def run_session(ev: Eval, name: str, cfg: RunConfig,
                      on_session: Callable[[Session], None] | None = None, *,
                      here: bool = False, agents: list[str] | None = None) -> Path:
    """Run `cfg` through one Session to its end; its run directory. `on_session` gets the
    Session before it starts (the faults phase notes its faults in it). With a fleet
    (--broker) the load comes from its agents, merged into the run directory, unless the
    load must come from this machine (`here`: the client pinned beside a neighbour, one
    target of several; or a Session to note in, behind this machine's fault proxy);
    `agents`: only those of the fleet's (the scaling across client machines)."""

    def say(notice: Notice) -> None:
        ev.say(f"  {name}: {notice.text}")

    if ev.fleet_load is not None and not here and on_session is None and cfg.url == ev.url:
        try:
            return await ev.fleet_load.run(cfg, name, say, agents=agents)
        except FleetLoadError as e:
            raise EvalError(str(e)) from None

    # the progress line every PROGRESS_EVERY_S, not every second: a day's soak in an eval is
    # otherwise 86 400 lines; events and warnings as they come
    session = Session(cfg, ev.secrets,
                      sinks=[ProgressLines(say, every=PROGRESS_EVERY_S), *ev.sinks_for(name)],
                      say=say)
    if on_session is not None:
        on_session(session)
    code = await session.run()
    if code == EXIT_UNUSABLE:  # said already, in the session's words
        raise EvalError(f"{name}: the run could not start (said above)")
    return Path(cfg.out or "")


PROGRESS_EVERY_S = 10.0


def baseline_load(ev: Eval) -> dict[str, Any]:
    b = ev.phases.baseline
    return {"mode": b.mode, "concurrency": b.concurrency, "rate": b.rate}


def knee_load(ev: Eval) -> tuple[float | None, str]:
    """The knee's load from the ramp (None with the reason when there is none)."""
    ramp_r = ev.results.ramp
    knee = ramp_r.figures.knee if ramp_r is not None and ramp_r.figures is not None else None
    if knee:
        return float(knee.load), ""
    if ramp_r is None or ramp_r.status != "done":
        return None, "the ramp did not run"
    return None, "the ramp found no knee (throughput scaled to its last step)"


def load_text(mode: str, concurrency: int, rate: float) -> str:
    return f"{concurrency} streams" if mode == "closed" else f"{rate:g} req/s"


