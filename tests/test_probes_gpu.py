"""GPU probes on a machine without an NVIDIA GPU.

The real NVML path is exercised in tests/gpu/. Here NVML is absent for real,
the simulator's GPU is served by a real aiohttp server on loopback, and the
per-metric "not supported" paths use a fake `pynvml` module (the one thing
that cannot exist here) that raises pynvml's own error classes.
"""

from __future__ import annotations

import logging
import sys
import threading
import types
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pynvml
import pytest
from aiohttp import web

from probes import nvml as nvml_module
from probes.gpu import GpuProbe
from probes.nvml import NvmlProbe
from probes.sim_gpu import SimGpuProbe
from probes.throttle import decode_throttle_reasons


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


needs_no_nvml = pytest.mark.skipif(_nvml_works(), reason="this machine has a working NVML")

# -- a fake pynvml ------------------------------------------------------------


class FakeNvml(types.ModuleType):
    """Two GPUs. GPU 0 is an old consumer card: no power reading, no memory v2."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_Unknown = pynvml.NVMLError_Unknown
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, init_error: Exception | None = None) -> None:
        super().__init__("pynvml")
        self.calls: Counter[tuple[str, int]] = Counter()
        self.threads: set[str] = set()
        self.init_error = init_error
        self.lost: set[int] = set()
        self.flaky_temperature: set[int] = set()
        self.energy_mj = [1_000_000, 2_000_000]
        self.shut_down = False

    def _call(self, name: str, handle: int) -> None:
        self.calls[(name, handle)] += 1
        self.threads.add(threading.current_thread().name)
        if handle in self.lost:
            raise pynvml.NVMLError_GpuIsLost()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes | str:
        return b"NVIDIA GeForce GTX 1080" if handle == 0 else "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        self._call("memory_v2" if version else "memory_v1", handle)
        if version and handle == 0:
            raise pynvml.NVMLError_FunctionNotFound()
        used = 3 * 2**30 if version else 4 * 2**30  # v1 counts reserved memory as used
        return types.SimpleNamespace(used=used, total=80 * 2**30, free=0)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._call("utilization", handle)
        return types.SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._call("power", handle)
        if handle == 0:
            raise pynvml.NVMLError_NotSupported()
        return 350_500  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        self._call("power_limit", handle)
        return 700_000

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._call("temperature", handle)
        if handle in self.flaky_temperature:
            raise pynvml.NVMLError_Unknown()
        return 61

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self._call("energy", handle)
        self.energy_mj[handle] += 1500
        return self.energy_mj[handle]


# -- NVML --------------------------------------------------------------------


@needs_no_nvml
def test_nvml_absent_here_gives_reason() -> None:
    probe = NvmlProbe()
    assert probe.available is False
    assert probe.message is not None
    assert "libnvidia-ml.so.1" in probe.message or "NVML" in probe.message
    status = probe.sample()
    assert status.source == "none"
    assert status.gpus == []
    assert status.message == probe.message
    probe.close()
    probe.close()  # idempotent


def test_library_not_found_words() -> None:
    probe = NvmlProbe(module=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound()))
    assert not probe.available
    assert probe.message == "no NVIDIA driver found (libnvidia-ml.so.1 could not be loaded)"


def test_other_init_failure_words() -> None:
    probe = NvmlProbe(module=FakeNvml(init_error=pynvml.NVMLError_Unknown()))
    assert probe.message == "NVML init failed: Unknown Error"


def test_unsupported_metrics_are_none_and_not_asked_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml()
    # Through sys.modules, as the real import in NvmlProbe would find it.
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    caplog.set_level(logging.DEBUG, logger="probes.nvml")
    probe = NvmlProbe()
    assert probe.available and probe.message is None

    first = probe.sample()
    assert first.source == "nvml"
    assert first.message is None
    assert first.poll_ms is not None and first.poll_ms >= 0
    old, new = first.gpus
    assert (old.index, old.name) == (0, "NVIDIA GeForce GTX 1080")
    assert old.power_w is None  # not supported: n/a, not 0
    assert old.memory_used_bytes == 4 * 2**30  # fell back to v1
    assert old.memory_total_bytes == 80 * 2**30
    assert old.utilization_pct == 87.0
    assert old.power_limit_w == 700.0
    assert old.temperature_c == 61.0
    assert old.energy_j == pytest.approx(1001.5)
    assert not old.simulated
    assert new.name == "NVIDIA H100 80GB HBM3"
    assert new.power_w == pytest.approx(350.5)
    assert new.memory_used_bytes == 3 * 2**30  # v2 where supported

    for _ in range(3):
        again = probe.sample()
    assert again.gpus[0].power_w is None
    assert again.gpus[0].memory_used_bytes == 4 * 2**30
    assert again.gpus[0].energy_j == pytest.approx(1006.0)  # the counter keeps moving

    # The unsupported calls happened once; the rest on every poll.
    assert fake.calls[("power", 0)] == 1
    assert fake.calls[("memory_v2", 0)] == 1
    assert fake.calls[("memory_v1", 0)] == 4
    assert fake.calls[("power", 1)] == 4
    assert fake.calls[("memory_v2", 1)] == 4
    assert fake.calls[("memory_v1", 1)] == 0

    # Quiet after the first time: one line per (device, metric).
    power_lines = [r for r in caplog.records if "power not available" in r.getMessage()]
    assert len(power_lines) == 1
    assert all(r.levelno <= logging.INFO for r in caplog.records)

    probe.close()
    assert fake.shut_down
    assert probe.sample().gpus == []


def test_transient_error_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    fake.flaky_temperature.add(1)
    probe = NvmlProbe(module=fake)
    assert probe.sample().gpus[1].temperature_c is None
    assert probe.sample().gpus[1].temperature_c is None
    assert fake.calls[("temperature", 1)] == 1  # not retried within the back-off

    monkeypatch.setattr(nvml_module, "RETRY_AFTER_S", 0.0)
    fake.flaky_temperature.clear()
    probe._devices[1].retry_at.clear()  # back-off elapsed
    assert probe.sample().gpus[1].temperature_c == 61.0


def test_gpu_lost_mid_run_does_not_crash() -> None:
    fake = FakeNvml()
    probe = NvmlProbe(module=fake)
    assert probe.sample().gpus[1].utilization_pct == 87.0

    fake.lost.add(1)
    status = probe.sample()
    assert status.source == "nvml"
    lost = status.gpus[1]
    assert (lost.index, lost.name) == (1, "NVIDIA H100 80GB HBM3")
    assert lost.memory_used_bytes is None
    assert lost.utilization_pct is None
    assert lost.power_w is None and lost.energy_j is None
    assert status.message is not None
    assert "GPU 1 (NVIDIA H100 80GB HBM3) is lost" in status.message
    assert status.gpus[0].utilization_pct == 87.0  # the other GPU carries on

    calls_before = sum(n for (_, h), n in fake.calls.items() if h == 1)
    again = probe.sample()
    assert again.gpus[1].utilization_pct is None
    assert again.message == status.message
    assert sum(n for (_, h), n in fake.calls.items() if h == 1) == calls_before


# -- simulated GPU and the choice of source -----------------------------------

SIM_GPU = {
    "index": 0,
    "name": "Simulated H100",
    "simulated": True,
    "memory_used_bytes": 40 * 2**30,
    "memory_total_bytes": 80 * 2**30,
    "utilization_pct": 73.5,
    "power_w": 412.0,
    "power_limit_w": 700.0,
    "temperature_c": 64,
    "energy_j": 12345.5,
}


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def sim_root() -> AsyncIterator[str]:
    async def gpu(_: web.Request) -> web.Response:
        return web.json_response(SIM_GPU)

    app = web.Application()
    app.router.add_get("/sim/gpu", gpu)
    runner, root = await _serve(app)
    try:
        yield root
    finally:
        await runner.cleanup()


@pytest.fixture
async def plain_root() -> AsyncIterator[str]:
    """A server that is not the simulator: no /sim/gpu."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner, root = await _serve(app)
    try:
        yield root
    finally:
        await runner.cleanup()


def _check_sim_values(status: Any) -> None:
    assert status.source == "simulated"
    assert status.message is None
    (gpu,) = status.gpus
    assert gpu.simulated is True
    assert gpu.name == "Simulated H100"
    assert gpu.memory_used_bytes == 40 * 2**30
    assert gpu.memory_total_bytes == 80 * 2**30
    assert gpu.utilization_pct == 73.5
    assert gpu.power_w == 412.0
    assert gpu.power_limit_w == 700.0
    assert gpu.temperature_c == 64.0
    assert gpu.energy_j == 12345.5


@needs_no_nvml
async def test_create_falls_back_to_simulated_gpu(
    sim_root: str, session: aiohttp.ClientSession
) -> None:
    probe = await GpuProbe.create(sim_root, session)
    assert probe.source == "simulated"
    _check_sim_values(await probe.sample())
    probe.close()


@needs_no_nvml
async def test_create_without_simulator_says_why(
    plain_root: str, session: aiohttp.ClientSession
) -> None:
    reason = NvmlProbe().message
    probe = await GpuProbe.create(plain_root + "/v1", session)
    assert probe.source == "none"
    status = await probe.sample()
    assert status.source == "none"
    assert status.gpus == []
    assert status.message == reason
    probe.close()


async def test_create_with_broken_nvml_uses_simulator(
    sim_root: str, session: aiohttp.ClientSession
) -> None:
    broken = NvmlProbe(module=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound()))
    probe = await GpuProbe.create(sim_root + "/v1/", session, nvml=broken)
    _check_sim_values(await probe.sample())


async def test_create_prefers_nvml_and_samples_off_the_loop(
    sim_root: str, session: aiohttp.ClientSession
) -> None:
    fake = FakeNvml()
    probe = await GpuProbe.create(sim_root, session, nvml=NvmlProbe(module=fake))
    assert probe.source == "nvml"
    status = await probe.sample()
    assert status.source == "nvml"
    assert len(status.gpus) == 2
    assert threading.main_thread().name not in fake.threads
    probe.close()
    assert fake.shut_down


async def test_sim_detect_and_unreachable(sim_root: str, session: aiohttp.ClientSession) -> None:
    assert await SimGpuProbe.detect(sim_root, session)
    assert not await SimGpuProbe.detect(sim_root + "/nothing-here", session)

    probe = SimGpuProbe("http://127.0.0.1:9", session)  # discard port: nothing listens
    assert not await SimGpuProbe.detect("http://127.0.0.1:9", session)
    status = await probe.sample()
    assert status.source == "simulated"
    assert status.gpus == []
    assert status.message is not None
    assert status.message.startswith("simulated GPU unreachable: ")


async def test_sim_accepts_a_list_of_gpus(session: aiohttp.ClientSession) -> None:
    async def gpus(_: web.Request) -> web.Response:
        return web.json_response({"gpus": [SIM_GPU, {**SIM_GPU, "index": 1, "simulated": False}]})

    app = web.Application()
    app.router.add_get("/sim/gpu", gpus)
    runner, root = await _serve(app)
    try:
        status = await SimGpuProbe(root, session).sample()
    finally:
        await runner.cleanup()
    assert [g.index for g in status.gpus] == [0, 1]
    assert all(g.simulated for g in status.gpus)  # never shown as a real GPU


# -- throttle reasons ---------------------------------------------------------


def _bit(name: str) -> int:
    return int(
        getattr(pynvml, f"nvmlClocksEventReason{name}", None)
        or getattr(pynvml, f"nvmlClocksThrottleReason{name}")
    )


def test_throttle_none() -> None:
    assert decode_throttle_reasons(0) == []


def test_throttle_each_reason_in_words() -> None:
    expected = {
        "SwPowerCap": "power cap",
        "SwThermalSlowdown": "thermal (software)",
        "HwThermalSlowdown": "thermal (hardware)",
        "HwSlowdown": "hardware slowdown",
        "HwPowerBrakeSlowdown": "power brake",
        "SyncBoost": "sync boost",
        "ApplicationsClocksSetting": "applications clocks setting",
        "DisplayClockSetting": "display clocks setting",
        "GpuIdle": "idle",
    }
    for name, words in expected.items():
        assert decode_throttle_reasons(_bit(name)) == [words]


def test_throttle_combined_and_unknown_bits() -> None:
    bits = _bit("SwPowerCap") | _bit("HwThermalSlowdown") | (1 << 40) | (1 << 33)
    assert decode_throttle_reasons(bits) == [
        "power cap",
        "thermal (hardware)",
        "unknown (0x200000000)",
        "unknown (0x10000000000)",
    ]
