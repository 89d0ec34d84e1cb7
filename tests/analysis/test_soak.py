"""Soak analysis: outages and MTTR (synthetic; a real simulator outage is in
tests/run/test_live_outage.py), drift, long tail, and --slo thresholds with the headless
exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import msgspec
import numpy as np
import pytest
from support import headless_argv

from loadgen.analysis.report import markdown
from loadgen.analysis.soak import TICK_METRICS, SoakAnalyzer, analyze
from loadgen.analysis.soak_result import Bucket
from loadgen.model import hdr
from loadgen.model.slo import parse_slos
from loadgen.model.snapshot import (
    Counters,
    LoadState,
    ProcessSample,
    ServerMetrics,
    Snapshot,
    Target,
)

T0 = 1_700_000_000.0


def blob(values_us) -> str:
    idx, cnt = hdr.sparse_counts(np.array(values_us, dtype=float))
    return hdr.encode(hdr.dense_from_sparse([(idx, cnt)]))


def series(ticks: list[dict], tick: float = 1.0) -> list[Snapshot]:
    """Snapshots from per-tick dicts: ok, failed (kind connect), srv_ok, ttft list, rss_mb,
    warmup."""
    c = Counters()
    out = []
    for i, d in enumerate(ticks):
        c = msgspec.structs.replace(c, errors=dict(c.errors))
        c.requests_ok += d.get("ok", 0)
        c.requests_failed += d.get("failed", 0)
        c.output_tokens += 10 * d.get("ok", 0)
        if d.get("failed"):
            c.errors["connect"] = c.errors.get("connect", 0) + d["failed"]
        hist = {"ttft": blob(d["ttft"])} if d.get("ttft") else {}
        out.append(Snapshot(
            run_id="r", seq=i, t=T0 + (i + 1) * tick, elapsed=(i + 1) * tick, interval=tick,
            target=Target(url="u", model="m"),
            load=LoadState(state="running", warmup=d.get("warmup", False)), counters=c,
            hist=hist, server=ServerMetrics(url="m", ok=d.get("srv_ok", True),
                                            error=None if d.get("srv_ok", True) else "refused"),
            process=ProcessSample(pid=1, rss_bytes=int(d.get("rss_mb", 100) * 1e6)),
        ))
    return out


def test_outages_mttr_and_success_rates():
    """By loadgen.model.outage: 4 s of connect errors is an outage (a quiet tick inside does
    not end it), 2 s is only errors; /metrics down is a server outage when held as long.
    The success rate leaves the warm-up out, like the thresholds and the summary."""
    ok = {"ok": 5, "ttft": [10_000] * 5}
    down = {"failed": 3, "srv_ok": False}
    quiet = {"srv_ok": False}  # nothing completed: does not end the outage
    ticks = ([{**ok, "warmup": True}] * 3 + [ok] * 2 + [down, quiet, down, down] + [ok] * 5
             + [down] * 2 + [ok] * 3 + [down] * 4)
    r = analyze(series(ticks))
    client = [o for o in r["outages"] if o["kind"] == "client"]
    server = [o for o in r["outages"] if o["kind"] == "server"]
    assert [(o["start"] - T0, o["duration_s"], o["ongoing"]) for o in client] == [
        (5.0, 4.0, False), (19.0, 4.0, True)]
    assert client[0]["failed"] == 9 and client[0]["errors"] == {"connect": 9}
    assert "cannot reach the server" in client[0]["reason"]
    assert [(o["start"] - T0, o["duration_s"]) for o in server] == [(5.0, 4.0), (19.0, 4.0)]
    assert server[0]["reason"] == "refused"
    assert r["mttr_s"]["client"] == pytest.approx(4.0)  # closed ones only
    # after warm-up: 9 ticks of 5 ok (the tick in which the warm-up ended was partly warm-up,
    # and is left out as the run's summary leaves it out), 9 ticks of 3 failed
    assert r["success_rate"] == pytest.approx(45 / (45 + 27))
    assert r["success_rate_during_outages"] == 0.0
    assert r["availability"] == pytest.approx(1 - 8 / 23)


def test_server_that_never_answers_metrics_is_not_an_outage():
    r = analyze(series([{"ok": 1, "srv_ok": False, "ttft": [1000]}] * 5))
    assert r["outages"] == [] and r["server_metrics_never_answered"] == "refused"


def test_drift_slopes_and_long_tail():
    ticks = []
    for i in range(120):
        ttft = [10_000] * 50 + ([900_000] if i == 70 else [])
        if i >= 60:
            ttft = [20_000] * 50 + ttft[50:]
        ticks.append({"ok": 5, "ttft": ttft, "rss_mb": 100 + i * 0.5})
    r = analyze(series(ticks), bucket_s=60.0)
    b = r["drift"]["buckets"]
    assert len(b) == 2 and b[1]["vs_first"]["ttft_p99"] == pytest.approx(2.0, rel=0.01)
    # 0.5 MB per 1 s tick = 1800 MB/h
    assert r["drift"]["server_rss"]["slope_mb_h"] == pytest.approx(1800.0, rel=1e-3)
    tail = r["long_tail"]["intervals"]
    assert [(t["seq"], t["metric"]) for t in tail] == [(70, "ttft")]
    assert tail[0]["max_ms"] == pytest.approx(900.0, rel=1e-3)
    assert r["long_tail"]["counts"]["ttft"] == 1


def test_the_typed_analysis_is_the_plain_one():
    """result() is analysis() as JSON-able values; a drift bucket has a field for each of
    the per-tick metrics, the keys the dict had."""
    ticks = [{"ok": 5, "ttft": [10_000 * (1 + i // 60)] * 50} for i in range(120)]
    a = SoakAnalyzer(bucket_s=60.0)
    for s in series(ticks):
        a.add(s)
    typed = a.analysis()
    assert msgspec.to_builtins(typed) == a.result()
    assert set(TICK_METRICS) <= set(Bucket.__struct_fields__)
    assert typed.drift.buckets[1].vs_first == a.result()["drift"]["buckets"][1]["vs_first"]
    assert typed.drift.buckets[1].ttft.p99_ms == pytest.approx(20.0, rel=0.01)


def test_thresholds_pass_and_fail_on_the_whole_run():
    ticks = [{"ok": 99, "failed": 1, "ttft": [100_000] * 98 + [900_000] * 2}] * 10
    slos = parse_slos("ttft_p99<500ms,ttft_p50<200ms,error_rate<0.1%,req_s>50")
    r = analyze(series(ticks), slos=slos)
    verdict = {t["text"]: t["passed"] for t in r["thresholds"]}
    assert verdict == {"ttft_p99<500ms": False, "ttft_p50<200ms": True,
                       "error_rate<0.1%": False, "req_s>50": True}
    assert r["thresholds_passed"] is False


def _headless(tmp_path, name: str, **settings) -> subprocess.CompletedProcess:
    """`tokentop run --headless` with these settings, recording under $XDG_DATA_HOME."""
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "xdg"))
    return subprocess.run(
        headless_argv("--json", str(tmp_path / f"{name}.json"), **settings),
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )


async def test_slo_exit_codes_and_default_run_dir(sim, tmp_path):
    base = dict(url=sim.url, concurrency=2, workers=1, tick=0.25, duration=1.5,
                output_tokens="8", input_tokens="8", drain_grace=1.0)
    ok, fail = await asyncio.gather(
        asyncio.to_thread(_headless, tmp_path, "good", **base, slo="ttft_p99<30s,error_rate<1%"),
        asyncio.to_thread(_headless, tmp_path, "bad", **base, slo="ttft_p99<1us,itl_p99<30s"))
    assert ok.returncode == 0, ok.stderr
    assert fail.returncode == 3, fail.stderr
    assert "threshold failed: ttft_p99<1us: measured" in fail.stderr
    # recorded by default under $XDG_DATA_HOME, and the run dir is said at the start
    runs = sorted((tmp_path / "xdg" / "tokentop" / "runs").iterdir())
    assert len(runs) == 2
    assert any(f"recording to {d}" in ok.stderr for d in runs)
    manifests = [json.loads((d / "manifest.json").read_text()) for d in runs]
    codes = sorted(m["summary"]["exit"]["code"] for m in manifests)
    assert codes == [0, 3]
    for m in manifests:
        th = m["summary"]["thresholds"]
        assert {t["text"] for t in th} & {"ttft_p99<30s", "ttft_p99<1us"}


def test_a_partial_last_bucket_is_listed_but_not_compared():
    """25 ticks of 1 s in buckets of 10 s: two whole buckets at 50 tokens/s, then 5 s at
    20 tokens/s (the run's end). The last bucket is listed, marked partial, and compared
    with nothing: last / first is of the whole buckets (the truth: 50 / 50)."""
    ticks = [{"ok": 5, "ttft": [10_000] * 5}] * 20 + [{"ok": 2, "ttft": [10_000] * 2}] * 5
    r = analyze(series(ticks), bucket_s=10.0)
    b = r["drift"]["buckets"]
    assert [(x["seconds"], x["output_tok_s"], x.get("partial")) for x in b] == [
        (10.0, 50.0, None), (10.0, 50.0, None), (5.0, 20.0, True)]
    assert "vs_first" in b[1] and "vs_first" not in b[2]
    assert r["drift"]["throughput_change"] == 1.0
    md = markdown({**r, "manifest": {}, "status": "finished", "run_dir": "d", "warnings": []},
                  [])
    assert "| 2 (partial) |" in md
    assert "last/first whole bucket: 1.000 (the last bucket, 5.0 s before the drain, is " \
           "partial: not compared)" in md
