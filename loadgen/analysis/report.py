"""`tokentop report DIR`: a soak report of a run directory.

Prints a summary on the terminal and writes report.md, report.json and PNG plots
(throughput, TTFT/ITL P50/P99 over time, queue depth, GPU memory/power, server
RSS; outage windows shaded red, recording gaps grey) into the run directory (or
--out-dir). Works on a finished, crashed (torn last line) or still-running
directory: it reports what is there now.

    tokentop report DIR [--out-dir D] [--slo ttft_p99<500ms,...] [--bucket 3600]
                        [--tail-k 5] [--tail-ms ttft=2000,itl=200] [--no-plots]

(the command line is tui/commands/report.py; `write_report` is what it calls)

The status says what the run is now, known rather than guessed (rundir.run_state):
running (a live tokentop still writes it), interrupted (it says running but its
writer is gone), recording stopped (a full disk ended the record early), finished.

The summary is printed before anything is written, so a full disk still shows it;
a file that cannot be written is removed rather than left partial (a 0-byte PNG)
and named in `not_written`.

Exit codes: 0 report written (thresholds passed or none); 3 a threshold failed;
2 not a readable run directory, or part of the report could not be written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import sys
import time
from pathlib import Path

import numpy as np

from loadgen.analysis.soak import SoakAnalyzer
from loadgen.model.slo import parse_slos
from loadgen.record.rundir import (
    INTERRUPTED,
    RUNNING,
    first_snapshot,
    iter_snapshots,
    last_snapshot,
    read_manifest,
    run_state,
)

PLOTS = ("throughput", "latency", "queue", "gpu", "server_rss")
STATUS_TEXT = {
    RUNNING: "running (a tokentop process is still writing it: this covers it so far)",
    INTERRUPTED: "interrupted (its writer died without finishing: killed, crashed, or the "
                 "machine went down)",
}


def pick_bucket(span_s: float) -> float:
    """An hour for soaks; shorter buckets for short runs, so drift still has rows."""
    for b in (3600.0, 600.0, 60.0, 10.0):
        if span_s >= 3 * b:
            return b
    return 10.0


def analyze_dir(run_dir: Path | str, *, slo: str | None = None, bucket_s: float | None = None,
                tail_k: float = 5.0, tail_abs_us: dict[str, float] | None = None,
                warnings: list[str] | None = None) -> tuple[dict, SoakAnalyzer]:
    run_dir = Path(run_dir)
    warnings = warnings if warnings is not None else []
    manifest = read_manifest(run_dir)
    if slo is None:
        slo = (manifest.get("config") or {}).get("slo")
    slos = parse_slos(slo)
    if bucket_s is None:
        first, last = first_snapshot(run_dir), last_snapshot(run_dir, warn=lambda _m: None)
        span = (last.elapsed if last else 0.0) - (first.elapsed if first else 0.0)
        bucket_s = pick_bucket(span)
    analyzer = SoakAnalyzer(slos=slos, bucket_s=bucket_s, tail_k=tail_k, tail_abs_us=tail_abs_us)
    for snap in iter_snapshots(run_dir, warn=warnings.append):
        analyzer.add(snap)
    result = analyzer.result()
    state = run_state(run_dir)  # after reading: a run that ended meanwhile says so
    result["run_dir"] = str(run_dir)
    result["manifest"] = {k: manifest.get(k) for k in (
        "tokentop_version", "run_id", "status", "start_time", "end_time", "engine", "host",
        "gpus", "gpu_source", "resumes", "recording_stopped")}
    result["state"] = state
    result["status"] = STATUS_TEXT.get(state, state) + ("" if manifest else "; no manifest.json")
    result["slo"] = slo
    result["warnings"] = warnings
    return result, analyzer


# ---- text -------------------------------------------------------------------------------------


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} ms"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.3f}%"


def summary_lines(r: dict) -> list[str]:
    # after warm-up, as the success rate and the thresholds are (older analyses: the whole run)
    req = r.get("measured_requests") or r["requests"]
    lines = [
        f"run {r['run_id']}  {r['status']}  target {(r['target'] or {}).get('url', '?')}",
        f"  wall {_fmt_s(r['wall_s'])}, load {_fmt_s(r['elapsed_s'])}, {r['ticks']} ticks; "
        f"{req['ok']} ok, {req['failed']} failed after warm-up; success "
        f"{_pct(r['success_rate'])} (during outages {_pct(r['success_rate_during_outages'])})",
    ]
    if r.get("availability") is not None:
        stalls = (r.get("stalls") or {}).get("count", 0)
        lines.append(f"  availability {_pct(r['availability'])} (time outside outages)"
                     + (f"; {stalls} stall(s): streams received nothing for a while"
                        if stalls else ""))
    if (r.get("manifest") or {}).get("recording_stopped"):
        lines.insert(1, f"  recording stopped early: {r['manifest']['recording_stopped']}")
    lat = r["latency_ms"]
    for m in ("ttft", "ttfa", "itl"):  # ttfa: reasoning models only (no samples otherwise)
        s = lat.get(m) or {}
        if s.get("count"):
            lines.append(f"  {m.upper():4} p50 {_ms(s['p50'])}  p99 {_ms(s['p99'])}  "
                         f"p99.9 {_ms(s['p99.9'])}  max {_ms(s['max'])}")
    rates = r["rates"]
    if rates.get("output_tok_s") is not None:
        lines.append(f"  throughput {rates['output_tok_s']:.1f} output tok/s, "
                     f"{rates['req_s']:.2f} req/s")
    outages = r["outages"]
    mttr = r["mttr_s"]
    lines.append(f"  outages: {len(outages)} (MTTR client {_fmt_s(mttr['client'])}, "
                 f"server {_fmt_s(mttr['server'])})")
    for o in outages[:10]:
        lines.append(f"    {o['kind']:6} at +{_fmt_s(o['start_rel'])}: {_fmt_s(o['duration_s'])}"
                     f"{' (ongoing)' if o['ongoing'] else ''}"
                     f"{' ' + _errs(o['errors']) if o['errors'] else ''}")
    for g in r["gaps"]:
        lines.append(f"  recording gap at +{_fmt_s(g['start_rel'])}: {_fmt_s(g['duration_s'])} "
                     "(tokentop was not running; resumed)")
    d = r["drift"]
    for name, key in (("server RSS", "server_rss"), ("GPU memory", "gpu_memory")):
        s = d[key]
        if s["slope_mb_h"] is not None:
            caveat = "" if s.get("trend", True) else "; too short a run to call it a trend"
            lines.append(f"  {name} slope {s['slope_mb_h']:+.1f} MB/h "
                         f"({s['first_mb']:.0f} → {s['last_mb']:.0f} MB{caveat})")
    lt = r["long_tail"]
    if any(lt["counts"].values()):
        counts = ", ".join(f"{m} {n}" for m, n in lt["counts"].items())
        lines.append(f"  long tail ({lt['rule']}): {counts} intervals")
    for t in r["thresholds"]:
        lines.append(f"  {'PASS' if t['passed'] else 'FAIL'} {t['shown']}")
    for w in r["warnings"][:5]:
        lines.append(f"  warning: {w}")
    return lines


def _errs(errors: dict[str, int]) -> str:
    return ", ".join(f"{n}× {k}" for k, n in sorted(errors.items()))


WATCHED_LISTED = 50  # SLO and GPU events listed in report.md at most


def _watched_events(events: list[dict]) -> list[str]:
    """The run's SLO breaches and recoveries, GPU throttling (loadgen.run.watch) and server
    restarts, in order."""
    watched = [e for e in events if e["kind"] in ("slo", "gpu", "restart")]
    if not watched:
        return []
    out = ["## SLO breaches, GPU throttling, server restarts", ""]
    out += [f"* {_when(e['t'])} (+{_fmt_s(e['rel'])}) {e['kind']}: {e['message']}"
            for e in watched[:WATCHED_LISTED]]
    if len(watched) > WATCHED_LISTED:
        out.append(f"* … and {len(watched) - WATCHED_LISTED} more (report.json has them)")
    return [*out, ""]


def _when(t: float | None) -> str:
    return "–" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def markdown(r: dict, plots: list[str]) -> str:
    m = r["manifest"]
    out = [f"# tokentop soak report: run {r['run_id']}", ""]
    out += [
        f"* status: **{r['status']}**",
        f"* target: {(r['target'] or {}).get('url')} model {(r['target'] or {}).get('model')}"
        f"{' (simulated)' if (r['target'] or {}).get('simulated') else ''}",
        f"* engine: {m.get('engine') or 'unknown'}; host: {(m.get('host') or {}).get('hostname')}",
        f"* started {_when(r['start_time'])}, last snapshot {_when(r['last_t'])}; wall "
        f"{_fmt_s(r['wall_s'])}, load {_fmt_s(r['elapsed_s'])}, measured {_fmt_s(r['measured_s'])}",
        f"* tokentop {m.get('tokentop_version')}; run directory `{r['run_dir']}`",
    ]
    if m.get("recording_stopped"):
        out.append(f"* **recording stopped early:** {m['recording_stopped']}")
    out += ["", "## Summary", "", "```", *summary_lines(r), "```", ""]
    if r["thresholds"]:
        out += ["## Thresholds", "", "| threshold | measured | result |", "| --- | --- | --- |"]
        for t in r["thresholds"]:
            out.append(f"| `{t['text']}` | {t['shown'].split(': ', 1)[-1]} | "
                       f"{'pass' if t['passed'] else '**FAIL**'} |")
        out.append("")
    out += ["## Outages", ""]
    if r["outages"]:
        out += ["| kind | start | end | duration | failed requests | why |",
                "| --- | --- | --- | --- | --- | --- |"]
        for o in r["outages"]:
            why = o["reason"] or _errs(o["errors"])
            out.append(f"| {o['kind']} | {_when(o['start'])} (+{_fmt_s(o['start_rel'])}) | "
                       f"{_when(o['end'])}{' (ongoing)' if o['ongoing'] else ''} | "
                       f"{_fmt_s(o['duration_s'])} | {o['failed']} | {why} |")
        mt = r["mttr_s"]
        out += ["", f"MTTR: client {_fmt_s(mt['client'])}, server {_fmt_s(mt['server'])}, "
                f"any {_fmt_s(mt['any'])}. Success rate {_pct(r['success_rate'])} after "
                f"warm-up, {_pct(r['success_rate_during_outages'])} during outages; "
                f"availability {_pct(r.get('availability'))}.", ""]
    else:
        out += ["None seen.", ""]
    if r.get("server_metrics_never_answered"):
        out += [f"The server's /metrics never answered "
                f"({r['server_metrics_never_answered']}): no server-side outage detection.", ""]
    out += _watched_events(r.get("events") or [])
    if r["gaps"]:
        out += ["## Recording gaps", ""]
        for g in r["gaps"]:
            out.append(f"* {_when(g['start'])} → {_when(g['end'])}: {_fmt_s(g['duration_s'])}, "
                       f"resumed at seq {g['resumed_seq']}")
        out.append("")
    d = r["drift"]
    out += [f"## Drift (buckets of {_fmt_s(d['bucket_s'])} of load)", "",
            "| bucket | TTFT p99 | TTFT p99.9 | ITL p99 | ITL p99.9 | out tok/s | err | "
            "server RSS MB | GPU mem MB |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for b in d["buckets"]:
        out.append(f"| {b['index']} | {_ms(b['ttft']['p99_ms'])} | {_ms(b['ttft']['p99.9_ms'])} "
                   f"| {_ms(b['itl']['p99_ms'])} | {_ms(b['itl']['p99.9_ms'])} | "
                   f"{b['output_tok_s']} | {_pct(b['error_rate'])} | {b['server_rss_mb']} | "
                   f"{b['gpu_mem_mb']} |")
    out += ["", f"Server RSS slope: {d['server_rss']['slope_mb_h']} MB/h; GPU memory slope: "
            f"{d['gpu_memory']['slope_mb_h']} MB/h; throughput last/first bucket: "
            f"{d['throughput_change']}.", ""]
    lt = r["long_tail"]
    out += ["## Long tail", "", f"Limit: {lt['rule']} ({lt['limits_ms']} ms); intervals above "
            f"it: {lt['counts'] or 'none'}.", ""]
    if lt["intervals"]:
        out += ["| time | metric | p99.9 | max | in flight | context |",
                "| --- | --- | --- | --- | --- | --- |"]
        for t in lt["intervals"]:
            out.append(f"| {_when(t['t'])} (+{_fmt_s(t['rel'])}) | {t['metric']} | "
                       f"{_ms(t['p99.9_ms'])} | {_ms(t['max_ms'])} | {t['in_flight']} | "
                       f"{'; '.join(t['context']) or '–'} |")
        out.append("")
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    if r["warnings"]:
        out += ["## Reading warnings", ""] + [f"* {w}" for w in r["warnings"][:50]] + [""]
    return "\n".join(out)


# ---- plots ------------------------------------------------------------------------------------


def plot(r: dict, analyzer: SoakAnalyzer, out_dir: Path,
         not_written: list[dict] | None = None) -> list[str]:
    """The PNGs written; one that cannot be (a full disk) is removed, noted in not_written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = {k: np.frombuffer(v, np.float64 if v.typecode == "d" else np.float32)
         for k, v in analyzer.series.items()}
    if len(s["rel"]) == 0:
        return []
    x = s["rel"] / 3600.0 if s["rel"][-1] > 3 * 3600 else s["rel"] / 60.0
    unit = "hours" if s["rel"][-1] > 3 * 3600 else "minutes"
    scale = 3600.0 if unit == "hours" else 60.0
    start = r["start_time"] or 0.0
    dt = np.where(s["interval"] > 0, s["interval"], np.nan)

    def shade(ax) -> None:
        for o in r["outages"]:
            ax.axvspan((o["start"] - start) / scale, (o["end"] - start) / scale,
                       color="red", alpha=0.2, lw=0)
        for g in r["gaps"]:
            ax.axvspan((g["start"] - start) / scale, (g["end"] - start) / scale,
                       color="grey", alpha=0.3, lw=0, hatch="//")

    def smooth(y: np.ndarray) -> np.ndarray:
        n = len(y)
        w = max(1, n // 1500)
        if w == 1:
            return y
        k = np.ones(w) / w
        return np.convolve(np.nan_to_num(y), k, mode="same")

    figs = {
        "throughput": [("output tok/s", smooth(s["output_tokens"] / dt)),
                       ("req/s ×100", smooth(s["ok"] / dt * 100)),
                       ("errors/s ×100", smooth(s["failed"] / dt * 100))],
        "latency": [("TTFT p50 ms", s["ttft_p50"] / 1e3), ("TTFT p99 ms", s["ttft_p99"] / 1e3),
                    ("ITL p50 ms", s["itl_p50"] / 1e3), ("ITL p99 ms", s["itl_p99"] / 1e3)],
        "queue": [("client in flight", s["in_flight"]), ("client backlog", s["backlog"]),
                  ("server waiting", s["srv_waiting"]), ("server running", s["srv_running"])],
        "gpu": [("GPU memory MB", s["gpu_mem_mb"]), ("GPU power W", s["gpu_power_w"])],
        "server_rss": [("server RSS MB", s["srv_rss_mb"])],
    }
    titles = {"throughput": "Throughput", "latency": "Latency per tick (log scale)",
              "queue": "Queue depth", "gpu": "GPU memory and power",
              "server_rss": "Server process RSS"}
    written = []
    for name, lines in figs.items():
        if all(np.all(np.isnan(y)) for _, y in lines):
            continue
        fig, ax = plt.subplots(figsize=(11, 4))
        if name == "gpu":
            ax2 = ax.twinx()
            ax.plot(x, lines[0][1], lw=0.8, label=lines[0][0], color="C0")
            ax2.plot(x, lines[1][1], lw=0.8, label=lines[1][0], color="C1")
            ax.set_ylabel(lines[0][0])
            ax2.set_ylabel(lines[1][0])
        else:
            for label, y in lines:
                if not np.all(np.isnan(y)):
                    ax.plot(x, y, lw=0.8, label=label)
            ax.legend(loc="upper left", fontsize=8)
        if name == "latency":
            ax.set_yscale("log")
        shade(ax)
        ax.set_xlabel(f"{unit} since the start (red: outages, grey: recording gaps)")
        ax.set_title(f"{titles[name]}, run {r['run_id']}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        if _written(path, lambda f, fig=fig: fig.savefig(f, dpi=90, format="png"),
                    not_written):
            written.append(str(path))
        plt.close(fig)
    return written


# ---- writing, on a disk that may be full ------------------------------------------------------


def _why(e: OSError) -> str:
    return {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
            errno.EFBIG: "file size limit reached"}.get(e.errno, e.strerror or str(e))


def _written(path: Path, write, not_written: list[dict] | None) -> bool:
    """`write(file)` into `path`; on failure the partial file is removed (no 0-byte PNG left
    to look like a plot) and the failure noted, for the one line that names them all."""
    try:
        with open(path, "wb") as f:
            write(f)
        return True
    except OSError as e:
        with contextlib.suppress(OSError):
            path.unlink()
        if not_written is None:
            raise
        not_written.append({"file": path.name, "why": _why(e)})
        return False


def _text(data: str):
    return lambda f: f.write(data.encode())


# ---- the report -------------------------------------------------------------------------------


def write_report(run_dir: Path | str, *, out_dir: Path | str | None = None,
                 slo: str | None = None, plots: bool = True, bucket_s: float | None = None,
                 tail_k: float = 5.0, tail_abs_us: dict[str, float] | None = None,
                 out=sys.stdout) -> tuple[int, dict]:
    """Analyse, print the summary, write report.json/report.md/PNGs; (exit code, result).

    The summary comes first: what was computed is shown even when nothing can be written.
    Files that could not be written are in r["not_written"] ({file, why}) and make it 2.
    Raises RunDirError / ConfigError / SnapshotVersionError with a message for the user."""
    run_dir = Path(run_dir)
    warnings: list[str] = []
    r, analyzer = analyze_dir(run_dir, slo=slo, bucket_s=bucket_s, tail_k=tail_k,
                              tail_abs_us=tail_abs_us, warnings=warnings)
    for line in summary_lines(r):
        print(line, file=out, flush=True)
    target = Path(out_dir) if out_dir else run_dir
    not_written: list[dict] = r.setdefault("not_written", [])
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        not_written.append({"file": str(target), "why": _why(e)})
        return 2, r
    written = plot(r, analyzer, target, not_written) if plots else []
    r["plots"] = written
    md = _written(target / "report.md", _text(markdown(r, written) + "\n"), not_written)
    _written(target / "report.json", _text(json.dumps(r, indent=2, default=str) + "\n"),
             not_written)
    if md:
        print(f"report: {target / 'report.md'}", file=out)
    if not_written:
        return 2, r
    return (3 if r["thresholds_passed"] is False else 0), r
