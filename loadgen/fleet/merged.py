"""The whole fleet as one run: a SnapshotSource for the ordinary console.

Once a tick it takes every Snapshot the agents sent since the last tick and
builds one fleet Snapshot from them: interval histograms added bucket by
bucket (so every percentile the console shows is an exact fleet-wide one),
counters summed (each agent counted from the moment it was first seen, and an
agent that restarts keeps what its earlier run contributed, so fleet totals
never go backwards), load summed, every agent's GPUs listed under its name,
and every agent's events, prefixed with its name.

It is read-only: steering happens per agent (or all agents) from the fleet list.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec

from loadgen.fleet.monitor import AgentState, FleetMonitor
from loadgen.fleet.tick_merge import add_hists, encoded, gpus_by_agent, tagged
from loadgen.model.snapshot import (
    Control,
    Counters,
    LoadState,
    Snapshot,
    Target,
)
from loadgen.model.source import SourceError, SourceStatus

TICK_S = 0.5


class _Contribution:
    """What one agent adds to the fleet totals: its current run's counters counted from
    when we first saw that run, plus everything its earlier runs added."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.base = Counters()
        self.earlier = Counters()
        self.latest = Counters()

    def update(self, snap: Snapshot) -> bool:
        """Take the agent's next Snapshot; False when its histograms must be left out of the
        fleet's, to stay consistent with the counters."""
        counted = True
        if snap.run_id != self.run_id:
            if self.run_id is not None:
                self.earlier.add(self.latest.since(self.base))
            self.run_id = snap.run_id
            if snap.seq == 0:
                # a run (or a restart) seen from its first tick: all of it counts
                self.base = Counters()
            else:
                # joined mid-run: count from here; what this tick holds is before our base
                # (its counters are the base), so its histograms are left out as well
                self.base = snap.counters
                counted = False
        self.latest = snap.counters
        return counted

    def total(self) -> Counters:
        out = Counters()
        out.add(self.earlier)
        out.add(self.latest.since(self.base))
        return out


class FleetMergedSource:

    def __init__(self, monitor: FleetMonitor, *, tick: float = TICK_S) -> None:
        self.monitor = monitor
        self.tick = tick
        self.description = (f"fleet {monitor.fleet}: all agents merged via "
                            f"{monitor.settings.display}")
        self._queues: dict[str, asyncio.Queue[Snapshot]] = {}
        self._shares: dict[str, _Contribution] = {}
        self._closed = False
        self._seq = 0
        self._t0 = time.time()

    def status(self) -> SourceStatus:
        return SourceStatus(kind="fleet", description=self.description)

    async def start(self) -> None:
        await self.monitor.start()
        self._listen()

    def _listen(self) -> None:
        """Follow every agent, including ones that appear later."""
        for name, st in self.monitor.agents.items():
            if name not in self._queues:
                q: asyncio.Queue[Snapshot] = asyncio.Queue()
                self._queues[name] = q
                st.listeners.add(q)
                if st.last is not None:
                    # before we listened: a base for the counters, never histograms
                    self._share(name).update(msgspec.structs.replace(st.last, seq=max(
                        1, st.last.seq)))

    def _share(self, agent: str) -> _Contribution:
        share = self._shares.get(agent)
        if share is None:
            share = self._shares[agent] = _Contribution()
        return share

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        while not self._closed:
            await asyncio.sleep(self.tick)
            self._listen()
            yield self.merge()

    def merge(self) -> Snapshot:
        """One fleet Snapshot from what every agent sent since the last call."""
        fresh: dict[str, list[Snapshot]] = {}
        dense: dict = {}
        for name, q in self._queues.items():
            while not q.empty():
                snap = q.get_nowait()
                fresh.setdefault(name, []).append(snap)
                if self._share(name).update(snap):
                    add_hists(dense, snap.hist)
        now = time.time()
        self._seq += 1
        live = self._live()
        return Snapshot(
            run_id=f"fleet-{self.monitor.fleet}",
            seq=self._seq,
            t=now,
            elapsed=now - self._t0,
            interval=self.tick,
            target=self._target(live),
            load=self._load(live),
            counters=self._counters(),
            hist=encoded(dense),
            gpu=gpus_by_agent(live),
            events=[tagged(name, e) for name, snaps in fresh.items()
                    for snap in snaps for e in snap.events],
        )

    def _live(self) -> dict[str, Snapshot]:
        return {a.name: a.last for a in self.monitor.contributing() if a.last is not None}

    def _target(self, live: dict[str, Snapshot]) -> Target:
        models = {s.target.model for s in live.values()}
        model = models.pop() if len(models) == 1 else ("mixed" if models else "n/a")
        return Target(url=f"{len(live)} of {len(self.monitor.agents)} agents",
                      model=model, simulated=any(s.target.simulated for s in live.values()))

    @staticmethod
    def _load(live: dict[str, Snapshot]) -> LoadState:
        loads = [s.load for s in live.values()]
        modes = {ld.mode for ld in loads}
        rates = [ld.target_rate for ld in loads if ld.target_rate is not None]
        states = {ld.state for ld in loads}
        return LoadState(
            mode=modes.pop() if len(modes) == 1 else "closed",
            state=states.pop() if len(states) == 1 else ("running" if loads else "stopped"),
            target_concurrency=sum(ld.target_concurrency for ld in loads),
            target_rate=sum(rates) if rates else None,
            in_flight=sum(ld.in_flight for ld in loads),
            backlog=sum(ld.backlog for ld in loads),
            outage_since=min((ld.outage_since for ld in loads if ld.outage_since), default=None),
            note=f"fleet of {len(loads)} agents: load is steered per agent from the list",
        )

    def _counters(self) -> Counters:
        out = Counters()
        for share in self._shares.values():
            out.add(share.total())
        return out

    async def control(self, msg: Control) -> None:
        raise SourceError("the merged fleet view is read-only: steer agents from the fleet "
                          "list (select one, or press a there for all)")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name, q in self._queues.items():
            st: AgentState | None = self.monitor.agents.get(name)
            if st is not None:
                st.listeners.discard(q)

