"""`tokentop agent --accept-jobs`: an agent that runs the load jobs an eval sends it.

It waits on `tokentop/<fleet>/<agent>/job` (the protocol: loadgen.fleet.jobs) and runs
each job as one Session of its own: the agent's flags (its --url, API key, workers,
tokenizer, run directory) with the job's load and workload, published like any agent's
run. One job at a time; a job while one runs is refused. Its state is retained on
`.../job/state` (idle, running, done with the run's summary; offline by the last will),
so an eval that connects later still finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from loadgen.fleet import jobs
from loadgen.fleet.jobs import Job, JobLoad, JobState
from loadgen.fleet.link import BrokerSettings, MqttLink, topic
from loadgen.model.notice import Notice
from loadgen.model.snapshot import Control
from loadgen.model.text import plain
from loadgen.model.urls import public_url
from loadgen.run.config import PublishTo, RunConfig
from loadgen.run.secrets import Secrets
from loadgen.run.session import Session, SessionError
from loadgen.run.summary import EXIT_UNUSABLE

log = logging.getLogger("tokentop.jobs")

Say = Callable[[Notice], None]


def job_config(base: RunConfig, load: JobLoad, job_id: str) -> RunConfig:
    """The agent's own settings with the job's load: the target, secrets, workers and the
    root of the run directories stay the agent's."""
    out = None
    if base.out:
        out = str(Path(base.out) / f"job-{re.sub(r'[^A-Za-z0-9._-]', '-', job_id)[:64]}")
    return msgspec.structs.replace(base, **msgspec.structs.asdict(load), out=out,
                                   ramp=None, auto_ramp=False, max_requests=None,
                                   resume=None, trace=None)


class JobAgent:
    """One agent's job loop; `run()` until `stop()`."""

    def __init__(self, base: RunConfig, secrets: Secrets, settings: BrokerSettings,
                 publish: PublishTo, *, say: Say, record: bool = True) -> None:
        self.base = base
        self.secrets = secrets
        self.settings = settings
        self.publish = publish
        self.say = say
        self.record = record
        self.name, self.fleet = publish.name, publish.fleet
        self.link = MqttLink(settings, identifier=f"tokentop-jobs-{self.fleet}-{self.name}",
                             will=self._will(), max_backoff=publish.max_backoff)
        self.state = JobState(agent=self.name, state="idle", **self._own())
        self.session: Session | None = None
        self._job: asyncio.Task | None = None
        self._job_id: str | None = None
        self._stop_before_start = asyncio.Event()
        self._client = None
        self._stopping = False
        self.done = asyncio.Event()

    def _own(self) -> dict:
        return {"url": public_url(self.base.url) if self.base.url else "embedded simulator",
                "max_concurrency": self.publish.max_concurrency,
                "max_rate": self.publish.max_rate}

    def topic(self, kind: str) -> str:
        return topic(self.fleet, self.name, kind)

    def _will(self):
        import aiomqtt

        gone = JobState(agent=self.name, state="offline", reason="connection lost")
        return aiomqtt.Will(self.topic("job/state"), jobs.encode(gone), qos=1, retain=True)

    async def run(self) -> None:
        """Take jobs until stop() (and the job running then has ended)."""
        link = asyncio.create_task(self.link.run(self._connected), name="job-agent")
        try:
            await self.done.wait()
        finally:
            self.link.stop_retrying()
            link.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await link

    def stop(self, *, now: bool = False) -> None:
        """Stop taking jobs; a job running is stopped in order (`now`: its requests in
        flight cancelled), then run() returns."""
        self._stopping = True
        self._stop_before_start.set()
        if self.session is not None:
            if now:
                self.session.abort("the agent was stopped again")
            else:
                self.session.request_stop("the agent is stopping")
        if self._job is None or self._job.done():
            self.done.set()

    async def _connected(self, client) -> None:
        self._client = client
        await self._tell(self.state)  # on every (re)connect: replaces the will
        await client.subscribe(self.topic("job"), qos=1)
        async for message in client.messages:
            await self._take(bytes(message.payload))

    async def _tell(self, state: JobState, retain: bool = True) -> None:
        if retain:
            self.state = state
        client = self._client
        if client is None:
            return
        try:
            await client.publish(self.topic("job/state"), jobs.encode(state), qos=1,
                                 retain=retain)
        except Exception as e:  # the retained state is told again on the next connect
            log.warning("cannot tell the job's state (%s): %s", state.state, e)

    async def _take(self, payload: bytes) -> None:
        try:
            job = jobs.decode_job(payload)
        except ValueError as e:
            log.warning("%s", e)
            return
        job_id = plain(job.id, jobs.ECHO_LIMIT)  # it came from outside: shown, recorded
        if job.op == "stop":
            if self.session is not None and self._job_id == job_id:
                self._stop_before_start.set()  # a stop in the wait for its start: not run
                self.session.request_stop("stopped by the eval that sent the job")
            return
        if job.op == "set":
            await self._set(job_id, job)
            return
        why = "this agent is stopping" if self._stopping else self._refusal(job)
        if why is not None:
            self.say(Notice("warning", f"job {job_id} refused: {why}"))
            await self._tell(JobState(agent=self.name, state="refused", job=job_id, reason=why,
                                      **self._own()), retain=not self._busy)
            return
        assert job.load is not None
        self._job_id = job_id
        self._stop_before_start = asyncio.Event()
        self._job = asyncio.create_task(self._run(job_id, job))

    @property
    def _busy(self) -> bool:
        """A job is under way: waiting for its start, running, or finishing."""
        return self._job is not None and not self._job.done()

    async def _set(self, job_id: str, job: Job) -> None:
        """A sweep's next step for the job running: its concurrency or rate, within caps."""
        session, load = self.session, job.load
        if session is None or self._job_id != job_id or load is None:
            return
        why = jobs.refusal(msgspec.structs.replace(load, duration=1.0),
                           max_concurrency=self.publish.max_concurrency,
                           max_rate=self.publish.max_rate)
        if why is not None:
            self.say(Notice("warning", f"job {job_id}: step refused: {why}"))
            return
        op, value = (("set_concurrency", float(load.concurrency)) if load.mode == "closed"
                     else ("set_rate", load.rate))
        await session.control(Control(op=op, value=value, source="mqtt"))

    def _refusal(self, job: Job) -> str | None:
        if self._busy:
            return f"this agent is running job {self._job_id}"
        if job.load is None:
            return "a run job needs its load"
        if job.start_at - time.time() > jobs.MAX_START_AHEAD_S:
            return (f"its start is {job.start_at - time.time():.0f} s ahead (at most "
                    f"{jobs.MAX_START_AHEAD_S:.0f}): is this machine's clock right?")
        return jobs.refusal(job.load, max_concurrency=self.publish.max_concurrency,
                            max_rate=self.publish.max_rate)

    async def _run(self, job_id: str, job: Job) -> None:
        assert job.load is not None
        cfg = job_config(self.base, job.load, job_id)
        cfg.publish = self.publish
        self.say(Notice("run", f"job {job_id}: {job.load.words()} for "
                        f"{job.load.duration:g} s"))
        session = self.session = Session(cfg, self.secrets, record=self.record,
                                         say=self.say)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_before_start.wait(),
                                       max(0.0, job.start_at - time.time()))
            if self._stop_before_start.is_set() or self._stopping:
                await self._tell(JobState(agent=self.name, state="done", job=job_id,
                                          reason="stopped before it started",
                                          exit=EXIT_UNUSABLE, **self._own()))
                return
            try:
                await session.start()
            except SessionError as e:
                await self._tell(JobState(agent=self.name, state="done", job=job_id,
                                          reason=str(e), exit=EXIT_UNUSABLE, **self._own()))
                return
            recording = session.recording
            run_dir = str(recording.run_dir) if recording and recording.run_dir else None
            await self._tell(JobState(agent=self.name, state="running", job=job_id,
                                      run_id=session.run_id, run_dir=run_dir, **self._own()))
            try:
                async for _ in session.snapshots():
                    pass
            finally:
                outcome = await session.finish()
            await self._tell(JobState(
                agent=self.name, state="done", job=job_id, run_id=session.run_id,
                run_dir=run_dir, exit=outcome.code, reason=outcome.reason,
                summary=outcome.summary, **self._own()))
            self.say(Notice("outcome", f"job {job_id}: {outcome.said().line}"))
        finally:
            self.session = None
            if self._stopping:
                self.done.set()

