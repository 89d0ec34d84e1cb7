"""--dcgm-url through the baseline: a dcgm-exporter sampled while the load runs, for the
efficiency rows (SM, tensor-pipe and DRAM activity, and the energy its counters say was used)."""

from __future__ import annotations

import asyncio
from typing import Any

from loadgen.eval.results import Dcgm


class DcgmWatch:
    """--dcgm-url through the baseline: SM, tensor-pipe and DRAM activity (the means over the
    measured part, every DCGM_EVERY_S) and the energy its counters say was used, or why
    there is none (no --dcgm-url, the exporter not answering, the fields not exported)."""

    def __init__(self, url: str | None, warmup_s: float) -> None:
        self.url = url
        self.warmup_s = warmup_s
        self.samples: list = []
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
                got = await probe.sample()
                if got.ok:
                    self.samples.append(got.gpus)
                else:
                    self.error = got.error
                await asyncio.sleep(DCGM_EVERY_S)

    def result(self, output_tok_s: float | None, seconds: float) -> Dcgm:
        from probes.dcgm import energy_between

        if not self.samples:
            return Dcgm(why=self.error or "no sample")
        out: dict[str, Any] = {}
        for field_name in ("sm_active", "tensor_active", "dram_active"):
            values = [getattr(g, field_name) for gpus in self.samples for g in gpus
                      if getattr(g, field_name) is not None]
            out[field_name] = sum(values) / len(values) if values else None
        joules = energy_between(self.samples[0], self.samples[-1])
        span = DCGM_EVERY_S * (len(self.samples) - 1)
        out["tokens_per_joule"] = (output_tok_s * span / joules
                                   if joules and output_tok_s and span else None)
        why = "" if any(v is not None for v in out.values()) else \
            "the exporter gives none of DCGM_FI_PROF_SM_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE"
        return Dcgm(**out, why=why)


DCGM_EVERY_S = 1.0
