"""Host probe against the real machine (psutil)."""

from __future__ import annotations

import os

from loadgen.snapshot import HostSample
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
