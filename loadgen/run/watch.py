"""Facts the run derives from its own Snapshots: SLO breaches, GPU throttling, tokens/J.

They are derived once, in the run (loadgen.run.session), before any sink sees the
Snapshot, so a headless run, an agent, the console, the recording, its replay
and its report all carry the same events. `WatchedSource` applies a Watch to a
source that was recorded without one (or with other SLOs): `tokentop replay --slo`.

* SLO breach / recovery: each whole-run latency threshold of `--slo`
  (`ttft_p99<1s`) judged on the last 10 s, once a second; an event when it starts
  failing ("slo", warn) and when it holds again ("slo", info).
* GPU throttling: an event when a GPU's clocks start being held back for a reason
  that matters (power cap, thermal, …; not idle) and when that ends.
* Tokens per joule: output tokens over GPU energy across the last ~10 s, both over the
  same times (loadgen.model.energy: fresh GPU readings only, the tokens counted by each),
  put in `Snapshot.efficiency`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator

from loadgen.model import units
from loadgen.model.energy import EnergyReadings, Reading, per_joule
from loadgen.model.slo import Slos
from loadgen.model.snapshot import Control, Efficiency, Event, Snapshot
from loadgen.model.source import SnapshotSource, SourceStatus
from loadgen.model.windows import SnapshotWindows
from probes.throttle import BENIGN_REASONS

SLO_WINDOW = "10s"  # the window live SLO checks judge
ENERGY_WINDOW_S = 10.0  # tokens per joule over about this long


class Watch:
    """Feed it every Snapshot in order (with the windows that already hold it)."""

    def __init__(self, slos: Slos | None = None) -> None:
        self.thresholds = [th for th in (slos.thresholds if slos else []) if th.stat is not None]
        self._failing: set[str] = set()
        self._last_second: int | None = None
        self._throttled: dict[int, frozenset[str]] = {}
        self._readings = EnergyReadings()
        self._energy: deque[Reading] = deque()

    def observe(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        """Add this tick's derived events to `snap.events` and its efficiency."""
        self._efficiency(snap)
        self._throttle(snap)
        second = int(snap.elapsed)
        if second != self._last_second:  # once a second is enough for a 10 s window
            self._last_second = second
            self._slo(snap, windows)

    def reset(self) -> None:
        """The stream went back in time (a replay sought backwards): start over."""
        self._failing.clear()
        self._last_second = None
        self._throttled.clear()
        self._readings.reset()
        self._energy.clear()

    # ---- SLO thresholds --------------------------------------------------------------------

    def _slo(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        if not self.thresholds or snap.load.warmup:
            return
        stats = windows.stats(SLO_WINDOW, {th.metric for th in self.thresholds})
        for th in self.thresholds:
            stat = th.stat or ""
            value = (stats.latency.get(th.metric) or {}).get(stat)
            if value is None:
                continue  # nothing finished in the window: no verdict either way
            if not th.passes(value) and th.text not in self._failing:
                self._failing.add(th.text)
                shown = f"{stat.upper()} {units.ms(value)}, last 10 s"
                snap.events.append(Event(t=snap.t, kind="slo", level="warn",
                                         message=f"SLO breach: {th.text} ({shown})"))
            elif th.passes(value) and th.text in self._failing:
                self._failing.discard(th.text)
                shown = f"{stat.upper()} {units.ms(value)}, last 10 s"
                snap.events.append(Event(t=snap.t, kind="slo",
                                         message=f"SLO met again: {th.text} ({shown})"))

    # ---- GPUs ------------------------------------------------------------------------------

    def _throttle(self, snap: Snapshot) -> None:
        for g in snap.gpu.gpus:
            if g.throttle_reasons is None:
                continue
            bad = frozenset(r for r in g.throttle_reasons if r not in BENIGN_REASONS)
            before = self._throttled.get(g.index, frozenset())
            if bad == before:
                continue
            self._throttled[g.index] = bad
            if bad:
                snap.events.append(Event(t=snap.t, kind="gpu", level="warn",
                                         message=f"GPU {g.index} throttled: "
                                         f"{', '.join(sorted(bad))}"))
            else:
                snap.events.append(Event(t=snap.t, kind="gpu",
                                         message=f"GPU {g.index} clocks no longer held back"))

    def _efficiency(self, snap: Snapshot) -> None:
        """Tokens per joule between the fresh GPU readings of the last ~10 s: the energy
        between two readings, and the tokens counted between the same two times."""
        reading = self._readings.see(snap)
        if not self._readings.counting:
            return  # no energy counter on this tick: no figure
        if reading is not None:
            self._energy.append(reading)
        while len(self._energy) > 2 and self._energy[1].t <= snap.t - ENERGY_WINDOW_S:
            self._energy.popleft()
        if len(self._energy) >= 2:
            tpj = per_joule(self._energy[0], self._energy[-1])
            if tpj is not None:
                snap.efficiency = Efficiency(tokens_per_joule=tpj)


class WatchedSource:
    """Any SnapshotSource, judged by a Watch of its own: its recorded SLO events are
    replaced by this Watch's verdicts (the SLOs given now), everything else passes through."""

    def __init__(self, source: SnapshotSource, slos: Slos) -> None:
        self.source = source
        self.watch = Watch(slos)
        self._windows = SnapshotWindows()

    def status(self) -> SourceStatus:
        return self.source.status()

    async def start(self) -> None:
        await self.source.start()

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        async for snap in self.source.snapshots():
            last = self._windows.last
            if last is not None and snap.seq < last.seq:
                self._windows = SnapshotWindows()
                self.watch.reset()
            snap.events = [e for e in snap.events if e.kind != "slo"]
            self._windows.add(snap)
            self.watch.observe(snap, self._windows)
            yield snap

    async def control(self, msg: Control) -> None:
        await self.source.control(msg)

    async def close(self) -> None:
        await self.source.close()
