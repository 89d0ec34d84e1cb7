"""`tokentop report` (python -m loadgen.analysis.report) on a torn, still-running directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from msgspec import to_builtins

from loadgen.model import hdr
from loadgen.model.snapshot import (
    Counters,
    Event,
    GpuSample,
    GpuStatus,
    LoadState,
    ProcessSample,
    ServerMetrics,
    Snapshot,
    Target,
)
from loadgen.record.recorder import Recorder
from loadgen.run.config import RunConfig

T0 = 1_700_000_000.0


def snap(i: int) -> Snapshot:
    down = 20 <= i < 25
    vals = np.full(20, 15_000.0 + (i % 7) * 100)
    idx, cnt = hdr.sparse_counts(vals)
    h = hdr.encode(hdr.dense_from_sparse([(idx, cnt)]))
    return Snapshot(
        run_id="r", seq=i, t=T0 + i + 1, elapsed=i + 1.0, interval=1.0,
        target=Target(url="http://x/v1", model="m"), load=LoadState(state="running",
                                                                     in_flight=4),
        counters=Counters(requests_ok=5 * min(i + 1, 20) + 5 * max(0, i - 24),
                          requests_failed=3 * max(0, min(i, 25) - 19),
                          errors={"connect": 3 * max(0, min(i, 25) - 19)},
                          output_tokens=50 * (i + 1)),
        hist={} if down else {"ttft": h, "itl": h},
        server=ServerMetrics(url="m", ok=not down, waiting=2.0, running=4.0,
                             error="refused" if down else None),
        gpu=GpuStatus(source="simulated", gpus=[GpuSample(index=0, name="g", simulated=True,
                                                          memory_used_bytes=int(8e9 + i * 1e6),
                                                          power_w=300.0)]),
        process=ProcessSample(pid=1, rss_bytes=int(1e9 + i * 2e6)),
        events=[Event(t=T0 + i, kind="error", level="error", message="3× connect")] if down
        else [],
    )


def test_report_on_a_torn_running_directory(tmp_path):
    rec = Recorder.create(tmp_path / "run", to_builtins(RunConfig(slo="ttft_p99<1s,error_rate<1%")),
                          run_id="r")
    for i in range(60):
        rec.write(snap(i))
    # no close(): still "running"; and a torn last line
    with open(rec.run_dir / "snapshots.jsonl", "ab") as f:
        f.write(b'{"v":1,"run_id":"r","seq":60,')
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "xdg"))
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "report", str(rec.run_dir)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 3, proc.stderr  # error_rate<1% fails
    assert "Traceback" not in proc.stderr
    assert "outages: 2" in proc.stdout
    assert "FAIL error_rate<1%" in proc.stdout and "PASS ttft_p99<1s" in proc.stdout
    r = json.loads((rec.run_dir / "report.json").read_text())
    assert r["ticks"] == 60
    assert any("incomplete" in w for w in r["warnings"])
    assert {o["kind"] for o in r["outages"]} == {"client", "server"}
    assert r["drift"]["server_rss"]["slope_mb_h"] == 7200.0  # 2 MB/s
    md = (rec.run_dir / "report.md").read_text()
    assert "## Outages" in md and "![latency](latency.png)" in md
    for name in ("throughput", "latency", "queue", "gpu", "server_rss"):
        png = rec.run_dir / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_report_on_a_missing_directory_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "report", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "is not a directory" in proc.stderr
