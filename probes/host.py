"""Host CPU, memory and load through psutil: cheap, non-blocking, never raises."""

from __future__ import annotations

import logging
import os

import psutil

from loadgen.snapshot import HostSample

log = logging.getLogger(__name__)


class HostProbe:
    def __init__(self) -> None:
        # cpu_percent(interval=None) reports usage since the previous call; the
        # first call has nothing to compare with and returns 0.0, so prime it
        # here and every sample() after that is a real, non-blocking reading.
        self._cpu_primed = _safe_cpu_percent() is not None

    def sample(self) -> HostSample:
        cpu = _safe_cpu_percent()
        if not self._cpu_primed:
            # This reading is the meaningless first one; say "n/a", not 0 %.
            self._cpu_primed = cpu is not None
            cpu = None
        used, total = _memory()
        return HostSample(
            cpu_pct=cpu,
            cpu_count=psutil.cpu_count(logical=True),
            mem_used_bytes=used,
            mem_total_bytes=total,
            load1=_load1(),
        )


def _safe_cpu_percent() -> float | None:
    try:
        return float(psutil.cpu_percent(interval=None))
    except Exception as exc:  # psutil can fail in odd containers (/proc hidden)
        log.debug("cpu_percent failed: %s", exc)
        return None


def _memory() -> tuple[int | None, int | None]:
    try:
        vm = psutil.virtual_memory()
    except Exception as exc:
        log.debug("virtual_memory failed: %s", exc)
        return None, None
    # total - available is what applications cannot get back; psutil's `used`
    # differs by platform and leaves out caches that cannot be reclaimed.
    return int(vm.total - vm.available), int(vm.total)


def _load1() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):  # not available on every platform
        return None
