"""GPU probes on a machine without an NVIDIA GPU.

The real NVML path is exercised in tests/gpu/. Here NVML is absent for real,
the simulator's GPU is served by a real aiohttp server on loopback, and the
per-metric "not supported" paths use a fake `pynvml` module (the one thing
that cannot exist here) that raises pynvml's own error classes.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import psutil
import pynvml
import pytest
from aiohttp import web

from probes import nvml as nvml_module
from probes.gpu import GpuProbe
from probes.nvml import NvmlProbe
from probes.nvml_events import describe_xid
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


# -- the newer fields: clocks, clock events, PCIe, ECC, processes, MIG ----------------

NO_SUCH_PID = 2**22 + 12345  # above Linux's largest pid_max: never a live process


class FakeNvmlFull(FakeNvml):
    """GPU 0: an old consumer card (no ECC, no PCIe counters, no MIG, only the old
    'throttle reasons' call). GPU 1: an H100 with everything, MIG on with two instances."""

    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self) -> None:
        super().__init__()
        self.reasons = _bit("SwPowerCap") | _bit("HwThermalSlowdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetName(self, handle: Any) -> bytes | str:
        if isinstance(handle, str):  # a MIG device handle
            return f"NVIDIA H100 80GB HBM3 MIG {handle}"
        return super().nvmlDeviceGetName(handle)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, str):
            return f"MIG-{handle}"
        return f"GPU-0000000{handle}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
        self._call("clock", handle)
        return 1980 if kind == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        self._call("clock_events", handle)
        if handle == 0:
            raise pynvml.NVMLError_FunctionNotFound()  # an older driver
        return self.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        self._call("throttle_reasons", handle)
        return _bit("GpuIdle")

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        self._call("pcie", handle)
        if handle == 0:
            raise pynvml.NVMLError_NotSupported()
        return 1234 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 5678

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        self._call("ecc", handle)
        assert counter == pynvml.NVML_VOLATILE_ECC
        if handle == 0:
            raise pynvml.NVMLError_NotSupported()
        return 3 if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self._call("compute_processes", handle)
        if handle == 0:
            return []
        return [
            types.SimpleNamespace(pid=NO_SUCH_PID, usedGpuMemory=None),  # another pid namespace
            types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=2 * 2**30),
        ]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        self._call("graphics_processes", handle)
        if handle == 1:
            raise pynvml.NVMLError_NotSupported()
        return [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=100 * 2**20)]

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        self._call("mig", handle)
        if handle == 0:
            raise pynvml.NVMLError_NotSupported()
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, index: int) -> str:
        if index == 1:
            raise pynvml.NVMLError_NotFound()  # an empty slot
        return f"{index + 1}g.10gb"


def test_new_fields_filled_and_unsupported_ones_quiet() -> None:
    fake = FakeNvmlFull()
    probe = NvmlProbe(module=fake)
    status = probe.sample()
    assert status.driver == "550.54.15"
    assert status.poll_ms is not None and status.poll_ms >= 0
    old, new = status.gpus

    assert old.uuid == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    assert (old.sm_clock_mhz, old.mem_clock_mhz) == (1980.0, 2619.0)
    assert old.throttle_reasons == ["idle"]  # through the older call
    assert old.pcie_tx_kbs is None and old.pcie_rx_kbs is None
    assert old.ecc_corrected is None and old.ecc_uncorrected is None
    assert old.mig is None
    assert old.processes is not None
    (mine,) = old.processes
    assert mine.pid == os.getpid() and mine.used_bytes == 100 * 2**20
    assert mine.name == psutil.Process().name()

    assert new.throttle_reasons == ["power cap", "thermal (hardware)"]
    assert (new.pcie_tx_kbs, new.pcie_rx_kbs) == (1234.0, 5678.0)
    assert (new.ecc_corrected, new.ecc_uncorrected) == (3, 0)
    assert new.mig == [
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb (MIG-1g.10gb)",
        "NVIDIA H100 80GB HBM3 MIG 3g.10gb (MIG-3g.10gb)",
    ]
    assert new.processes is not None
    # biggest first; a pid psutil cannot see has no name and unknown memory
    assert [(p.pid, p.used_bytes) for p in new.processes] == [
        (os.getpid(), 2 * 2**30),
        (NO_SUCH_PID, None),
    ]
    assert new.processes[1].name is None
    assert not new.lost and new.message is None

    for _ in range(3):
        again = probe.sample()
    assert again.gpus[0].throttle_reasons == ["idle"]
    assert again.gpus[1].pcie_rx_kbs == 5678.0
    # Not supported: asked once, never again; the old-name fallback is remembered.
    assert fake.calls[("pcie", 0)] == 1
    assert fake.calls[("ecc", 0)] == 1
    assert fake.calls[("mig", 0)] == 1
    assert fake.calls[("graphics_processes", 1)] == 1
    assert fake.calls[("clock_events", 0)] == 1
    assert fake.calls[("throttle_reasons", 0)] == 4
    assert fake.calls[("clock_events", 1)] == 4
    assert fake.calls[("pcie", 1)] == 8  # TX and RX every poll
    probe.close()


def test_slow_calls_are_cached_between_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvmlFull()
    probe = NvmlProbe(module=fake)
    for _ in range(4):
        status = probe.sample()
    # Cached values are still reported on every poll…
    assert status.gpus[1].ecc_corrected == 3
    assert status.gpus[1].power_limit_w == 700.0
    assert status.gpus[1].processes is not None and len(status.gpus[1].processes) == 2
    # …but read once within SLOW_PERIOD_S.
    assert fake.calls[("ecc", 1)] == 2  # corrected + uncorrected
    assert fake.calls[("compute_processes", 1)] == 1
    assert fake.calls[("power_limit", 1)] == 1
    assert fake.calls[("mig", 1)] == 1
    assert fake.calls[("utilization", 1)] == 4  # fast metrics every poll

    monkeypatch.setattr(nvml_module, "SLOW_PERIOD_S", 0.0)
    for dev in probe._devices:
        dev.slow_due = 0.0
    probe.sample()
    probe.sample()
    assert fake.calls[("compute_processes", 1)] == 3
    probe.close()


def test_server_processes_listed_first() -> None:
    fake = FakeNvmlFull()
    probe = NvmlProbe(module=fake)
    probe.set_server_pids([NO_SUCH_PID])
    procs = probe.sample().gpus[1].processes
    assert procs is not None
    assert [p.pid for p in procs] == [NO_SUCH_PID, os.getpid()]
    probe.close()


def test_lost_gpu_is_flagged_and_becomes_an_event() -> None:
    fake = FakeNvmlFull()
    probe = NvmlProbe(module=fake)
    probe.sample()
    assert probe.drain_events() == []
    fake.lost.add(1)
    status = probe.sample()
    lost = status.gpus[1]
    assert lost.lost is True
    assert lost.uuid is not None
    assert lost.message is not None and "lost" in lost.message.lower()
    assert lost.processes is None and lost.sm_clock_mhz is None
    (event,) = probe.drain_events()
    assert (event.kind, event.level) == ("gpu", "error")
    assert event.message.startswith("GPU 1 (NVIDIA H100 80GB HBM3) lost")
    probe.sample()
    assert probe.drain_events() == []  # said once
    probe.close()


# -- Xid events -----------------------------------------------------------------------


class FakeNvmlEvents(FakeNvmlFull):
    """Adds an NVML event set: GPU 1 supports Xid events, GPU 0 none."""

    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self) -> None:
        super().__init__()
        self.queue: queue.Queue[Any] = queue.Queue()
        self.registered: list[tuple[int, int]] = []
        self.freed = False
        self.waits = 0

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, handle: int) -> int:
        return pynvml.nvmlEventTypeXidCriticalError if handle == 1 else 0

    def nvmlDeviceRegisterEvents(self, handle: int, types_: int, event_set: object) -> None:
        self.registered.append((handle, types_))

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> Any:
        self.waits += 1
        try:
            return self.queue.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.freed = True

    def deliver_xid(self, handle: int, xid: int) -> None:
        self.queue.put(
            types.SimpleNamespace(
                device=handle, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
            )
        )


def _wait_for_events(probe: NvmlProbe | GpuProbe, n: int, timeout_s: float = 5.0) -> list[Any]:
    events: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(events) < n and time.monotonic() < deadline:
        events += probe.drain_events()
        time.sleep(0.01)
    return events


def test_xid_event_arrives_in_drain_events() -> None:
    fake = FakeNvmlEvents()
    probe = NvmlProbe(module=fake)
    gpu = GpuProbe(nvml=probe)
    assert fake.registered == [(1, pynvml.nvmlEventTypeXidCriticalError)]  # GPU 0: quietly not
    before = time.time()
    fake.deliver_xid(1, 79)
    fake.deliver_xid(1, 4242)
    events = _wait_for_events(gpu, 2)
    assert [e.message for e in events] == [
        "GPU 1 (NVIDIA H100 80GB HBM3): Xid 79 (GPU has fallen off the bus)",
        "GPU 1 (NVIDIA H100 80GB HBM3): Xid 4242",
    ]
    assert all(e.kind == "gpu" and e.level == "error" and e.t >= before for e in events)
    assert gpu.drain_events() == []

    t0 = time.monotonic()
    gpu.close()
    assert time.monotonic() - t0 < 3.0  # the waiting thread stops within its timeout
    assert fake.freed and fake.shut_down
    assert not any(t.name == "nvml-events" and t.is_alive() for t in threading.enumerate())


def test_no_event_support_is_quiet_and_starts_no_thread() -> None:
    probe = NvmlProbe(module=FakeNvmlFull())  # bindings without an event set
    assert probe._watcher is None
    assert probe.drain_events() == []
    probe.close()


def test_describe_xid() -> None:
    assert describe_xid(48) == "Xid 48 (double-bit ECC error)"
    assert describe_xid(31) == "Xid 31 (GPU memory page fault)"
    assert describe_xid(12345) == "Xid 12345"


async def test_drain_events_without_nvml_is_empty(
    sim_root: str, session: aiohttp.ClientSession
) -> None:
    broken = NvmlProbe(module=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound()))
    probe = await GpuProbe.create(sim_root, session, nvml=broken)
    assert probe.source == "simulated"
    assert probe.drain_events() == []
    probe.set_server_pids([1])  # harmless without NVML
    assert GpuProbe(message="none").drain_events() == []
