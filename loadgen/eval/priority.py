"""Priority classes (the eval's `priority` phase): the plan's mix of classes (each as --mix
takes it) at a load past the knee, where requests queue and the server's order decides who
waits; then the same mix without its priorities, so the rows show what the server does
with them.

Each run is an ordinary run with a --mix (OUT/runs/priority, OUT/runs/priority-without):
every class is measured apart by the workers and its figures are the run's own summary's
`classes` rows and class thresholds (loadgen.run.summary), over the run's measured window,
read back from the recording's manifest. Nothing is re-derived here.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from loadgen.eval.phase_run import Eval, knee_load, load_text, phase_cfg, run_session
from loadgen.eval.results import (
    ClassFigures,
    ClassThreshold,
    PhaseResult,
    PriorityFigures,
    done,
    skipped,
)
from loadgen.record.rundir import RunDirError, read_manifest
from loadgen.worker.mix import parse_mix

WITHOUT = "priority-without"  # the run without priorities, by its directory's name


async def run(ev: Eval) -> PhaseResult:
    """The priority phase's result: the mix with its priorities, then without."""
    p = ev.phases.priority
    if not p.enabled:
        return skipped("disabled in the plan")
    load, load_why = _load(ev)
    mix = [str(c) for c in p.classes]  # plain str: the run config is encoded
    with_dir = await _run(ev, "priority", mix, load)
    classes = class_figures(with_dir)
    without: list[ClassFigures] = []
    without_dir: Path | None = None
    without_why = "the plan says without = false"
    if p.without:
        without_dir = await _run(ev, WITHOUT, unprioritised(mix), load)
        without, without_why = class_figures(without_dir), ""
        _refused(classes, without)
    mode = ev.phases.baseline.mode
    return done(PriorityFigures(
        load=load_text(mode, int(load), load), load_why=load_why, classes=classes,
        without=without, without_why=without_why,
        without_run_dir=str(without_dir) if without_dir else None), str(with_dir))


def _load(ev: Eval) -> tuple[float, str]:
    """The phase's load (streams or req/s, in the baseline's mode) and how it was chosen."""
    p, b = ev.phases.priority, ev.phases.baseline
    base, what = float(b.concurrency if b.mode == "closed" else b.rate), "the baseline's"
    if p.load == "knee":
        knee, why = knee_load(ev)
        base, what = (knee, "the ramp's knee") if knee else (base, f"the baseline's ({why})")
    load = base * p.factor
    if b.mode == "closed":
        load = float(max(1, round(load)))
    unit = "streams" if b.mode == "closed" else "req/s"
    return load, f"{p.factor:g} × {what}, {base:g} {unit}"


async def _run(ev: Eval, name: str, mix: list[str], load: float) -> Path:
    p, mode = ev.phases.priority, ev.phases.baseline.mode
    cfg = msgspec.structs.replace(
        phase_cfg(ev, name, mode=mode, concurrency=int(load), rate=load,
                  duration=float(p.duration), warmup=float(p.warmup)), mix=mix)
    return await run_session(ev, name, cfg)


def unprioritised(mix: list[str]) -> list[str]:
    """The same classes with no `priority=`: every request then waits in arrival order."""
    return [" ".join(w for w in text.split() if not w.startswith("priority=")) for text in mix]


def class_figures(run_dir: Path) -> list[ClassFigures]:
    """Each class of a run with a mix, as its summary (the recording's manifest) has it."""
    try:
        summary = read_manifest(run_dir).get("summary") or {}
    except RunDirError as e:
        summary = {"why": str(e)}
    rows = summary.get("classes") or []
    judged = [t for t in summary.get("thresholds") or [] if t.get("class")]
    if not rows:
        mix = (summary.get("config") or {}).get("mix") or []
        why = summary.get("why") or "the run wrote no summary (it was stopped before its end)"
        return [_empty(c.name, c.priority, c.share, why) for c in parse_mix(mix)]
    return [_class(row, [t for t in judged if t["class"] == row["name"]]) for row in rows]


def _class(row: dict, judged: list[dict]) -> ClassFigures:
    requests, latency = row["requests"], row["latency_ms"]
    ok, failed = requests["ok"], requests["failed"]
    return ClassFigures(
        name=row["name"], priority=row["priority"], share_asked=row["share_asked"],
        share_sent=row["share_sent"], requests_ok=ok, requests_failed=failed,
        errors=dict(requests["errors"]), ttft_ms=latency.get("ttft"),
        itl_ms=latency.get("itl"), e2e_ms=latency.get("e2e"),
        output_tok_s=row["throughput"]["output_tok_s"],
        goodput_req_s=row["throughput"]["goodput_req_s"], limits=row["limits"],
        thresholds=[_threshold(row["name"], t) for t in judged],
        why="" if ok else ("none of its requests succeeded" if failed
                           else "no request of it ended in the measured window"))


def _threshold(name: str, t: dict) -> ClassThreshold:
    # "shown" is "interactive: ttft_p99<1s: measured 41.2 ms" (or ": no data (fails)")
    measured = t["shown"].removeprefix(f"{name}: ").removeprefix(f"{t['text']}: ")
    return ClassThreshold(shown=t["text"], passed=t["passed"], measured=measured)


def _empty(name: str, priority: int | None, share: float, why: str) -> ClassFigures:
    return ClassFigures(name=name, priority=priority, share_asked=share, share_sent=None,
                        requests_ok=0, requests_failed=0, errors={}, ttft_ms=None,
                        itl_ms=None, e2e_ms=None, output_tok_s=None, goodput_req_s=None,
                        limits=None, thresholds=[], why=why)


def _refused(with_: list[ClassFigures], without: list[ClassFigures]) -> None:
    """A class whose requests all failed with their priority and succeeded without it: the
    server does not take the field. Said on its row, in the words that fix it."""
    ok_without = {c.name: c.requests_ok for c in without}
    for c in with_:
        if c.priority and c.requests_failed and not c.requests_ok and ok_without.get(c.name):
            c.refused = True
            c.why = ("its requests failed with their priority and succeeded without: the "
                     "server does not schedule by priority (vLLM: start it with "
                     "--scheduling-policy priority)")
