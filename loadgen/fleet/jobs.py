"""Jobs: an eval (or sweep) on one machine running its load from a fleet's agents.

An agent started with `tokentop agent --accept-jobs` starts no load of its own: it waits
for jobs. Topics (beside the publisher's, see loadgen.fleet.publisher):

    tokentop/<fleet>/<agent>/job        a job in, QoS 1: {"id", "op": "run", "start_at", "load"};
                                        {"id", "op": "set", "load"} (a sweep's next step: the
                                        job's new concurrency or rate); {"id", "op": "stop"}
    tokentop/<fleet>/<agent>/job/state  retained, QoS 1: the agent's JobState (idle, running,
                                        done, refused); the last will says "offline"

A job carries the load and the workload only (JobLoad): the target URL, the API key, the
workers and the run directory are the agent's own flags, so a job can never point an agent
at another server or read its secrets, and its load is capped by the agent's own
--max-concurrency and --max-rate. While it runs, the agent's run publishes its Snapshots
as any agent's do (the fleet console watches it live); when it ends, its JobState `done`
carries the run's summary and where its run directory is on the agent's machine.

This module is the protocol alone: the agent's loop is loadgen.run.job_agent, the side that
sends jobs and merges what comes back is loadgen.run.fleet_load.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from loadgen.model.text import plain

JOB_FORMAT = 1
JobOp = Literal["run", "set", "stop"]
AgentJobState = Literal["idle", "running", "done", "refused", "offline"]
READY_STATES: tuple[AgentJobState, ...] = ("idle", "done", "refused")
# a job's start at most this far ahead: a clock far off is refused, not waited for
MAX_START_AHEAD_S = 60.0
ECHO_LIMIT = 80  # characters of a job id kept


class JobLoad(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One agent's part of the load, and the workload every agent sends alike. The fields
    are RunConfig's of the same names; anything else in a job is refused."""

    mode: Literal["closed", "open"] = "closed"
    concurrency: int = 0
    rate: float = 0.0
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_in_flight: int | None = None
    stagger: float | None = None
    api: Literal["chat", "completions"] = "chat"
    model: str | None = None
    input_tokens: str = "128"
    output_tokens: str = "128"
    shared_prefix: int = 0
    dataset: str = "synthetic"
    ignore_eos: bool = True
    duration: float = 0.0  # seconds of load after the warm-up: a job always ends
    warmup: float = 0.0
    slo: str | None = None
    mix: list[str] = msgspec.field(default_factory=list)
    tick: float = 0.5
    drain_grace: float = 10.0
    seed: int = 0  # each agent's own: the eval's seed plus the agent's index

    def words(self) -> str:
        return (f"{self.concurrency} streams" if self.mode == "closed"
                else f"{self.rate:g} req/s")


class Job(msgspec.Struct, kw_only=True):
    id: str
    op: JobOp
    start_at: float = 0.0  # unix seconds: every agent of the job starts its load then
    load: JobLoad | None = None
    v: int = JOB_FORMAT


class JobState(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What an agent says of itself and of its job, retained on .../job/state."""

    agent: str
    state: AgentJobState
    job: str | None = None  # the job's id
    reason: str | None = None  # refused: why; done: how the run ended
    url: str | None = None  # the agent's target, as shown (no credentials)
    max_concurrency: int | None = None
    max_rate: float | None = None
    run_id: str | None = None
    run_dir: str | None = None  # on the agent's machine
    exit: int | None = None
    summary: dict | None = None  # done: the run's --json summary
    v: int = JOB_FORMAT


def encode(msg: Job | JobState) -> bytes:
    return msgspec.json.encode(msg)


_job = msgspec.json.Decoder(Job)
_state = msgspec.json.Decoder(JobState)


def decode_job(payload: bytes) -> Job:
    """A job's JSON; raises ValueError in words."""
    try:
        return _job.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"bad job: {e}") from None


def decode_state(payload: bytes) -> JobState:
    try:
        return _state.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"bad job state: {e}") from None


def refusal(load: JobLoad, *, max_concurrency: int, max_rate: float) -> str | None:
    """Why an agent refuses this load, in words; None when it runs it."""
    if not (math.isfinite(load.duration) and load.duration > 0):
        return "a job needs a duration above 0 s (an agent's load from a job always ends)"
    if not (math.isfinite(load.warmup) and load.warmup >= 0):
        return "a job's warmup must be 0 s or more"
    if load.mode == "closed" and not 0 <= load.concurrency <= max_concurrency:
        return (f"{load.concurrency} streams is over this agent's --max-concurrency "
                f"{max_concurrency}" if load.concurrency > 0 else "streams below 0")
    if load.mode == "open" and not (math.isfinite(load.rate) and 0 <= load.rate <= max_rate):
        return f"{load.rate:g} req/s is over this agent's --max-rate {max_rate:g}"
    if load.dataset != "synthetic":
        return ("a job's prompts are synthetic: a dataset file is not read on an agent "
                f"from a job (the eval asked for {plain(load.dataset.split(':', 1)[0], 16)})")
    if not (math.isfinite(load.tick) and 0.05 <= load.tick <= 60):
        return "a job's tick must be between 0.05 and 60 s"
    return None


def split_streams(total: int, agents: int) -> list[int]:
    """`total` streams over `agents`, as even as whole streams go (the first ones get the
    remainder): 10 over 3 is 4, 3, 3. An agent may get none."""
    base, extra = divmod(max(0, total), agents)
    return [base + (1 if i < extra else 0) for i in range(agents)]


def split_rate(total: float, agents: int) -> list[float]:
    return [total / agents] * agents
