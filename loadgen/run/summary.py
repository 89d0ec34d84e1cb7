"""What a finished run says: the JSON summary, the exit code and reason, the progress line.

One definition for every front end (headless, agent, the console's run process,
sweep), so the same run gives the same summary and the same exit code wherever
it ran. Exit codes: 0 the run completed requests (and passed every --slo
threshold); 1 no request succeeded (every one failed, or none finished); 2 the
target, the config or the run directory could not be used at all; 3 a --slo
threshold failed; 4 recording failed and the load was stopped
(--on-disk-full=stop, the default).
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from loadgen import __version__
from loadgen.model import units
from loadgen.model.slo import Slo, Slos, evaluate_thresholds, parse_slos, rates_from
from loadgen.model.snapshot import ServerMetrics, Snapshot
from loadgen.model.windows import SnapshotWindows, WindowStats
from loadgen.run.config import RunConfig
from loadgen.worker.mix import TrafficClass, judges_goodput, parse_mix
from loadgen.worker.pacing import BACKOFF_FIRST_S, BACKOFF_MAX_S, RETRY_AFTER_MAX_S

SUMMARY_FORMAT = 1  # of the --json summary; tokentop compare reads it
MS = 1e-3  # µs → ms

EXIT_OK = 0
EXIT_NOTHING_SUCCEEDED = 1
EXIT_UNUSABLE = 2
EXIT_THRESHOLD_FAILED = 3
EXIT_RECORDING_FAILED = 4


def build_summary(cfg: RunConfig, windows: SnapshotWindows) -> dict:
    """The run window (after warm-up) as the --json summary."""
    run = windows.stats("run")
    last = windows.last
    latency = _latency_ms(run)
    mix = parse_mix(cfg.mix)
    return {
        "format": SUMMARY_FORMAT,
        "tokentop_version": __version__,
        "run_id": last.run_id if last else None,
        "target": msgspec.to_builtins(last.target) if last else None,
        "config": msgspec.to_builtins(cfg),
        # load time: from the end of warm-up to the start of the drain (the drain is apart)
        "duration_s": round(run.seconds, 3),
        "drain": windows.drain(),
        "requests": {
            "ok": run.requests_ok,
            "failed": run.requests_failed,
            "cancelled": run.requests_cancelled,
            "errors": run.errors,
        },
        # success rates are per attempt: how the streams paced themselves after failures
        "pacing": pacing(run),
        "tokens": {
            "output": run.output_tokens,  # delivered, counted as they arrived
            "output_completed": run.completed_output_tokens,  # of requests that completed
            "input": run.input_tokens,
            "output_estimated": run.tokens_estimated,
            "input_per_request": _input_per_request(run),
            # completed requests whose server-counted output length is not the max_tokens
            # asked exactly (ignore_eos / min_tokens not honoured, or a stop)
            "output_differs": run.counters.output_differs if run.counters else 0,
            # how the asked lengths were made: exact (a tokenizer) or approx (~1 token a word)
            "lengths": last.target.lengths if last else None,
        },
        "throughput": {
            "output_tok_s": run.output_tok_s,
            "input_tok_s": run.input_tok_s,
            "req_s": run.req_s,
            # requests/s within every --slo limit (None when no --slo was given); with a
            # --mix, each request within its class's limits (class_limits)
            "goodput_req_s": run.goodput_req_s if judges_goodput(cfg.slo, mix) else None,
            # what one user sees stream in: 1 / TPOT request by request, its median and slow
            # tail (p10); the console's user tok/s is the same (windows.per_user_tok_s)
            "per_user_tok_s": run.user_tok_s,
        },
        "latency_ms": latency,
        # --mix: a row per class, in the mix's order, its figures over the same window
        **_classes(mix, windows, run, parse_slos(cfg.slo).per_request),
        # reasoning models: present only when some completed request reasoned
        **_reasoning(run),
        # prefix caching, where the server reported it; multi-turn conversations by turn
        **_prefix_cache(run, last.server if last else None),
        **_turns(run),
        # open loop: arrivals dropped from a full backlog were never sent, so the
        # intended-time percentiles (ttft_co, e2e_co) cannot hold them: this many are missing
        "co_dropped_arrivals": run.errors.get("client_backlog_full", 0)
        if "ttft_co" in latency else None,
        # ITL token gaps spread over multi-token chunks (no per-chunk usage): estimated
        "itl_estimated": run.itl_estimated,
        "clipped_samples": run.clipped_samples,  # latencies above 1 h, recorded at 1 h
        "server": msgspec.to_builtins(last.server) if last and last.server else None,
        # what the load did by itself at the end, in words: an auto-ramp's settle (where, and
        # every step it tried with its verdict; the figures above are from the settle on)
        "load_note": last.load.note if last else None,
        "finished_at": time.time(),
    }


def _latency_ms(run: WindowStats) -> dict:
    """A window's latency summaries in ms (counts as they are)."""
    return {
        m: {k: (None if v is None else (v * MS if k != "count" else v)) for k, v in s.items()}
        for m, s in run.latency.items()
        # TTFA exists for streams that reasoned only: absent, not an empty row, without them
        if m != "ttfa" or s["count"]
    }


def _classes(mix: tuple[TrafficClass, ...], windows: SnapshotWindows, run: WindowStats,
             run_limits: Slo | None) -> dict:
    """{"classes": [a row per --mix class]} over the run window, else {}: what each class
    was asked to be and what it got, its share of the requests as sent beside its share as
    asked."""
    if not mix:
        return {}
    total = run.requests_ok + run.requests_failed
    rows = []
    for c in mix:
        limits = c.per_request or run_limits
        sub = windows.classes.get(c.name)
        s = sub.stats("run") if sub is not None else None
        n = (s.requests_ok + s.requests_failed) if s else 0
        rows.append({
            "name": c.name,
            "share_asked": c.share,
            "share_sent": round(n / total, 4) if total else None,
            "priority": c.priority,
            "slo": c.slo,
            "requests": {"ok": s.requests_ok if s else 0,
                         "failed": s.requests_failed if s else 0,
                         "cancelled": s.requests_cancelled if s else 0,
                         "errors": s.errors if s else {}},
            "tokens": {"output": s.output_tokens if s else 0,
                       "input": s.input_tokens if s else 0},
            "throughput": {
                "output_tok_s": s.output_tok_s if s else None,
                "req_s": s.req_s if s else None,
                # None where neither the class nor the run set per-request limits
                "goodput_req_s": s.goodput_req_s if s and limits else None,
            },
            "limits": limits.text if limits else None,  # what its goodput was judged by
            "latency_ms": _latency_ms(s) if s else {},
        })
    return {"classes": rows}


def thresholds(cfg: RunConfig, windows: SnapshotWindows,
               stability: dict | None = None) -> list[dict]:
    """The --slo whole-run thresholds judged on the run window (after warm-up); the
    stability ones (`availability>99.9%`, `outages<1`) on the run's `stability`; then each
    --mix class's own (`slo=ttft_p99<200ms`) on that class's requests alone."""
    out = _judged(parse_slos(cfg.slo), windows, stability)
    for c in parse_mix(cfg.mix):
        sub = windows.classes.get(c.name)
        for t in _judged(c.slos(), sub or SnapshotWindows(), None):
            out.append(t | {"class": c.name, "shown": f"{c.name}: {t['shown']}"})
    return out


def class_rows(mix: list[str], slo: str | None, windows: SnapshotWindows) -> list[dict]:
    """Each --mix class's summary row over `windows`' run window, with its own limits'
    verdicts (`thresholds`): a recording's classes as `tokentop report` tells them.
    Raises WorkloadError in words for a mix that does not read."""
    classes = parse_mix(mix)
    rows = _classes(classes, windows, windows.stats("run"),
                    parse_slos(slo).per_request).get("classes", [])
    for row, c in zip(rows, classes, strict=True):
        row["thresholds"] = _judged(c.slos(), windows.classes.get(c.name) or SnapshotWindows(),
                                    None)
    return rows


def _judged(slos: Slos, windows: SnapshotWindows, stability: dict | None) -> list[dict]:
    if not slos.thresholds:
        return []
    run = windows.stats("run")
    good = (run.goodput_req_s or 0.0) * run.seconds
    rates = rates_from(run.requests_ok, run.requests_failed, round(good), run.output_tokens,
                       run.seconds)
    if stability is not None:
        rates |= {"availability": stability["availability"], "outages": stability["outages"]}
    return evaluate_thresholds(slos.thresholds, run.latency, rates)


def _reasoning(run: WindowStats) -> dict:
    """{"reasoning": …} over the run window when requests in it reasoned, else {}."""
    c = run.counters
    if c is None or not c.reasoning_requests:
        return {}
    n = c.reasoning_requests
    return {"reasoning": {
        "requests": n,
        "reasoning_tokens": c.reasoning_tokens,
        "answer_tokens": c.answer_tokens,
        "reasoning_per_request": round(c.reasoning_tokens / n, 1),
        "answer_per_request": round(c.answer_tokens / n, 1),
        # server: usage.completion_tokens_details; counted: from the reasoning-only chunks
        # (estimated); mixed: some of each
        "counted_by": ("server" if not c.estimated_reasoning_tokens else
                       "counted" if c.estimated_reasoning_tokens == c.reasoning_tokens
                       else "mixed"),
    }}


def _prefix_cache(run: WindowStats, server: ServerMetrics | None) -> dict:
    """{"prefix_cache": …} over the run window when the answers reported cached prompt
    tokens (or the server's /metrics its cache), else {}.

    The server's hit rate is its own counters' difference over the run window (restarts
    summed across: windows.ServerCache), never the last scrape interval's, which after a
    drain holds no lookup at all. An engine with only a hit-rate gauge (vLLM V0, SGLang)
    gives that gauge's last value, and no counts."""
    c = run.counters
    reported = c.cache_reported_input_tokens if c else 0
    queries = run.server_cache_queries
    server_rate = run.server_cache_hit_rate
    if queries is None and server is not None and server.ok:
        server_rate = server.prefix_cache_hit_rate  # a gauge: there is nothing to difference
    if not reported and server_rate is None and not queries:
        return {}
    return {"prefix_cache": {
        "cached_tokens": c.cached_tokens if c else 0,
        # cached / prompt tokens, over the completed requests whose answer said
        "hit_rate": round(c.cached_tokens / reported, 4) if c and reported else None,
        "server_hit_rate": None if server_rate is None else round(server_rate, 4),
        # prompt tokens the server looked up in its cache, and found, over the run window
        "server_queries": None if queries is None else round(queries),
        "server_hits": None if run.server_cache_hits is None else round(run.server_cache_hits),
    }}


def _turns(run: WindowStats) -> dict:
    """{"turns": [a row per turn number]} for conversations (--turns), else {}: means per
    completed request of that turn (the last row holds every later turn too)."""
    c = run.counters
    if c is None or not c.turns:
        return {}
    rows = []
    for i, t in enumerate(c.turns):
        if not t.requests:
            continue
        n = t.requests
        rows.append({"turn": i + 1, "requests": n,
                     "ttft_ms_mean": round(t.ttft_us / n * MS, 3),
                     "input_per_request": round(t.input_tokens / n, 1),
                     "cached_per_request": round(t.cached_tokens / n, 1)})
    return {"turns": rows} if rows else {}


def _input_per_request(run: WindowStats) -> dict | None:
    """What was asked against what the server counted (its chat template adds tokens)."""
    server, asked = run.input_per_request, run.input_asked_per_request
    if server is None or asked is None:
        return None
    return {"server": round(server, 1), "asked": round(asked, 1),
            "differs": run.input_differs}


def exit_status(summary: dict, recording_failed: str | None = None) -> tuple[int, str]:
    """The exit code and its one-line reason, from the summary (and a recording failure).
    A run that did anything ends with its "done:" figures, whatever the code: a failed
    threshold or a recording failure is said first, the done line after it."""
    req = summary["requests"]
    ok, failed = req["ok"], req["failed"]
    drain = summary.get("drain") or {}
    finished = ok + drain.get("requests_ok", 0)
    streamed = summary["tokens"]["output"] + drain.get("output_tokens", 0)
    if finished == 0 and streamed == 0:
        if failed > 0:
            kinds = ", ".join(f"{n}× {k}" for k, n in sorted(req["errors"].items()))
            return EXIT_NOTHING_SUCCEEDED, f"every request failed ({kinds})"
        return EXIT_NOTHING_SUCCEEDED, "no request completed; run longer or check the server"
    done = done_text(summary)
    failing = [t for t in summary.get("thresholds") or [] if not t["passed"]]
    if failing:
        return EXIT_THRESHOLD_FAILED, ("threshold failed: "
                                       + "; ".join(t["shown"] for t in failing) + f" | {done}")
    if recording_failed:
        return EXIT_RECORDING_FAILED, f"recording failed, load stopped: {recording_failed} | {done}"
    return EXIT_OK, done


def done_text(summary: dict) -> str:
    """"done: N requests ok, M failed, … tok/s over T s" and what a reader must know of it."""
    req, tput = summary["requests"], summary["throughput"]
    drain = summary.get("drain") or {}
    done = (f"done: {req['ok']} requests ok, {req['failed']} failed, "
            f"{tput['output_tok_s'] or 0:.0f} output tok/s over {summary['duration_s']:.1f} s")
    prompt = summary["tokens"].get("input_per_request")
    if prompt and prompt["differs"]:
        done += (f"; the server counted {prompt['server']:.0f} prompt tokens a request, "
                 f"{prompt['asked']:.0f} asked")
    if summary["tokens"].get("output_differs"):
        done += (f"; {summary['tokens']['output_differs']} answers not of the asked output "
                 "length")
    if drain.get("requests_ok") or drain.get("requests_cancelled"):
        done += (f"; drain: {drain['requests_ok']} finished, {drain['requests_cancelled']} "
                 "cancelled")
    if summary.get("recording_error"):  # --on-disk-full=continue: say so in the last line too
        done += f"; recording stopped early: {summary['recording_error']}"
    return done


def final_line(summary: dict) -> str:
    """A finished run's summary in one line: its exit reason, then what a script's log
    should keep of it: P50/P99 of TTFT, ITL and E2E, and the goodput when --slo set
    per-request limits."""
    latency = summary.get("latency_ms") or {}
    parts = []
    for metric in ("ttft", "itl", "e2e"):
        stats = latency.get(metric)
        if stats and stats.get("count"):  # none when no request completed
            p50, p99 = (units.ms(units.us_of_ms(stats[q])) for q in ("p50", "p99"))
            parts.append(f"{metric.upper()} {p50} / {p99}")
    line = summary["exit"]["reason"]
    if parts:
        line += " | p50/p99 " + ", ".join(parts)
    line += stability_text(summary.get("stability"))
    line += pacing_text(summary.get("pacing"))
    goodput = (summary.get("throughput") or {}).get("goodput_req_s")
    slo = (summary.get("config") or {}).get("slo")
    if goodput is not None and parse_slos(slo).per_request is not None:
        line += f" | goodput {units.rate(goodput, 'req/s')} within the --slo"
    elif goodput is not None:  # judged by the --mix classes' limits alone
        line += f" | goodput {units.rate(goodput, 'req/s')} within each class's SLO"
    line += classes_text(summary.get("classes"))
    if summary.get("load_note"):  # an auto-ramp's exploration, after the settled figures
        line += f" | {summary['load_note']}"
    return line


def classes_text(rows: list[dict] | None) -> str:
    """The last line's word on each --mix class: its requests (ok, failed), its TTFT tail,
    its goodput where it was judged for one."""
    parts = []
    for row in rows or []:
        ttft = (row["latency_ms"].get("ttft") or {})
        failed = row["requests"]["failed"]
        part = f"{row['name']} {row['requests']['ok']} ok"
        if failed:
            part += f" {failed} failed"
        if ttft.get("count"):
            part += f", TTFT p99 {units.ms(units.us_of_ms(ttft['p99']))}"
        goodput = row["throughput"]["goodput_req_s"]
        if goodput is not None:
            part += f", goodput {units.rate(goodput, 'req/s')}"
        parts.append(part)
    return " | classes: " + "; ".join(parts) if parts else ""


def stability_text(stability: dict | None) -> str:
    """The last line's word on outages: none, or how many, the time down, availability."""
    if not stability:
        return ""
    n = stability["outages"]
    if not n:
        return " | no outage"
    ongoing = ", one still going" if stability.get("ongoing") else ""
    return (f" | {n} outage{'s' if n > 1 else ''}{ongoing}: down "
            f"{units.duration(stability['downtime_s'])}, availability "
            f"{units.pct(stability['availability'])}")


def pacing(run: WindowStats) -> dict:
    """How closed-loop streams paced themselves after failed requests over the run window
    (loadgen.worker.pacing): the waits, those the server's Retry-After set, and the
    stream-seconds spent waiting; with the back-off's bounds, so a reader knows what the
    per-attempt success rate was measured under. Open loop never waits (zeros)."""
    c = run.counters
    return {
        "backoffs": c.backoffs if c else 0,
        "retry_after_waits": c.backoffs_retry_after if c else 0,
        "backoff_s": round(c.backoff_us / 1e6, 3) if c else 0.0,
        "backoff_first_s": BACKOFF_FIRST_S,
        "backoff_max_s": BACKOFF_MAX_S,
        "retry_after_max_s": RETRY_AFTER_MAX_S,
    }


def pacing_text(p: dict | None) -> str:
    """The last line's word on pacing, when streams waited after failures at all."""
    if not p or not p.get("backoffs"):
        return ""
    asked = (f", {p['retry_after_waits']} as the server's Retry-After asked"
             if p.get("retry_after_waits") else "")
    return (f" | streams backed off {units.duration(p['backoff_s'])} in all after "
            f"{p['backoffs']} failures{asked}")


def write_json(path: Path, summary: dict) -> None:
    """Atomically: a reader never sees half a summary."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n")
    tmp.replace(path)


# ---- the progress line ----------------------------------------------------------------------


def progress_line(snap: Snapshot, w: WindowStats) -> str:
    """One line a second on stderr: state, load, throughput, latency, errors, server queue."""
    ld = snap.load
    srv = snap.server
    server = (
        f"srv wait {units.number(srv.waiting)} run {units.number(srv.running)}"
        if srv is not None and srv.ok
        else f"srv {units.NA}"
    )
    ttft, itl = w.latency["ttft"], w.latency["itl"]
    est = " est" if w.tokens_estimated else ""
    itl_est = " est" if w.itl_estimated else ""
    c = snap.counters
    load = f"c={ld.target_concurrency}" if ld.mode == "closed" else (
        f"rate={ld.target_rate:g}/s backlog={ld.backlog}")
    if ld.trace_span is not None:
        load = f"{trace_text(snap)} backlog={ld.backlog}"
    state = "warm-up" if ld.warmup and ld.state == "running" else ld.state
    return (
        f"[{snap.elapsed:6.0f}s] {state:<8} {load} inflight={ld.in_flight}"
        f" | {units.rate(w.output_tok_s, 'tok/s')}{est} {units.rate(w.req_s, 'req/s')}"
        f" | TTFT p50 {units.ms(ttft['p50'])} p99 {units.ms(ttft['p99'])}"
        f" | ITL p99 {units.ms(itl['p99'])}{itl_est}"
        f" | ok {c.requests_ok} err {c.requests_failed} | {server}"
    )


def trace_text(snap: Snapshot) -> str:
    """--trace: the request it is at of all its requests, its own clock in its span, and the
    rate it sends at (its --rate is an unused default): trace 37/53 1.2 s/3.8 s rate=9.00/s."""
    ld = snap.load
    rate = units.NA if ld.target_rate is None else f"{units.rate(ld.target_rate)}/s"
    return (f"trace {units.count(ld.trace_sent)}/{units.count(ld.trace_total)} "
            f"{units.duration(ld.trace_time)}/{units.duration(ld.trace_span)} rate={rate}")
