"""`tokentop report DIR`: a soak report of a run directory.

Prints a summary on the terminal and writes report.md, report.json and PNG plots
(throughput, TTFT/ITL P50/P99 over time, queue depth, GPU memory and power, server
RSS) into the run directory (or --out-dir), then one `wrote PATH` line a file written.
Works on a finished, crashed (torn last line) or still-running directory: it reports
what is there now.

The plots are for a postmortem: a title, units on every axis and in the legend, a
legend entry only for a line that is drawn, time in the run's own scale (seconds, minutes
or hours: time_axis), client outages shaded red, /metrics outages orange, pauses blue,
recording gaps grey, faults a proxy put on (the eval's faults phase: "fault" events)
dotted, and a dashed line (labelled) at each operator event and note (`e`). report.md has
a table of those faults with the throughput and latency measured while each was on.

A memory slope over less than MIN_SLOPE_SPAN_S of samples (10 min, loadgen.model.trend: the
console's RSS slope follows the same rule) is withheld: report.json has slope_mb_h null
and slope_withheld saying why.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from loadgen.analysis import plot_style
from loadgen.analysis.soak import SoakAnalyzer
from loadgen.analysis.soak_result import Slope, SoakResult
from loadgen.model import hdr, trend, units
from loadgen.model.slo import parse_slos
from loadgen.model.snapshot import Snapshot
from loadgen.model.text import plain, plain_all
from loadgen.model.trend import MIN_SLOPE_SPAN_S
from loadgen.model.windows import SnapshotWindows
from loadgen.record.rundir import (
    INTERRUPTED,
    RUNNING,
    first_snapshot,
    iter_snapshots,
    last_snapshot,
    read_events,
    read_manifest,
    run_state,
)
from loadgen.run.summary import class_rows
from loadgen.worker.distributions import WorkloadError

CELL_LIMIT = 200  # characters of a recorded event's words in a table cell
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


class Pause(msgspec.Struct, kw_only=True):
    start: float
    end: float
    start_rel: float
    duration_s: float
    ongoing: bool  # still paused at the last Snapshot


class NotWritten(msgspec.Struct, kw_only=True):
    file: str
    why: str  # in words: "disk full"


class SpanFigures(msgspec.Struct, kw_only=True):
    """What was measured while something was on (a fault): the ticks wholly inside the
    span, as DuringSpan takes them. None: no such tick, or no sample."""

    ticks: int  # how many ticks the figures are of
    output_tok_s: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p90_ms: float | None
    e2e_p99_ms: float | None


class DuringSpan:
    """Throughput and latency over the ticks wholly inside [start, end] (end None: to the
    last). A Snapshot covers the interval before its time: the tick that ends just after
    the start is mostly from before the fault (a quarter second at 400 tok/s moved a 4 s
    cap's rate by half), so it is left out, and so are the requests that ended in it."""

    def __init__(self, start: float, end: float | None) -> None:
        self.start, self.end = start, end
        self._prev_tokens = 0
        self._tokens = 0
        self._seconds = 0.0
        self._ticks = 0
        self._dense = {m: np.zeros(hdr.COUNTS_LEN, np.int64) for m in ("itl", "e2e")}

    def see(self, snap: Snapshot) -> None:
        """Every Snapshot of the run, in order (those outside the span only set the base)."""
        tokens = snap.counters.output_tokens
        inside = (self.start <= snap.t - snap.interval
                  and (self.end is None or snap.t <= self.end))
        if inside:
            self._tokens += tokens - self._prev_tokens
            self._seconds += snap.interval
            self._ticks += 1
            for m, dense in self._dense.items():
                if m in snap.hist:
                    dense += hdr.decode(snap.hist[m])
        self._prev_tokens = tokens

    def figures(self) -> SpanFigures:
        itl, e2e = (hdr.summarize(self._dense[m]) for m in ("itl", "e2e"))
        rate = self._tokens / self._seconds if self._seconds > 0 else None
        return SpanFigures(ticks=self._ticks, output_tok_s=_round(rate, 1),
                           itl_p50_ms=_ms_of(itl["p50"]), itl_p99_ms=_ms_of(itl["p99"]),
                           e2e_p50_ms=_ms_of(e2e["p50"]), e2e_p90_ms=_ms_of(e2e["p90"]),
                           e2e_p99_ms=_ms_of(e2e["p99"]))


def _ms_of(us: int | None) -> float | None:
    return None if us is None else us / 1000.0


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


class FaultRow(msgspec.Struct, kw_only=True):
    """One fault of the run (a fault-injecting proxy's, the eval's faults phase), from its
    "fault" events in events.jsonl: the start event, and the end whose `since` names it."""

    what: str  # the start event's words: the fault and its settings
    start: float  # unix seconds
    end: float | None  # None: no end recorded (the run ended with it on, or was cut)
    start_rel: float  # seconds from the run's first Snapshot
    duration_s: float | None
    during: SpanFigures | None = None


class FaultSpans:
    """The "fault" events of a run directory paired into spans, and what was measured in
    each (feed it every Snapshot)."""

    def __init__(self, run_dir: Path, warn) -> None:
        events = [e for e in read_events(run_dir, warn=warn) if e.get("kind") == "fault"]
        ends = {e["since"]: e["t"] for e in events if e.get("since") is not None}
        self._spans = [(e, ends.get(e["t"])) for e in events if e.get("since") is None]
        self._during = [DuringSpan(e["t"], end) for e, end in self._spans]

    def see(self, snap: Snapshot) -> None:
        for d in self._during:
            d.see(snap)

    def rows(self, start_time: float) -> list[FaultRow]:
        return [FaultRow(what=_cell(str(e.get("message", ""))), start=e["t"], end=end,
                         start_rel=round(e["t"] - start_time, 3),
                         duration_s=None if end is None else round(end - e["t"], 3),
                         during=d.figures())
                for (e, end), d in zip(self._spans, self._during, strict=True)]


def _cell(text: str) -> str:
    """Text from a file, fit for a table cell and a terminal: plain, no `|`."""
    return plain(text.replace("|", " "), CELL_LIMIT)


class Report(SoakResult, kw_only=True):
    """What `tokentop report` computes of a run directory (report.json): the soak analysis
    and what the directory says of the run."""

    pauses: list[Pause] = msgspec.field(default_factory=list)  # not in the first reports
    faults: list[FaultRow] = msgspec.field(default_factory=list)  # the "fault" events' spans
    # --mix: a row a class over the same window as the run's summary (loadgen.run.summary's
    # class_rows: requests, throughput, goodput, percentiles, its own limits' verdicts)
    classes: list[dict[str, Any]] = msgspec.field(default_factory=list)
    run_dir: str
    # what the run is of, in words (the plots' titles): the eval's phase, the load, the target
    subject: str = ""
    manifest: dict[str, Any]  # manifest.json's facts about the run, as it has them
    status: str  # the run's state in words (STATUS_TEXT)
    slo: str | None
    warnings: list[str]  # what reading the Snapshots warned of
    # set by write_report (absent from analyze_dir's): files that could not be written,
    # and the PNGs that were
    not_written: list[NotWritten] | UnsetType = UNSET
    plots: list[str] | UnsetType = UNSET


class Pauses:
    """When the load was paused (the `p` key, MQTT), from each Snapshot's load state: the
    analyzer keeps no series of it."""

    def __init__(self) -> None:
        self._spans: list[list[float]] = []
        self._open: list[float] | None = None

    def see(self, snap: Snapshot) -> None:
        if snap.load.state != "paused":
            self._open = None
        elif self._open is None:
            self._open = [snap.t - snap.interval, snap.t]
            self._spans.append(self._open)
        else:
            self._open[1] = snap.t

    def spans(self, start_time: float) -> list[Pause]:
        return [Pause(start=a, end=b, start_rel=round(a - start_time, 3),
                      duration_s=round(b - a, 3), ongoing=s is self._open)
                for s in self._spans for a, b in [s]]


def withhold_short_slope(s: Slope, span_s: float) -> None:
    """A slope over less than MIN_SLOPE_SPAN_S of samples is start-up growth, not a leak
    (a 17 s run read +36056 MB/h): null, with the reason, so nobody quotes the figure."""
    if s.trend:
        return
    s.slope_mb_h = None
    s.min_span_s = MIN_SLOPE_SPAN_S
    s.slope_withheld = f"run too short for a slope ({_fmt_s(span_s)}; {trend.needs()})"


def analyze_dir(run_dir: Path | str, *, slo: str | None = None, bucket_s: float | None = None,
                tail_k: float = 5.0, tail_abs_us: dict[str, float] | None = None,
                warnings: list[str] | None = None) -> tuple[dict, SoakAnalyzer]:
    """soak_report's Report as plain JSON-able values (report.json's, less the files)."""
    r, analyzer = soak_report(run_dir, slo=slo, bucket_s=bucket_s, tail_k=tail_k,
                              tail_abs_us=tail_abs_us, warnings=warnings)
    return msgspec.to_builtins(r), analyzer


def soak_report(run_dir: Path | str, *, slo: str | None = None, bucket_s: float | None = None,
                tail_k: float = 5.0, tail_abs_us: dict[str, float] | None = None,
                warnings: list[str] | None = None) -> tuple[Report, SoakAnalyzer]:
    """The Report of a run directory (nothing written) and the analyzer (its plot series)."""
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
    pauses = Pauses()
    faults = FaultSpans(run_dir, warnings.append)
    mix = (manifest.get("config") or {}).get("mix") or []
    windows = SnapshotWindows() if mix else None  # each class's own, as the summary's
    for snap in iter_snapshots(run_dir, warn=warnings.append):
        analyzer.add(snap)
        pauses.see(snap)
        faults.see(snap)
        if windows is not None:
            windows.add(snap)
    soak = analyzer.analysis()
    drift = soak.drift
    # the analyzer's span_h, unrounded (the Slope's is rounded)
    withhold_short_slope(drift.server_rss, analyzer.rss.span_h * 3600)
    withhold_short_slope(drift.gpu_memory, analyzer.gpu_mem.span_h * 3600)
    state = run_state(run_dir)  # after reading: a run that ended meanwhile says so
    result = Report(
        **(msgspec.structs.asdict(soak) | {"state": state}),  # the run's, not its load's
        pauses=pauses.spans(analyzer.start_time or 0.0),
        faults=faults.rows(analyzer.start_time or 0.0),
        run_dir=str(run_dir),
        subject=subject_of(run_dir, manifest),
        manifest={k: manifest.get(k) for k in (
            "tokentop_version", "run_id", "status", "start_time", "end_time", "engine", "host",
            "gpus", "gpu_source", "resumes", "recording_stopped")},
        status=STATUS_TEXT.get(state, state) + ("" if manifest else "; no manifest.json"),
        slo=slo, warnings=warnings, classes=_class_rows(mix, slo, windows, warnings))
    # a recording is outside text (another machine's, an older tokentop's, edited): every
    # string it gave the report (the model, event words, warnings quoting a line) is made
    # plain here, once, before the summary, report.md, report.json or a plot label has it
    return plain_all(result), analyzer


def _class_rows(mix: list, slo: str | None, windows: SnapshotWindows | None,
                warnings: list[str]) -> list[dict]:
    """The recording's --mix classes, each as the run's summary gives it; a mix that does
    not read (an edited manifest) is a warning, not a report lost."""
    if windows is None:
        return []
    try:
        return class_rows([str(m) for m in mix], slo, windows)
    except WorkloadError as e:
        warnings.append(f"the recorded --mix does not read, no class rows: {e}")
        return []


def subject_of(run_dir: Path, manifest: dict) -> str:
    """"faults phase: 4 streams against the embedded simulator": the load from the recorded
    config, the target as the run names it. A run directory of an eval (OUT/runs/PHASE, an
    eval.json beside runs/) is of its phase and of the eval's target: the phase's own URL
    is the eval's simulator's port, or the fault proxy's, thrown away when the eval ends."""
    load = plot_style.load_words(manifest.get("config") or {})
    target = manifest.get("target") or {}
    name = plot_style.target_name(target.get("url"), target.get("model"), manifest.get("engine"),
                                  bool(target.get("simulated")))
    ev = _eval_of(run_dir)
    if ev is None:
        return f"{load} {plot_style.against(name)}"
    header = ev.get("header") if isinstance(ev.get("header"), dict) else {}
    url = ev.get("target") if isinstance(ev.get("target"), str) else None
    name = plot_style.target_name(None if url == plot_style.EMBEDDED_SIM else url,
                                  header.get("model"), header.get("engine"))
    return f"{plot_style.phase_of(run_dir.name)} phase: {load} {plot_style.against(name)}"


def _eval_of(run_dir: Path) -> dict | None:
    """The eval.json of the eval this run directory is a phase of (None: not an eval's, or
    one that cannot be read: the title then names the run's own target)."""
    if run_dir.parent.name != "runs":
        return None
    try:
        doc = json.loads((run_dir.parent.parent / "eval.json").read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


# ---- text -------------------------------------------------------------------------------------


# the figures as tokentop prints them everywhere (loadgen.model.units)


def _fmt_s(s: float | None) -> str:
    return units.duration(s)


def _ms(x: float | None) -> str:
    """A latency the soak analysis keeps in ms."""
    return units.ms(units.us_of_ms(x))


def _pct(x: float | None) -> str:
    return units.pct(x)


def summary_lines(r: dict) -> list[str]:
    # after warm-up and before the drain, as the success rate, the thresholds and the run's
    # summary are (older analyses: the whole run)
    req = r.get("measured_requests") or r["requests"]
    lines = [
        f"run {r['run_id']}  {r['status']}  target {(r['target'] or {}).get('url', '?')}",
        f"  wall {_fmt_s(r['wall_s'])}, load {_fmt_s(r['elapsed_s'])}, measured "
        f"{_fmt_s(r['measured_s'])}, {r['ticks']} ticks; "
        f"{req['ok']} ok, {req['failed']} failed in it; success "
        f"{_pct(r['success_rate'])} (during outages {_pct(r['success_rate_during_outages'])})",
    ]
    drain = _drain_text(r.get("drain"))
    if drain:
        lines.append(f"  {drain}")
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
        lines.append(f"  throughput {units.rate(rates['output_tok_s'], 'output tok/s')}, "
                     f"{units.rate(rates['req_s'], 'req/s')}")
    outages = r["outages"]
    mttr = r["mttr_s"]
    events = r.get("outage_events")
    events = len({o.get("event", i) for i, o in enumerate(outages)}) if events is None else events
    lines.append(f"  outages: {events} (MTTR {_fmt_s(mttr['any'])}; as the client saw them "
                 f"{_fmt_s(mttr['client'])}, as /metrics did {_fmt_s(mttr['server'])})")
    for o in outages[:10]:
        lines.append(f"    #{o.get('event', 0)} {o['kind']:6} at +{_fmt_s(o['start_rel'])}: "
                     f"{_fmt_s(o['duration_s'])}"
                     f"{' (ongoing)' if o['ongoing'] else ''}"
                     f"{' ' + _errs(o['errors']) if o['errors'] else ''}")
    for g in r["gaps"]:
        lines.append(f"  recording gap at +{_fmt_s(g['start_rel'])}: {_fmt_s(g['duration_s'])} "
                     "(tokentop was not running; resumed)")
    d = r["drift"]
    for name, key in (("server RSS", "server_rss"), ("GPU memory", "gpu_memory")):
        s = d[key]
        if s["first_mb"] is not None:
            lines.append(f"  {name} {s['first_mb']:.0f} → {s['last_mb']:.0f} MB; "
                         f"{_slope_text(s)}")
    lt = r["long_tail"]
    if any(lt["counts"].values()):
        counts = ", ".join(f"{m} {n}" for m, n in lt["counts"].items())
        lines.append(f"  long tail ({lt['rule']}): {counts} intervals")
    for t in r["thresholds"]:
        lines.append(f"  {'PASS' if t['passed'] else 'FAIL'} {t['shown']}")
    lines += _class_lines(r.get("classes") or [])
    for w in r["warnings"][:5]:
        lines.append(f"  warning: {w}")
    return lines


def _class_lines(rows: list[dict]) -> list[str]:
    """A line a --mix class (its priority, requests, share, TTFT and E2E tail, goodput),
    then its own limits' verdicts."""
    lines = []
    for c in rows:
        lat = c["latency_ms"]
        ttft, e2e = lat.get("ttft") or {}, lat.get("e2e") or {}
        req = c["requests"]
        goodput = c["throughput"]["goodput_req_s"]
        lines.append(
            f"  class {c['name']} (priority {c['priority']}): {req['ok']} ok, {req['failed']} "
            f"failed; {_pct(c['share_sent'])} of the requests ({_pct(c['share_asked'])} "
            f"asked); TTFT p50 {_ms(ttft.get('p50'))} p99 {_ms(ttft.get('p99'))}, E2E p99 "
            f"{_ms(e2e.get('p99'))}"
            + (f"; goodput {units.rate(goodput, 'req/s')}" if goodput is not None else ""))
        for t in c.get("thresholds") or []:
            lines.append(f"    {'PASS' if t['passed'] else 'FAIL'} {c['name']}: {t['shown']}")
    return lines


def _class_table(rows: list[dict]) -> list[str]:
    """report.md's --mix classes: a row each, its verdicts in the last cell."""
    if not rows:
        return []
    out = ["## Classes (--mix)", "", "| class | priority | ok | failed | share sent (asked) | "
           "TTFT p50 | TTFT p99 | E2E p99 | goodput | its limits |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in rows:
        lat = c["latency_ms"]
        ttft, e2e = lat.get("ttft") or {}, lat.get("e2e") or {}
        goodput = c["throughput"]["goodput_req_s"]
        verdicts = ", ".join(f"`{t['text']}` {'pass' if t['passed'] else '**FAIL**'}"
                             for t in c.get("thresholds") or []) or "none"
        out.append(f"| {_cell(c['name'])} | {c['priority']} | {c['requests']['ok']} | "
                   f"{c['requests']['failed']} | {_pct(c['share_sent'])} "
                   f"({_pct(c['share_asked'])}) | {_ms(ttft.get('p50'))} | "
                   f"{_ms(ttft.get('p99'))} | {_ms(e2e.get('p99'))} | "
                   f"{units.rate(goodput, 'req/s') if goodput is not None else 'n/a'} | "
                   f"{verdicts} |")
    return [*out, ""]


def _drain_text(drain: dict | None) -> str:
    """What the drain did, said apart: its seconds and requests are in no rate."""
    if not drain:
        return ""
    return (f"drain {_fmt_s(drain['seconds'])}: {drain['requests_ok']} finished, "
            f"{drain['requests_failed']} failed, {drain['requests_cancelled']} cancelled "
            "(not in the rates; their latencies are)")


def _change_text(d: dict) -> str:
    """Throughput last / first whole bucket, and whether a partial last one was left out."""
    change = d["throughput_change"]
    text = units.NA if change is None else f"{change:.3f}"
    buckets = d["buckets"]
    if buckets and buckets[-1].get("partial"):
        text += (f" (the last bucket, {_fmt_s(buckets[-1]['seconds'])} before the drain, is "
                 "partial: not compared)")
    return text


def _slope_text(s: dict) -> str:
    """The MB/h figure, or why there is none (a run too short for one)."""
    if s["slope_mb_h"] is not None:
        return f"slope {s['slope_mb_h']:+.1f} MB/h"
    return s.get("slope_withheld") or f"slope {units.NA} (too few samples)"


def _per_metric(values: dict, shown=units.count) -> str:
    """{'ttft': 159.5, 'itl': 65.0} as "TTFT 160 ms, ITL 65.0 ms" (shown=_ms), counts as
    they are."""
    if not values:
        return "none"
    return ", ".join(f"{m.upper()} {shown(v)}" for m, v in values.items())


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


def _operator_section(r: dict) -> list[str]:
    """Pauses, operator events and notes (the `e` key), as the plots mark them."""
    pauses, events = r.get("pauses") or [], marks(r)
    if not pauses and not events:
        return []
    items = [(p["start"], f"* {_when(p['start'])} (+{_fmt_s(p['start_rel'])}) load paused for "
              f"{_fmt_s(p['duration_s'])}{' (still paused)' if p['ongoing'] else ''}")
             for p in pauses]
    items += [(e["t"], f"* {_when(e['t'])} (+{_fmt_s(e['rel'])}) {e['message']}")
              for e in events[:WATCHED_LISTED]]
    out = ["## Pauses, operator events and notes", "", *(line for _, line in sorted(items))]
    if len(events) > WATCHED_LISTED:
        out.append(f"* … and {len(events) - WATCHED_LISTED} more (report.json has them)")
    return [*out, ""]


def _fault_section(r: dict) -> list[str]:
    """The faults a proxy put on the run (the eval's faults phase), and what the load
    measured while each was on."""
    rows = r.get("faults") or []
    if not rows:
        return []
    out = ["## Faults", "", "| fault | start | end | duration | ticks | out tok/s | ITL p50 "
           "| ITL p99 | E2E p50 | E2E p90 | E2E p99 |", "| --- |" + " --- |" * 10]
    for f in rows:
        d = f.get("during") or {}
        ms = [_ms(d.get(k)) for k in ("itl_p50_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p90_ms",
                                      "e2e_p99_ms")]
        end = "not recorded" if f["end"] is None else _when(f["end"])
        out.append(f"| {f['what']} | {_when(f['start'])} (+{_fmt_s(f['start_rel'])}) | {end} "
                   f"| {_fmt_s(f['duration_s'])} | {d.get('ticks', 0)} | "
                   f"{units.rate(d.get('output_tok_s'))} | {' | '.join(ms)} |")
    return [*out, "", "Figures over the ticks wholly inside each fault.", ""]


def _when(t: float | None) -> str:
    return units.NA if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def markdown(r: dict, plots: list[str]) -> str:
    m = r["manifest"]
    out = [f"# tokentop soak report: run {r['run_id']}", ""]
    out += [
        f"* status: **{r['status']}**",
        f"* target: {(r['target'] or {}).get('url')} model {(r['target'] or {}).get('model')}"
        f"{' (simulated)' if (r['target'] or {}).get('simulated') else ''}",
        f"* engine: {m.get('engine') or 'unknown'}; host: {(m.get('host') or {}).get('hostname')}",
        f"* started {_when(r['start_time'])}, last snapshot {_when(r['last_t'])}; wall "
        f"{_fmt_s(r['wall_s'])}, load {_fmt_s(r['elapsed_s'])}, measured {_fmt_s(r['measured_s'])}"
        " (after warm-up, before the drain: the rates' window)",
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
    out += _class_table(r.get("classes") or [])
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
    out += _fault_section(r)
    out += _watched_events(r.get("events") or [])
    out += _operator_section(r)
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
        index = f"{b['index']} (partial)" if b.get("partial") else b["index"]
        out.append(f"| {index} | {_ms(b['ttft']['p99_ms'])} | {_ms(b['ttft']['p99.9_ms'])} "
                   f"| {_ms(b['itl']['p99_ms'])} | {_ms(b['itl']['p99.9_ms'])} | "
                   f"{units.rate(b['output_tok_s'])} | {_pct(b['error_rate'])} | "
                   f"{units.number(b['server_rss_mb'])} | {units.number(b['gpu_mem_mb'])} |")
    out += ["", f"Server RSS: {_slope_text(d['server_rss'])}; GPU memory: "
            f"{_slope_text(d['gpu_memory'])}; throughput last/first whole bucket: "
            f"{_change_text(d)}.", ""]
    lt = r["long_tail"]
    out += ["## Long tail", "", f"Limit ({lt['rule']}): {_per_metric(lt['limits_ms'], _ms)}; "
            f"intervals above it: {_per_metric(lt['counts'])}.", ""]
    if lt["intervals"]:
        out += ["| time | metric | p99.9 | max | in flight | context |",
                "| --- | --- | --- | --- | --- | --- |"]
        for t in lt["intervals"]:
            out.append(f"| {_when(t['t'])} (+{_fmt_s(t['rel'])}) | {t['metric']} | "
                       f"{_ms(t['p99.9_ms'])} | {_ms(t['max_ms'])} | {t['in_flight']} | "
                       f"{'; '.join(t['context']) or 'none'} |")
        out.append("")
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    if r["warnings"]:
        out += ["## Reading warnings", ""] + [f"* {w}" for w in r["warnings"][:50]] + [""]
    return "\n".join(out)


# ---- plots ------------------------------------------------------------------------------------

# Colours of the lines; red is left out, it marks the outages.
LINE_COLOURS = ("C0", "C1", "C2", "C4", "C5", "C6", "C8", "C9")


@dataclass
class Panel:
    """One y axis: its unit, the lines on it (label, values a tick), and what they are,
    which says how the axis is scaled (loadgen.analysis.plot_style): "count" (counts and
    rates: from 0), "latency" (log when it spans decades), "memory" (a minimum span),
    "level" (as the values fall)."""

    unit: str
    lines: list[tuple[str, np.ndarray]]
    kind: str = "level"


def time_axis(span_s: float) -> tuple[str, float]:
    """The run's own time scale: (unit, seconds a unit). A 17 s run in seconds, an
    afternoon in minutes, a soak in hours."""
    if span_s <= 180:
        return "s", 1.0
    if span_s <= 3 * 3600:
        return "min", 60.0
    return "h", 3600.0


def drawn(lines: list[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """The lines that have something to draw: only they get a legend entry."""
    return [(label, y) for label, y in lines if np.isfinite(y).any()]


def isolated(y: np.ndarray) -> bool:
    """A finite value with no finite neighbour: a line alone would not show it (TTFT in
    a short run: a tick sees a first token only now and then)."""
    f = np.isfinite(y)
    left = np.concatenate(([False], f[:-1]))
    right = np.concatenate((f[1:], [False]))
    return bool((f & ~left & ~right).any())


def moving_mean(y: np.ndarray, w: int) -> np.ndarray:
    """Mean over w ticks, of the finite values only (edges and holes are not read as 0)."""
    if w <= 1:
        return y
    f = np.isfinite(y)
    k = np.ones(w)
    total = np.convolve(np.where(f, y, 0.0), k, mode="same")
    n = np.convolve(f.astype(float), k, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / n, np.nan)


def rate_window(rel: np.ndarray) -> tuple[int, float]:
    """(ticks, seconds) of the moving mean of the rates: at least 2 s (a tick's request count
    is lumpy: streams finish together), at most 1500 points a plot."""
    if len(rel) < 2:
        return 1, 0.0
    tick = float(np.median(np.diff(rel))) or 1.0
    seconds = max(2.0, (rel[-1] - rel[0]) / 1500)
    return max(1, round(seconds / tick)), seconds


def plot_specs(s: dict[str, np.ndarray]) -> dict[str, tuple[str, list[Panel]]]:
    """Every plot: its title and panels (units on the axes and in the labels)."""
    dt = np.where(s["interval"] > 0, s["interval"], np.nan)
    w, seconds = rate_window(s["rel"])
    # tokens flow smoothly: averaged only to keep a soak's plot at ~1500 points
    w_tok = max(1, len(dt) // 1500)

    def rate(v: np.ndarray, ticks: int) -> np.ndarray:
        return moving_mean(v / dt, ticks)

    avg = f" ({seconds:g} s mean)" if w > 1 else ""
    return {
        "throughput": ("Throughput", [
            Panel("tokens/s", [("output tokens/s", rate(s["output_tokens"], w_tok))],
                  "count"),
            Panel("requests/s", [(f"ok requests/s{avg}", rate(s["ok"], w)),
                                 (f"failed requests/s{avg}", rate(s["failed"], w))],
                  "count")]),
        "latency": ("Latency per tick (client side)", [Panel("ms", [
            ("TTFT p50 (ms)", s["ttft_p50"] / 1e3), ("TTFT p99 (ms)", s["ttft_p99"] / 1e3),
            ("ITL p50 (ms)", s["itl_p50"] / 1e3), ("ITL p99 (ms)", s["itl_p99"] / 1e3)],
            "latency")]),
        "queue": ("Queue depth", [Panel("requests", [
            ("client in flight", s["in_flight"]), ("client backlog", s["backlog"]),
            ("server waiting", s["srv_waiting"]), ("server running", s["srv_running"])],
            "count")]),
        "gpu": ("GPU memory and power (all GPUs together)", [
            Panel("MB", [("GPU memory used (MB)", s["gpu_mem_mb"])], "memory"),
            Panel("W", [("GPU power (W)", s["gpu_power_w"])])]),
        "server_rss": ("Server process RSS", [Panel("MB", [("server RSS (MB)",
                                                            s["srv_rss_mb"])], "memory")]),
    }


def _y_axis(ax, panel: Panel, ys: list[np.ndarray]) -> None:
    """The axis scaled for what it shows (Panel.kind), plain tick labels (20, 50, 100;
    never 2×10^1, never an offset), the unit on the axis."""
    values = np.concatenate(ys)
    if panel.kind == "latency":
        plot_style.latency_y(ax, values, panel.unit)
        return
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_ylabel(panel.unit)
    if panel.kind == "count":
        plot_style.counts_from_zero(ax)
    elif panel.kind == "memory":
        plot_style.memory_span(ax, values)


def _draw_panel(ax, x: np.ndarray, panel: Panel, gap: float) -> None:
    """The panel's lines; a latency's drawn across ticks without a sample up to `gap` (in
    x units: a tick that saw no first token is no event), so it is a line, not dots."""
    lines = drawn(panel.lines)
    for (label, y), colour in zip(lines, LINE_COLOURS, strict=False):
        xs, ys = plot_style.bridged(x, y, gap) if panel.kind == "latency" else (x, y)
        ax.plot(xs, ys, lw=0.9, label=label, color=colour,
                marker="." if isolated(ys) else None, ms=4)
    if lines:
        _y_axis(ax, panel, [y for _, y in lines])
    ax.grid(alpha=0.3)


def _spans(r: dict) -> list[tuple[str, dict, float, float]]:
    """(legend label, style, start, end) of what is shaded: outages, pauses, gaps."""
    client = {"color": "red", "alpha": 0.2}
    server = {"color": "orange", "alpha": 0.25}
    out = [("client outage" if o["kind"] == "client" else "server /metrics outage",
            client if o["kind"] == "client" else server, o["start"], o["end"])
           for o in r["outages"]]
    out += [("load paused", {"color": "C0", "alpha": 0.15}, p["start"], p["end"])
            for p in r.get("pauses") or []]
    out += [("recording gap (tokentop not running)",
             {"color": "grey", "alpha": 0.3, "hatch": "//"}, g["start"], g["end"])
            for g in r["gaps"]]
    last = r.get("last_t") or 0.0
    out += [("fault on (proxy)", {"color": "C8", "alpha": 0.12, "hatch": ".."}, f["start"],
             f["end"] if f["end"] is not None else last) for f in r.get("faults") or []]
    return out


def marks(r: dict) -> list[dict]:
    """Operator events and notes (the `e` key): a vertical line each."""
    return [e for e in r.get("events") or [] if e["kind"] == "operator"]


def _mark_run(axes, r: dict, scale: float, span: float) -> list:
    """Shade outages, pauses and gaps, draw a line a mark (labelled on the top panel, the
    labels thinned: plot_style.thin_labels); the legend handles of what was drawn. `span`:
    the x axis' length, in its units."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    start = r["start_time"] or 0.0
    handles: dict[str, object] = {}
    for label, style, a, b in _spans(r):
        for ax in axes:
            ax.axvspan((a - start) / scale, (b - start) / scale, lw=0, **style)
        handles.setdefault(label, Patch(label=label, **style))
    events = [((e["t"] - start) / scale, e["message"]) for e in marks(r)]
    for at, _ in events:
        for ax in axes:
            ax.axvline(at, color="purple", lw=0.8, ls="--")
    labels, unlabelled = plot_style.thin_labels(events, span)
    for label in labels:
        axes[0].text(label.at, 0.98, " " + label.text, rotation=90, va="top", ha="right",
                     fontsize=7, color="purple", transform=axes[0].get_xaxis_transform())
    if events:
        more = f" (+{unlabelled} more not labelled)" if unlabelled else ""
        handles["marks"] = Line2D([], [], color="purple", lw=0.8, ls="--",
                                  label=f"operator event / note{more}")
    return list(handles.values())


def title_of(what: str, r: dict) -> str:
    """What the plot is of: the figure, then the phase, load and target; the run id last
    (the run directory's name, to find it again)."""
    subject = r.get("subject") or ""
    return f"{what}\n{subject + ', ' if subject else ''}run {r['run_id']}"


def figures(r: dict, analyzer: SoakAnalyzer) -> dict:
    """The report's matplotlib figures by name (close them when done); none without ticks,
    and none for a plot with nothing to draw (no GPU seen: no GPU plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = {k: np.frombuffer(v, np.float64 if v.typecode == "d" else np.float32)
         for k, v in analyzer.series.items()}
    if len(s["rel"]) == 0:
        return {}
    unit, scale = time_axis(float(s["rel"][-1]))
    x = s["rel"] / scale
    _, seconds = rate_window(s["rel"])
    tick = float(np.median(np.diff(s["rel"]))) if len(s["rel"]) > 1 else 0.0
    gap = max(seconds, 2 * tick) / scale  # a latency line is broken by a longer silence
    out = {}
    for name, (title, panels) in plot_specs(s).items():
        panels = [p for p in panels if drawn(p.lines)]
        if not panels:
            continue
        fig, axes = plt.subplots(len(panels), 1, figsize=(12, 2.2 + 2.3 * len(panels)),
                                 sharex=True, squeeze=False)
        axes = list(axes[:, 0])
        for ax, panel in zip(axes, panels, strict=True):
            _draw_panel(ax, x, panel, gap)
        span = max(float(x[-1]), 1e-9)
        extra = _mark_run(axes, r, scale, span)
        for i, ax in enumerate(axes):
            lines, _ = ax.get_legend_handles_labels()
            ax.legend(handles=lines + (extra if i == 0 else []), loc="upper left",
                      bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
        axes[-1].set_xlabel(f"time since the run started ({unit})")
        axes[-1].set_xlim(0, span)
        axes[0].set_title(title_of(title, r))
        fig.tight_layout()
        out[name] = fig
    return out


def plot(r: dict, analyzer: SoakAnalyzer, out_dir: Path,
         not_written: list[NotWritten] | None = None) -> list[str]:
    """The PNGs written; one that cannot be (a full disk) is removed, noted in not_written."""
    figs = figures(r, analyzer)  # first: it picks the Agg backend before pyplot is imported
    import matplotlib.pyplot as plt

    written = []
    for name, fig in figs.items():
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


def _written(path: Path, write, not_written: list[NotWritten] | None) -> bool:
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
        not_written.append(NotWritten(file=path.name, why=_why(e)))
        return False


def _text(data: str):
    return lambda f: f.write(data.encode())


# ---- the report -------------------------------------------------------------------------------


def write_report(run_dir: Path | str, *, out_dir: Path | str | None = None,
                 slo: str | None = None, plots: bool = True, bucket_s: float | None = None,
                 tail_k: float = 5.0, tail_abs_us: dict[str, float] | None = None,
                 out=sys.stdout) -> tuple[int, dict]:
    """Analyse, print the summary, write report.json/report.md/PNGs; (exit code, result as
    plain JSON-able values). See write_soak_report."""
    code, r = write_soak_report(run_dir, out_dir=out_dir, slo=slo, plots=plots,
                                bucket_s=bucket_s, tail_k=tail_k, tail_abs_us=tail_abs_us,
                                out=out)
    return code, msgspec.to_builtins(r)


def write_soak_report(run_dir: Path | str, *, out_dir: Path | str | None = None,
                      slo: str | None = None, plots: bool = True, bucket_s: float | None = None,
                      tail_k: float = 5.0, tail_abs_us: dict[str, float] | None = None,
                      out=sys.stdout) -> tuple[int, Report]:
    """Analyse, print the summary, write report.json/report.md/PNGs; (exit code, Report).

    The summary comes first: what was computed is shown even when nothing can be written.
    Files that could not be written are in r.not_written and make it 2.
    Raises RunDirError / ConfigError / SnapshotVersionError with a message for the user."""
    run_dir = Path(run_dir)
    warnings: list[str] = []
    r, analyzer = soak_report(run_dir, slo=slo, bucket_s=bucket_s, tail_k=tail_k,
                              tail_abs_us=tail_abs_us, warnings=warnings)
    shown = msgspec.to_builtins(r)  # the text and the plots read the plain values
    for line in summary_lines(shown):
        print(line, file=out, flush=True)
    target = Path(out_dir) if out_dir else run_dir
    not_written: list[NotWritten] = []
    r.not_written = not_written
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        not_written.append(NotWritten(file=str(target), why=_why(e)))
        return 2, r
    written = plot(shown, analyzer, target, not_written) if plots else []
    r.plots = written
    files = list(written)
    texts = {"report.md": lambda: markdown(shown, written),
             "report.json": lambda: json.dumps(msgspec.to_builtins(r), indent=2, default=str)}
    for name, text in texts.items():  # the md first: the json then holds the whole result
        if _written(target / name, _text(text() + "\n"), not_written):
            files.append(str(target / name))
    for f in files:  # every file, so the plots are found as easily as report.md
        print(f"wrote {f}", file=out)
    if not_written:
        return 2, r
    return (3 if r.thresholds_passed is False else 0), r
