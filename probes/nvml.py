"""NVIDIA GPUs through NVML (nvidia-ml-py, imported as `pynvml`).

Written the way nvitop treats NVML: any call may be unsupported on some GPU,
driver or virtualisation layer, so every metric is read on its own, a failure
turns into None ("n/a") for that metric only, and a metric that is not
supported is remembered per device and never asked for again. Nothing here
raises to the caller and nothing prints; each (device, metric) problem is
logged at most once.

Slow or rarely changing calls (process lists, ECC counts, the power limit, the
MIG layout) are read every `SLOW_PERIOD_S` and cached in between. A GPU that
stops answering is flagged `lost` and becomes one event; Xid critical errors
arrive through an NVML event set read in its own thread (`probes.nvml_events`).
Both are collected by `drain_events()`.

`NvmlProbe.sample()` blocks in the driver (a few ms, far more on a sick GPU;
`nvmlDeviceGetPcieThroughput` samples its counter over ~20 ms), so callers run
it in a worker thread (see `probes.gpu`). `GpuStatus.poll_ms` is its cost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psutil

from loadgen.model.snapshot import Event, GpuProcess, GpuSample, GpuStatus
from probes.throttle import decode_throttle_reasons

log = logging.getLogger(__name__)

# Errors that mean "this device will never answer this call": stop asking.
_PERMANENT = (
    "NVMLError_NotSupported",
    "NVMLError_FunctionNotFound",
    "NVMLError_NoPermission",
    "NVMLError_ArgumentVersionMismatch",
    "NVMLError_InvalidArgument",
    "NVMLError_Deprecated",
)
# Errors that mean the device itself is gone (fell off the bus, needs a reset).
_LOST = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired", "NVMLError_GpuNotFound")

# Other NVML errors (timeouts, "unknown") may clear up; ask again after this long
# rather than every poll.
RETRY_AFTER_S = 30.0

# Slow or rarely changing calls (process lists, ECC counts, power limit, MIG layout)
# are read at most this often and cached in between.
SLOW_PERIOD_S = 5.0

# Most events kept for drain_events() when nobody drains (oldest dropped first).
MAX_QUEUED_EVENTS = 1000


class _GpuLost(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Device:
    index: int
    handle: Any
    name: str
    unsupported: set[str] = field(default_factory=set)
    retry_at: dict[str, float] = field(default_factory=dict)
    logged: set[str] = field(default_factory=set)
    memory_v2: bool = True
    clock_events_api: bool = True  # nvmlDeviceGetCurrentClocksEventReasons (newer name)
    lost: str | None = None
    uuid: str | None = None
    slow_due: float = 0.0  # monotonic time of the next slow read
    slow: dict[str, Any] = field(default_factory=dict)  # cached slow values


class NvmlProbe:
    """Polls every NVIDIA GPU on this host. Never raises; see `available`/`message`."""

    def __init__(self, module: ModuleType | None = None, *, watch_events: bool = True) -> None:
        self.available = False
        self.message: str | None = None
        self.driver: str | None = None
        self._nvml: ModuleType | None = None
        self._devices: list[_Device] = []
        # sample() runs in worker threads; one poll at a time, and close() must
        # not shut NVML down under a poll in progress.
        self._lock = threading.Lock()
        # Events (Xid, lost GPUs) from the poll and the event thread, for drain_events().
        self._events: deque[Event] = deque(maxlen=MAX_QUEUED_EVENTS)
        self._events_lock = threading.Lock()
        self._server_pids: frozenset[int] = frozenset()
        self._watcher: Any = None
        self._open(module)
        if self.available and watch_events:
            self._start_watcher()

    # -- setup -------------------------------------------------------------

    def _open(self, module: ModuleType | None) -> None:
        nvml = module if module is not None else _import_pynvml()
        if nvml is None:
            self.message = "NVML bindings (nvidia-ml-py) are not installed"
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self.message = describe_init_error(nvml, exc)
            return
        self._nvml = nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self.message = f"NVML could not count GPUs: {_words(exc)}"
            self.close()
            return
        if count == 0:
            self.message = "NVML found no NVIDIA GPUs"
            self.close()
            return
        try:
            self.driver = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception as exc:
            log.debug("NVML driver version not available: %s", _words(exc))
        self._devices = [self._open_device(i) for i in range(count)]
        self.available = True

    def _start_watcher(self) -> None:
        from probes.nvml_events import NvmlEventWatcher

        devices = [(d.index, d.name, d.handle) for d in self._devices if d.handle is not None]
        assert self._nvml is not None
        watcher = NvmlEventWatcher(self._nvml, devices, self._push_event)
        if watcher.start():
            self._watcher = watcher

    def _open_device(self, index: int) -> _Device:
        nvml = self._nvml
        assert nvml is not None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            reason = _words(exc)
            log.warning("GPU %d: cannot get an NVML handle: %s", index, reason)
            return _Device(index=index, handle=None, name=f"GPU {index}", lost=reason)
        try:
            name = _text(nvml.nvmlDeviceGetName(handle))
        except Exception as exc:
            log.debug("GPU %d: name not available: %s", index, _words(exc))
            name = f"GPU {index}"
        try:
            uuid: str | None = _text(nvml.nvmlDeviceGetUUID(handle))
        except Exception as exc:
            log.debug("GPU %d: UUID not available: %s", index, _words(exc))
            uuid = None
        return _Device(index=index, handle=handle, name=name, uuid=uuid)

    # -- events and the server's processes ----------------------------------

    def set_server_pids(self, pids: Iterable[int]) -> None:
        """The inference server's pids (process and children): listed first in `processes`."""
        self._server_pids = frozenset(int(p) for p in pids)

    def drain_events(self) -> list[Event]:
        """Events since the last call (Xid errors, GPUs lost), oldest first; thread-safe."""
        with self._events_lock:
            events = list(self._events)
            self._events.clear()
        return events

    def _push_event(self, event: Event) -> None:
        with self._events_lock:
            self._events.append(event)

    # -- polling -----------------------------------------------------------

    def sample(self) -> GpuStatus:
        start = time.perf_counter()
        with self._lock:
            if self._nvml is None or not self._devices:
                return GpuStatus(source="none", message=self.message)
            gpus = [self._sample_device(dev) for dev in self._devices]
            lost = [f"GPU {d.index} ({d.name}) is lost: {d.lost}" for d in self._devices if d.lost]
        return GpuStatus(
            source="nvml",
            message="; ".join(lost) or None,
            gpus=gpus,
            poll_ms=(time.perf_counter() - start) * 1000.0,
            driver=self.driver,
        )

    def _lost_sample(self, dev: _Device) -> GpuSample:
        return GpuSample(
            index=dev.index,
            name=dev.name,
            uuid=dev.uuid,
            lost=True,
            message=f"GPU lost: {dev.lost}",
        )

    def _sample_device(self, dev: _Device) -> GpuSample:
        if dev.lost is not None:
            return self._lost_sample(dev)
        sample = GpuSample(index=dev.index, name=dev.name, uuid=dev.uuid)
        try:
            self._fill(dev, sample)
        except _GpuLost as lost:
            dev.lost = lost.reason
            log.warning("GPU %d (%s) is lost: %s", dev.index, dev.name, lost.reason)
            self._push_event(
                Event(
                    t=time.time(),
                    kind="gpu",
                    level="error",
                    message=f"GPU {dev.index} ({dev.name}) lost: {lost.reason}",
                )
            )
            # Values read before the loss in this poll are not trusted either.
            return self._lost_sample(dev)
        return sample

    def _fill(self, dev: _Device, s: GpuSample) -> None:
        nvml = self._nvml
        assert nvml is not None
        h = dev.handle
        memory = self._read(dev, "memory", lambda: self._memory(dev))
        if memory is not None:
            s.memory_used_bytes, s.memory_total_bytes = memory
        util = self._read(dev, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            s.utilization_pct = float(util.gpu)
        power = self._read(dev, "power", lambda: nvml.nvmlDeviceGetPowerUsage(h))
        s.power_w = None if power is None else power / 1000.0  # mW
        temp = self._read(
            dev, "temperature", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
        )
        s.temperature_c = None if temp is None else float(temp)
        energy = self._read(dev, "energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        s.energy_j = None if energy is None else energy / 1000.0  # mJ
        sm = self._read(dev, "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        s.sm_clock_mhz = None if sm is None else float(sm)
        mem = self._read(
            dev, "mem_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)
        )
        s.mem_clock_mhz = None if mem is None else float(mem)
        bits = self._read(dev, "throttle", lambda: self._clock_events(dev))
        s.throttle_reasons = None if bits is None else decode_throttle_reasons(int(bits))
        # KB/s over NVML's own short sampling window.
        tx = self._read(
            dev, "pcie", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES)
        )
        rx = None
        if tx is not None:
            rx = self._read(
                dev,
                "pcie",
                lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES),
            )
        s.pcie_tx_kbs = None if tx is None or rx is None else float(tx)
        s.pcie_rx_kbs = None if tx is None or rx is None else float(rx)
        self._fill_slow(dev, s)

    def _fill_slow(self, dev: _Device, s: GpuSample) -> None:
        """Power limit, ECC counts, processes and MIG layout: every SLOW_PERIOD_S, cached."""
        nvml = self._nvml
        assert nvml is not None
        h = dev.handle
        now = time.monotonic()
        if now >= dev.slow_due:
            dev.slow_due = now + SLOW_PERIOD_S
            c = dev.slow
            c["power_limit"] = self._read(
                dev, "power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h)
            )
            c["ecc_corrected"] = self._read(dev, "ecc", lambda: self._ecc(dev, corrected=True))
            c["ecc_uncorrected"] = (
                None
                if c["ecc_corrected"] is None
                else self._read(dev, "ecc", lambda: self._ecc(dev, corrected=False))
            )
            c["processes"] = self._processes(dev)
            c["mig"] = self._read(dev, "mig", lambda: self._mig(dev))
        c = dev.slow
        limit = c.get("power_limit")
        s.power_limit_w = None if limit is None else limit / 1000.0  # mW
        s.ecc_corrected = c.get("ecc_corrected")
        s.ecc_uncorrected = c.get("ecc_uncorrected")
        procs = c.get("processes")
        if procs is not None:
            server = self._server_pids
            # The server's processes first, then the biggest users.
            procs = sorted(procs, key=lambda p: (p.pid not in server, -(p.used_bytes or 0)))
            s.processes = [
                GpuProcess(pid=p.pid, name=p.name, used_bytes=p.used_bytes) for p in procs
            ]
        s.mig = c.get("mig")

    def _clock_events(self, dev: _Device) -> int:
        """Clock-event reason bits; the older 'throttle' call where the new one is missing."""
        nvml = self._nvml
        assert nvml is not None
        new = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if dev.clock_events_api and new is not None:
            try:
                return int(new(dev.handle))
            except Exception as exc:
                if self._is(exc, _LOST) or not self._is(exc, ("NVMLError_FunctionNotFound",)):
                    raise
                dev.clock_events_api = False  # an older driver: the old name from now on
        return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(dev.handle))

    def _ecc(self, dev: _Device, *, corrected: bool) -> int:
        nvml = self._nvml
        assert nvml is not None
        kind = (
            nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
            if corrected
            else nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        )
        return int(nvml.nvmlDeviceGetTotalEccErrors(dev.handle, kind, nvml.NVML_VOLATILE_ECC))

    def _processes(self, dev: _Device) -> list[GpuProcess] | None:
        """Compute and graphics processes on this GPU, with used memory; None if unsupported."""
        nvml = self._nvml
        assert nvml is not None
        h = dev.handle
        compute = self._read(
            dev, "compute_processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h)
        )
        graphics = self._read(
            dev, "graphics_processes", lambda: nvml.nvmlDeviceGetGraphicsRunningProcesses(h)
        )
        if compute is None and graphics is None:
            return None
        used: dict[int, int | None] = {}
        for info in [*(compute or ()), *(graphics or ())]:
            pid = int(info.pid)
            mem = getattr(info, "usedGpuMemory", None)
            mem = None if mem is None else int(mem)
            old = used.get(pid)
            # A process in both lists (or in several MIG instances): keep the larger figure.
            used[pid] = mem if old is None else max(old, mem or 0)
        return [
            GpuProcess(pid=pid, name=_process_name(pid), used_bytes=mem)
            for pid, mem in used.items()
        ]

    def _mig(self, dev: _Device) -> list[str] | None:
        """MIG devices as "name (UUID)", or None where MIG is off or not supported."""
        nvml = self._nvml
        assert nvml is not None
        current, _pending = nvml.nvmlDeviceGetMigMode(dev.handle)
        if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return None
        out: list[str] = []
        for i in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(dev.handle))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
            except Exception as exc:
                if self._is(exc, _LOST):
                    raise
                continue  # an empty slot answers NotFound
            name = _quiet(lambda m=mig: _text(nvml.nvmlDeviceGetName(m))) or f"MIG {i}"
            uuid = _quiet(lambda m=mig: _text(nvml.nvmlDeviceGetUUID(m)))
            out.append(f"{name} ({uuid})" if uuid else name)
        return out

    def _memory(self, dev: _Device) -> tuple[int, int]:
        """Used/total bytes; v2 where the driver has it, since v1 counts reserved memory as used."""
        nvml = self._nvml
        assert nvml is not None
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        if dev.memory_v2 and v2 is not None:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(dev.handle, version=v2)
                return int(info.used), int(info.total)
            except Exception as exc:
                if self._is(exc, _LOST):
                    raise
                # Old drivers lack nvmlDeviceGetMemoryInfo_v2: use v1 from now on.
                dev.memory_v2 = False
                self._log_once(dev, "memory_v2", exc, logging.DEBUG)
        info = nvml.nvmlDeviceGetMemoryInfo(dev.handle)
        return int(info.used), int(info.total)

    def _read(self, dev: _Device, metric: str, call: Callable[[], Any]) -> Any:
        """One NVML call for one metric: its value, or None when it cannot be had."""
        if metric in dev.unsupported:
            return None
        now = time.monotonic()
        if dev.retry_at.get(metric, 0.0) > now:
            return None
        try:
            return call()
        except Exception as exc:
            if self._is(exc, _LOST):
                raise _GpuLost(_words(exc)) from exc
            if not self._is_nvml_error(exc):
                # Not NVML's doing (a binding bug, a bad struct): treat as
                # unsupported rather than crash the console every poll.
                dev.unsupported.add(metric)
                self._log_once(dev, metric, exc, logging.INFO)
            elif self._is(exc, _PERMANENT):
                dev.unsupported.add(metric)
                self._log_once(dev, metric, exc, logging.DEBUG)
            else:
                dev.retry_at[metric] = now + RETRY_AFTER_S
                self._log_once(dev, metric, exc, logging.INFO)
            return None

    def _log_once(self, dev: _Device, metric: str, exc: BaseException, level: int) -> None:
        if metric in dev.logged:
            return
        dev.logged.add(metric)
        log.log(
            level, "GPU %d (%s): %s not available: %s", dev.index, dev.name, metric, _words(exc)
        )

    def _is(self, exc: BaseException, names: tuple[str, ...]) -> bool:
        classes = tuple(c for n in names if isinstance(c := getattr(self._nvml, n, None), type))
        return bool(classes) and isinstance(exc, classes)

    def _is_nvml_error(self, exc: BaseException) -> bool:
        base = getattr(self._nvml, "NVMLError", None)
        return isinstance(base, type) and isinstance(exc, base)

    # -- teardown ----------------------------------------------------------

    def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()  # before nvmlShutdown: the thread is inside nvmlEventSetWait
        with self._lock:
            nvml, self._nvml = self._nvml, None
            self._devices = []
            self.available = False
        if nvml is None:
            return
        try:
            nvml.nvmlShutdown()
        except Exception as exc:  # shutting down a broken driver must not crash the exit path
            log.debug("nvmlShutdown failed: %s", _words(exc))


def _import_pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def describe_init_error(nvml: ModuleType, exc: BaseException) -> str:
    """Why NVML could not start, in words an operator can act on."""

    def is_(name: str) -> bool:
        cls = getattr(nvml, name, None)
        return isinstance(cls, type) and isinstance(exc, cls)

    if is_("NVMLError_LibraryNotFound"):
        return "no NVIDIA driver found (libnvidia-ml.so.1 could not be loaded)"
    if is_("NVMLError_DriverNotLoaded"):
        return "NVML init failed: the NVIDIA kernel driver is not loaded"
    if is_("NVMLError_NoPermission"):
        return "NVML init failed: no permission to open the NVIDIA device files"
    if is_("NVMLError_LibRmVersionMismatch"):
        return (
            "NVML init failed: the NVIDIA driver and its library have different versions "
            "(reload the kernel module or reboot)"
        )
    return f"NVML init failed: {_words(exc)}"


def _process_name(pid: int) -> str | None:
    """A GPU process's name; None when it is gone or in another pid namespace."""
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return None


def _quiet(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:
        return None


def _words(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _text(value: str | bytes) -> str:
    # Old pynvml returns bytes, new returns str.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
