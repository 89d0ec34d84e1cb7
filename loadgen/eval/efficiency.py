"""The baseline's GPU figures over its measured window: energy per token and per request,
utilisation, GPU memory per request in flight."""

from __future__ import annotations

from pathlib import Path

from loadgen.analysis.report import Report
from loadgen.eval.results import GpuUse
from loadgen.model.energy import EnergyReadings, Reading, per_joule
from loadgen.record.rundir import iter_snapshots


def gpu_use(run_dir: Path, r: Report) -> GpuUse:
    """Output tokens per joule and requests/s per watt (requests per joule) over the
    measured window, the report's rates' own (after warm-up, before the drain): the GPUs'
    energy between the first and last fresh readings inside it, and the tokens and
    requests counted between those same times (loadgen.model.energy); mean GPU
    utilisation and GPU memory per request in flight over its ticks; `energy_why` when the
    GPUs give no energy figure."""
    first = last = None  # the energy readings
    source, util, mem_per = None, [], []
    readings = EnergyReadings()
    for snap in iter_snapshots(run_dir):
        reading = readings.see(snap)
        if not _inside(r, snap.t) or not snap.gpu.gpus:
            continue
        source = source or snap.gpu.source
        if reading is not None and _inside(r, reading.t):
            first, last = first or reading, reading
        gpus = snap.gpu.gpus
        util += [g.utilization_pct for g in gpus if g.utilization_pct is not None]
        mem = sum(g.memory_used_bytes or 0 for g in gpus)
        if snap.load.in_flight and mem:
            mem_per.append(mem / snap.load.in_flight / 1e6)
    energy = _energy_j(first, last)
    return GpuUse(tokens_per_joule=per_joule(first, last) if energy else None,
                  req_s_per_w=per_joule(first, last, "requests_ok") if energy else None,
                  gpu_util_pct=sum(util) / len(util) if util else None,
                  gpu_memory_mb_per_in_flight=sum(mem_per) / len(mem_per) if mem_per else None,
                  gpu_source=source or "none",
                  energy_why=None if energy else "no GPU energy counter (no NVIDIA GPU seen)")


def _inside(r: Report, t: float) -> bool:
    """Within the report's measured window (after warm-up, before the drain)."""
    return r.measured_from is not None and r.measured_to is not None \
        and r.measured_from <= t <= r.measured_to


def _energy_j(a: Reading | None, b: Reading | None) -> float | None:
    """Joules between two readings of the same GPUs; None without two, or when the counter
    went down (a driver reload)."""
    if a is None or b is None or a is b or a.gpus != b.gpus:
        return None
    used = b.energy_j - a.energy_j
    return used if used > 0 else None
