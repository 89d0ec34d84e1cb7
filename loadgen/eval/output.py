"""What an eval leaves: the matrix on the terminal, eval.json (with the rows), eval.md and
eval.html beside it (loadgen.eval.document: the same header, matrix and phases; eval.html
with every plot inside it, to be sent on its own), and its PNGs: the pressure ramp's curve
(the sweep's own), the long tail's and the faults run's report plots (each phase's run
directory), and faults.png, the latency and the errors through the faults phase with each
fault shaded and named."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loadgen.eval.battery import Eval
from loadgen.eval.document import html, markdown, table
from loadgen.eval.matrix import rows, to_json
from loadgen.eval.phases import PHASES
from loadgen.eval.results import UnderFault
from loadgen.model import hdr
from loadgen.record.rundir import iter_snapshots

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
        out.append(Path(ramp.figures.plot))
    for figures in (tail and tail.figures, faults and faults.figures):
        out += [Path(p) for p in (figures.plots if figures else []) if Path(p).exists()]
    if faults and faults.status == "done" and faults.figures and faults.run_dir:
        path = ev.out / "faults.png"
        if faults_plot(Path(faults.run_dir), faults.figures.faults, path):
            written.append(path)
            out.insert(0, path)
    return out


def faults_plot(run_dir: Path, faults: list[UnderFault], path: Path) -> bool:
    """TTFT P50/P99 and failed requests per tick through the faults phase, each fault's span
    shaded and named; False when the run has no Snapshot to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    t, p50, p99, failed = [], [], [], []
    prev = None
    for snap in iter_snapshots(run_dir):
        t.append(snap.t)
        stats = _ttft(snap)
        p50.append(stats[0])
        p99.append(stats[1])
        failed.append(snap.counters.requests_failed - (prev or 0))
        prev = snap.counters.requests_failed
    if not t:
        return False
    t0 = t[0]
    x = np.array(t) - t0
    fig, (lat, err) = plt.subplots(2, 1, figsize=(11, 6), sharex=True,
                                   gridspec_kw={"height_ratios": [3, 1]})
    lat.plot(x, p50, label="TTFT P50", marker=".", lw=1)
    lat.plot(x, p99, label="TTFT P99", marker=".", lw=1)
    lat.set_ylabel("ms")
    lat.set_title("Latency through the faults phase (faults shaded)")
    err.bar(x, failed, width=0.4, color="#d62828", label="failed requests")
    err.set_ylabel("requests / tick")
    err.set_xlabel("time since the phase started (s)")
    seen = set()
    for f in faults:
        start, end = f.start - t0, (f.end or t[-1]) - t0
        label = f.fault if f.fault not in seen else None
        seen.add(f.fault)
        for ax in (lat, err):
            ax.axvspan(start, end, color=FAULT_COLOURS.get(f.fault, "#999"), alpha=0.25,
                       label=label if ax is lat else None)
    err.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    for ax in (lat, err):
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _ttft(snap) -> tuple[float | None, float | None]:
    enc = snap.hist.get("ttft")
    if not enc:
        return None, None
    s = hdr.summarize(hdr.decode(enc))
    return (None if s["p50"] is None else s["p50"] / 1000,
            None if s["p99"] is None else s["p99"] / 1000)
