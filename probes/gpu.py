"""Which GPU source a run shows: real NVML, the simulator's GPU, or nothing (with why)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import aiohttp

from loadgen.model.snapshot import Event, GpuStatus
from probes.nvml import NvmlProbe
from probes.sim_gpu import SimGpuProbe


class GpuProbe:
    def __init__(
        self,
        nvml: NvmlProbe | None = None,
        sim: SimGpuProbe | None = None,
        message: str | None = None,
    ) -> None:
        self._nvml = nvml
        self._sim = sim
        self._message = message

    @property
    def source(self) -> str:
        if self._nvml is not None:
            return "nvml"
        return "simulated" if self._sim is not None else "none"

    @classmethod
    async def create(
        cls,
        root_url: str | None,
        session: aiohttp.ClientSession,
        *,
        nvml: NvmlProbe | None = None,
    ) -> GpuProbe:
        """NVML when it works, else the target's simulated GPU, else a reasoned "none".

        `nvml` lets a caller hand in a probe it already opened; by default one
        is opened here, in a thread, because nvmlInit can block for seconds.
        """
        probe = nvml if nvml is not None else await asyncio.to_thread(NvmlProbe)
        if probe.available:
            return cls(nvml=probe)
        reason = probe.message
        probe.close()
        if root_url and await SimGpuProbe.detect(root_url, session):
            return cls(sim=SimGpuProbe(root_url, session))
        return cls(message=reason or "no GPU data source")

    async def sample(self) -> GpuStatus:
        if self._nvml is not None:
            # NVML calls block in the driver: keep them off the event loop.
            return await asyncio.to_thread(self._nvml.sample)
        if self._sim is not None:
            return await self._sim.sample()
        return GpuStatus(source="none", message=self._message)

    def drain_events(self) -> list[Event]:
        """GPU events since the last call (Xid errors, GPUs lost), oldest first; [] without NVML."""
        return self._nvml.drain_events() if self._nvml is not None else []

    def set_server_pids(self, pids: Iterable[int]) -> None:
        """The server's pids (e.g. `ProcessProbe.pids()`): listed first among GPU processes."""
        if self._nvml is not None:
            self._nvml.set_server_pids(pids)

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()
