"""The real NVML path on a real NVIDIA GPU: load it and watch the numbers move.

Skipped wherever NVML cannot start (no driver, no GPU). The load comes from a
child process running PyTorch matmuls on CUDA, so this process never holds a
CUDA context and NVML sees the load the way it sees an inference server's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

pynvml = pytest.importorskip("pynvml")

pytestmark = pytest.mark.gpu

try:
    pynvml.nvmlInit()
except pynvml.NVMLError as exc:  # no driver / no GPU: nothing to test here
    pytest.skip(f"NVML not available: {exc}", allow_module_level=True)
else:
    pynvml.nvmlShutdown()

import psutil  # noqa: E402

from loadgen.model.snapshot import GpuSample, GpuStatus  # noqa: E402
from probes import nvml as nvml_module  # noqa: E402
from probes.nvml import NvmlProbe  # noqa: E402

BUSY_BYTES = 2 * 2**30  # held by the child so the memory rise is unmistakable

# Runs in the child: allocate, say "ready", then matmul until stdin closes or time runs out.
CHILD = textwrap.dedent(
    f"""
    import sys, time
    import torch
    if not torch.cuda.is_available():
        print("no-cuda", flush=True)
        sys.exit(3)
    dev = torch.device("cuda", 0)
    hold = torch.empty({BUSY_BYTES} // 4, dtype=torch.float32, device=dev)
    a = torch.randn(8192, 8192, device=dev)
    b = torch.randn(8192, 8192, device=dev)
    c = a @ b
    torch.cuda.synchronize()
    print("ready", torch.cuda.get_device_properties(dev).name, flush=True)
    deadline = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < deadline:
        for _ in range(8):
            c = a @ b
        torch.cuda.synchronize()
    """
)


@pytest.fixture
def probe() -> Iterator[NvmlProbe]:
    p = NvmlProbe()
    assert p.available, p.message
    yield p
    p.close()


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The child's first stdout line, without hanging the test if it never comes."""
    assert proc.stdout is not None
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    return box[0].strip() if box else ""


@contextlib.contextmanager
def busy_gpu(seconds: float = 120.0) -> Iterator[str]:
    """Run the matmul child; yields the CUDA device name once it is loading the GPU."""
    with busy_child(seconds) as (name, _pid):
        yield name


@contextlib.contextmanager
def busy_child(seconds: float = 120.0) -> Iterator[tuple[str, int]]:
    """Run the matmul child; yields (CUDA device name, child pid) once it is loading the GPU."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed: no way to load the GPU")
    # CUDA device 0 need not be NVML device 0 (CUDA orders fastest first by default);
    # the test finds the loaded GPU by its memory rise instead of assuming.
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = _read_line(proc, timeout_s=120.0)
        if line == "no-cuda":
            pytest.skip("PyTorch has no CUDA here")
        assert line.startswith("ready"), f"load child did not start: {line!r}"
        yield line.removeprefix("ready").strip(), proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _by_index(status: GpuStatus) -> dict[int, GpuSample]:
    return {g.index: g for g in status.gpus}


def _watch(probe: NvmlProbe, seconds: float) -> tuple[dict[int, GpuSample], dict[int, float]]:
    """Busiest sample per GPU over `seconds`, and mean power from the energy counter."""
    first = _by_index(probe.sample())
    t0 = time.monotonic()
    peak = dict(first)
    while time.monotonic() - t0 < seconds:
        time.sleep(0.25)
        for index, gpu in _by_index(probe.sample()).items():
            if (gpu.utilization_pct or 0) >= (peak[index].utilization_pct or 0):
                peak[index] = gpu
    last = _by_index(probe.sample())
    elapsed = time.monotonic() - t0
    mean_w = {}
    for index, gpu in last.items():
        start, end = first[index].energy_j, gpu.energy_j
        if start is not None and end is not None:
            mean_w[index] = (end - start) / elapsed
    # Memory from the last sample: the child allocates before saying "ready".
    for index, gpu in last.items():
        peak[index].memory_used_bytes = gpu.memory_used_bytes
    return peak, mean_w


def test_idle_sample_is_complete(probe: NvmlProbe) -> None:
    status = probe.sample()
    assert status.source == "nvml"
    assert status.gpus, "NVML is up but reports no GPU"
    assert status.poll_ms is not None
    for gpu in status.gpus:
        assert gpu.name and not gpu.simulated
        # Memory is supported on every GPU NVML knows; the rest may be n/a on some.
        assert gpu.memory_total_bytes and gpu.memory_total_bytes > 0
        assert gpu.memory_used_bytes is not None
        assert 0 <= gpu.memory_used_bytes <= gpu.memory_total_bytes
        if gpu.utilization_pct is not None:
            assert 0.0 <= gpu.utilization_pct <= 100.0


def test_load_raises_utilisation_power_energy_memory(probe: NvmlProbe) -> None:
    idle, idle_w = _watch(probe, 2.0)
    with busy_gpu() as name:
        time.sleep(1.0)  # let clocks and the utilisation window catch up
        busy, busy_w = _watch(probe, 5.0)

    def rise(i: int) -> int:
        return (busy[i].memory_used_bytes or 0) - (idle[i].memory_used_bytes or 0)

    loaded = max(busy, key=rise)
    before, during = idle[loaded], busy[loaded]
    assert rise(loaded) >= 0.9 * BUSY_BYTES, f"{name}: memory rose only {rise(loaded)} B"
    if during.utilization_pct is not None:
        assert during.utilization_pct >= 50.0, f"{name}: utilisation {during.utilization_pct} %"
        assert during.utilization_pct > (before.utilization_pct or 0.0)
    if during.power_w is not None and before.power_w is not None:
        assert during.power_w > before.power_w, f"{name}: {before.power_w} -> {during.power_w} W"
    if loaded in busy_w and loaded in idle_w:
        # The energy counter must climb faster under load than at idle.
        assert busy_w[loaded] > idle_w[loaded], f"{name}: {idle_w[loaded]} -> {busy_w[loaded]} W"
        assert during.energy_j is not None and before.energy_j is not None
        assert during.energy_j > before.energy_j


def test_idle_sample_has_the_newer_fields(probe: NvmlProbe) -> None:
    status = probe.sample()
    assert status.driver, "driver version missing"
    for gpu in status.gpus:
        assert gpu.uuid and gpu.uuid.startswith(("GPU-", "MIG-"))
        assert not gpu.lost and gpu.message is None
        # Clocks and clock-event reasons are supported on every data-centre GPU.
        assert gpu.sm_clock_mhz is not None and gpu.mem_clock_mhz is not None
        assert gpu.mem_clock_mhz > 0
        assert isinstance(gpu.throttle_reasons, list)
        assert all(isinstance(r, str) and r for r in gpu.throttle_reasons)
        if gpu.ecc_corrected is not None:
            assert gpu.ecc_corrected >= 0 and gpu.ecc_uncorrected is not None
        if gpu.pcie_tx_kbs is not None:
            assert gpu.pcie_tx_kbs >= 0 and gpu.pcie_rx_kbs is not None
        assert gpu.processes is not None, "process list not supported"
        assert gpu.mig is None or all(isinstance(m, str) for m in gpu.mig)
    assert probe.drain_events() == []  # nothing happened


def test_busy_child_is_listed_with_its_memory_and_clocks_move(
    probe: NvmlProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml_module, "SLOW_PERIOD_S", 0.0)  # the process list on every poll
    try:
        with busy_child() as (name, pid):
            time.sleep(1.0)
            deadline = time.monotonic() + 20.0
            seen: list[tuple[int, GpuSample]] = []
            while time.monotonic() < deadline:
                status = probe.sample()
                seen = [(g.index, g) for g in status.gpus if _listed(g, pid)]
                if seen:
                    break
                time.sleep(0.5)
            listed = [p for g in status.gpus for p in (g.processes or [])]
            if not seen and listed and not any(psutil.pid_exists(p.pid) for p in listed):
                # NVML reports pids of the host's pid namespace (a container): match by memory.
                seen = [
                    (g.index, g)
                    for g in status.gpus
                    if any((p.used_bytes or 0) >= 0.9 * BUSY_BYTES for p in g.processes or [])
                ]
            assert seen, f"{name}: child {pid} not among GPU processes {listed}"
            _, gpu = seen[0]
            assert gpu.processes is not None
            mine = [p for p in gpu.processes if p.pid == pid]
            if mine:
                assert mine[0].used_bytes is None or mine[0].used_bytes >= 0.9 * BUSY_BYTES
                assert mine[0].name and "python" in mine[0].name.lower()
            assert gpu.sm_clock_mhz is not None and gpu.sm_clock_mhz > 0, f"{name}: SM clock"
            assert gpu.mem_clock_mhz is not None and gpu.mem_clock_mhz > 0
            assert isinstance(gpu.throttle_reasons, list)
            # The server's pids come first once they are known.
            probe.set_server_pids([pid])
            first = probe.sample().gpus[gpu.index].processes or []
            if mine:
                assert first and first[0].pid == pid
    finally:
        probe.set_server_pids([])


def _listed(gpu: GpuSample, pid: int) -> bool:
    return any(p.pid == pid for p in gpu.processes or [])
