"""The embedded simulator's pretend GPU, read from its `/sim/gpu` endpoint.

Used only when NVML has no GPU and the target is a simulator: the samples are
marked `simulated` so the console can label them as such.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import msgspec

from loadgen.model.snapshot import GpuSample, GpuStatus
from probes.server_metrics import server_root

TIMEOUT_S = 2.0
_DETECT_TIMEOUT_S = 1.0


class SimGpuProbe:
    def __init__(self, root_url: str, session: aiohttp.ClientSession) -> None:
        self.url = server_root(root_url) + "/sim/gpu"
        self._session = session

    async def sample(self) -> GpuStatus:
        start = time.perf_counter()
        try:
            payload = await _get_json(self._session, self.url, TIMEOUT_S)
            gpus = parse_sim_gpus(payload)
        except Exception as exc:
            return GpuStatus(
                source="simulated", message=f"simulated GPU unreachable: {_reason(exc)}"
            )
        return GpuStatus(
            source="simulated", gpus=gpus, poll_ms=(time.perf_counter() - start) * 1000.0
        )

    @staticmethod
    async def detect(root_url: str, session: aiohttp.ClientSession) -> bool:
        """True when the target serves a simulated GPU (answers 200 with JSON)."""
        try:
            payload = await _get_json(
                session, server_root(root_url) + "/sim/gpu", _DETECT_TIMEOUT_S
            )
            parse_sim_gpus(payload)
        except Exception:
            return False
        return True


def parse_sim_gpus(payload: Any) -> list[GpuSample]:
    """Accept one GPU object, a list of them, or {"gpus": [...]}; all marked simulated."""
    if isinstance(payload, dict) and isinstance(payload.get("gpus"), list):
        items = payload["gpus"]
    elif isinstance(payload, list):
        items = payload
    elif isinstance(payload, dict):
        items = [payload]
    else:
        raise ValueError(f"unexpected JSON ({type(payload).__name__})")
    gpus = [msgspec.convert(item, GpuSample, strict=False) for item in items]
    for gpu in gpus:
        gpu.simulated = True  # whatever the server says, this is not a real GPU
    return gpus


async def _get_json(session: aiohttp.ClientSession, url: str, timeout_s: float) -> Any:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.get(url, timeout=timeout) as resp:
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status} from {url}")
        return await resp.json(content_type=None)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return f"timed out after {TIMEOUT_S} s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, msgspec.ValidationError):
        return f"unexpected JSON: {exc}"
    return str(exc) or type(exc).__name__
