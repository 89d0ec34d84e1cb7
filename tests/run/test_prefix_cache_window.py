"""The summary's server prefix-cache hit rate is the server's counters over the run window
(restarts summed across), not the last scrape interval's, which after a drain holds no
lookup at all. Truth: the simulator's own /metrics counters, scraped by the test."""

from __future__ import annotations

import asyncio
import json

import pytest
from support import scrape, tokentop

from loadgen.model.snapshot import Counters, LoadState, ServerMetrics, Snapshot, Target
from loadgen.model.windows import SnapshotWindows
from loadgen.run.config import RunConfig
from loadgen.run.summary import build_summary
from loadgen.sim import SimConfig, start_sim

HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


async def test_the_servers_hit_rate_is_over_the_run_not_the_last_scrape(tmp_path):
    """Every prompt shares a 48-word prefix: the server finds it in its cache for every
    request after the first. Requests of 3 s (exact timing) arriving twice a second make a
    drain of over 2.5 s, in which the probe scrapes twice and the server looks nothing up."""
    sim = await start_sim(SimConfig(exact_ttft_ms=50.0, exact_itl_ms=20.0),
                          host="127.0.0.1", port=0)
    metrics = sim.url.removesuffix("/v1") + "/metrics"
    try:
        before = await scrape(metrics)
        out = tmp_path / "summary.json"
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", "--mode=open", "--rate=2",
            "--arrival=constant",
            "--workers=1", "--tick=0.25", "--duration=5", "--drain-grace=5",
            "--output-tokens=150", "--input-tokens=64", "--shared-prefix=48",
            "--tokenizer=none", "--json", str(out), "--no-record")
        after = await scrape(metrics)
    finally:
        await sim.close()
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["drain"]["seconds"] > 2.0  # the last scrapes saw no lookup
    hits, queries = after[HITS] - before[HITS], after[QUERIES] - before[QUERIES]
    assert hits > 0
    cache = summary["prefix_cache"]
    assert cache["server_hit_rate"] == pytest.approx(hits / queries, abs=0.02)
    # the run window's lookups: all but those after the last scrape before the drain (the
    # probe scrapes once a second, so a second's worth at most: 2 or 3 requests)
    per_request = queries / (summary["requests"]["ok"] + summary["drain"]["requests_ok"])
    assert queries - 3 * per_request <= cache["server_queries"] <= queries
    assert cache["server_hits"] <= hits


def _snap(i: int, hits: float | None, queries: float | None, ok: bool = True) -> Snapshot:
    return Snapshot(
        run_id="r", seq=i, t=1000.0 + i + 1, elapsed=i + 1.0, interval=1.0,
        target=Target(url="u", model="m"), load=LoadState(state="running"),
        counters=Counters(requests_ok=i + 1),
        server=ServerMetrics(url="m", ok=ok, prefix_cache_hits_total=hits,
                             prefix_cache_queries_total=queries))


def test_a_restart_in_the_run_is_summed_across():
    """The server restarts after counting 300 of 1000 (its counters back near zero), then
    counts 50 of 100 more: the run's counts are 300 + 50 of 1000 + 100, by hand. A scrape
    that failed in between counts nothing."""
    counters = [(0, 0), (100, 400), (300, 1000), None, (20, 40), (50, 100)]
    windows = SnapshotWindows()
    for i, c in enumerate(counters):
        windows.add(_snap(i, *(c or (None, None)), ok=c is not None))
    cache = build_summary(RunConfig(), windows)["prefix_cache"]
    assert (cache["server_hits"], cache["server_queries"]) == (350, 1100)
    assert cache["server_hit_rate"] == pytest.approx(350 / 1100, abs=1e-4)
