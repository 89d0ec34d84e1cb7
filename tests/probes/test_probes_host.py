"""Host probe against the real machine (psutil); counter resets with fed counters."""

from __future__ import annotations

import os
import tempfile
import time

import psutil
import pytest

from loadgen.model.snapshot import HostSample
from probes import host
from probes.host import HostProbe


def test_sample_has_real_values() -> None:
    probe = HostProbe()
    sum(i * i for i in range(200_000))  # a little CPU so the reading covers some work
    s = probe.sample()
    assert isinstance(s, HostSample)
    assert s.cpu_count is not None and s.cpu_count >= 1
    assert s.cpu_pct is not None and 0.0 <= s.cpu_pct <= 100.0
    assert s.mem_total_bytes is not None and s.mem_total_bytes > 0
    assert s.mem_used_bytes is not None and 0 < s.mem_used_bytes <= s.mem_total_bytes
    if hasattr(os, "getloadavg"):
        assert s.load1 is not None and s.load1 >= 0.0


def test_repeated_samples_do_not_block_or_raise() -> None:
    probe = HostProbe()
    samples = [probe.sample() for _ in range(5)]
    assert all(s.cpu_pct is not None for s in samples)


def test_per_core_swap_and_rates() -> None:
    probe = HostProbe()
    first = probe.sample()
    # Rates need two readings: the first says "n/a", never 0.
    assert first.net_rx_bps is None and first.net_tx_bps is None
    assert first.disk_read_bps is None and first.disk_write_bps is None
    assert first.swap_total_bytes is not None and first.swap_total_bytes >= 0
    assert first.swap_used_bytes is not None and 0 <= first.swap_used_bytes <= max(
        first.swap_total_bytes, first.swap_used_bytes
    )

    time.sleep(0.2)
    # Some disk writes between the two readings (fsync'd so the kernel counts them).
    with tempfile.NamedTemporaryFile() as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    second = probe.sample()
    assert second.cpu_per_core is not None
    assert len(second.cpu_per_core) == second.cpu_count
    assert all(0.0 <= c <= 100.0 for c in second.cpu_per_core)
    for rate in (second.net_rx_bps, second.net_tx_bps):
        assert rate is not None and rate >= 0.0
    # A container may hide /proc/diskstats: then n/a, else a real rate.
    if psutil.disk_io_counters() is not None:
        assert second.disk_read_bps is not None and second.disk_read_bps >= 0.0
        assert second.disk_write_bps is not None and second.disk_write_bps >= 0.0


def test_counter_going_backwards_gives_none_not_negative(monkeypatch: pytest.MonkeyPatch) -> None:
    # Counter values cannot be made to go backwards on a real machine: feed them.
    net = iter([(1000, 2000), (3000, 6000), (10, 20), (1010, 2020)])
    disk = iter([(0, 0), (500, 700), (100, 100), (600, 600)])
    monkeypatch.setattr(host, "_net_bytes", lambda: next(net))
    monkeypatch.setattr(host, "_disk_bytes", lambda: next(disk))
    clock = iter([100.0, 102.0, 104.0, 105.0])
    probe = HostProbe(clock=lambda: next(clock))
    assert probe.sample().net_rx_bps is None
    s = probe.sample()
    assert (s.net_rx_bps, s.net_tx_bps) == (1000.0, 2000.0)
    assert (s.disk_read_bps, s.disk_write_bps) == (250.0, 350.0)
    s = probe.sample()  # an interface went away / counters reset
    assert (s.net_rx_bps, s.net_tx_bps, s.disk_read_bps, s.disk_write_bps) == (None,) * 4
    s = probe.sample()  # and rates resume from the new baseline
    assert (s.net_rx_bps, s.net_tx_bps) == (1000.0, 2000.0)
    assert (s.disk_read_bps, s.disk_write_bps) == (500.0, 500.0)


def test_rate() -> None:
    assert host.rate(None, 5, 1.0) is None
    assert host.rate(5, None, 1.0) is None
    assert host.rate(10, 5, 1.0) is None
    assert host.rate(5, 10, 0.0) is None
    assert host.rate(5, 15, 2.0) == 5.0


def test_loopback_is_not_network() -> None:
    assert host._is_loopback("lo") and host._is_loopback("lo0")
    assert host._is_loopback("Loopback Pseudo-Interface 1")
    assert not host._is_loopback("eth0") and not host._is_loopback("lowpan0")
