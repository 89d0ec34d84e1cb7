"""NVIDIA GPUs through NVML (nvidia-ml-py, imported as `pynvml`).

Written the way nvitop treats NVML: any call may be unsupported on some GPU,
driver or virtualisation layer, so every metric is read on its own, a failure
turns into None ("n/a") for that metric only, and a metric that is not
supported is remembered per device and never asked for again. Nothing here
raises to the caller and nothing prints; each (device, metric) problem is
logged at most once.

`NvmlProbe.sample()` blocks in the driver (a few ms, far more on a sick GPU),
so callers run it in a worker thread (see `probes.gpu`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from loadgen.snapshot import GpuSample, GpuStatus

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
    lost: str | None = None


class NvmlProbe:
    """Polls every NVIDIA GPU on this host. Never raises; see `available`/`message`."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self.available = False
        self.message: str | None = None
        self._nvml: ModuleType | None = None
        self._devices: list[_Device] = []
        # sample() runs in worker threads; one poll at a time, and close() must
        # not shut NVML down under a poll in progress.
        self._lock = threading.Lock()
        self._open(module)

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
        self._devices = [self._open_device(i) for i in range(count)]
        self.available = True

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
        return _Device(index=index, handle=handle, name=name)

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
        )

    def _sample_device(self, dev: _Device) -> GpuSample:
        sample = GpuSample(index=dev.index, name=dev.name)
        if dev.lost is not None:
            return sample
        try:
            self._fill(dev, sample)
        except _GpuLost as lost:
            dev.lost = lost.reason
            log.warning("GPU %d (%s) is lost: %s", dev.index, dev.name, lost.reason)
            # Values read before the loss in this poll are not trusted either.
            return GpuSample(index=dev.index, name=dev.name)
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
        limit = self._read(dev, "power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
        s.power_limit_w = None if limit is None else limit / 1000.0  # mW
        temp = self._read(
            dev, "temperature", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
        )
        s.temperature_c = None if temp is None else float(temp)
        energy = self._read(dev, "energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        s.energy_j = None if energy is None else energy / 1000.0  # mJ

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


def _words(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _text(value: str | bytes) -> str:
    # Old pynvml returns bytes, new returns str.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
