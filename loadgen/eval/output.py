"""What an eval leaves: the matrix on the terminal, eval.json (with the rows), eval.md and
eval.html beside it (loadgen.eval.document: the same header, matrix and phases; eval.html
with every plot inside it, to be sent on its own), and its PNGs: the pressure ramp's curve
(the sweep's, drawn again here with the target as the eval names it: the embedded
simulator's port is thrown away when the eval ends), the long tail's and the faults run's
report plots (each phase's run directory), and faults.png: TTFT, throughput and requests
through the faults phase, a line per metric, each fault shaded and named."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loadgen.analysis import plot_style
from loadgen.analysis.report import moving_mean, rate_window, subject_of, time_axis
from loadgen.analysis.sweep import curve_figure, curve_title
from loadgen.eval.document import html, markdown, table
from loadgen.eval.matrix import rows, to_json
from loadgen.eval.phase_run import Eval, target_of
from loadgen.eval.phases import PHASES
from loadgen.eval.results import RampFigures, UnderFault
from loadgen.model import hdr
from loadgen.record.rundir import iter_snapshots, read_manifest

FAULT_COLOURS = {"latency": "#f2c14e", "reset": "#e76f51", "blackhole": "#6c757d",
                 "bandwidth": "#2a9d8f"}


def write_outputs(ev: Eval) -> tuple[str, list[Path]]:
    """(the matrix as text, the files written)."""
    all_rows = rows(ev.results, str(ev.plan.slo) or None)
    written: list[Path] = []
    plots = _plots(ev, written)
    finished = len(ev.results.ran()) == len(PHASES)
    ev.save(finished=finished, rows=to_json(all_rows))
    written.append(ev.state_path)
    state = ev.state(finished)
    for name, make in (("eval.md", markdown), ("eval.html", html)):
        path = ev.out / name
        path.write_text(make(state, all_rows, plots, ev.out), encoding="utf-8")
        written.append(path)
    return table(all_rows), written


def _plots(ev: Eval, written: list[Path]) -> list[Path]:
    out: list[Path] = []
    ramp, tail, faults = ev.results.ramp, ev.results.long_tail, ev.results.faults
    if ramp and ramp.figures and ramp.figures.plot and Path(ramp.figures.plot).exists():
        ramp_plot(ev, ramp.figures)
        out.append(Path(ramp.figures.plot))
    for figures in (tail and tail.figures, faults and faults.figures):
        out += [Path(p) for p in (figures.plots if figures else []) if Path(p).exists()]
    if faults and faults.status == "done" and faults.figures and faults.run_dir:
        path = ev.out / "faults.png"
        if faults_plot(Path(faults.run_dir), faults.figures.faults, path):
            written.append(path)
            out.insert(0, path)
    return out


def ramp_plot(ev: Eval, figures: RampFigures) -> None:
    """The ramp's sweep.png again, its legend and title the eval's target, not the URL the
    sweep loaded (the embedded simulator's port)."""
    import matplotlib.pyplot as plt

    target = target_of(ev)
    fig = ramp_figure(figures, target, ev.phases.baseline.mode)
    try:
        fig.savefig(figures.plot)
    finally:
        plt.close(fig)


def ramp_figure(figures: RampFigures, target: str, mode: str):
    title = curve_title("Pressure ramp (eval)", figures.steps, figures.unit, mode, target)
    return curve_figure([(target, figures.steps)], figures.knee, unit=figures.unit,
                        title=title)


def faults_plot(run_dir: Path, faults: list[UnderFault], path: Path) -> bool:
    """faults_figure, written to `path`; False when the run has no Snapshot to draw."""
    import matplotlib.pyplot as plt

    fig = faults_figure(run_dir, faults)
    if fig is None:
        return False
    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return True


class _Series:
    """The faults phase's Snapshots as series: time since the run started, TTFT P50/P99 and
    ITL P99 a tick (ticks without a sample left out: the line is drawn across them), and
    tokens, ok and failed requests a second (a mean over a few seconds: a tick is lumpy)."""

    def __init__(self, run_dir: Path) -> None:
        snaps = list(iter_snapshots(run_dir))
        self.empty = not snaps
        if self.empty:
            return
        self.start = snaps[0].t - snaps[0].elapsed  # unix seconds, as the faults' spans
        self.rel = np.array([s.t - self.start for s in snaps])
        dt = np.array([s.interval if s.interval > 0 else np.nan for s in snaps])
        self.window, self.seconds = rate_window(self.rel)

        def per_s(counter: str) -> np.ndarray:
            c = np.array([getattr(s.counters, counter) for s in snaps], float)
            return moving_mean(np.diff(c, prepend=0.0) / dt, self.window)

        self.tok_s = per_s("output_tokens")
        self.ok_s, self.failed_s = per_s("requests_ok"), per_s("requests_failed")
        self.ttft_p50, self.ttft_p99 = _pcts(snaps, "ttft", 50.0), _pcts(snaps, "ttft", 99.0)
        self.itl_p99 = _pcts(snaps, "itl", 99.0)


def _pcts(snaps, metric: str, p: float) -> np.ndarray:
    """A percentile of each tick's histogram, in ms (NaN: no sample that tick)."""
    out = np.full(len(snaps), np.nan)
    for i, snap in enumerate(snaps):
        enc = snap.hist.get(metric)
        if enc:
            v = hdr.summarize(hdr.decode(enc), (p,))[f"p{p:g}"]
            out[i] = np.nan if v is None else v / 1000
    return out


def faults_figure(run_dir: Path, faults: list[UnderFault]):
    """TTFT P50/P99 and ITL P99, output tokens/s, and ok and failed requests/s through the faults
    phase, a line each (the rates means over a few seconds: a tick alone is lumpy; a
    latency line broken only where no request said anything for longer), each fault's span
    shaded and named; the title what the phase loaded and against what. None when the run
    has no Snapshot. Close it when done."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = _Series(run_dir)
    if s.empty:
        return None
    unit, scale = time_axis(float(s.rel[-1]))
    x = s.rel / scale
    fig, (lat, tok, req) = plt.subplots(3, 1, figsize=(11, 8), sharex=True,
                                        gridspec_kw={"height_ratios": [3, 2, 2]})
    mean = f" ({s.seconds:g} s mean)" if s.window > 1 else ""
    gap = max(s.seconds, 2 * float(np.median(np.diff(s.rel))) if len(s.rel) > 1 else 0.0)
    for label, y in (("TTFT P50", s.ttft_p50), ("TTFT P99", s.ttft_p99),
                     ("ITL P99", s.itl_p99)):
        lat.plot(*plot_style.bridged(x, y, gap / scale), lw=1.2, label=f"{label} (per tick)")
    plot_style.latency_y(lat, np.concatenate([s.ttft_p50, s.ttft_p99, s.itl_p99]), "ms")
    tok.plot(x, s.tok_s, lw=1.2, color="C2", label=f"output tokens/s{mean}")
    tok.set_ylabel("tokens/s")
    req.plot(x, s.ok_s, lw=1.2, color="C0", label=f"ok requests/s{mean}")
    req.plot(x, s.failed_s, lw=1.2, color="#d62828", label=f"failed requests/s{mean}")
    req.set_ylabel("requests/s")
    for ax in (tok, req):
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        plot_style.counts_from_zero(ax)
    _shade(faults, (lat, tok, req), s.start, scale, float(x[-1]))
    req.set_xlabel(f"time since the phase started ({unit})")
    req.set_xlim(0, max(float(x[-1]), 1e-9))
    subject = subject_of(run_dir, read_manifest(run_dir))
    lat.set_title(f"Faults: latency, throughput and requests through each fault\n{subject}",
                  fontsize=11)
    for ax in (lat, tok, req):
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def _shade(faults: list[UnderFault], axes, t0: float, scale: float, last: float) -> None:
    """Each fault's span on every panel, in its kind's colour (one legend entry a kind, on
    the top panel), its kind written at the top of the span."""
    seen: set[str] = set()
    for f in faults:
        a = (f.start - t0) / scale
        b = (f.end - t0) / scale if f.end is not None else last
        colour = FAULT_COLOURS.get(f.fault, "#999")
        for ax in axes:
            ax.axvspan(a, b, color=colour, alpha=0.25, lw=0,
                       label=f"{f.fault} fault" if ax is axes[0] and f.fault not in seen
                       else None)
        seen.add(f.fault)
        axes[0].text((a + b) / 2, 0.98, f.fault, ha="center", va="top", fontsize=8,
                     transform=axes[0].get_xaxis_transform())
