"""One run's load from a fleet's agents (`tokentop eval --fleet NAME --broker URL`).

FleetLoad finds the agents of a fleet that accept jobs (`tokentop agent --accept-jobs`,
the protocol in loadgen.fleet.jobs), gives each its share of a run's load (streams split
as evenly as whole streams go, a rate in equal parts), one start time for all, and
records what they measured as one run directory: each agent's tick N merged into the
fleet's tick N (loadgen.fleet.tick_merge: histograms added bucket by bucket, counters
summed), through the same windows, outage tally and summary as a Session's, so whatever
reads a run directory (the eval's phases, `tokentop report`) reads a fleet's alike.
`agents.json` beside it names each agent's share, its own run directory (on its machine),
its run's exit and its requests; each agent keeps its own recording.

FleetLoad holds the link; each job is a FleetRun, which is to the fleet what a Session is
to this machine (start, snapshots, control, request_stop, finish), so a sweep steers one
the way it steers a Session: each step's load split again over the agents ("set" jobs).

A tick an agent's stream lost is asked again (the publisher's resend); one still missing
is merged without that agent's histograms (its counters are cumulative, so the totals
stay whole) and counted in agents.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from loadgen.fleet import jobs
from loadgen.fleet.jobs import Job, JobLoad, JobState
from loadgen.fleet.link import BrokerError, BrokerSettings, MqttLink, is_level, topic
from loadgen.fleet.publisher import decode_snapshot
from loadgen.fleet.tick_merge import job_tick
from loadgen.model.notice import Notice
from loadgen.model.outage import OutageTally
from loadgen.model.slo import parse_slos
from loadgen.model.snapshot import Control, Snapshot
from loadgen.model.text import plain
from loadgen.model.urls import public_url
from loadgen.model.windows import SnapshotWindows
from loadgen.record.recorder import Recording, RecordingError
from loadgen.record.rundir import scrub, write_json_atomic
from loadgen.run.config import FleetFrom, RunConfig
from loadgen.run.secrets import Secrets
from loadgen.run.sinks import broker_settings
from loadgen.run.summary import build_summary, exit_status, thresholds

log = logging.getLogger("tokentop.fleet_load")

Say = Callable[[Notice], None]

DISCOVER_S = 2.0  # after connecting: the retained job states arrive at once; a margin
START_LEAD_S = 2.0  # the job is sent this long before its start: every agent gets it first
ANSWER_S = 30.0  # an agent that has not said running (or refused) by then is given up
RESEND_AFTER = 4  # ticks an agent is past a missing one before it is asked again
LOST_AFTER = 20  # ticks past it before the missing tick is merged without it
END_WAIT_S = 10.0  # after an agent's done: its last ticks may still be on their way
PROGRESS_EVERY_S = 10.0


class FleetLoadError(Exception):
    """The fleet cannot run the load; str(e) says why, for the user."""


@dataclass
class _Part:
    """One agent's side of a job: its share, what it said, the ticks not merged yet."""

    agent: str
    load: JobLoad
    state: JobState | None = None
    ticks: dict[int, Snapshot] = field(default_factory=dict)
    latest: Snapshot | None = None
    last_seq: int | None = None  # its stopped tick's seq, once seen
    stopped_at: float | None = None  # when that tick came (monotonic)
    done_at: float | None = None  # when its done state came (monotonic)
    asked: set[int] = field(default_factory=set)
    lost: int = 0

    @property
    def run_id(self) -> str | None:
        return self.state.run_id if self.state is not None else None

    def late(self, now: float) -> bool:
        """It said done long enough ago that what has not come is not coming."""
        return self.done_at is not None and now - self.done_at > END_WAIT_S

    def ended(self, now: float) -> bool:
        """Its part is over: it said done (its summary with it), or its stream stopped and
        no done came for a while (a done lost, an agent gone)."""
        quiet = self.stopped_at is not None and now - self.stopped_at > END_WAIT_S
        return self.done_at is not None or quiet


class FleetLoad:
    """The agents of one fleet on one broker, and the jobs given to them."""

    def __init__(self, settings: BrokerSettings, fleet: str, *,
                 agents: list[str] | None = None, secrets: Secrets | None = None) -> None:
        self.settings = settings
        self.fleet = fleet
        self.wanted = agents
        self.secrets = secrets or Secrets()  # cut out of what is recorded (a --url's password)
        self.states: dict[str, JobState] = {}
        self.agents: list[str] = []
        self.link = MqttLink(settings, identifier=f"tokentop-eval-{fleet}-{os.getpid()}-"
                             f"{uuid.uuid4().hex[:6]}")
        self._task: asyncio.Task | None = None
        self._client = None
        self._run: FleetRun | None = None  # the job under way

    # ---- the link -----------------------------------------------------------------------

    async def open(self, wait_s: float = 10.0) -> list[str]:
        """Connect and find the agents ready for jobs; raises FleetLoadError in words."""
        self._task = asyncio.create_task(self.link.run(self._connected), name="fleet-load")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.link.connected.wait(), wait_s)
        if not self.link.connected.is_set():
            await self.close()
            raise FleetLoadError(self.link.last_error or f"the broker {self.settings.display} "
                                 f"did not answer in {wait_s:g} s")
        await asyncio.sleep(DISCOVER_S)
        ready = sorted(a for a, s in self.states.items() if s.state in jobs.READY_STATES)
        if self.wanted:
            missing = [a for a in self.wanted if a not in ready]
            if missing:
                await self.close()
                raise FleetLoadError(f"fleet {self.fleet}: {', '.join(missing)} not ready "
                                     f"for jobs ({self._seen()})")
            ready = list(self.wanted)
        if not ready:
            await self.close()
            raise FleetLoadError(f"no agent of fleet {self.fleet} on {self.settings.display} "
                                 f"takes jobs ({self._seen()}); start one on each load "
                                 "machine with: tokentop agent --accept-jobs --broker URL "
                                 f"--fleet {self.fleet} --url TARGET")
        self.agents = ready
        return ready

    def url_mismatches(self, url: str) -> list[str]:
        """The agents whose own --url is not `url` (the same server by another name, or
        not the same server: the user knows which)."""
        shown = public_url(url)
        return [f"agent {a} loads {plain(st.url or '?', 200)}, not {shown}"
                for a in self.agents if (st := self.states.get(a)) is not None
                and st.url != shown]

    def _seen(self) -> str:
        if not self.states:
            return "none seen"
        return ", ".join(f"{a} {s.state}" for a, s in sorted(self.states.items()))

    async def close(self) -> None:
        self.link.stop_retrying()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _connected(self, client) -> None:
        self._client = client
        base = f"tokentop/{self.fleet}/+"
        await client.subscribe([(f"{base}/job/state", 1), (f"{base}/snapshot", 1)])
        async for message in client.messages:
            parts = str(message.topic).split("/")
            if len(parts) < 4:
                continue
            agent, kind = parts[2], "/".join(parts[3:])
            if not is_level(agent):  # a name no agent could have: not shown, not used
                continue
            try:
                if kind == "job/state":
                    self._take_state(agent, jobs.decode_state(bytes(message.payload)))
                elif kind == "snapshot":
                    self._take_snapshot(agent, decode_snapshot(message.payload))
            except (ValueError, msgspec.ValidationError, msgspec.DecodeError) as e:
                log.warning("%s: a bad %s message: %s", plain(agent, 40), kind,
                            plain(str(e), 200))

    def _take_state(self, agent: str, state: JobState) -> None:
        self.states[agent] = state
        if self._run is not None:
            self._run.take_state(agent, state)

    def _take_snapshot(self, agent: str, snap: Snapshot) -> None:
        if self._run is not None:
            self._run.take_snapshot(agent, snap)

    async def send(self, agent: str, job: Job) -> None:
        if self._client is None:
            raise FleetLoadError(f"lost the broker {self.settings.display}")
        await self._client.publish(topic(self.fleet, agent, "job"), jobs.encode(job), qos=1)

    async def ask_resend(self, agent: str, run_id: str, first: int, last: int) -> None:
        if self._client is not None:
            body = {"run_id": run_id, "seqs": [[first, last]]}
            with contextlib.suppress(Exception):
                await self._client.publish(topic(self.fleet, agent, "resend"),
                                           json.dumps(body), qos=1)

    # ---- runs ---------------------------------------------------------------------------

    def live(self, cfg: RunConfig, name: str, say: Say, *,
             agents: list[str] | None = None, steered: bool = False) -> FleetRun:
        """A run of `cfg`'s load on the agents (or those named), to start(), follow through
        snapshots() and finish(), as a Session is (a sweep steers it with control())."""
        if self._run is not None:
            raise FleetLoadError(f"{name}: the fleet is running {self._run.name}")
        names = [a for a in self.agents if agents is None or a in agents]
        self._run = FleetRun(self, cfg, name, say, names, steered=steered)
        return self._run

    async def run(self, cfg: RunConfig, name: str, say: Say, *,
                  agents: list[str] | None = None) -> Path:
        """`cfg`'s load from the agents (or those of them named), recorded merged in
        `cfg.out`; that directory. `say`: its progress and warnings."""
        run = self.live(cfg, name, say, agents=agents)
        try:
            await run.start()
            async for _ in run.snapshots():
                pass
        finally:
            path = await run.finish()
        return path

    def ended(self, run: FleetRun) -> None:
        if self._run is run:
            self._run = None


class FleetRun:
    """One job on the fleet, merged as it comes: what a Session is to the one machine."""

    def __init__(self, fleet: FleetLoad, cfg: RunConfig, name: str, say: Say,
                 agents: list[str], *, steered: bool) -> None:
        if cfg.duration is None:
            raise FleetLoadError(f"{name}: a load from the fleet needs a duration")
        self.fleet, self.cfg, self.name, self.say = fleet, cfg, name, say
        self.slos = parse_slos(cfg.slo)
        self.job_id = f"{re.sub(r'[^A-Za-z0-9._-]', '-', name)[:40]}-{uuid.uuid4().hex[:8]}"
        self.run_id = f"fleet-{self.job_id}"
        loads = shares(cfg, len(agents))
        # an agent whose share is nothing (1 stream over 2 agents) gets no job: an idle run
        # of its own would only say it served nothing; a steered run's shares change
        self.parts = {a: _Part(a, load) for a, load in zip(agents, loads, strict=True)
                      if steered or (load.concurrency if load.mode == "closed"
                                     else load.rate) > 0}
        if not self.parts:
            raise FleetLoadError(f"{name}: no load to share ({loads[0].words()} in all)")
        self.windows, self.outages = SnapshotWindows(), OutageTally()
        self.recording: Recording | None = None
        self._changed = asyncio.Event()
        self._stopped = False
        self._complete = False  # every part over and merged
        self._path: Path | None = None

    # ---- what the link brings -----------------------------------------------------------

    def take_state(self, agent: str, state: JobState) -> None:
        part = self.parts.get(agent)
        if part is not None and state.job == self.job_id:
            part.state = state
            if state.state == "done" and part.done_at is None:
                part.done_at = time.monotonic()
            self._changed.set()

    def take_snapshot(self, agent: str, snap: Snapshot) -> None:
        part = self.parts.get(agent)
        if part is None or part.run_id != snap.run_id:
            return  # not this job's run (or its running state is still on its way)
        part.ticks[snap.seq] = snap
        if snap.load.state == "stopped" and part.last_seq is None:
            part.last_seq, part.stopped_at = snap.seq, time.monotonic()
        self._changed.set()

    # ---- start, follow, steer, stop, finish ---------------------------------------------

    async def start(self) -> None:
        """Every agent's job sent and running, the merged run directory open; raises
        FleetLoadError in words (and stops whatever started)."""
        cfg = self.cfg
        try:
            self.recording = Recording.open(config=self._fit(msgspec.to_builtins(cfg)),
                                            run_id=self.run_id, out=cfg.out,
                                            on_disk_full=cfg.on_disk_full)
        except RecordingError as e:
            self.fleet.ended(self)
            raise FleetLoadError(f"{self.name}: {e}") from None
        start_at = time.time() + START_LEAD_S
        self.say(Notice("run", "from " + ", ".join(
            f"{a} ({p.load.words()})" for a, p in self.parts.items())))
        try:
            for agent, part in self.parts.items():
                await self.fleet.send(agent, Job(id=self.job_id, op="run", start_at=start_at,
                                                 load=part.load))
            await self._started()
        except BaseException as e:
            await self._stop_all()
            self.recording.discard({"error": str(e)})
            self.fleet.ended(self)
            raise

    async def _started(self) -> None:
        """Every agent running this job, or FleetLoadError naming the one that is not."""
        deadline = time.monotonic() + START_LEAD_S + ANSWER_S
        while True:
            waiting = []
            for part in self.parts.values():
                st = part.state
                if st is not None and st.state == "refused":
                    raise FleetLoadError(f"{self.name}: agent {part.agent} refused the job: "
                                         f"{plain(st.reason or '', 200)}")
                if st is not None and st.state == "done" and st.run_id is None:
                    raise FleetLoadError(f"{self.name}: agent {part.agent} could not start "
                                         f"the run: {plain(st.reason or '', 200)}")
                if st is None or st.run_id is None:
                    waiting.append(part.agent)
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise FleetLoadError(f"{self.name}: no answer to the job from "
                                     f"{', '.join(waiting)} in {ANSWER_S:.0f} s")
            await self._wait_change(1.0)

    async def _wait_change(self, timeout: float) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def control(self, msg: Control) -> None:
        """A sweep's step: the load set on the fleet, each agent its share of it."""
        if msg.op not in ("set_concurrency", "set_rate") or msg.value is None:
            raise FleetLoadError(f"{self.name}: {msg.op} is not steered across a fleet")
        n = len(self.parts)
        values = (jobs.split_streams(int(msg.value), n) if msg.op == "set_concurrency"
                  else jobs.split_rate(float(msg.value), n))
        for (agent, part), value in zip(self.parts.items(), values, strict=True):
            part.load = msgspec.structs.replace(
                part.load, **({"concurrency": value} if msg.op == "set_concurrency"
                              else {"rate": value}))
            await self.fleet.send(agent, Job(id=self.job_id, op="set", load=part.load))

    def request_stop(self, reason: str | None = None) -> None:
        """Stop every agent's part in order (their drains, then their last ticks)."""
        if not self._stopped:
            self._stopped = True
            task = asyncio.ensure_future(self._stop_all())
            task.add_done_callback(lambda t: t.exception())

    async def _stop_all(self) -> None:
        with contextlib.suppress(Exception):
            for agent in self.parts:
                await self.fleet.send(agent, Job(id=self.job_id, op="stop"))

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        """The fleet's ticks as every agent's come in, recorded; ends when every part has
        ended (or the run's time is long over: said)."""
        assert self.recording is not None
        cfg, recording = self.cfg, self.recording
        seq, said = 0, time.monotonic()
        limit = (time.monotonic() + START_LEAD_S + (cfg.warmup or 0) + (cfg.duration or 0)
                 + cfg.drain_grace + ANSWER_S + END_WAIT_S)
        while True:
            for snap in self._merged(seq):
                self.windows.add(snap)
                self.outages.add(snap)
                recording.take(snap)
                seq = snap.seq + 1
                yield snap
            if recording.stop_load and not self._stopped:  # a full disk, by default
                self.say(Notice("warning", f"{recording.error or 'recording failed'}: "
                                "stopping the agents' load"))
                self.request_stop()
            if self._over(seq):
                self._complete = True
                return
            now = time.monotonic()
            if now > limit:
                self.say(Notice("warning", f"{self._unfinished()} did not finish in time: "
                                "recorded as far as it reported"))
                return
            if now - said > PROGRESS_EVERY_S and self.windows.last is not None:
                said = now
                self.say(Notice("progress", _progress(self.windows.last, len(self.parts))))
            await self._ask_again()
            await self._wait_change(1.0)

    async def finish(self) -> Path:
        """The summary (the same windows, tally and verdicts as a Session's), the recording
        closed, agents.json beside it; the run directory. Safe to call more than once."""
        if self._path is not None:
            return self._path
        self.fleet.ended(self)
        if not self._complete:  # ended early (an error, a stop): the agents stop too
            await self._stop_all()
        cfg, recording = self.cfg, self.recording
        assert recording is not None
        summary = build_summary(cfg, self.windows)
        summary["run_dir"] = str(recording.run_dir) if recording.run_dir else None
        summary["recording_error"] = recording.error
        summary["stability"] = self.outages.summary()
        summary["thresholds"] = thresholds(cfg, self.windows, summary["stability"])
        summary["fleet"] = self._agents_rows()
        summary = self._fit(summary)
        code, reason = exit_status(summary)
        summary["exit"] = {"code": code, "reason": reason}
        error = recording.close(summary)
        if error:
            self.say(Notice("warning", error))
        self._path = Path(recording.run_dir or cfg.out or ".")
        with contextlib.suppress(OSError):
            write_json_atomic(self._path / "agents.json", {
                "fleet": self.fleet.fleet, "job": self.job_id, "agents": summary["fleet"]})
        return self._path

    def _fit(self, data: dict) -> dict:
        """`data` with every secret of the eval cut out, as a Session writes its own."""
        return scrub(data, self.fleet.secrets.values())

    # ---- merging ------------------------------------------------------------------------

    def _merged(self, seq: int):
        """The fleet's ticks from `seq` on that every agent has reported (or will not)."""
        now = time.monotonic()
        parts = self.parts.values()
        while not all(self._beyond(p, seq, now) for p in parts):
            if any(seq not in p.ticks and not self._past(p, seq, now) for p in parts):
                return  # some agent's tick is still on its way
            ticks: dict[str, Snapshot] = {}
            for part in parts:
                snap = part.ticks.pop(seq, None)
                if snap is not None:
                    ticks[part.agent] = part.latest = snap
                elif part.last_seq is None or seq <= part.last_seq:
                    part.lost += 1  # lost on the way, not after its run's end
            latest = {p.agent: p.latest for p in parts if p.latest is not None}
            if latest:
                yield job_tick(self.run_id, seq, ticks, latest)
            seq += 1

    @staticmethod
    def _past(part: _Part, seq: int, now: float) -> bool:
        """Tick `seq` of `part` is not coming: its run ended before it, or it is lost
        (it is far behind the agent's newer ticks, or the agent said done a while ago)."""
        if part.last_seq is not None and seq > part.last_seq:
            return True
        newer = [s for s in part.ticks if s > seq]
        return part.late(now) or (bool(newer) and max(newer) - seq >= LOST_AFTER)

    @staticmethod
    def _beyond(part: _Part, seq: int, now: float) -> bool:
        """`part` has no tick `seq` or later to come: past its stopped tick, or silent
        since its done."""
        if any(s >= seq for s in part.ticks):
            return False
        return (part.last_seq is not None and seq > part.last_seq) or part.late(now)

    def _over(self, seq: int) -> bool:
        """Every agent's ticks are merged up to `seq`, none is to come, each part over."""
        now = time.monotonic()
        return all(p.ended(now) and self._beyond(p, seq, now) for p in self.parts.values())

    async def _ask_again(self) -> None:
        """Ask an agent for the ticks its stream skipped (the publisher's resend)."""
        for part in self.parts.values():
            if not part.ticks or part.run_id is None:
                continue
            have = sorted(part.ticks)
            lowest = part.latest.seq + 1 if part.latest is not None else 0
            gaps = [s for s in range(lowest, have[-1]) if s not in part.ticks
                    and s not in part.asked and have[-1] - s >= RESEND_AFTER]
            if gaps:
                part.asked.update(gaps)
                await self.fleet.ask_resend(part.agent, part.run_id, gaps[0], gaps[-1])

    def _unfinished(self) -> str:
        now = time.monotonic()
        return ", ".join(p.agent for p in self.parts.values() if not p.ended(now)) or "none"

    def _agents_rows(self) -> list[dict]:
        rows = []
        for p in self.parts.values():
            st = p.state
            requests = (st.summary or {}).get("requests", {}) if st is not None else {}
            rows.append({
                "agent": p.agent, "mode": p.load.mode, "concurrency": p.load.concurrency,
                "rate": p.load.rate, "run_id": p.run_id,
                "run_dir": st.run_dir if st is not None else None,  # on the agent's machine
                "exit": st.exit if st is not None else None,
                "reason": plain(st.reason, 200) if st is not None and st.reason else None,
                "requests_ok": requests.get("ok"), "requests_failed": requests.get("failed"),
                "lost_ticks": p.lost,
                "started": round(p.latest.t - p.latest.elapsed, 3) if p.latest else None,
            })
        starts = [r["started"] for r in rows if r["started"] is not None]
        for r in rows:
            r["start_skew_s"] = round(r["started"] - min(starts), 3) if r["started"] else None
        return rows


def fleet_load(f: FleetFrom, secrets: Secrets | None) -> FleetLoad:
    """The FleetLoad of --broker and its flags (the broker's password with the rest of the
    run's secrets); raises FleetLoadError in words."""
    secrets = secrets or Secrets()
    try:
        settings = broker_settings(f, secrets.mqtt_password)
    except BrokerError as e:
        raise FleetLoadError(str(e)) from None
    return FleetLoad(settings, f.fleet, agents=list(f.agents) or None, secrets=secrets)


def shares(cfg: RunConfig, agents: int) -> list[JobLoad]:
    """`cfg`'s load split over `agents` (the workload the same; each its own seed)."""
    fields = {f: getattr(cfg, f) for f in JobLoad.__struct_fields__ if hasattr(cfg, f)}
    fields["duration"] = float(cfg.duration or 0.0)
    streams = jobs.split_streams(cfg.concurrency, agents)
    rates = jobs.split_rate(cfg.rate, agents)
    return [JobLoad(**{**fields, "concurrency": streams[i], "rate": rates[i],
                       "seed": cfg.seed + i, "mix": list(cfg.mix)})
            for i in range(agents)]


def _progress(snap: Snapshot, agents: int) -> str:
    c = snap.counters
    return (f"{agents} agents: {snap.load.in_flight} in flight, {c.requests_ok} ok, "
            f"{c.requests_failed} failed")
