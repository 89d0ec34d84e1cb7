"""Several agents' Snapshots as one: the fleet's arithmetic, in one place.

The live fleet view (loadgen.fleet.merged) merges whatever arrived since its last tick; a
fleet job (loadgen.run.fleet_load) merges each agent's tick N, as every agent of a job
started together with the same tick. Both add interval histograms bucket by bucket, so
each percentile of the merge is an exact fleet-wide one, list each agent's GPUs under its
name and prefix each agent's events with it.
"""

from __future__ import annotations

import msgspec

from loadgen.model import hdr
from loadgen.model.snapshot import (
    ClassTick,
    ClientSample,
    Counters,
    Event,
    GpuStatus,
    LoadState,
    Snapshot,
)


def add_hists(dense: dict, hist: dict[str, str]) -> None:
    """`hist`'s encoded interval histograms added into `dense` (metric -> dense counts)."""
    for metric, blob in hist.items():
        d = hdr.decode(blob)
        dense[metric] = dense[metric] + d if metric in dense else d


def encoded(dense: dict) -> dict[str, str]:
    return {m: hdr.encode(d) for m, d in dense.items()}


def tagged(agent: str, e: Event) -> Event:
    return msgspec.structs.replace(e, message=f"{agent}: {e.message}")


def gpus_by_agent(live: dict[str, Snapshot]) -> GpuStatus:
    """Every agent's GPUs, named agent/GPU, numbered across the fleet."""
    gpus = []
    for name in sorted(live):
        for g in live[name].gpu.gpus:
            gpus.append(msgspec.structs.replace(g, index=len(gpus), name=f"{name}/{g.name}"))
    sources = {s.gpu.source for s in live.values()}
    source = "nvml" if "nvml" in sources else ("simulated" if gpus else "none")
    return GpuStatus(source=source, gpus=gpus,
                     message=None if gpus else "no agent reports a GPU")


def job_tick(run_id: str, seq: int, ticks: dict[str, Snapshot],
             latest: dict[str, Snapshot]) -> Snapshot:
    """Tick `seq` of a fleet job: `ticks` holds the agents that sent their tick `seq`,
    `latest` every agent's last Snapshot up to it (an agent whose run ended sooner, or
    whose tick was lost, still counts with its last counters, without histograms).
    Counters are cumulative, so they are summed as they stand; the load state is the
    fleet's: warm-up while any agent warms up, draining from the first agent's drain,
    stopped when all have stopped."""
    first = latest[min(latest)]
    counters = Counters()
    for snap in latest.values():
        counters.add(snap.counters)
    dense: dict = {}
    for snap in ticks.values():
        add_hists(dense, snap.hist)
    newest = max(ticks.values() or latest.values(), key=lambda s: s.t)
    return Snapshot(
        run_id=run_id, seq=seq, t=newest.t, elapsed=newest.elapsed,
        interval=max(s.interval for s in (ticks or latest).values()),
        target=first.target,
        load=_load(list(latest.values()), running=set(ticks)),
        counters=counters, hist=encoded(dense),
        server=first.server,  # the same server, scraped by each agent: the first's
        gpu=gpus_by_agent(latest),
        client=_client(list(latest.values())),
        events=[tagged(name, e) for name in sorted(ticks) for e in ticks[name].events],
        classes=_classes(ticks, latest),
    )


def _load(loads: list[Snapshot], running: set[str]) -> LoadState:
    states = {s.load.state for s in loads}
    # one agent's load over is the fleet's drain begun: the windows end the load there
    state = ("stopped" if states == {"stopped"} else
             "draining" if "draining" in states or "stopped" in states else
             "running" if "running" in states else min(states))
    rates = [s.load.target_rate for s in loads if s.load.target_rate is not None]
    return LoadState(
        mode=loads[0].load.mode, state=state,  # type: ignore[arg-type]
        target_concurrency=sum(s.load.target_concurrency for s in loads),
        target_rate=sum(rates) if rates else None,
        in_flight=sum(s.load.in_flight for s in loads),
        backlog=sum(s.load.backlog for s in loads),
        warmup=any(s.load.warmup for s in loads),
        stalled=sum(s.load.stalled for s in loads),
        stalled_first=sum(s.load.stalled_first for s in loads),
        health=max((s.load.health for s in loads), key=("up", "degraded", "outage").index),
        outage_since=min((s.load.outage_since for s in loads if s.load.outage_since),
                         default=None),
        note=f"{len(loads)} agents ({len(running)} reported this tick)",
    )


def _client(snaps: list[Snapshot]) -> ClientSample:
    """The client side of the fleet: every worker, the worst loop lag of any."""
    lags = [s.client.loop_lag_ms for s in snaps if s.client.loop_lag_ms is not None]
    cpus = [s.client.cpu_pct for s in snaps if s.client.cpu_pct is not None]
    per = [c for s in snaps for c in (s.client.worker_cpu_pct or [])]
    return ClientSample(workers=sum(s.client.workers for s in snaps),
                        cpu_pct=sum(cpus) if cpus else None, worker_cpu_pct=per or None,
                        loop_lag_ms=max(lags) if lags else None)


def _classes(ticks: dict[str, Snapshot], latest: dict[str, Snapshot]) -> dict[str, ClassTick]:
    names = [n for s in latest.values() for n in s.classes]
    out = {}
    for name in dict.fromkeys(names):
        counters = Counters()
        for snap in latest.values():
            if name in snap.classes:
                counters.add(snap.classes[name].counters)
        dense: dict = {}
        for snap in ticks.values():
            if name in snap.classes:
                add_hists(dense, snap.classes[name].hist)
        out[name] = ClassTick(counters=counters, hist=encoded(dense))
    return out
