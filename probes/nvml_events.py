"""NVML critical events (Xid errors) read in their own thread, each turned into an `Event`.

An NVML event set is registered for Xid critical errors on every GPU that
supports them, and one daemon thread waits on it with a short timeout so that
`stop()` takes effect within about `WAIT_MS`. A GPU or driver that does not
support events is skipped quietly (one debug line); when no GPU supports them,
no thread is started at all.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from loadgen.model.snapshot import Event

log = logging.getLogger(__name__)

WAIT_MS = 500  # how long one nvmlEventSetWait blocks; also how long stop() may take

# Well-known Xid codes, in words (NVIDIA's "Xid Errors" table). Codes not listed are
# shown by number; the table in the driver docs has the long descriptions.
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    68: "video decoder (NVDEC) exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    154: "GPU recovery action changed",
}


def describe_xid(xid: int) -> str:
    meaning = XID_MEANINGS.get(xid)
    return f"Xid {xid} ({meaning})" if meaning else f"Xid {xid}"


class NvmlEventWatcher:
    """Waits on an NVML event set in a daemon thread; calls `emit(Event)` for each Xid."""

    def __init__(
        self,
        nvml: ModuleType,
        devices: Sequence[tuple[int, str, Any]],  # (index, name, handle)
        emit: Callable[[Event], None],
    ) -> None:
        self._nvml = nvml
        self._devices = list(devices)
        self._emit = emit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self.registered: list[int] = []  # GPU indexes whose Xid events are watched

    def start(self) -> bool:
        """Register for Xid events and start the thread; False (quietly) where unsupported."""
        nvml = self._nvml
        xid_bit = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        create = getattr(nvml, "nvmlEventSetCreate", None)
        if xid_bit is None or create is None or not hasattr(nvml, "nvmlEventSetWait"):
            log.debug("NVML events: not offered by these bindings")
            return False
        try:
            self._event_set = create()
        except Exception as exc:
            log.debug("NVML events: cannot create an event set: %s", exc)
            return False
        for index, _name, handle in self._devices:
            try:
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if not supported & xid_bit:
                    log.debug("GPU %d: Xid events not supported", index)
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, xid_bit, self._event_set)
            except Exception as exc:  # not supported, no permission (containers), …
                log.debug("GPU %d: cannot watch Xid events: %s", index, exc)
                continue
            self.registered.append(index)
        if not self.registered:
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()
        return True

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():  # stuck in the driver: leave the set alone
                log.debug("NVML event thread did not stop within %.1f s", timeout_s)
                return
        self._free()

    def _free(self) -> None:
        event_set, self._event_set = self._event_set, None
        if event_set is None:
            return
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except Exception as exc:
            log.debug("nvmlEventSetFree failed: %s", exc)

    def _run(self) -> None:
        nvml = self._nvml
        timeout_cls = getattr(nvml, "NVMLError_Timeout", None)
        failures = 0
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(self._event_set, WAIT_MS)
            except Exception as exc:
                if isinstance(timeout_cls, type) and isinstance(exc, timeout_cls):
                    failures = 0
                    continue
                failures += 1
                if failures == 1:
                    log.info("NVML event wait failed: %s", exc)
                # A broken event set must not spin: back off, give up after a while.
                if failures >= 10:
                    log.info("NVML events: giving up after repeated failures")
                    return
                self._stop.wait(min(5.0, 0.5 * failures))
                continue
            failures = 0
            try:
                self._emit(self._to_event(data))
            except Exception as exc:  # a bad event must not end the thread
                log.debug("NVML event not understood: %s", exc)

    def _to_event(self, data: Any) -> Event:
        index, name = self._which(getattr(data, "device", None))
        gpu = f"GPU {index}" if index is not None else "a GPU"
        if name:
            gpu += f" ({name})"
        xid_bit = getattr(self._nvml, "nvmlEventTypeXidCriticalError", 0)
        event_type = int(getattr(data, "eventType", 0))
        if event_type & xid_bit:
            what = describe_xid(int(getattr(data, "eventData", 0)))
        else:
            what = f"NVML event 0x{event_type:x} (data {getattr(data, 'eventData', '?')})"
        return Event(t=time.time(), kind="gpu", level="error", message=f"{gpu}: {what}")

    def _which(self, handle: Any) -> tuple[int | None, str | None]:
        """The event's GPU (index, name), by handle value or by NVML's own index."""
        if handle is None:
            return None, None
        key = _handle_key(handle)
        for index, name, known in self._devices:
            if _handle_key(known) == key:
                return index, name
        try:
            index = int(self._nvml.nvmlDeviceGetIndex(handle))
        except Exception:
            return None, None
        for known_index, name, _ in self._devices:
            if known_index == index:
                return index, name
        return index, None


def _handle_key(handle: Any) -> Any:
    """A comparable key for an NVML handle: ctypes pointers compare by address, not identity."""
    if isinstance(handle, int):
        return handle
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except Exception:
        return handle
