"""Host CPU, memory, swap, load, network and disk through psutil: cheap, non-blocking, never raises.

Network and disk figures are rates from the counters' differences between two
calls: None on the first call, and None for one sample when a counter went
backwards (a wrap, an interface that went away, a counter reset), never a
negative or absurd rate. Loopback traffic is left out of the network rates: a
local load generator talking to a local server is not network traffic.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import psutil

from loadgen.model.snapshot import HostSample

log = logging.getLogger(__name__)


class HostProbe:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # cpu_percent(interval=None) reports usage since the previous call; the
        # first call has nothing to compare with and returns 0.0, so prime it
        # here and every sample() after that is a real, non-blocking reading.
        self._cpu_primed = _safe_cpu_percent() is not None
        self._per_core_primed = _per_core() is not None
        self._cpu_count = _cpu_count()
        # (monotonic time, net rx, net tx, disk read, disk write); None before the first call
        self._last: tuple[float, int | None, int | None, int | None, int | None] | None = None

    def sample(self) -> HostSample:
        cpu = _safe_cpu_percent()
        if not self._cpu_primed:
            # This reading is the meaningless first one; say "n/a", not 0 %.
            self._cpu_primed = cpu is not None
            cpu = None
        per_core = _per_core()
        if not self._per_core_primed:
            self._per_core_primed = per_core is not None
            per_core = None
        used, total = _memory()
        swap_used, swap_total = _swap()
        now = self._clock()
        rx, tx = _net_bytes()
        read, write = _disk_bytes()
        s = HostSample(
            cpu_pct=cpu,
            cpu_count=self._cpu_count,
            cpu_per_core=per_core,
            mem_used_bytes=used,
            mem_total_bytes=total,
            swap_used_bytes=swap_used,
            swap_total_bytes=swap_total,
            load1=_load1(),
        )
        last, self._last = self._last, (now, rx, tx, read, write)
        if last is not None:
            dt = now - last[0]
            s.net_rx_bps = rate(last[1], rx, dt)
            s.net_tx_bps = rate(last[2], tx, dt)
            s.disk_read_bps = rate(last[3], read, dt)
            s.disk_write_bps = rate(last[4], write, dt)
        return s


def rate(before: float | None, after: float | None, dt: float) -> float | None:
    """Per-second rate of a counter; None when unknown or when it went backwards (reset/wrap)."""
    if before is None or after is None or dt <= 0 or after < before:
        return None
    return (after - before) / dt


def _safe_cpu_percent() -> float | None:
    try:
        return float(psutil.cpu_percent(interval=None))
    except Exception as exc:  # psutil can fail in odd containers (/proc hidden)
        log.debug("cpu_percent failed: %s", exc)
        return None


def _per_core() -> list[float] | None:
    try:
        return [float(x) for x in psutil.cpu_percent(interval=None, percpu=True)]
    except Exception as exc:
        log.debug("per-core cpu_percent failed: %s", exc)
        return None


def _cpu_count() -> int | None:
    try:
        return psutil.cpu_count(logical=True)
    except Exception:
        return None


def _swap() -> tuple[int | None, int | None]:
    try:
        sw = psutil.swap_memory()
    except Exception as exc:  # some containers have no /proc/vmstat
        log.debug("swap_memory failed: %s", exc)
        return None, None
    return int(sw.used), int(sw.total)


def _net_bytes() -> tuple[int | None, int | None]:
    """Bytes received and sent on all interfaces but loopback, since boot."""
    try:
        nics = psutil.net_io_counters(pernic=True)
    except Exception as exc:
        log.debug("net_io_counters failed: %s", exc)
        return None, None
    rx = tx = 0
    for name, c in nics.items():
        if _is_loopback(name):
            continue
        rx += c.bytes_recv
        tx += c.bytes_sent
    return rx, tx


def _is_loopback(name: str) -> bool:
    # Linux "lo", BSD/macOS "lo0", Windows "Loopback Pseudo-Interface 1"
    return (
        name == "lo"
        or (name.startswith("lo") and name[2:].isdigit())
        or name.startswith("Loopback")
    )


def _disk_bytes() -> tuple[int | None, int | None]:
    """Bytes read and written on all physical disks (partitions are not counted twice)."""
    try:
        c = psutil.disk_io_counters(perdisk=False)
    except Exception as exc:  # no /proc/diskstats in some containers
        log.debug("disk_io_counters failed: %s", exc)
        return None, None
    if c is None:
        return None, None
    return int(c.read_bytes), int(c.write_bytes)


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
