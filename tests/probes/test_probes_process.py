"""The server-process probe against real child processes on loopback, and the RSS trend."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from support import ROOT

from probes import process as process_module
from probes.process import ProcessProbe, RssTrend, find_listener, local_port

ANNOUNCE = "TOKENTOP_SIM_LISTENING"


def _read_line(proc: subprocess.Popen[str], timeout_s: float = 30.0) -> str:
    assert proc.stdout is not None
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    return box[0].strip() if box else ""


@contextlib.contextmanager
def _child(args: list[str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        args,
        stdin=subprocess.PIPE,  # --exit-with-parent: EOF on stdin ends it
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def sim_script(tmp_path: Path) -> Path:
    """A uniquely named launcher for the simulator, so a search by name finds only ours."""
    script = tmp_path / f"tokentop_test_server_{uuid.uuid4().hex[:8]}.py"
    script.write_text("import runpy\nrunpy.run_module('tui.cli', run_name='__main__')\n")
    return script


@contextlib.contextmanager
def _sim(script: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    with _child(
        [sys.executable, str(script), "sim", "--port", "0", "--announce", "--exit-with-parent"]
    ) as proc:
        line = _read_line(proc)
        assert line.startswith(ANNOUNCE), f"simulator did not start: {line!r}"
        yield proc, int(line.split()[-1])


def test_found_by_pid_and_sampled(sim_script: Path) -> None:
    with _sim(sim_script) as (proc, _port):
        probe = ProcessProbe(pid=proc.pid)
        first = probe.sample()
        assert first is not None
        assert first.pid == proc.pid
        assert first.found_by == "pid"
        assert first.rss_bytes is not None and first.rss_bytes > 10 * 2**20
        assert first.cpu_pct is None  # the first reading has nothing to compare with
        assert first.threads is not None and first.threads >= 1
        assert first.open_files is not None and first.open_files >= 3  # stdio + the socket
        assert first.children == 0
        assert first.rss_slope_mb_h is None  # not enough points yet
        deadline = time.monotonic() + 5.0  # cpu % needs a measurable interval between samples
        while (second := probe.sample()) is None or second.cpu_pct is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"no CPU % within 5 s: {second}")
            time.sleep(0.05)
        assert second.cpu_pct >= 0.0
        assert probe.pids() == [proc.pid]
        events = probe.drain_events()
        assert [e.message for e in events] == [
            f"server process {proc.pid} ({first.name}) found by pid"
        ]


def test_found_by_listening_port(sim_script: Path) -> None:
    with _sim(sim_script) as (proc, port):
        probe = ProcessProbe(port=port)
        s = probe.sample()
        assert s is not None
        assert (s.pid, s.found_by) == (proc.pid, "port")
        assert local_port(f"http://127.0.0.1:{port}/v1") == port


def test_port_fallback_when_the_socket_table_is_not_ours(
    sim_script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unprivileged on macOS (AccessDenied) or Linux (owner pid None): scan processes instead.
    def denied(kind: str = "inet") -> list:
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "net_connections", denied)
    with _sim(sim_script) as (proc, port):
        found = find_listener(port)
        assert found is not None and found.pid == proc.pid


def test_found_by_name_and_refound_after_restart(
    sim_script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_module, "REFIND_PERIOD_S", 0.0)
    probe = ProcessProbe(name=sim_script.name)
    with _sim(sim_script) as (first, _):
        s = probe.sample()
        assert s is not None and (s.pid, s.found_by) == (first.pid, "name")
    # The server went away: n/a with the reason, and an event.
    assert probe.sample() is None
    assert probe.message is not None and sim_script.name in probe.message
    messages = [e.message for e in probe.drain_events()]
    assert f"server process {first.pid} exited" in messages
    # A new server under the same name is found again.
    with _sim(sim_script) as (second, _):
        s = probe.sample()
        assert s is not None and s.pid == second.pid


def test_children_are_summed() -> None:
    code = (
        "import subprocess, sys\n"
        "c = subprocess.Popen([sys.executable, '-c', "
        "'import sys, time; x = bytearray(80_000_000); print(1, flush=True); time.sleep(60)'], "
        "stdout=subprocess.PIPE)\n"
        "c.stdout.readline(); print('ready', flush=True); sys.stdin.read()\n"
    )
    with _child([sys.executable, "-c", code]) as proc:
        assert _read_line(proc) == "ready"
        parent_rss = psutil.Process(proc.pid).memory_info().rss
        s = ProcessProbe(pid=proc.pid).sample()
        assert s is not None
        assert s.children == 1
        assert s.rss_bytes is not None and s.rss_bytes >= parent_rss + 75_000_000
        assert s.threads is not None and s.threads >= 2


def test_missing_pid_says_why() -> None:
    probe = ProcessProbe(pid=2**22 + 12345)
    assert probe.sample() is None
    assert probe.message == f"no process with pid {2**22 + 12345}"


def test_nothing_listening_says_why() -> None:
    probe = ProcessProbe(port=9)  # discard: nothing listens
    assert probe.sample() is None
    assert probe.message == "no visible process listens on TCP port 9"


def test_local_port() -> None:
    assert local_port("http://127.0.0.1:8000/v1") == 8000
    assert local_port("http://localhost/v1") == 80
    assert local_port("https://[::1]/v1") == 443
    assert local_port("http://203.0.113.5:8000/v1") is None  # TEST-NET-3: not this machine
    assert local_port("http://inference.example:8000/v1") is None
    assert local_port("not a url") is None


# -- RSS trend ----------------------------------------------------------------------------


def test_rss_trend_slope_by_least_squares() -> None:
    trend = RssTrend(window_s=1800.0, min_points=10, min_span_s=30.0)
    rng = np.random.default_rng(7)
    base = 2e9
    t0 = 1_700_000_000.0
    for i in range(9):
        trend.add(t0 + i * 10.0, base)
    assert trend.slope_mb_h() is None  # too few points
    trend = RssTrend(window_s=1800.0)
    for i in range(360):  # one hour, every 10 s: +36 MB/h with ±2 MB noise
        t = t0 + i * 10.0
        trend.add(t, base + 10_000.0 * (t - t0) + rng.normal(0.0, 2e6))
    slope = trend.slope_mb_h()
    assert slope is not None and slope == pytest.approx(36.0, abs=2.0)
    assert len(trend) <= 181  # only the last 30 minutes are kept


def test_rss_trend_flat_and_falling_and_bounded() -> None:
    trend = RssTrend(max_points=50, min_points=5, min_span_s=1.0)
    for i in range(200):
        trend.add(float(i), 1e9)
    assert len(trend) == 50
    assert trend.slope_mb_h() == pytest.approx(0.0, abs=1e-9)
    trend.clear()
    for i in range(20):
        trend.add(float(i), 1e9 - 1e6 * i)  # -1 MB/s
    assert trend.slope_mb_h() == pytest.approx(-3600.0)


def test_rss_trend_needs_a_time_span() -> None:
    trend = RssTrend(min_points=3, min_span_s=60.0)
    for i in range(20):
        trend.add(1000.0 + i, 1e9 + i)  # 19 s of points: not enough span
    assert trend.slope_mb_h() is None


def test_own_process_is_never_found_by_name() -> None:
    me = psutil.Process(os.getpid())
    probe = ProcessProbe(name=me.name())
    s = probe.sample()
    assert s is None or s.pid != os.getpid()
