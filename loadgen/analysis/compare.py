"""`tokentop compare A B [C…]`: runs or sweeps side by side, with the difference in per cent.

Each argument is a run directory (what every run records), a headless summary
(`tokentop run --headless --json FILE`), or a sweep (`--sweep-out DIR`, or its
sweep.json). Runs are compared with runs and sweeps with sweeps. The first is
the baseline; every other column shows its value and the change against it,
marked better or worse for that metric. Runs whose workloads differ (prompt
or output lengths, API, prefix, prompt file) are flagged above the table: the
numbers are still shown, but they do not compare like for like. So is a run
directory that did not finish (rundir.run_state: interrupted, still running, or
recording stopped): its numbers cover only part of its run; the table marks it
in a "state" row.

Formats read: run directories with manifest format_version 1 and Snapshot v1,
headless summaries with format 1 (and those written before the field existed),
sweeps with format 1. Anything newer is refused with a message, not guessed at.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from loadgen.analysis.sweep import SWEEP_FORMAT, StepResult, curve_title, plot_curve
from loadgen.model import units
from loadgen.model.snapshot import SNAPSHOT_VERSION, SnapshotVersionError
from loadgen.record.rundir import (
    FINISHED,
    MANIFEST_FORMAT,
    RunDirError,
    first_snapshot,
    read_manifest,
    run_state,
)

SUMMARY_FORMAT = 1
RUN_FORMATS = (MANIFEST_FORMAT,)
# the settings that make two runs the same experiment
WORKLOAD_KEYS = ("api", "input_tokens", "output_tokens", "shared_prefix", "prompts_file",
                 "dataset", "tokenizer", "ignore_eos", "continuous_usage")
LOAD_KEYS = ("mode", "concurrency", "rate", "arrival", "max_in_flight")

# (label, path into the summary, True when higher is better)
RUN_ROWS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("output tok/s", ("rates", "output_tok_s"), True),
    ("req/s", ("rates", "req_s"), True),
    ("goodput req/s", ("rates", "goodput_req_s"), True),
    ("error rate", ("rates", "error_rate"), False),
    ("TTFT p50", ("latency_ms", "ttft", "p50"), False),
    ("TTFT p99", ("latency_ms", "ttft", "p99"), False),
    ("TTFT p99.9", ("latency_ms", "ttft", "p99.9"), False),
    ("ITL p50", ("latency_ms", "itl", "p50"), False),
    ("ITL p99", ("latency_ms", "itl", "p99"), False),
    ("TPOT p50", ("latency_ms", "tpot", "p50"), False),
    ("E2E p50", ("latency_ms", "e2e", "p50"), False),
    ("E2E p99", ("latency_ms", "e2e", "p99"), False),
)


class CompareError(Exception):
    pass


@dataclass
class Item:
    name: str
    kind: str  # run | sweep
    config: dict
    summary: dict = field(default_factory=dict)  # runs: latency_ms, rates
    steps: list[StepResult] = field(default_factory=list)  # sweeps
    knee: float | None = None
    max_goodput: dict | None = None
    state: str = FINISHED  # a run directory's run_state; summaries and sweeps are written whole


def load(path: Path) -> Item:
    """One argument, whatever it is; CompareError says why it cannot be read."""
    if path.is_dir() and (path / "sweep.json").exists():
        return _sweep(path / "sweep.json")
    if path.is_file():
        doc = _json(path)
        if "steps" in doc and "knee" in doc:
            return _sweep(path, doc)
        if "latency_ms" in doc and "tokentop_version" in doc:
            return _summary(path, doc)
        raise CompareError(f"{path}: not a tokentop run, summary or sweep")
    if path.is_dir():
        return _run_dir(path)
    raise CompareError(f"{path}: no such file or directory")


def _json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CompareError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(doc, dict):
        raise CompareError(f"{path}: not a tokentop file")
    return doc


def _check(path: Path, what: str, version: object, supported: tuple[int, ...]) -> None:
    if version not in supported:
        raise CompareError(f"{path}: {what} format {version} is not supported by this tokentop "
                           f"(it reads {', '.join(map(str, supported))}); upgrade tokentop")


def _sweep(path: Path, doc: dict | None = None) -> Item:
    doc = doc if doc is not None else _json(path)
    _check(path, "sweep", doc.get("format"), (SWEEP_FORMAT,))
    steps = [StepResult(**s) for s in doc["steps"]]
    return Item(name=_name(path), kind="sweep", config=doc.get("config") or {}, steps=steps,
                knee=doc.get("knee"), max_goodput=doc.get("max_goodput"))


def _summary(path: Path, doc: dict) -> Item:
    # summaries written before the format field existed are format 1
    _check(path, "summary", doc.get("format", 1), (SUMMARY_FORMAT,))
    rates = dict(doc.get("throughput") or {})
    req = doc.get("requests") or {}
    n = (req.get("ok") or 0) + (req.get("failed") or 0)
    rates["error_rate"] = req.get("failed", 0) / n if n else None
    return Item(name=_name(path), kind="run", config=doc.get("config") or {},
                summary={"latency_ms": doc.get("latency_ms") or {}, "rates": rates})


def _run_dir(path: Path) -> Item:
    from loadgen.analysis.report import analyze_dir

    try:
        manifest = read_manifest(path)
        _check(path, "run directory", manifest.get("format_version", 1), RUN_FORMATS)
        first = first_snapshot(path)
        state = run_state(path)
    except (RunDirError, SnapshotVersionError) as e:
        raise CompareError(f"{path}: {e}") from None
    if first is None:
        raise CompareError(f"{path}: the run recorded no Snapshot")
    if first.v != SNAPSHOT_VERSION:
        _check(path, "snapshot", first.v, (SNAPSHOT_VERSION,))
    result, _ = analyze_dir(path, warnings=[])
    config = manifest.get("config") or {}
    rates = dict(result["rates"])
    if not config.get("slo"):
        rates["goodput_req_s"] = None  # no per-request limits were set: no goodput to speak of
    return Item(name=_name(path), kind="run", config=config,
                summary={"latency_ms": result["latency_ms"], "rates": rates}, state=state)


def _name(path: Path) -> str:
    return (path.parent.name if path.name in ("sweep.json",) else path.name) or str(path)


# ---- comparing ---------------------------------------------------------------------------------


def workload_flags(items: list[Item]) -> list[str]:
    base = items[0].config
    flags = []
    for item in items[1:]:
        diff = [f"{k} {base.get(k)!r} vs {item.config.get(k)!r}" for k in WORKLOAD_KEYS
                if base.get(k) != item.config.get(k)]
        if diff:
            flags.append(f"WORKLOADS DIFFER ({items[0].name} vs {item.name}): "
                         f"{'; '.join(diff)} — not a like-for-like comparison")
        load = [f"{k} {base.get(k)!r} vs {item.config.get(k)!r}" for k in LOAD_KEYS
                if base.get(k) != item.config.get(k)]
        if load and items[0].kind == "run":
            flags.append(f"load differs ({item.name}): {'; '.join(load)}")
    return flags


def state_flags(items: list[Item]) -> list[str]:
    """A line for each run directory that did not finish: its numbers are those of the
    part it recorded, so set beside a whole run they do not compare like for like."""
    return [f"{i.name} is {i.state.upper()} (not finished): its numbers cover only the part "
            "it recorded — not a like-for-like comparison" for i in items if i.state != FINISHED]


def _dig(d: dict, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)  # type: ignore[assignment]
    return d if isinstance(d, int | float) else None


def delta(base: float | None, value: float | None, higher_better: bool) -> str:
    if base is None or value is None:
        return ""
    if base == 0:
        return "" if value == 0 else "(new)"
    pct = (value - base) / abs(base) * 100.0
    if abs(pct) < 0.5:
        return "(=)"
    better = (pct > 0) == higher_better
    return f"({pct:+.1f}% {'better' if better else 'worse'})"


def _fmt(x: float | None, path: tuple[str, ...]) -> str:
    """A cell as tokentop prints the figure anywhere: a latency with its unit (the
    summary keeps them in ms), the error rate in per cent, a rate (its unit is the row's)."""
    if path[0] == "latency_ms":
        return units.ms(units.us_of_ms(x))
    if path[-1] == "error_rate":
        return units.pct(x)
    return units.rate(x)


def run_table(items: list[Item]) -> list[str]:
    width = max(14, *(len(i.name) for i in items)) + 18
    lines = [f"{'':<16}" + "".join(f"{i.name:>{width}}" for i in items)]
    if any(i.state != FINISHED for i in items):
        lines.append(f"{'state':<16}" + "".join(
            f"{i.state if i.state == FINISHED else i.state.upper():>{width}}" for i in items))
    for label, path, higher in RUN_ROWS:
        base = _dig(items[0].summary, path)
        cells = []
        for n, item in enumerate(items):
            v = _dig(item.summary, path)
            text = _fmt(v, path) + ("" if n == 0 else " " + delta(base, v, higher))
            cells.append(f"{text:>{width}}")
        lines.append(f"{label:<16}" + "".join(cells))
    return lines


def sweep_table(items: list[Item]) -> list[str]:
    loads = sorted({s.load for i in items for s in i.steps})
    head = f"{'load':>7}" + "".join(f"{i.name[:26]:>30}" for i in items)
    lines = [head, f"{'':>7}" + "".join(f"{'tok/s · TTFT p99':>30}" for _ in items)]
    for load in loads:
        cells = []
        base = next((s for s in items[0].steps if s.load == load), None)
        for n, item in enumerate(items):
            s = next((s for s in item.steps if s.load == load), None)
            if s is None:
                cells.append(f"{units.NA:>30}")
                continue
            ttft = units.ms(units.us_of_ms(s.ttft_ms.get("p99")))
            text = f"{units.rate(s.output_tok_s)} · {ttft}"
            if n and base is not None:
                text += " " + delta(base.output_tok_s, s.output_tok_s, True)
            cells.append(f"{text:>30}")
        lines.append(f"{load:>7g}" + "".join(cells))
    for item in items:
        good = item.max_goodput
        lines.append(f"{item.name}: knee {item.knee if item.knee is not None else 'not reached'}"
                     + (f", max goodput {good['req_s']:.2f} req/s at {good['load']:g}"
                        if good else ""))
    return lines


def plot_runs(path: Path, items: list[Item]) -> None:
    """runs_figure, written to `path` (a PNG)."""
    import matplotlib.pyplot as plt

    fig = runs_figure(items)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)


def runs_figure(items: list[Item]):
    """Headline bars for runs: output tok/s and TTFT p99, one bar per run (the first the
    baseline); a figure a run lacks is no bar, and says so, rather than a bar at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4), dpi=110)
    names = [i.name for i in items]
    for ax, (label, unit, key) in zip(axes, (
            ("output tokens/s", "tokens/s", ("rates", "output_tok_s")),
            ("TTFT p99", "ms", ("latency_ms", "ttft", "p99"))), strict=True):
        values = [_dig(i.summary, key) for i in items]
        ax.bar(names, [v or 0.0 for v in values])
        for n, v in enumerate(values):
            if v is None:
                ax.annotate(units.NA, (n, 0), ha="center", va="bottom")
        ax.set_title(label)
        ax.set_ylabel(unit)
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"Runs compared against {items[0].name} (the first)", fontsize=11)
    fig.tight_layout()
    return fig


def _sweep_unit(items: list[Item]) -> str:
    modes = {i.config.get("mode", "closed") for i in items}
    return "req/s" if modes == {"open"} else "streams" if modes == {"closed"} else \
        "streams or req/s"


def compare(paths: list[Path], *, png: Path | None = None, json_path: Path | None = None,
            out: TextIO | None = None) -> None:
    """Print the comparison of `paths` (the first is the baseline) and write the PNG and
    JSON asked for. Raises CompareError with a message for the user when the items cannot
    be compared at all (fewer than two, unreadable, runs mixed with sweeps)."""
    out = out or sys.stdout
    if len(paths) < 2:
        raise CompareError("give at least two runs or sweeps")
    items = [load(path) for path in paths]
    kinds = {i.kind for i in items}
    if len(kinds) > 1:
        raise CompareError("compare runs with runs and sweeps with sweeps")
    flags = state_flags(items) + workload_flags(items)
    for line in flags:
        print(line, file=out)
    table = run_table(items) if "run" in kinds else sweep_table(items)
    print("\n".join(table), file=out)
    if png is not None:
        if "sweep" in kinds:
            unit = _sweep_unit(items)
            plot_curve(png, [(i.name, i.steps) for i in items], unit=unit,
                       title=curve_title("Sweeps compared", [s for i in items for s in i.steps],
                                         unit, "/".join(sorted({i.config.get("mode", "closed")
                                                                 for i in items})), None))
        else:
            plot_runs(png, items)
        print(f"wrote {png}", file=out)
    if json_path is not None:
        json_path.write_text(json.dumps({
            "items": [{"name": i.name, "kind": i.kind, "state": i.state, "summary": i.summary,
                       "knee": i.knee, "max_goodput": i.max_goodput} for i in items],
            "flags": flags}, indent=2))
