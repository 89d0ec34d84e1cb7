"""--dcgm-url through the baseline: a dcgm-exporter sampled while the load runs, for the
efficiency rows (SM, tensor-pipe and DRAM activity, and the energy its counters say was used)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loadgen.eval.results import Dcgm
from loadgen.record.rundir import iter_snapshots

if TYPE_CHECKING:
    from loadgen.analysis.report import Report


class DcgmWatch:
    """--dcgm-url through the baseline: SM, tensor-pipe and DRAM activity (the means over the
    measured part, every DCGM_EVERY_S) and the energy its counters say was used, or why
    there is none (no --dcgm-url, the exporter not answering, the fields not exported).

    Each sample keeps the time it was scraped at (a scrape takes time of its own: counting
    DCGM_EVERY_S a sample read −20 % with a 0.25 s scrape), and only the samples inside the
    run's measured window count (the watch starts before the Session and ends after the
    drain): tokens per joule is the energy between the first and last of them over the
    tokens the recording says arrived between those same times."""

    def __init__(self, url: str | None, warmup_s: float) -> None:
        self.url = url
        self.warmup_s = warmup_s
        self.samples: list[tuple[float, list]] = []  # (unix time, the GPUs' DcgmGpu)
        self.error: str | None = None if url else "no --dcgm-url"

    async def run(self) -> None:
        if self.url is None:
            return
        import aiohttp

        from probes.dcgm import DcgmProbe

        async with aiohttp.ClientSession() as session:
            probe = DcgmProbe(self.url, session)
            await asyncio.sleep(self.warmup_s)
            while True:
                before = time.time()
                got = await probe.sample()
                if got.ok:  # the exporter read its counters during the scrape: its middle
                    self.samples.append(((before + time.time()) / 2, got.gpus))
                else:
                    self.error = got.error
                await asyncio.sleep(DCGM_EVERY_S)

    def result(self, run_dir: Path, report: Report) -> Dcgm:
        """The figures over the report's measured window (after warm-up, before the drain),
        the tokens from the run's recording."""
        window = (report.measured_from, report.measured_to)
        if window[0] is None or window[1] is None:
            return self.figures(None, lambda _t: 0.0)
        return self.figures((window[0], window[1]), arrived_tokens(run_dir))

    def figures(self, window: tuple[float, float] | None,
                tokens_at: Callable[[float], float]) -> Dcgm:
        from probes.dcgm import energy_between

        inside = [(t, gpus) for t, gpus in self.samples
                  if window is not None and window[0] <= t <= window[1]]
        if not inside:
            return Dcgm(why=self.error or ("no sample inside the measured run" if self.samples
                                           else "no sample"))
        out: dict[str, Any] = {}
        for field_name in ("sm_active", "tensor_active", "dram_active"):
            values = [getattr(g, field_name) for _, gpus in inside for g in gpus
                      if getattr(g, field_name) is not None]
            out[field_name] = sum(values) / len(values) if values else None
        (t0, first), (t1, last) = inside[0], inside[-1]
        joules = energy_between(first, last) if t1 > t0 else None
        tokens = tokens_at(t1) - tokens_at(t0)
        out["tokens_per_joule"] = tokens / joules if joules and tokens > 0 else None
        why = "" if any(v is not None for v in out.values()) else \
            "the exporter gives none of DCGM_FI_PROF_SM_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE"
        return Dcgm(**out, why=why)


def arrived_tokens(run_dir: Path) -> Callable[[float], float]:
    """The output tokens the recording says had arrived by a time (unix), linear between
    its ticks."""
    t, n = [], []
    for snap in iter_snapshots(run_dir):
        t.append(snap.t)
        n.append(snap.counters.output_tokens)
    times, counts = np.array(t, float), np.array(n, float)
    return lambda at: float(np.interp(at, times, counts)) if len(times) else 0.0


DCGM_EVERY_S = 1.0
