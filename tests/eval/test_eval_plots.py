"""The eval's plots, from a real `tokentop eval` on its embedded simulator (a ramp and three
proxy faults, seconds each; requests of 128 tokens, so many a tick sees no first token):
the ramp's curve names the embedded simulator, not the port it listened on; faults.png
draws a line per metric, has a throughput panel, and shades each fault where the proxy's
own record puts it; the faults phase's report plots say the phase and the eval's target.
The truths: eval.json's fault records (the proxy's), the phase's Snapshots and manifest
(whose URLs are the simulator's and the proxy's 127.0.0.1 ports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle
from support import ROOT, only_phases

from loadgen.analysis.report import analyze_dir, figures
from loadgen.eval.battery import resumed
from loadgen.eval.output import faults_figure, ramp_figure, target_of
from loadgen.eval.results import read_state
from loadgen.record.rundir import iter_snapshots, read_manifest
from loadgen.run.config import RunConfig

pytestmark = pytest.mark.timeout(300)

PLAN = only_phases("""
version = 1
slo = "ttft<2s,error_rate<50%"
fault_settle = "5s"  # the simulator recovers at once: the least a plan may say
[phases.baseline]
enabled = false
concurrency = 4
input_tokens = 32
output_tokens = 128
[phases.ramp]
steps = [1, 2, 4]
step_duration = "2s"
step_warmup = "0.5s"
[[phases.faults]]
at = "1s"
fault = "latency"
ms = 100
for = "2s"
[[phases.faults]]
at = "4s"
fault = "blackhole"
seconds = 3
[[phases.faults]]
at = "8s"
fault = "reset"
probability = 1.0
for = "1s"
""")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """(OUT, the Eval as eval.json describes it, with the command line's settings: no --url)."""
    tmp = tmp_path_factory.mktemp("eval_plots")
    (tmp / "plan.toml").write_text(PLAN)
    out = tmp / "out"
    done = subprocess.run([sys.executable, "-m", "tui.cli", "eval", f"--plan={tmp / 'plan.toml'}",
                           f"--out={out}", "--workers=1"], capture_output=True, text=True,
                          timeout=240, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    state = read_state((out / "eval.json").read_bytes())
    return out, resumed(state, RunConfig(), out, say=lambda _s: None)


def test_the_ramp_names_the_embedded_simulator_not_its_port(evaluated, tmp_path):
    out, ev = evaluated
    ramp = ev.results.ramp.figures
    # the case: the sweep loaded the eval's simulator at a port thrown away when it ended
    assert read_manifest(ev.results.ramp.run_dir)["target"]["url"].startswith("http://127.0.0.1:")
    fig = ramp_figure(ramp, target_of(ev), ev.phases.baseline.mode)
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["embedded simulator"]
        title = ax.get_title()
        assert title.startswith("Pressure ramp (eval)") and "1 → 4 streams" in title
        assert "against the embedded simulator" in title and "127.0.0.1" not in title
        ticks = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)]
        assert not any("10^" in t or "×" in t for t in ticks), ticks
        # and the PNG the eval left is that figure
        fig.savefig(tmp_path / "again.png")
    finally:
        plt.close(fig)
    assert (tmp_path / "again.png").read_bytes() == (out / "ramp" / "sweep.png").read_bytes()


def _runs(y: np.ndarray) -> int:
    """How many separate stretches of finite values a line has (dot pairs: many)."""
    f = np.isfinite(y)
    return int(f[0]) + int((f[1:] & ~f[:-1]).sum()) if len(f) else 0


def test_faults_png_is_a_line_a_metric_a_throughput_panel_and_each_fault_shaded(evaluated):
    _, ev = evaluated
    phase = ev.results.faults
    faults = phase.figures.faults
    assert {f.fault for f in faults} == {"latency", "blackhole", "reset"}
    snaps = list(iter_snapshots(phase.run_dir))
    start = snaps[0].t - snaps[0].elapsed
    fig = faults_figure(Path(phase.run_dir), faults)
    try:
        lat, tok, req = fig.axes[:3]
        assert tok.get_ylabel() == "tokens/s" and req.get_ylabel() == "requests/s"
        for ax in (tok, req):
            assert ax.get_ylim()[0] == 0
        # the throughput line carries the run's tokens: its mean rate is the recording's
        (line,) = tok.get_lines()
        measured = (snaps[-1].counters.output_tokens - snaps[0].counters.output_tokens) / (
            snaps[-1].t - snaps[0].t)
        assert np.nanmean(line.get_ydata()) == pytest.approx(measured, rel=0.15)
        # TTFT: lines, not dots: a tick without a first token is bridged; only a long
        # silence (the blackhole) may break a line
        ttft = [ln for ln in lat.get_lines() if ln.get_label().startswith("TTFT")]
        assert len(ttft) == 2
        has = np.array([bool(s.hist.get("ttft")) for s in snaps])
        ticks_with_ttft = int(has.sum())
        # the case: ticks without a first token between ticks with one
        assert (~has[1:-1] & has[:-2] & has[2:]).any()
        for ln in ttft:
            assert ln.get_marker() in ("None", None, "")
            y = np.asarray(ln.get_ydata(), float)
            assert np.isfinite(y).sum() == ticks_with_ttft
            assert _runs(y) <= 1 + len(faults), (ln.get_label(), _runs(y))
        # each fault shaded on every panel where the proxy's record puts it
        for ax in (lat, tok, req):
            spans = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches
                     if isinstance(p, Rectangle)]
            for f in faults:
                assert any(a == pytest.approx(f.start - start, abs=1e-6)
                           and b == pytest.approx(f.end - start, abs=1e-6)
                           for a, b in spans), (f.fault, spans)
        legend = [t.get_text() for t in lat.get_legend().get_texts()]
        assert {"latency fault", "blackhole fault", "reset fault"} <= set(legend)
        title = lat.get_title()
        assert "faults phase: 4 streams against the embedded simulator" in title, title
    finally:
        plt.close(fig)


def test_the_faults_phases_report_plots_say_the_phase_and_the_evals_target(evaluated):
    _, ev = evaluated
    run_dir = Path(ev.results.faults.run_dir)
    # the case: the phase loaded the fault proxy's port
    assert read_manifest(run_dir)["target"]["url"].startswith("http://127.0.0.1:")
    r, analyzer = analyze_dir(run_dir, warnings=[])
    out = figures(r, analyzer)
    try:
        assert set(out) >= {"throughput", "latency", "queue"}
        for name, fig in out.items():
            title = fig.axes[0].get_title()
            assert "faults phase: 4 streams against the embedded simulator" in title, name
            assert "127.0.0.1" not in title
        # its latency per tick is lines too, broken only by a long silence
        ttft = [ln for ln in out["latency"].axes[0].get_lines()
                if ln.get_label().startswith("TTFT")]
        assert len(ttft) == 2
        for ln in ttft:
            y = np.asarray(ln.get_ydata(), float)
            assert _runs(y) <= 1 + len(ev.results.faults.figures.faults), ln.get_label()
    finally:
        for fig in out.values():
            plt.close(fig)
