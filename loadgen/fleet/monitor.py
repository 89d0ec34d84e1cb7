"""The fleet, seen from the broker: agents, their Snapshots, and an exact fleet-wide merge.

`FleetMonitor` subscribes to `tokentop/<fleet>/+/{snapshot,status,control/reply}`
and keeps one `AgentState` per agent:

* state: online, stale (online, but no Snapshot for more than 5 s), offline
  (the agent said so on a clean stop, or the broker published its last will);
  agents may start, stop and restart (a new run_id) at any time;
* Snapshots de-duplicated by (run_id, seq) (catch-up after a broker outage
  re-sends some), gaps counted, late arrivals filled in;
* the last 10 s of interval histograms, held sparse, and counters for rates.

The fleet aggregate adds the agents' interval histograms bucket by bucket
(HdrHistogram add), so the fleet P99 is the P99 of the union of every
agent's samples, never an average of P99s.

`FleetAgentSource` is a SnapshotSource over one agent, so the ordinary console
(`tui.app.TokentopApp`) shows an agent exactly as it shows a local run; its
`control()` goes to the agent over MQTT and raises when the agent refuses.
`close()` only stops watching: the agent's load goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import aiomqtt
import msgspec
import numpy as np

from loadgen.fleet.link import BrokerSettings, MqttLink, check_level, is_level, topic
from loadgen.fleet.publisher import decode_snapshot
from loadgen.model import hdr
from loadgen.model.snapshot import METRICS, Control, Snapshot
from loadgen.model.source import SourceError, SourceStatus
from loadgen.model.text import plain, plain_all

log = logging.getLogger("tokentop.fleet")

STALE_AFTER_S = 5.0
WINDOW_S = 10.0
RECENT = 240  # Snapshots kept per agent to fill a console that opens it (2 min at 2 Hz)
MISSING_CAP = 10_000
REPLY_TIMEOUT_S = 3.0
RESEND_EVERY_S = 1.0
TEXT_LIMIT = 200  # characters kept of each string of an agent's status (its target, model)
REASON_LIMIT = 300  # characters kept of an agent's reply (a refusal's reason)

_json = msgspec.json.Encoder()


# ---- windows of interval histograms ---------------------------------------------------------


class IntervalWindow:
    """The interval histograms of the last `span` seconds (by the Snapshots' own clock), sparse."""

    def __init__(self, span: float = WINDOW_S) -> None:
        self.span = span
        self._items: list[tuple[float, dict[str, tuple[np.ndarray, np.ndarray]]]] = []
        self.newest = 0.0

    def add(self, t: float, hist: dict[str, str]) -> None:
        sparse = {}
        for m, blob in hist.items():
            if m in METRICS:
                dense = hdr.decode(blob)
                nz = np.flatnonzero(dense)
                sparse[m] = (nz.astype(np.int32), dense[nz])
        self._items.append((t, sparse))
        self.newest = max(self.newest, t)
        horizon = self.newest - self.span
        if self._items[0][0] <= horizon:
            self._items = [it for it in self._items if it[0] > horizon]

    def sparse(self, metric: str) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        for _, s in self._items:
            if metric in s:
                yield s[metric]

    def dense(self, metric: str) -> np.ndarray:
        return hdr.dense_from_sparse(self.sparse(metric))

    def clear(self) -> None:
        self._items.clear()
        self.newest = 0.0


def merge_dense(windows: Iterable[IntervalWindow], metric: str) -> np.ndarray:
    """HdrHistogram add of several windows: the counts of every bucket summed."""
    return hdr.dense_from_sparse(p for w in windows for p in w.sparse(metric))


# ---- one agent ------------------------------------------------------------------------------


@dataclass
class AgentRow:
    """The headline numbers of one agent (or of the fleet), as the fleet table shows them."""

    name: str
    state: str
    target: str | None = None
    model: str | None = None
    mode: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    in_flight: int | None = None
    out_tok_s: float | None = None
    req_s: float | None = None
    err_s: float | None = None
    ttft_p99_us: int | None = None
    itl_p99_us: int | None = None
    last_seen_s: float | None = None  # seconds since its last Snapshot
    remote_control: bool | None = None
    max_concurrency: int | None = None
    dropped: int = 0
    load_state: str | None = None
    agents: int = 1


@dataclass
class AgentState:
    name: str
    window_s: float = WINDOW_S
    status: dict | None = None
    status_at: float | None = None  # monotonic
    last: Snapshot | None = None
    last_seen: float | None = None  # monotonic, last Snapshot received
    run_id: str | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    received: int = 0  # distinct Snapshots of the current run
    duplicates: int = 0
    late: int = 0
    missing: set[int] = field(default_factory=set)
    runs: int = 0  # runs seen (an agent restart starts a new one)
    window: IntervalWindow = field(default_factory=IntervalWindow)
    counters: deque = field(default_factory=deque)  # (t, Counters) over the window
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    listeners: set = field(default_factory=set)
    resend_asked: float = 0.0  # monotonic, last resend request

    def state(self, now: float, stale_after: float = STALE_AFTER_S) -> str:
        st = (self.status or {}).get("state")
        if st == "offline" and (self.last_seen is None or self.status_at is None
                                or self.last_seen <= self.status_at):
            return "offline"
        if self.last_seen is None:
            if st == "online" and self.status_at is not None \
                    and now - self.status_at > stale_after:
                return "stale"
            return "online" if st == "online" else "unknown"
        return "stale" if now - self.last_seen > stale_after else "online"

    def take(self, snap: Snapshot, now: float) -> bool:
        """Fold in one Snapshot; False for a duplicate (or a Snapshot of an older run)."""
        if snap.run_id != self.run_id:
            if self.last is not None and snap.t < self.last.t:
                return False  # the tail of a previous run, arriving late
            self.run_id = snap.run_id
            self.first_seq = self.last_seq = None
            self.received = self.duplicates = self.late = 0
            self.missing.clear()
            self.window.clear()
            self.counters.clear()
            self.recent.clear()
            self.runs += 1
        seq = snap.seq
        if self.last_seq is not None and seq <= self.last_seq:
            if seq in self.missing:
                self.missing.discard(seq)
                self.late += 1
                self.received += 1
                self.window.add(snap.t, snap.hist)
                return True
            self.duplicates += 1
            return False
        if self.last_seq is None:
            self.first_seq = seq
        elif seq > self.last_seq + 1 and len(self.missing) < MISSING_CAP:
            self.missing.update(range(self.last_seq + 1, min(seq, self.last_seq + 1
                                                             + MISSING_CAP)))
        self.last_seq = seq
        self.received += 1
        self.last = snap
        self.last_seen = now
        self.window.add(snap.t, snap.hist)
        self.counters.append((snap.t, snap.counters))
        while len(self.counters) > 2 and self.counters[1][0] <= snap.t - self.window_s:
            self.counters.popleft()
        self.recent.append(snap)
        for q in self.listeners:
            q.put_nowait(snap)
        return True

    def rates(self) -> tuple[float | None, float | None, float | None]:
        """(output tok/s, req/s, errors/s) over the window."""
        if len(self.counters) < 2:
            return None, None, None
        (t0, a), (t1, b) = self.counters[0], self.counters[-1]
        dt = t1 - t0
        if dt <= 0:
            return None, None, None
        return ((b.output_tokens - a.output_tokens) / dt, (b.requests_ok - a.requests_ok) / dt,
                (b.requests_failed - a.requests_failed) / dt)

    def row(self, now: float, stale_after: float = STALE_AFTER_S) -> AgentRow:
        status = self.status or {}
        out, req, err = self.rates()
        snap = self.last
        row = AgentRow(
            name=self.name,
            state=self.state(now, stale_after),
            target=snap.target.url if snap else status.get("target"),
            model=snap.target.model if snap else status.get("model"),
            out_tok_s=out, req_s=req, err_s=err,
            ttft_p99_us=_p99(self.window.dense("ttft")),
            itl_p99_us=_p99(self.window.dense("itl")),
            last_seen_s=None if self.last_seen is None else now - self.last_seen,
            remote_control=status.get("remote_control"),
            max_concurrency=status.get("max_concurrency"),
            dropped=int(status.get("dropped") or 0),
        )
        if snap is not None:
            ld = snap.load
            row.mode, row.concurrency, row.in_flight = ld.mode, ld.target_concurrency, ld.in_flight
            row.rate, row.load_state = ld.target_rate, ld.state
        return row


def _p99(dense: np.ndarray) -> int | None:
    total = int(dense.sum())
    if total == 0:
        return None
    return hdr.value_at_percentile(np.cumsum(dense), total, 99.0)


# ---- the monitor ----------------------------------------------------------------------------


class FleetMonitor:
    """Watches one fleet on one broker; see the module text."""

    def __init__(self, settings: BrokerSettings, fleet: str = "default", *,
                 stale_after: float = STALE_AFTER_S, window: float = WINDOW_S,
                 max_backoff: float = 30.0) -> None:
        self.settings = settings
        self.fleet = check_level("fleet", fleet)
        self.stale_after = stale_after
        self.window = window
        self.agents: dict[str, AgentState] = {}
        self.version = 0  # bumped on every change, for redraws
        self.bad_payloads = 0
        self._pending: dict[str, tuple[asyncio.Queue, float]] = {}
        self._bg: set[asyncio.Task] = set()
        host = socket.gethostname().split(".")[0][:32] or "host"
        self.link = MqttLink(settings, identifier=f"tokentop-fleet-{self.fleet}-{host}-"
                             f"{os.getpid()}-{uuid.uuid4().hex[:6]}",
                             persistent=True, max_backoff=max_backoff)
        self._task: asyncio.Task | None = None

    @property
    def connected(self) -> bool:
        return self.link.connected.is_set()

    @property
    def last_error(self) -> str | None:
        return self.link.last_error

    async def start(self, wait: float | None = None) -> None:
        """Start watching; with `wait`, wait that long for the first connection."""
        if self._task is None:
            self._task = asyncio.create_task(self.link.run(self._session), name="fleet-monitor")
        if wait:
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self.link.connected.wait(), wait)

    async def close(self) -> None:
        self.link.stop_retrying()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _session(self, client: aiomqtt.Client) -> None:
        base = f"tokentop/{self.fleet}/+"
        await client.subscribe([(f"{base}/snapshot", 1), (f"{base}/status", 1),
                                (f"{base}/control/reply", 1)])
        async for message in client.messages:
            self._dispatch(str(message.topic), bytes(message.payload))

    def _ask_resend(self, client: aiomqtt.Client, st: AgentState, now: float) -> None:
        """Ask the agent for the seqs we are missing (at most once a second per agent)."""
        if not st.missing or now - st.resend_asked < RESEND_EVERY_S or st.run_id is None:
            return
        st.resend_asked = now
        seqs = sorted(st.missing)[:2000]
        ranges: list[list[int]] = []
        for q in seqs:
            if ranges and ranges[-1][1] == q - 1:
                ranges[-1][1] = q
            else:
                ranges.append([q, q])
        req = _json.encode({"run_id": st.run_id, "seqs": ranges[:100]})
        task = asyncio.create_task(client.publish(topic(self.fleet, st.name, "resend"), req,
                                                  qos=1))
        self._bg.add(task)
        task.add_done_callback(self._bg_done)

    def _bg_done(self, task: asyncio.Task) -> None:
        self._bg.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("resend request failed: %s", task.exception())

    def _dispatch(self, name: str, payload: bytes) -> None:
        parts = name.split("/")
        if len(parts) < 4 or parts[0] != "tokentop" or parts[1] != self.fleet:
            return
        agent, kind = parts[2], "/".join(parts[3:])
        now = time.monotonic()
        if not is_level(agent):  # no tokentop agent has such a name: it is not shown
            self.bad_payloads += 1
            log.warning("ignored a %s message from an agent named %r (not a tokentop "
                        "agent name)", plain(kind, 40), plain(agent, 80))
            return
        try:
            if kind == "snapshot":
                self.take_snapshot(agent, decode_snapshot(payload), now)
                client = self.link.client
                if client is not None:
                    self._ask_resend(client, self.agents[agent], now)
            elif kind == "status":
                self._take_status(agent, payload, now)
            elif kind == "control/reply":
                self._take_reply(msgspec.json.decode(payload))
        except (ValueError, msgspec.DecodeError) as e:
            self.bad_payloads += 1
            log.warning("ignored a bad %s message from %s: %s", plain(kind, 40), agent,
                        plain(e, REASON_LIMIT))

    def take_snapshot(self, agent: str, snap: Snapshot, now: float | None = None) -> bool:
        st = self.agents.get(agent)
        if st is None:
            st = self.agents[agent] = AgentState(agent, window_s=self.window,
                                                 window=IntervalWindow(self.window))
        taken = st.take(snap, time.monotonic() if now is None else now)
        self.version += 1
        return taken

    def _take_status(self, agent: str, payload: bytes, now: float) -> None:
        if not payload:  # a cleared retained status: forget the agent
            self.agents.pop(agent, None)
            self.version += 1
            return
        status = msgspec.json.decode(payload)
        if not isinstance(status, dict):
            raise ValueError("status is not a JSON object")
        st = self.agents.get(agent)
        if st is None:
            st = self.agents[agent] = AgentState(agent, window_s=self.window,
                                                 window=IntervalWindow(self.window))
        st.status, st.status_at = plain_all(status, TEXT_LIMIT), now
        self.version += 1

    def _take_reply(self, reply: object) -> None:
        if not isinstance(reply, dict):
            raise ValueError("reply is not a JSON object")
        pending = self._pending.get(reply.get("id"))
        if pending is not None:  # an agent's words, shown by the console: plain, bounded
            pending[0].put_nowait(plain_all(reply, REASON_LIMIT))

    # ---- what the console reads ------------------------------------------------------------

    def rows(self) -> list[AgentRow]:
        now = time.monotonic()
        return [self.agents[n].row(now, self.stale_after) for n in sorted(self.agents)]

    def contributing(self) -> list[AgentState]:
        """Agents whose last Snapshot is recent enough to be in the fleet's window."""
        now = time.monotonic()
        return [a for a in self.agents.values()
                if a.last_seen is not None and now - a.last_seen <= self.window]

    def merged(self, metric: str) -> np.ndarray:
        """The fleet's dense histogram of `metric` over the window: every agent's intervals
        added (HdrHistogram add), so percentiles of it are exact fleet-wide percentiles."""
        return merge_dense((a.window for a in self.contributing()), metric)

    def merged_summary(self, metric: str) -> hdr.Summary:
        return hdr.summarize(self.merged(metric))

    def aggregate(self) -> AgentRow:
        """The fleet's row: rates and in-flight summed, P99s from the merged histograms."""
        now = time.monotonic()
        live = self.contributing()
        rows = [a.row(now, self.stale_after) for a in live]
        states = [a.state(now, self.stale_after) for a in self.agents.values()]
        row = AgentRow(name="fleet", state=f"{states.count('online')}/{len(states)} online",
                       agents=len(live))
        row.out_tok_s = _sum(r.out_tok_s for r in rows)
        row.req_s = _sum(r.req_s for r in rows)
        row.err_s = _sum(r.err_s for r in rows)
        row.in_flight = _sum(r.in_flight for r in rows)
        row.concurrency = _sum(r.concurrency for r in rows if r.mode == "closed")
        row.ttft_p99_us = _p99(self.merged("ttft"))
        row.itl_p99_us = _p99(self.merged("itl"))
        seen = [r.last_seen_s for r in rows if r.last_seen_s is not None]
        row.last_seen_s = min(seen) if seen else None
        row.dropped = sum(r.dropped for r in rows)
        return row

    # ---- control ---------------------------------------------------------------------------

    async def control(self, agent: str, op: str, value: float | None = None,
                      note: str | None = None, timeout: float = REPLY_TIMEOUT_S) -> list[dict]:
        """Send one command to `agent` (or "all") and wait for the replies: one from the agent,
        or one from every agent that is online, until `timeout`. A missing reply is reported
        as refused ("no reply …")."""
        if not self.connected or self.link.client is None:
            raise SourceError(f"not connected to {self.settings.display}")
        cid = uuid.uuid4().hex
        cmd: dict = {"id": cid, "op": op}
        if value is not None:
            cmd["value"] = value
        if note is not None:
            cmd["note"] = note
        now = time.monotonic()
        if agent == "all":
            expect = {a.name for a in self.agents.values()
                      if a.state(now, self.stale_after) in ("online", "stale")}
        else:
            expect = {agent}
        queue: asyncio.Queue = asyncio.Queue()
        self._pending[cid] = (queue, now)
        replies: dict[str, dict] = {}
        try:
            await self.link.client.publish(topic(self.fleet, agent, "control"), _json.encode(cmd),
                                           qos=1)
            deadline = time.monotonic() + timeout
            while not expect <= replies.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    reply = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                replies[str(reply.get("agent"))] = reply
        except aiomqtt.MqttError as e:
            raise SourceError(f"cannot send the command: {e}") from None
        finally:
            self._pending.pop(cid, None)
        for name in sorted(expect - replies.keys()):
            replies[name] = {"id": cid, "agent": name, "op": op, "value": value,
                             "applied": False, "reason": f"no reply within {timeout:g} s"}
        return [replies[n] for n in sorted(replies)]

    def source(self, agent: str) -> FleetAgentSource:
        return FleetAgentSource(self, agent)


def _sum(values: Iterable[float | int | None]):
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


# ---- one agent as a SnapshotSource ----------------------------------------------------------


class FleetAgentSource:
    """One agent's Snapshots from the broker, for the ordinary console."""

    def __init__(self, monitor: FleetMonitor, agent: str, *, own_monitor: bool = False) -> None:
        self.monitor = monitor
        self.agent = agent
        self.own_monitor = own_monitor
        self.description = f"fleet {monitor.fleet}/{agent} via {monitor.settings.display}"
        self._queue: asyncio.Queue[Snapshot | None] = asyncio.Queue()
        self._closed = False

    def status(self) -> SourceStatus:
        return SourceStatus(kind="fleet", description=self.description)

    async def start(self) -> None:
        await self.monitor.start()
        st = self.monitor.agents.get(self.agent)
        if st is None:
            st = self.monitor.agents[self.agent] = AgentState(self.agent)
        for snap in st.recent:
            self._queue.put_nowait(snap)
        st.listeners.add(self._queue)

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        while (snap := await self._queue.get()) is not None:
            yield snap

    async def control(self, msg: Control) -> None:
        """Send to the agent; raises SourceError with the agent's reason when it refuses."""
        replies = await self.monitor.control(self.agent, msg.op, msg.value, msg.note)
        refused = [r for r in replies if not r.get("applied")]
        if refused:
            raise SourceError(str(refused[0].get("reason")))

    async def close(self) -> None:
        """Stop watching (the agent's load goes on)."""
        if self._closed:
            return
        self._closed = True
        st = self.monitor.agents.get(self.agent)
        if st is not None:
            st.listeners.discard(self._queue)
        self._queue.put_nowait(None)
        if self.own_monitor:
            await self.monitor.close()

