"""The plots postmortems paste, from real runs: a run against the embedded simulator in which
the operator pressed `e` fifty times, and a sweep against a simulator with two slots (so its
TTFT climbs by decades past them). Each plot says what it is of (the load and the target as
the run names them), counts start at 0, memory is not blown up to full height, the event
labels do not overprint, log-scale ticks are plain numbers. The truths are the recording's
own: its manifest, its events.jsonl, its Snapshots' RSS samples; the simulator's address."""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from support import FAST, running_sim

from loadgen.analysis import plot_style
from loadgen.analysis.report import analyze_dir, figures
from loadgen.analysis.sweep import (
    SweepPlan,
    TargetSeen,
    curve_figure,
    find_knee,
    run_sweep,
    write_outputs,
)
from loadgen.model.snapshot import Control
from loadgen.record.rundir import iter_snapshots, read_events, read_manifest
from loadgen.run.config import RunConfig
from loadgen.run.session import Session
from loadgen.sim import SimConfig

MARKS = 50
STREAMS = 6


async def record_run(out: Path) -> None:
    """5 s of 6 streams on the embedded simulator; fifty notes between 1 s and 3 s, a few
    a tick, as an operator hammering `e` does."""
    cfg = RunConfig(url=None, sim=SimConfig(**FAST), concurrency=STREAMS, duration=5.0,
                    tick=0.25, workers=1, drain_grace=1.0, out=str(out), tokenizer="none")
    session = Session(cfg)
    await session.start()
    due = [1.0 + 2.0 * i / MARKS for i in range(MARKS)]
    n = 0
    async for snap in session.snapshots():
        while due and snap.elapsed >= due[0]:
            due.pop(0)
            n += 1
            await session.control(Control(op="mark", note=f"note {n}", source="key"))
    await session.finish()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("postmortem") / "run"
    asyncio.run(record_run(out))
    return out


@pytest.fixture(scope="module")
def figs(run_dir):
    r, analyzer = analyze_dir(run_dir, warnings=[])
    out = figures(r, analyzer)
    for fig in out.values():
        fig.canvas.draw()
    yield out
    for fig in out.values():
        plt.close(fig)


def test_titles_say_the_load_and_the_target_as_the_run_names_them(figs, run_dir):
    manifest = read_manifest(run_dir)
    assert manifest["config"]["url"] is None and manifest["target"]["simulated"]
    for name, fig in figs.items():
        title = fig.axes[0].get_title()
        assert f"{STREAMS} streams against the embedded simulator" in title, (name, title)
        assert "127.0.0.1" not in title and title.endswith(f"run {manifest['run_id']}")


def test_counts_start_at_zero_and_memory_is_not_blown_up(figs, run_dir):
    for name in ("throughput", "queue"):
        for ax in figs[name].axes:
            assert ax.get_ylim()[0] == 0, (name, ax.get_ylabel(), ax.get_ylim())
    # the recording's own RSS samples: the axis spans at least 10 % of the level (or 4 MB)
    rss = np.array([s.process.rss_bytes / 1e6 for s in iter_snapshots(run_dir)
                    if s.process is not None and s.process.rss_bytes])
    assert len(rss)
    lo, hi = figs["server_rss"].axes[0].get_ylim()
    assert hi - lo >= 0.999 * max(0.1 * rss.max(), 4.0)  # the series keeps float32
    assert lo <= rss.min() and hi >= rss.max()


def _drawn_labels(fig) -> list[str]:
    return [t.get_text().strip() for t in fig.axes[0].texts if t.get_rotation() == 90]


def test_fifty_notes_are_labelled_without_overprinting_and_all_counted(figs, run_dir):
    notes = [e for e in read_events(run_dir) if e["kind"] == "operator"
             and e["message"].startswith("mark: note ")]
    assert len(notes) == MARKS
    fig = figs["throughput"]
    labels = _drawn_labels(fig)
    assert 1 <= len(labels) <= plot_style.LABELS_AT_MOST
    # no two labels nearer than LABEL_GAP of the axis
    at = sorted(t.get_position()[0] for t in fig.axes[0].texts if t.get_rotation() == 90)
    span = fig.axes[0].get_xlim()[1] - fig.axes[0].get_xlim()[0]
    assert all(b - a >= plot_style.LABEL_GAP * span - 1e-9 for a, b in itertools.pairwise(at))
    # every note is in a label ("(+n)" merged into it) or counted in the legend
    merged = sum(1 + int(m.group(1)) if (m := re.search(r"\(\+(\d+)\)$", lb)) else 1
                 for lb in labels)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    (mark,) = [t for t in legend if t.startswith("operator event / note")]
    more = re.search(r"\+(\d+) more", mark)
    assert merged + (int(more.group(1)) if more else 0) == MARKS, (labels, mark)
    # and each note still has its line, at its time
    lines = [ln.get_xdata()[0] for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "--"]
    first = next(iter_snapshots(run_dir))
    start = first.t - first.elapsed
    assert sorted(lines) == pytest.approx(sorted(e["t"] - start for e in notes), abs=1e-6)


# ---- a sweep past a two-slot simulator's knee


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """Steps 1, 2, 8, 32 on a simulator with two slots: past them a request waits for a
    slot, so TTFT P99 climbs by more than a decade."""
    async def go():
        async with running_sim(slots=2, **{k: getattr(SimConfig(), k) for k in FAST}) as sim:
            cfg = RunConfig(url=sim.url, output_tokens="16", input_tokens="16", workers=1,
                            tick=0.25, drain_grace=1.0, tokenizer="none")
            seen = TargetSeen()
            plan = SweepPlan(steps=[1, 2, 8, 32], step_seconds=2.0, step_warmup=0.5)
            steps = await run_sweep(cfg, plan, echo=lambda _s: None, record=False,
                                    progress=lambda _s: None, sinks=[seen])
            return sim.url, cfg, steps, seen.name

    url, cfg, steps, name = asyncio.run(go())
    return url, cfg, steps, name, tmp_path_factory.mktemp("sweep")


def test_the_sweep_names_its_target_by_model_engine_and_host(swept):
    url, cfg, steps, name, out = swept
    host = url.split("//", 1)[1].split("/", 1)[0]  # the simulator's own address
    assert name == f"tokentop-sim on vllm at {host}"
    write_outputs(out, cfg, steps, find_knee(steps), None, target=name)
    assert (out / "sweep.png").stat().st_size > 10_000


def test_sweep_log_ticks_are_plain_numbers(swept):
    _, _, steps, name, _ = swept
    p99 = [s.ttft_ms["p99"] for s in steps if s.ttft_ms.get("p99")]
    assert max(p99) / min(p99) > plot_style.LOG_WHEN_SPAN, p99  # the case that read 2×10^1
    fig = curve_figure([(name, steps)], find_knee(steps), unit="streams", title="Sweep")
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        assert ax.get_yscale() == "log" and ax.get_ylabel() == "P99 TTFT, ms (log scale)"
        shown = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)
                 if t.get_text()]
        assert shown and all(re.fullmatch(r"[\d.]+", t) for t in shown), shown
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [name]
    finally:
        plt.close(fig)
