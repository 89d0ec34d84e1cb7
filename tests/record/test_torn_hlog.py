"""A latency.hlog torn mid-record (a full disk, a kill between a tick's Snapshot line and its
latency lines) is cut and mended on resume: read back by HdrHistogram's own reader, the
resumed recording holds every recorded tick's histograms once, the same counts as the
Snapshots (what the workers measured), nothing lost before the tear."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader
from support import headless_argv

from loadgen.model import hdr
from loadgen.record.rundir import iter_snapshots, read_manifest


def run(argv: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    env.pop("OPENAI_API_KEY", None)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done


Interval = tuple[str, float, int]  # metric, start (unix s), samples


def hlog_intervals(path) -> list[Interval]:
    """Every interval of the log in file order, as HdrHistogram's own reader reads it."""
    reader = HistogramLogReader(str(path), HdrHistogram(1, 3_600_000_000, 3))
    got: list[Interval] = []
    while (h := reader.get_next_interval_histogram()) is not None:
        got.append((h.get_tag(), h.get_start_time_stamp() / 1000.0, h.get_total_count()))
    return got


def snapshot_intervals(run_dir, start_time: float) -> list[Interval]:
    """The same from the Snapshots: each tick's histograms, a metric at a time."""
    warnings: list[str] = []
    want: list[Interval] = []
    for snap in iter_snapshots(run_dir, warn=warnings.append):
        start = max(snap.t - snap.interval, start_time)
        want += [(metric, start, int(hdr.decode(blob).sum()))
                 for metric, blob in snap.hist.items()]
    assert warnings == []
    return want


def same(log: list[Interval], snaps: list[Interval]) -> bool:
    """The same intervals in the same order (starts as the log writes them, to the ms)."""
    return len(log) == len(snaps) and all(
        a[0] == b[0] and a[2] == b[2] and abs(a[1] - b[1]) < 0.002
        for a, b in zip(log, snaps, strict=True))


@pytest.mark.parametrize("where", ["in the last tick", "half way through"])
async def test_a_torn_hlog_is_cut_and_mended_on_resume(sim, tmp_path, where: str):
    out = tmp_path / "run"
    # the simulator answers on this loop: each run waits in a thread
    await asyncio.to_thread(run, headless_argv(
        url=sim.url, concurrency=3, workers=1, tick=0.2, duration=2.0, output_tokens="16",
        input_tokens="16", out=out, drain_grace=1.0), tmp_path)
    hlog = out / "latency.hlog"
    data = hlog.read_bytes()
    start_time = read_manifest(out)["start_time"]
    before = snapshot_intervals(out, start_time)
    assert len(before) > 20 and same(hlog_intervals(hlog), before)  # as recorded
    # the tear: in the middle of a record, either the last tick's second line (the disk
    # filled after its first) or a line half way through the log
    lines = data.splitlines(keepends=True)
    tags = [i for i, line in enumerate(lines) if line.startswith(b"Tag=")]
    torn = tags[-2] if where == "in the last tick" else tags[len(tags) // 2]
    cut = sum(len(line) for line in lines[:torn]) + len(lines[torn]) // 2
    hlog.write_bytes(data[:cut])

    resumed = await asyncio.to_thread(run, headless_argv(resume=out, duration=1.0), tmp_path)
    assert f"resuming {out}" in resumed.stderr
    after = snapshot_intervals(out, start_time)
    assert len(after) > len(before) and after[:len(before)] == before  # and the resumed ticks
    # whole: every tick's histograms once, in order, those around the tear included
    assert same(hlog_intervals(hlog), after)
