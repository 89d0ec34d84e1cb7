"""`tokentop report` on a real recorded run (the simulator on 127.0.0.1, a note, a pause): the
files it prints are the files it wrote, report.md speaks in words, a short run's MB/h slope
is withheld, and the plots are ones to paste into a postmortem: every legend entry drawn,
plain tick labels with units, time in the run's own scale, the note and the pause marked.
The truths come from the recording itself (Snapshots, events.jsonl), not from the report."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle
from msgspec import to_builtins
from support import FAST, running_sim, tokentop

from loadgen.analysis.report import analyze_dir, figures, time_axis
from loadgen.model import hdr
from loadgen.model.snapshot import (
    Control,
    Counters,
    GpuSample,
    GpuStatus,
    LoadState,
    ProcessSample,
    Snapshot,
    Target,
)
from loadgen.record.recorder import Recorder
from loadgen.record.rundir import iter_snapshots, read_events
from loadgen.run.config import RunConfig
from loadgen.run.session import Session
from loadgen.sim import SimConfig

NOTE = "raised max-num-seqs to 16"
SECONDS = 8.0


async def record_run(out: Path) -> None:
    """8 s of 8 streams at the simulator's own (slow) step times: a stream lasts over a
    second and they finish together, so a 0.5 s tick sees a first token only now and then
    (the TTFT series that once got a legend entry and no line). A note at 2 s, a pause
    from 3.5 s to 5 s, steered by the Snapshots' own clock."""
    real_steps = {k: getattr(SimConfig(), k) for k in FAST}
    async with running_sim(**real_steps) as sim:
        # started at once (--stagger 0), so they finish together: the case that broke it
        cfg = RunConfig(url=sim.url, concurrency=8, duration=SECONDS, tick=0.5, workers=1,
                        drain_grace=1.0, out=str(out), tokenizer="none", stagger=0.0)
        session = Session(cfg)
        await session.start()
        steps = [(2.0, Control(op="mark", note=NOTE, source="key")),
                 (3.5, Control(op="pause", source="key")),
                 (5.0, Control(op="resume", source="key"))]
        async for snap in session.snapshots():
            while steps and snap.elapsed >= steps[0][0]:
                await session.control(steps.pop(0)[1])
        await session.finish()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "run"
    asyncio.run(record_run(out))
    return out


@pytest.fixture(scope="module")
def reported(run_dir, tmp_path_factory):
    """`tokentop report RUN --out-dir D` once: (its output, D)."""
    where = tmp_path_factory.mktemp("written")
    proc = tokentop("report", str(run_dir), "--out-dir", str(where))
    assert proc.returncode == 0, proc.stderr
    return proc, where


@pytest.fixture(scope="module")
def figs(run_dir):
    r, analyzer = analyze_dir(run_dir, warnings=[])
    out = figures(r, analyzer)
    for fig in out.values():
        fig.canvas.draw()  # tick labels exist once drawn
    yield out
    for fig in out.values():
        plt.close(fig)


def snapshots(run_dir: Path) -> list[Snapshot]:
    return list(iter_snapshots(run_dir))


# ---- the command's output and its files


def test_it_prints_every_file_it_wrote_and_no_png_is_empty(reported):
    proc, where = reported
    printed = {Path(line.removeprefix("wrote ")) for line in proc.stdout.splitlines()
               if line.startswith("wrote ")}
    on_disk = set(where.iterdir())
    assert printed == on_disk
    pngs = {p for p in on_disk if p.suffix == ".png"}
    assert {p.name for p in on_disk - pngs} == {"report.md", "report.json"}
    assert {p.stem for p in pngs} == {"throughput", "latency", "queue", "gpu", "server_rss"}
    assert all(p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 1000 for p in pngs)


def test_report_md_speaks_in_words_and_withholds_a_short_slope(reported, run_dir):
    proc, where = reported
    md = (where / "report.md").read_text()
    assert "{'" not in md and "{" not in md.split("## Plots")[0]  # no Python dict anywhere
    assert re.search(r"Limit \(5x the median per-tick P99\): TTFT [\d.]+ ms, ITL [\d.]+ ms; "
                     r"intervals above it: TTFT \d+, ITL \d+\.", md)
    assert "MB/h" not in md and "MB/h" not in proc.stdout
    # the RSS samples' span, from the recording: the load's ticks, up to the first draining
    # one (what the drain frees is no trend)
    snaps = snapshots(run_dir)
    load_end = next(s for s in snaps if s.load.state in ("draining", "stopped"))
    span = load_end.elapsed - snaps[0].elapsed
    said = f"run too short for a slope ({span:.1f} s; needs ≥ 10.0 min)"
    assert f"Server RSS: {said}" in md and "server RSS " in proc.stdout and said in proc.stdout
    r = json.loads((where / "report.json").read_text())
    for key in ("server_rss", "gpu_memory"):
        s = r["drift"][key]
        assert s["slope_mb_h"] is None and s["slope_withheld"] == said
        assert s["min_span_s"] == 600.0
    # the note and the pause, in words, at their times
    assert f"mark: {NOTE}" in md and "load paused for" in md


# ---- the plots


def visible(line) -> bool:
    """Drawn so one can see it: a marker on a finite point, or two finite points in a row
    (a line between NaNs draws nothing)."""
    y = np.asarray(line.get_ydata(), float)
    f = np.isfinite(y)
    if line.get_marker() not in (None, "None", "", " "):
        return bool(f.any())
    return bool((f[1:] & f[:-1]).any()) and line.get_linestyle() not in ("None", "")


def test_every_legend_entry_is_a_line_one_can_see(figs, run_dir):
    # the case that broke it is there: ticks with a first token between ticks without
    ttft = np.array([hdr.decode(s.hist["ttft"]).sum() if "ttft" in s.hist else 0
                     for s in snapshots(run_dir)]) > 0
    alone = ttft & ~np.r_[False, ttft[:-1]] & ~np.r_[ttft[1:], False]
    assert alone.any(), "the recording has no tick with a TTFT between ticks without"
    for name, fig in figs.items():
        for ax in fig.axes:
            data_lines = {ln.get_label(): ln for ln in ax.get_lines()
                          if not ln.get_label().startswith("_")}
            listed = [t.get_text() for t in ax.get_legend().get_texts()]
            for label, line in data_lines.items():
                assert label in listed, (name, label)
                assert visible(line), (name, label)
            # the rest of the legend names what is marked, not a series
            extra = set(listed) - set(data_lines)
            assert extra <= {"client outage", "server /metrics outage", "load paused",
                             "recording gap (tokentop not running)",
                             "operator event / note"}, (name, extra)
    latency = {t.get_text() for t in figs["latency"].axes[0].get_legend().get_texts()}
    assert {"TTFT p50 (ms)", "TTFT p99 (ms)", "ITL p50 (ms)", "ITL p99 (ms)"} <= latency


def test_axes_have_units_and_plain_tick_labels(figs):
    assert [ax.get_ylabel() for ax in figs["gpu"].axes] == ["MB", "W"]  # no twin axis
    assert [t.get_text() for t in figs["gpu"].axes[0].get_legend().get_texts()][:1] == \
        ["GPU memory used (MB)"]
    assert [t.get_text() for t in figs["gpu"].axes[1].get_legend().get_texts()] == \
        ["GPU power (W)"]
    for name, fig in figs.items():
        for ax in fig.axes:
            assert ax.get_ylabel(), name
            labels = [t.get_text() for t in ax.get_yticklabels()]
            assert labels and not any(re.search(r"[$^×]|10\^|e[+-]\d", lb) for lb in labels), \
                (name, labels)
        assert fig.axes[0].get_title().endswith(f"run {fig.axes[0].get_title().split()[-1]}")


def test_time_is_in_seconds_for_a_short_run(figs, run_dir):
    snaps = snapshots(run_dir)
    start = snaps[0].t - snaps[0].elapsed
    for name, fig in figs.items():
        ax = fig.axes[-1]
        assert ax.get_xlabel() == "time since the run started (s)", name
        x = np.concatenate([ln.get_xdata() for ln in ax.get_lines()
                            if not ln.get_label().startswith("_")])
        assert x.max() == pytest.approx(snaps[-1].t - start, abs=1e-6)


def test_time_axis_is_the_runs_own_scale():
    assert time_axis(17) == ("s", 1.0)
    assert time_axis(180) == ("s", 1.0)
    assert time_axis(20 * 60) == ("min", 60.0)
    assert time_axis(3 * 3600) == ("min", 60.0)
    assert time_axis(5 * 3600) == ("h", 3600.0)


def test_the_note_and_the_pause_are_marked(figs, run_dir):
    snaps = snapshots(run_dir)
    start = snaps[0].t - snaps[0].elapsed
    (note,) = [e for e in read_events(run_dir) if e["message"] == f"mark: {NOTE}"]
    paused = [s for s in snaps if s.load.state == "paused"]
    assert paused, "the recording has no paused tick"
    pause = (paused[0].t - paused[0].interval - start, paused[-1].t - start)
    for name, fig in figs.items():
        for ax in fig.axes:
            at = [ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_linestyle() == "--"]
            assert any(abs(a - (note["t"] - start)) < 1e-6 for a in at), name
            spans = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches
                     if isinstance(p, Rectangle)]
            assert any(a == pytest.approx(pause[0], abs=1e-6)
                       and b == pytest.approx(pause[1], abs=1e-6) for a, b in spans), name
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert any(t.strip().startswith("mark: raised max-num") for t in texts), name
        assert "load paused" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


# ---- a longer run: minutes, and its slope shown


def test_a_twenty_minute_run_is_in_minutes_and_shows_its_slope(tmp_path):
    step, n = 2.0, 600  # 20 min of 2 s ticks; the RSS grows 5 kB/s, 18 MB/h
    rec = Recorder.create(tmp_path / "run", to_builtins(RunConfig()), run_id="long")
    idx, cnt = hdr.sparse_counts(np.full(20, 15_000.0))
    h = hdr.encode(hdr.dense_from_sparse([(idx, cnt)]))
    t0 = 1_700_000_000.0
    for i in range(n):
        e = (i + 1) * step
        rec.write(Snapshot(
            run_id="long", seq=i, t=t0 + e, elapsed=e, interval=step,
            target=Target(url="http://x/v1", model="m"), load=LoadState(state="running"),
            counters=Counters(requests_ok=10 * (i + 1), output_tokens=1000 * (i + 1)),
            hist={"ttft": h, "itl": h},
            gpu=GpuStatus(source="simulated", gpus=[GpuSample(index=0, name="g",
                                                              simulated=True)]),
            process=ProcessSample(pid=1, rss_bytes=int(1e9 + e * 5e3))))
    rec.close()
    r, analyzer = analyze_dir(rec.run_dir, warnings=[])
    rss = r["drift"]["server_rss"]
    assert rss["slope_mb_h"] == pytest.approx(5e3 * 3600 / 1e6, rel=1e-3)
    assert "slope_withheld" not in rss
    out = figures(r, analyzer)
    try:
        assert "gpu" not in out  # no memory nor power seen: no empty plot
        assert {fig.axes[-1].get_xlabel() for fig in out.values()} == {
            "time since the run started (min)"}
        x = out["server_rss"].axes[0].get_lines()[0].get_xdata()
        assert x.max() == pytest.approx(n * step / 60)
    finally:
        for fig in out.values():
            plt.close(fig)
