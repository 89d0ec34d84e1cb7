"""Each console figure over its own window, named, and by the same definition as the
summary and the report: user tok/s (the median user's 1 / TPOT), the prefix-cache line
(one window a line), the server-RSS slope (withheld under 10 minutes, as the report
withholds it), and `m`'s rate (the load at its current setting, not across a pause).
The scripted Snapshots' own values are the truth, worked out here by hand or with numpy."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import numpy as np
import pytest
from scripted_source import ScriptedSource, encode_values, make_snapshot
from test_tui import wait_drawn, wait_until

from loadgen.analysis.soak import SoakAnalyzer
from loadgen.model.snapshot import Counters, ProcessSample, Snapshot, TurnCounts
from loadgen.model.windows import SnapshotWindows
from loadgen.run.config import RunConfig
from loadgen.run.summary import build_summary
from probes.process import RssTrend
from tui.app import TokentopApp

SIZE = (120, 40)
WIDE = (200, 60)  # where a panel has room for its whole words (120×40 says them short)


@pytest.fixture(autouse=True)
def _config_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("NO_COLOR", raising=False)


def _plain(app: TokentopApp, selector: str) -> str:
    return app.query_one(selector).plain


def _row(text: str, label: str) -> list[str]:
    """The cells of one row of a panel's table, by its label."""
    line = next(line for line in text.splitlines() if line.strip().startswith(label))
    return line.strip().removeprefix(label).split()


# ---- user tok/s: two groups of users at very different speeds ------------------------------

FAST_US, SLOW_US = 10_000.0, 100_000.0  # TPOT: 100 and 10 tok/s
FAST, SLOW = 6, 4  # completed requests a tick of each group: the median user is a fast one


def _two_speeds(n: int) -> list[Snapshot]:
    """Ticks in which 6 users stream at 100 tok/s and 4 at 10 tok/s, each request 50 tokens
    (its 49 token gaps in ITL, its TPOT once)."""
    tpot = np.array([FAST_US] * FAST + [SLOW_US] * SLOW)
    itl = np.array([FAST_US] * 49 * FAST + [SLOW_US] * 49 * SLOW)
    snaps = []
    for i in range(n):
        snap = make_snapshot(i)
        snap.hist = {**snap.hist, "tpot": encode_values(tpot), "itl": encode_values(itl)}
        snaps.append(snap)
    return snaps


async def test_user_tok_s_is_the_median_users_speed_in_the_console_and_the_summary():
    snaps = _two_speeds(6)
    # the truth: every request's own speed, 1 / its TPOT, over the whole run
    speeds = 1e6 / np.array(([FAST_US] * FAST + [SLOW_US] * SLOW) * len(snaps))
    p50, p10 = np.percentile(speeds, 50), np.percentile(speeds, 10)
    assert (p50, p10) == (100.0, 10.0)  # 1 / mean ITL would read 21.7
    windows = SnapshotWindows()
    for s in snaps:
        windows.add(s)
    per_user = build_summary(RunConfig(), windows)["throughput"]["per_user_tok_s"]
    assert per_user["p50"] == pytest.approx(p50, rel=0.01)  # HDR: 3 significant figures
    assert per_user["p10"] == pytest.approx(p10, rel=0.01)

    app = TokentopApp(ScriptedSource(snaps, hold=True), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, len(snaps) - 1)
        cells = _row(_plain(app, "#throughput"), "user tok/s")
        assert len(cells) >= 2  # 10s, (1m,) run: the same population in each
        assert [float(c) for c in cells] == pytest.approx([p50] * len(cells), rel=0.01)


# ---- the prefix-cache line: one window a line, named -----------------------------------------

WARMUP_TICKS, TICKS = 3, 20


def _hits(i: int) -> tuple[int, int]:
    """The server's prefix-cache (hits, queries) in tick i: 30 of 100 for the first ten,
    then 90 of 100, and none in the last (a scrape interval with no lookup)."""
    if i == TICKS - 1:
        return 0, 0
    return (30, 100) if i < 10 else (90, 100)


def _cached_run() -> list[Snapshot]:
    """20 ticks of 1 s: a warm-up of 3 in which turn 1 takes 1000 ms to the first token
    (after it: 100 ms; turn 2: 50 ms), 40 % of the prompt tokens cached by the answers."""
    snaps, hits, queries, turns = [], 0, 0, [TurnCounts(), TurnCounts()]
    for i in range(TICKS):
        h, q = _hits(i)
        hits, queries = hits + h, queries + q
        warm = i < WARMUP_TICKS
        turns = [TurnCounts(turns[0].requests + 2, turns[0].ttft_us + 2 * (1_000_000 if warm
                                                                          else 100_000)),
                 TurnCounts(turns[1].requests + 2, turns[1].ttft_us + 2 * 50_000)]
        snap = make_snapshot(i)
        snap.load.warmup = warm
        snap.counters = msgspec.structs.replace(snap.counters, cached_tokens=400 * (i + 1),
                                                cache_reported_input_tokens=1000 * (i + 1),
                                                turns=[msgspec.structs.replace(t) for t in turns])
        snap.server = msgspec.structs.replace(snap.server, prefix_cache_hits_total=float(hits),
                                              prefix_cache_queries_total=float(queries),
                                              prefix_cache_hit_rate=None)
        snaps.append(snap)
    return snaps


async def test_the_cache_lines_say_their_window_and_hold_to_it():
    snaps = _cached_run()
    # the truth, by hand: the last 10 s are ticks 10..19
    last10 = [_hits(i) for i in range(TICKS - 10, TICKS)]
    server_10s = sum(h for h, _ in last10) / sum(q for _, q in last10)
    app = TokentopApp(ScriptedSource(snaps, hold=True), refresh=0.05)
    async with app.run_test(size=WIDE) as pilot:
        await wait_drawn(pilot, app, TICKS - 1)
        load = _plain(app, "#load")
        cache = next(line for line in load.splitlines() if "prefix cache" in line)
        assert cache.rstrip().endswith("(10 s)")
        assert "40.0% of prompt tokens" in cache
        assert f"server {100 * server_10s:.1f}%" in cache
        turns = next(line for line in load.splitlines() if "TTFT ms by turn" in line)
        # after warm-up only: turn 1's warm-up TTFTs of 1000 ms are not in the run's mean
        assert re.search(r"TTFT ms by turn 1:100 2:50\s+\(run\)", turns), turns


# ---- the server's RSS slope: one rule, live and in reports -----------------------------------

async def test_the_rss_slope_waits_for_ten_minutes_as_the_report_does():
    """70 s of RSS climbing 27 MB/h: the probe gives no slope, the report marks its own
    not a trend, and the console says why in words; past 10 minutes all three give it."""
    t0, rss0, mb_s = 1_700_000_000.0, 9e9, 27.0 / 3600
    trend, soak = RssTrend(), SoakAnalyzer()
    shown = []
    for i in range(0, 612, 2):  # a sample every 2 s
        rss = rss0 + mb_s * 1e6 * i
        trend.add(t0 + i, rss)
        snap = make_snapshot(0)
        snap.seq, snap.t, snap.elapsed, snap.interval = i // 2, t0 + i, float(i + 2), 2.0
        snap.process = ProcessSample(pid=1, name="vllm", rss_bytes=int(rss),
                                     rss_slope_mb_h=trend.slope_mb_h())
        soak.add(snap)
        if i in (70, 610):
            shown.append((snap, soak.analysis().drift.server_rss.trend))
    (early, early_trend), (late, late_trend) = shown
    assert early.process.rss_slope_mb_h is None and not early_trend
    assert late.process.rss_slope_mb_h == pytest.approx(27.0, rel=1e-6) and late_trend
    for snap, words in ((early, "slope n/a (needs ≥ 10.0 min)"), (late, "+27 MB/h")):
        app = TokentopApp(ScriptedSource([snap], hold=True), refresh=0.05)
        async with app.run_test(size=WIDE) as pilot:
            await wait_drawn(pilot, app, snap.seq)
            assert words in _plain(app, "#host")


# ---- `m`: the rate of the load as it runs now ------------------------------------------------

def _paused_span() -> list[Snapshot]:
    """8 streams at 7 req/s for 10 s, paused for 5 s, then running again for 5 s."""
    snaps, ok = [], 0
    for i in range(20):
        paused = 10 <= i < 15
        ok += 0 if paused else 7
        snap = make_snapshot(i, concurrency=8, state="paused" if paused else "running")
        snap.counters = Counters(requests_ok=ok, output_tokens=100 * ok)
        snaps.append(snap)
    return snaps


async def test_m_opens_the_loop_at_the_rate_since_the_resume():
    snaps = _paused_span()
    # the truth: 7 requests a second while it runs; the last 10 s hold 5 s of pause (3.5)
    assert (snaps[-1].counters.requests_ok - snaps[-11].counters.requests_ok) / 10 == 3.5
    src = ScriptedSource(snaps, hold=True)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, len(snaps) - 1)
        await pilot.press("m")
        await wait_until(pilot, lambda: len(src.controls) == 2)
        assert [(c.op, c.value, c.note) for c in src.controls] == [
            ("set_rate", 7.0, None), ("set_mode", None, "open")]
