"""`tokentop run --headless`: the same engine, a progress line a second, a JSON summary.

Exit codes: 0 the run completed requests; 1 no request succeeded (every one
failed, or none finished); 2 the target could not be used at all. The reason
is always one line on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

import msgspec

from loadgen import __version__
from loadgen.coordinator import Coordinator
from loadgen.preflight import TargetError
from loadgen.run_config import ConfigError, RunConfig
from loadgen.snapshot import Snapshot
from loadgen.windows import SnapshotWindows, WindowStats

MS = 1e-3  # µs → ms


async def run_headless(
    cfg: RunConfig,
    *,
    api_key: str | None = None,
    json_path: Path | None = None,
    out: TextIO = sys.stderr,
) -> int:
    try:
        coord = Coordinator(cfg, api_key)
        await coord.start()
    except (TargetError, ConfigError) as e:
        print(f"tokentop: {e}", file=out)
        return 2
    _install_signal_handlers(coord, out)
    windows = SnapshotWindows()
    last_second = -1
    try:
        measuring = cfg.warmup == 0
        async for snap in coord.snapshots():
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
    code, reason = exit_status(summary)
    summary["exit"] = {"code": code, "reason": reason}
    if json_path is not None:
        try:
            _write_json(json_path, summary)
        except OSError as e:
            print(f"tokentop: cannot write {json_path}: {e.strerror or e}", file=out)
            code = code or 1
    print(f"tokentop: {reason}", file=out)
    return code


def _install_signal_handlers(coord: Coordinator, out: TextIO) -> None:
    loop = asyncio.get_running_loop()

    def stop() -> None:
        print("tokentop: stopping, letting in-flight requests finish…", file=out)
        coord.request_stop()

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
        },
        "latency_ms": latency,
        "server": msgspec.to_builtins(last.server) if last and last.server else None,
        "finished_at": time.time(),
    }


def exit_status(summary: dict) -> tuple[int, str]:
    req = summary["requests"]
    ok, failed = req["ok"], req["failed"]
    if ok == 0 and failed > 0:
        kinds = ", ".join(f"{n}× {k}" for k, n in sorted(req["errors"].items()))
        return 1, f"every request failed ({kinds})"
    if ok == 0:
        return 1, "no request completed; run longer or check the server"
    tput = summary["throughput"]
    return 0, (
        f"done: {ok} requests ok, {failed} failed, "
        f"{tput['output_tok_s'] or 0:.0f} output tok/s over {summary['duration_s']:.1f} s"
    )


def _write_json(path: Path, summary: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n")
    tmp.replace(path)
