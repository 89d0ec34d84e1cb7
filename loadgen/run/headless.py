"""`tokentop run --headless`: the same engine, a progress line a second, a JSON summary.

Exit codes: 0 the run completed requests (and passed every --slo threshold);
1 no request succeeded (every one failed, or none finished); 2 the target, the
config or the run directory could not be used at all; 3 a --slo threshold
failed; 4 recording failed (disk full, unwritable) and the load was stopped
(--on-disk-full=stop, the default). The reason is always one line on stderr.

Every run is recorded (loadgen.record.recorder) to `cfg.out`, or to a timestamped
directory under $XDG_DATA_HOME/tokentop/runs; `cfg.resume` continues a run
directory. `python -m loadgen.run.headless '<RunConfig JSON>' [--json P] [--no-record]`
runs this without the command line (tests, scripts).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

import msgspec

from loadgen import __version__
from loadgen.analysis.soak import evaluate_thresholds, rates_from
from loadgen.model.snapshot import Snapshot, SnapshotVersionError
from loadgen.model.windows import SnapshotWindows, WindowStats
from loadgen.record.recorder import Recording, RecordingError, resumed
from loadgen.record.rundir import iter_snapshots
from loadgen.run.config import ConfigError, RunConfig, parse_slos
from loadgen.run.coordinator import Coordinator
from loadgen.run.preflight import TargetError

MS = 1e-3  # µs → ms


async def run_headless(
    cfg: RunConfig,
    *,
    api_key: str | None = None,
    json_path: Path | None = None,
    out: TextIO = sys.stderr,
    record: bool = True,
) -> int:
    resume = None
    windows = SnapshotWindows()
    try:
        if cfg.resume:
            cfg, resume = resumed(cfg)
            # the summary covers the whole run: what was recorded before the gap first
            for old in iter_snapshots(cfg.resume, warn=lambda m: print(f"tokentop: warning: {m}",
                                                                       file=out)):
                windows.add(old)
        coord = Coordinator(cfg, api_key, resume=resume)
        recording = Recording.open(cfg, run_id=coord.run_id, record=record)
    except (ConfigError, RecordingError, SnapshotVersionError) as e:
        print(f"tokentop: {e}", file=out)
        return 2
    try:
        await coord.start()
    except (TargetError, ConfigError) as e:
        print(f"tokentop: {e}", file=out)
        recording.discard({"error": str(e)})
        return 2
    if recording.run_dir is not None:
        verb = "resuming" if resume else "recording to"
        print(f"tokentop: {verb} {recording.run_dir}", file=out, flush=True)
    install_signal_handlers(coord, out)
    last_second = -1
    recording_failed = False
    try:
        measuring = cfg.warmup == 0
        async for snap in coord.snapshots():
            recording.take(snap)
            if recording.stop_load and not recording_failed:
                recording_failed = True
                coord.request_stop("recording failed")
            windows.add(snap)
            if not measuring and not snap.load.warmup:
                windows.reset()  # the results start when the warm-up ends
                measuring = True
            for ev in snap.events:
                if ev.level != "info":
                    print(f"tokentop: {ev.level}: {ev.message}", file=out)
            if int(snap.elapsed) > last_second or snap.load.state == "stopped":
                last_second = int(snap.elapsed)
                print(progress_line(snap, windows.stats("10s")), file=out, flush=True)
    finally:
        await coord.close()
    summary = build_summary(cfg, windows)
    summary["run_dir"] = str(recording.run_dir) if recording.run_dir else None
    summary["recording_error"] = recording.error
    summary["thresholds"] = thresholds(cfg, windows)
    code, reason = exit_status(summary)
    if code == 0 and recording_failed:
        code, reason = 4, f"recording failed, load stopped: {recording.error}"
    summary["exit"] = {"code": code, "reason": reason}
    close_error = recording.close(summary)
    if close_error:
        print(f"tokentop: {close_error}", file=out)
    if json_path is not None:
        try:
            _write_json(json_path, summary)
        except OSError as e:
            print(f"tokentop: cannot write {json_path}: {e.strerror or e}", file=out)
            code = code or 1
    print(f"tokentop: {reason}", file=out)
    return code


def install_signal_handlers(coord: Coordinator, out: TextIO) -> None:
    """Ctrl-C / SIGTERM stop the load in order (in-flight requests drain), never abruptly."""
    loop = asyncio.get_running_loop()

    def stop() -> None:
        print("tokentop: stopping, letting in-flight requests finish…", file=out)
        coord.request_stop("stopped by a signal")

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop)


def _ms(us: float | None, digits: int = 1) -> str:
    return "–" if us is None else f"{us * MS:.{digits}f}ms"


def progress_line(snap: Snapshot, w: WindowStats) -> str:
    ld = snap.load
    srv = snap.server
    server = (
        f"srv wait {_num(srv.waiting)} run {_num(srv.running)}"
        if srv is not None and srv.ok
        else "srv n/a"
    )
    ttft, itl = w.latency["ttft"], w.latency["itl"]
    est = " est" if w.tokens_estimated else ""
    c = snap.counters
    load = f"c={ld.target_concurrency}" if ld.mode == "closed" else (
        f"rate={ld.target_rate:g}/s backlog={ld.backlog}")
    state = "warm-up" if ld.warmup and ld.state == "running" else ld.state
    return (
        f"[{snap.elapsed:6.0f}s] {state:<8} {load} inflight={ld.in_flight}"
        f" | {_num(w.output_tok_s)} tok/s{est} {_num(w.req_s, 1)} req/s"
        f" | TTFT p50 {_ms(ttft['p50'])} p99 {_ms(ttft['p99'])} | ITL p99 {_ms(itl['p99'], 2)}"
        f" | ok {c.requests_ok} err {c.requests_failed} | {server}"
    )


def _num(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def build_summary(cfg: RunConfig, windows: SnapshotWindows) -> dict:
    run = windows.stats("run")
    last = windows.last
    latency = {
        m: {k: (None if v is None else (v * MS if k != "count" else v)) for k, v in s.items()}
        for m, s in run.latency.items()
    }
    return {
        "format": 1,  # of this summary; tokentop compare reads it
        "tokentop_version": __version__,
        "run_id": last.run_id if last else None,
        "target": msgspec.to_builtins(last.target) if last else None,
        "config": msgspec.to_builtins(cfg),
        "duration_s": round(run.seconds, 3),
        "requests": {
            "ok": run.requests_ok,
            "failed": run.requests_failed,
            "cancelled": run.requests_cancelled,
            "errors": run.errors,
        },
        "tokens": {
            "output": run.output_tokens,
            "input": run.input_tokens,
            "output_estimated": run.tokens_estimated,
        },
        "throughput": {
            "output_tok_s": run.output_tok_s,
            "input_tok_s": run.input_tok_s,
            "req_s": run.req_s,
            # requests/s within every --slo limit (None when no --slo was given)
            "goodput_req_s": run.goodput_req_s if cfg.slo else None,
            # what one user sees stream in: 1 / TPOT, so its median is 1 / median TPOT and
            # its slow tail (p10) is 1 / TPOT's p90
            "per_user_tok_s": _per_user(run.latency.get("tpot")),
        },
        "latency_ms": latency,
        "server": msgspec.to_builtins(last.server) if last and last.server else None,
        "finished_at": time.time(),
    }


def thresholds(cfg: RunConfig, windows: SnapshotWindows) -> list[dict]:
    """The --slo whole-run thresholds judged on the run window (after warm-up)."""
    slos = parse_slos(cfg.slo)
    if not slos.thresholds:
        return []
    run = windows.stats("run")
    good = (run.goodput_req_s or 0.0) * run.seconds
    rates = rates_from(run.requests_ok, run.requests_failed, round(good), run.output_tokens,
                       run.seconds)
    return evaluate_thresholds(slos.thresholds, run.latency, rates)


def _per_user(tpot: dict | None) -> dict[str, float | None]:
    def inv(us: float | None) -> float | None:
        return None if not us else 1e6 / us

    return {"p50": inv((tpot or {}).get("p50")), "p10": inv((tpot or {}).get("p90"))}


def exit_status(summary: dict) -> tuple[int, str]:
    req = summary["requests"]
    ok, failed = req["ok"], req["failed"]
    if ok == 0 and failed > 0:
        kinds = ", ".join(f"{n}× {k}" for k, n in sorted(req["errors"].items()))
        return 1, f"every request failed ({kinds})"
    if ok == 0:
        return 1, "no request completed; run longer or check the server"
    failing = [t for t in summary.get("thresholds") or [] if not t["passed"]]
    if failing:
        return 3, "threshold failed: " + "; ".join(t["shown"] for t in failing)
    tput = summary["throughput"]
    return 0, (
        f"done: {ok} requests ok, {failed} failed, "
        f"{tput['output_tok_s'] or 0:.0f} output tok/s over {summary['duration_s']:.1f} s"
    )


def _write_json(path: Path, summary: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """`python -m loadgen.run.headless '<RunConfig as JSON>' [--json PATH] [--no-record]`."""
    import argparse

    from loadgen.worker import eventloop

    p = argparse.ArgumentParser(prog="python -m loadgen.run.headless")
    p.add_argument("config", help="the RunConfig as JSON (msgspec field names)")
    p.add_argument("--json", type=Path)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    try:
        cfg = msgspec.json.decode(args.config, type=RunConfig)
    except msgspec.DecodeError as e:
        print(f"tokentop: bad configuration: {e}", file=sys.stderr)
        return 2
    key = os.environ.get("OPENAI_API_KEY") or None
    return eventloop.run(lambda: run_headless(cfg, api_key=key, json_path=args.json,
                                              record=not args.no_record))


if __name__ == "__main__":
    sys.exit(main())
