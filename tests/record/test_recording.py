"""Run directories: the recorder, crash safety (real kill -9), resume, torn lines, disk full,
and latency.hlog read back with HdrHistogram's own reader."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader
from msgspec import to_builtins
from support import FIXTURES, fsize_limit, headless_argv

from loadgen.analysis.soak import analyze
from loadgen.model import hdr
from loadgen.model.snapshot import (
    Counters,
    Event,
    LoadState,
    Snapshot,
    SnapshotVersionError,
    Target,
)
from loadgen.record.recorder import Recorder, Recording, RecordingError
from loadgen.record.rundir import iter_snapshots, last_snapshot, parts, read_events, read_manifest
from loadgen.run.config import ConfigError, RunConfig
from loadgen.run.resume import read_resume

T0 = 1_700_000_000.0


@pytest.fixture(autouse=True)
def _data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def snap(seq: int, *, tick: float = 0.5, ok: int = 0, values_us=(1000, 2000, 50_000),
         events=()) -> Snapshot:
    idx, cnt = hdr.sparse_counts(np.array(values_us, dtype=float))
    blob = hdr.encode(hdr.dense_from_sparse([(idx, cnt)]))
    return Snapshot(
        run_id="r1", seq=seq, t=T0 + (seq + 1) * tick, elapsed=(seq + 1) * tick, interval=tick,
        target=Target(url="http://127.0.0.1:1/v1", model="m"),
        load=LoadState(state="running"), counters=Counters(requests_ok=ok),
        hist={"ttft": blob, "itl": blob}, events=list(events),
    )


def child_env(tmp_path) -> dict:
    env = dict(os.environ)
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    env.pop("OPENAI_API_KEY", None)
    return env


def test_layout_manifest_and_hlog_read_back_by_hdrhistograms_reader(tmp_path):
    cfg = RunConfig(url="http://127.0.0.1:1/v1", slo="ttft_p99<1s")
    rec = Recorder.create(None, to_builtins(cfg), run_id="r1")
    assert rec.run_dir.parent == tmp_path / "xdg" / "tokentop" / "runs"
    assert rec.run_dir.name.endswith("-r1")
    for i in range(6):
        rec.write(snap(i, ok=i, events=[Event(t=T0 + i, kind="operator", message=f"m{i}")]))
    rec.close({"done": True, "api_key": "sk-secret"})
    m = read_manifest(rec.run_dir)
    assert m["status"] == "finished" and m["run_id"] == "r1"
    assert m["start_time"] == pytest.approx(T0)
    assert m["config"]["slo"] == "ttft_p99<1s" and m["target"]["model"] == "m"
    assert m["summary"]["api_key"] == "[removed]"
    assert "sk-secret" not in (rec.run_dir / "manifest.json").read_text()
    assert [s.seq for s in iter_snapshots(rec.run_dir)] == list(range(6))
    assert [e["message"] for e in read_events(rec.run_dir)] == [f"m{i}" for i in range(6)]

    text = (rec.run_dir / "latency.hlog").read_text()
    assert "#[Histogram log format version 1.2]" in text
    assert "Tag=ttft,0.000,0.500,50.015," in text  # start, length, max in ms
    reader = HistogramLogReader(str(rec.run_dir / "latency.hlog"),
                                HdrHistogram(1, 3_600_000_000, 3))
    got = []
    while (h := reader.get_next_interval_histogram()) is not None:
        got.append((h.get_tag(), h.get_start_time_stamp() / 1000.0, h.get_total_count(),
                    h.get_value_at_percentile(50)))
    assert reader.get_start_time_sec() == pytest.approx(T0, abs=1e-3)
    assert len(got) == 12
    assert got[0][0] == "ttft" and got[1][0] == "itl"
    assert got[2][1] == pytest.approx(T0 + 0.5, abs=1e-3)  # absolute start of tick 1
    assert all(count == 3 for _, _, count, _ in got)
    assert got[0][3] == pytest.approx(2000, rel=1e-3)


def test_rotation_keeps_files_bounded_and_readers_read_all_parts(tmp_path):
    rec = Recorder.create(tmp_path / "run", to_builtins(RunConfig()), run_id="r1",
                          rotate_bytes=4000)
    for i in range(20):
        rec.write(snap(i))
    rec.close()
    snaps = parts(rec.run_dir, "snapshots")
    assert len(snaps) > 3
    assert snaps[0].name == "snapshots.jsonl" and snaps[1].name == "snapshots.000001.jsonl"
    assert all(p.stat().st_size < 4000 + 2000 for p in snaps)
    assert len(parts(rec.run_dir, "latency")) == len(snaps)
    assert [s.seq for s in iter_snapshots(rec.run_dir)] == list(range(20))
    # every hlog part stands alone for HdrHistogram's tools (its own header)
    for p in parts(rec.run_dir, "latency"):
        assert p.read_text().startswith("#[tokentop")


def test_torn_and_corrupt_lines_are_skipped_with_a_warning(tmp_path):
    rec = Recorder.create(tmp_path / "run", to_builtins(RunConfig()), run_id="r1")
    for i in range(4):
        rec.write(snap(i))
    rec.close(status="running")
    path = rec.run_dir / "snapshots.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = b'{"v":1,"run_id":"r1","seq":\n'  # corrupt in the middle
    path.write_bytes(b"".join(lines) + lines[3][:57])  # and torn at the end
    warnings: list[str] = []
    assert [s.seq for s in iter_snapshots(rec.run_dir, warn=warnings.append)] == [0, 2, 3]
    assert any("line 2 is not a valid snapshot" in w for w in warnings)
    assert any("last line is incomplete" in w for w in warnings)
    assert last_snapshot(rec.run_dir).seq == 3


def test_unknown_snapshot_version_is_refused_in_words(tmp_path):
    rec = Recorder.create(tmp_path / "run", to_builtins(RunConfig()), run_id="r1")
    rec.write(snap(0))
    rec.close()
    with open(rec.run_dir / "snapshots.jsonl", "ab") as f:
        f.write(b'{"v": 99, "whatever": true}\n')
    with pytest.raises(SnapshotVersionError, match="version 99 is not supported"):
        list(iter_snapshots(rec.run_dir))


def test_unwritable_directory_is_one_clear_error(tmp_path):
    with pytest.raises(RecordingError, match="cannot create the run directory /dev/null/x"):
        Recorder.create("/dev/null/x", to_builtins(RunConfig()), run_id="r1")
    # the policy: "continue" goes on without recording, and the first Snapshot says so
    r = Recording.open(config={}, out="/dev/null/x", on_disk_full="continue", run_id="r1")
    s = snap(0)
    ev = r.take(s)
    assert ev is not None and "without recording" in ev.message and r.run_dir is None


def test_disk_full_stops_recording_with_a_message(tmp_path):
    run = tmp_path / "run"
    Recorder.create(run, to_builtins(RunConfig()), run_id="r1").close(status="running")
    (run / "snapshots.jsonl").unlink()
    (run / "snapshots.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    r = Recording(Recorder.resume(run), "stop")
    ev = r.take(snap(0))
    assert ev is not None and ev.level == "error"
    assert f"disk full while writing {run}/snapshots.jsonl: recording stopped" in ev.message
    assert r.stop_load
    assert r.take(snap(1)) is None  # once, then quiet
    assert r.close() is None
    assert "disk full" in read_manifest(run)["recording_stopped"]


async def test_file_size_limit_in_a_real_headless_run_stops_or_continues(sim, tmp_path):
    base = dict(url=sim.url, concurrency=4, workers=1, tick=0.1, duration=4.0,
                output_tokens="16", input_tokens="16", drain_grace=1.0)

    def run(name: str, policy: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            headless_argv(**base, out=tmp_path / name, on_disk_full=policy),
            capture_output=True, text=True, timeout=60, env=child_env(tmp_path),
            stdin=subprocess.DEVNULL,
            preexec_fn=fsize_limit(40_000),
        )

    stop, cont = await asyncio.gather(asyncio.to_thread(run, "stop", "stop"),
                                      asyncio.to_thread(run, "cont", "continue"))
    assert stop.returncode == 4, stop.stderr
    assert "file size limit reached while writing" in stop.stderr
    assert "recording stopped; stopping the load" in stop.stderr
    assert "Traceback" not in stop.stderr
    assert cont.returncode == 0, cont.stderr
    assert "the load goes on without recording" in cont.stderr
    last = cont.stderr.strip().splitlines()[-1]  # the final line says it too
    assert last.startswith("tokentop: done:") and "recording stopped early: file size" in last
    # what was written before is still readable
    for name in ("stop", "cont"):
        assert len(list(iter_snapshots(tmp_path / name, warn=lambda _m: None))) > 3


async def test_kill_9_mid_run_then_resume(sim, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        headless_argv(url=sim.url, concurrency=3, workers=1, tick=0.2, duration=60.0,
                      output_tokens="16", input_tokens="16", out=out, drain_grace=1.0),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=child_env(tmp_path),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            path = out / "snapshots.jsonl"
            if path.exists() and path.read_bytes().count(b"\n") >= 10:
                break
            await asyncio.sleep(0.1)
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)  # tokentop itself, mid-flight
        proc.wait(timeout=10)
    finally:
        # its load workers are ours too: make sure none is left behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    # every tool reads the directory; at most the last 2 s are lost
    snaps = list(iter_snapshots(out))
    assert len(snaps) >= 10
    assert [s.seq for s in snaps] == list(range(len(snaps)))
    assert killed_at - snaps[-1].t < 2.0
    assert read_manifest(out)["status"] == "running"
    reader = HistogramLogReader(str(out / "latency.hlog"), HdrHistogram(1, 3_600_000_000, 3))
    assert reader.get_next_interval_histogram() is not None
    # a torn last line, as a crash mid-write would leave
    with open(out / "snapshots.jsonl", "ab") as f:
        f.write(b'{"v":1,"run_id":"torn')

    resumed_cfg, resume = read_resume(out)
    assert resume.run_id == snaps[-1].run_id and resume.seq == snaps[-1].seq + 1
    assert resumed_cfg.concurrency == 3

    done = await asyncio.to_thread(
        subprocess.run,
        headless_argv("--json", str(tmp_path / "summary.json"), resume=out, duration=1.0),
        capture_output=True, text=True, timeout=60, env=child_env(tmp_path),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert f"resuming {out}" in done.stderr
    warnings: list[str] = []
    after = list(iter_snapshots(out, warn=warnings.append))
    assert warnings == []  # the torn tail was cut before appending
    assert [s.seq for s in after] == list(range(len(after)))
    assert {s.run_id for s in after} == {resume.run_id}
    assert after[-1].counters.requests_ok >= snaps[-1].counters.requests_ok
    assert any("resumed run" in e["message"] for e in read_events(out))
    m = read_manifest(out)
    assert m["status"] == "finished" and len(m["resumes"]) == 1
    result = analyze(after)
    assert len(result["gaps"]) == 1 and result["gaps"][0]["resumed_seq"] == resume.seq
    summary = json.loads((tmp_path / "summary.json").read_text())
    drained = (summary["drain"] or {}).get("requests_ok", 0)
    assert summary["requests"]["ok"] + drained == after[-1].counters.requests_ok
    # the latencies cover the whole run too, the part before the kill included: one E2E
    # sample per completed request, as the recorded histograms hold them
    recorded = sum(int(hdr.decode(s.hist["e2e"]).sum()) for s in after if "e2e" in s.hist)
    assert summary["latency_ms"]["e2e"]["count"] == recorded == after[-1].counters.requests_ok


def test_resume_reads_a_run_recorded_when_sim_args_were_flags(tmp_path):
    run = tmp_path / "run-v1"
    shutil.copytree(FIXTURES / "formats" / "run-v1", run)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["sim_args"] == []  # what those runs recorded
    manifest["config"]["duration"] = None
    (run / "manifest.json").write_text(json.dumps(manifest))
    cfg, _ = read_resume(run)
    assert cfg.sim is None  # the default simulator, as it was
    manifest["config"]["sim_args"] = ["--profile", "tiny"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"simulator flags \(--profile tiny\) were recorded"):
        read_resume(run)
