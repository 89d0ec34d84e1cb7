"""The simulated GPU: memory, utilisation, power, energy and temperature.

It has no timer of its own. Each read advances the state from the previous
read with exact first-order (exponential) updates, so reading once a second
or ten times a second gives the same curves:

* memory = gpu_memory_utilization × the GPU's memory, from the start and whatever the
  load, as vLLM preallocates its weights, activations and whole KV pool (so a leak inside
  the pool never moves it: the engine's own KV figures are what show one);
* utilisation = the fraction of wall time the engine spent inside steps, smoothed (~1 s):
  what NVML reports (a kernel was running), so one busy sequence already reads ~100 %;
* batch occupancy = running sequences / slots, smoothed (~1 s);
* power = idle + (limit − idle) × utilisation × (0.5 + 0.5 × occupancy), smoothed
  (~0.5 s): a GPU busy with one sequence draws about half of what a full batch does;
  energy integrates it;
* temperature follows power with a slow lag (~30 s), as a heatsink does.

With `gpu_count` > 1 (tensor parallelism) every GPU holds the same preallocated share and
shows the same utilisation and power; /sim/gpu then answers
`{"gpus": [...]}`, one object per GPU (a single GPU stays one plain object).
"""

from __future__ import annotations

import math
from typing import Any

from loadgen.sim.model import BatchModel

UTIL_TAU_S = 1.0
POWER_TAU_S = 0.5
TEMP_TAU_S = 30.0


class SimGpu:
    def __init__(self, engine: BatchModel) -> None:
        self._engine = engine
        cfg = engine.cfg
        self._t: float | None = None
        self._busy = 0.0
        self._util = 0.0  # 0..1
        self._occupancy = 0.0  # 0..1
        self._power = cfg.idle_power_w
        self._energy = 0.0
        self._temp = cfg.ambient_c + cfg.c_per_watt * cfg.idle_power_w  # idle equilibrium

    def _advance(self, now: float) -> None:
        engine = self._engine
        cfg = engine.cfg
        busy = engine.busy_seconds(now)
        if self._t is None:
            self._t, self._busy = now, busy
            return
        dt = now - self._t
        if dt <= 0:
            return
        busy_frac = min(1.0, max(0.0, (busy - self._busy) / dt))
        smooth = 1.0 - math.exp(-dt / UTIL_TAU_S)
        self._util += (busy_frac - self._util) * smooth
        occupancy = min(1.0, engine.num_running / cfg.slots)
        self._occupancy += (occupancy - self._occupancy) * smooth
        work = self._util * (0.5 + 0.5 * self._occupancy)
        target_w = cfg.idle_power_w + (cfg.power_limit_w - cfg.idle_power_w) * work
        old_w = self._power
        self._power += (target_w - old_w) * (1.0 - math.exp(-dt / POWER_TAU_S))
        self._energy += 0.5 * (old_w + self._power) * dt  # trapezoid
        target_c = cfg.ambient_c + cfg.c_per_watt * self._power
        self._temp += (target_c - self._temp) * (1.0 - math.exp(-dt / TEMP_TAU_S))
        self._t, self._busy = now, busy

    def memory_used_bytes(self) -> int:
        """Preallocated at start, the same on every GPU: flat whatever runs or leaks."""
        cfg = self._engine.cfg
        return int(cfg.gpu_memory_utilization * cfg.gpu_memory_bytes)

    def sample(self) -> dict[str, Any]:
        """The /sim/gpu body; field names are those of loadgen.model.snapshot.GpuSample."""
        self._advance(self._engine.now())
        cfg = self._engine.cfg
        if cfg.gpu_count == 1:
            return self._one(0)
        return {"gpus": [self._one(i) for i in range(cfg.gpu_count)]}

    def _one(self, index: int) -> dict[str, Any]:
        cfg = self._engine.cfg
        return {
            "index": index,
            "name": cfg.gpu_name,
            "simulated": True,
            "memory_used_bytes": self.memory_used_bytes(),
            "memory_total_bytes": cfg.gpu_memory_bytes,
            "utilization_pct": round(self._util * 100.0, 3),
            "power_w": round(self._power, 3),
            "power_limit_w": cfg.power_limit_w,
            "temperature_c": round(self._temp, 3),
            "energy_j": round(self._energy, 3),
        }
