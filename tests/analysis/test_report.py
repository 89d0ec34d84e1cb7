"""`tokentop report` on a torn, still-running directory, and on a disk that fills: the summary
it computed is printed all the same, one line says what could not be written, no partial
(0-byte) PNG is left, exit 2."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import msgspec
import numpy as np
import pytest
from msgspec import UNSET, to_builtins
from support import fsize_limit, tokentop

from loadgen.analysis.report import Report, write_report
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
                          # no token arrives while it is down: an outage by the definition
                          output_tokens=50 * (min(i + 1, 20) + max(0, i - 24))),
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
    # one failure (connects refused and /metrics silent at once): one outage, two views
    assert "outages: 1 (" in proc.stdout
    assert "FAIL error_rate<1%" in proc.stdout and "PASS ttft_p99<1s" in proc.stdout
    r = json.loads((rec.run_dir / "report.json").read_text())
    assert r["ticks"] == 60
    assert r["outage_events"] == 1
    assert sorted(o["kind"] for o in r["outages"]) == ["client", "server"]
    assert {o["event"] for o in r["outages"]} == {1}
    assert any("incomplete" in w for w in r["warnings"])
    assert {o["kind"] for o in r["outages"]} == {"client", "server"}
    # 2 MB/s for a minute: start-up growth, not a leak, so no MB/h figure (test_soak has it)
    rss = r["drift"]["server_rss"]
    assert rss["slope_mb_h"] is None and rss["slope_withheld"].startswith(
        "run too short for a slope (59.0 s; needs ≥ 10.0 min)")
    md = (rec.run_dir / "report.md").read_text()
    assert "## Outages" in md and "![latency](latency.png)" in md
    for name in ("throughput", "latency", "queue", "gpu", "server_rss"):
        png = rec.run_dir / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_report_json_reads_back_as_a_report_byte_for_byte(tmp_path):
    """The typed Report is report.json's shape: same keys, same nesting, same order; and a
    report.json from before pauses, stalls, availability and the measured requests reads."""
    rec = Recorder.create(tmp_path / "run", to_builtins(RunConfig(slo="ttft_p99<1s")),
                          run_id="r")
    for i in range(60):
        rec.write(snap(i))
    rec.close()
    code, r = write_report(rec.run_dir, out=io.StringIO(), plots=False)
    raw = (rec.run_dir / "report.json").read_text()
    report = msgspec.json.decode(raw, type=Report)
    assert json.dumps(to_builtins(report), indent=2, default=str) + "\n" == raw
    assert to_builtins(report) == r and code == 0
    assert report.outages[0].duration_s == pytest.approx(5.0)
    assert report.drift.server_rss.slope_withheld.startswith("run too short")
    old = json.loads(raw)
    for key in ("measured_requests", "outage_s", "availability", "stalls", "pauses",
                "not_written", "plots"):
        del old[key]
    for o in old["outages"]:
        del o["gap_s"]
    for slope in ("server_rss", "gpu_memory"):
        del old["drift"][slope]["min_span_s"], old["drift"][slope]["slope_withheld"]
    first = msgspec.convert(old, Report)
    assert first.measured_requests is None and first.pauses == []
    assert first.outages[0].gap_s == 0.0 and first.drift.server_rss.slope_withheld is UNSET


def test_report_on_a_missing_directory_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "report", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "is not a directory" in proc.stderr


# ---- on a full disk

LIMIT = 16_000  # bytes a file: report.md and report.json fit (~2 and ~12 kB), no plot does


def tick(i: int) -> Snapshot:
    idx, cnt = hdr.sparse_counts(np.full(20, 15_000.0 + (i % 7) * 900))
    h = hdr.encode(hdr.dense_from_sparse([(idx, cnt)]))
    return Snapshot(
        run_id="r", seq=i, t=T0 + i + 1, elapsed=i + 1.0, interval=1.0,
        target=Target(url="http://x/v1", model="m"),
        load=LoadState(state="running", in_flight=4 + i % 3),
        counters=Counters(requests_ok=5 * (i + 1), output_tokens=50 * (i + 1)),
        hist={"ttft": h, "itl": h},
        server=ServerMetrics(url="m", ok=True, waiting=float(i % 4), running=4.0),
        gpu=GpuStatus(source="simulated", gpus=[GpuSample(
            index=0, name="g", simulated=True, memory_used_bytes=int(8e9 + i * 1e6),
            power_w=300.0 + i % 5)]),
        process=ProcessSample(pid=1, rss_bytes=int(1e9 + i * 2e6)),
    )


def test_a_full_disk_still_prints_the_summary_and_leaves_no_partial_png(tmp_path):
    rec = Recorder.create(tmp_path / "run", to_builtins(RunConfig()), run_id="r")
    for i in range(120):
        rec.write(tick(i))
    rec.close()
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "report", str(rec.run_dir)],
                          capture_output=True, text=True, timeout=90,
                          stdin=subprocess.DEVNULL, preexec_fn=fsize_limit(LIMIT))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith("run r  finished  target http://x/v1")  # what it computed
    assert "outages: 0" in proc.stdout and "TTFT p50" in proc.stdout
    said = [line for line in proc.stderr.splitlines() if line.startswith("tokentop")]
    assert len(said) == 1, proc.stderr
    assert said[0].startswith("tokentop report: could not write throughput.png, latency.png")
    assert "file size limit reached" in said[0] and str(rec.run_dir) in said[0]
    assert list(rec.run_dir.glob("*.png")) == []  # none left half-written
    r = json.loads((rec.run_dir / "report.json").read_text())  # what fitted is whole
    assert r["plots"] == [] and {m["file"] for m in r["not_written"]} == {
        "throughput.png", "latency.png", "queue.png", "gpu.png", "server_rss.png"}
    assert "## Plots" not in (rec.run_dir / "report.md").read_text()

    helped = tokentop("report", "--help")
    assert "part of the report could not be written" in " ".join(helped.stdout.split())
