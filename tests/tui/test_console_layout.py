"""What the console shows at its target sizes beyond the pictures: SLO verdicts in words
(mono theme), help that scrolls at 80x24, dialogs over a visible dashboard, charts that
fill tall terminals and caption the data they show, the simulator's description."""

from __future__ import annotations

import pytest
from scripted_source import ScriptedSource, make_snapshots
from test_tui import held, wait_drawn, wait_until
from textual.containers import VerticalScroll

from themes import MONO_THEME
from tui.app import TokentopApp
from tui.help_screen import HelpScreen
from tui.screens import InputModal
from tui.widgets.chart import Chart

SLO = "ttft_p99<300ms,tpot<50ms,e2e<10s"


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("NO_COLOR", raising=False)


def screen_text(app: TokentopApp) -> str:
    """What the terminal shows now, as text (the top screen composited over those below).
    Textual has no public text dump; the compositor's strips are what it writes."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)


async def test_slo_verdict_is_in_words_in_the_mono_theme() -> None:
    # the scripted TTFT P99 is 389 ms: ttft_p99<300ms is breached, the other two hold
    app = TokentopApp(held(12), theme=MONO_THEME, refresh=0.05, slo=SLO)
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_drawn(pilot, app, 11)
        latency = app.query_one("#latency").plain
        assert "SLO FAIL" in latency
        assert "ttft_p99<300ms breach" in latency and "tpot<50.0ms ok" in latency
        assert "!389 ms" in latency, "the breached cell carries a mark, not only red"
    app = TokentopApp(held(12), theme=MONO_THEME, refresh=0.05, slo="ttft_p99<1s")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_drawn(pilot, app, 11)
        assert "SLO PASS" in app.query_one("#latency").plain


async def test_help_scrolls_to_its_end_at_80x24_and_explains_colours() -> None:
    app = TokentopApp(held(3), refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_drawn(pilot, app, 2)
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        scroll = app.screen.query_one("#help-scroll", VerticalScroll)
        await wait_until(pilot, lambda: scroll.max_scroll_y > 0)
        assert "command palette" not in screen_text(app), "the help fits: nothing to scroll"
        await pilot.press("end")
        await wait_until(pilot, lambda: "command palette" in screen_text(app))
        shown = screen_text(app)
        assert "colours" in shown and "red" in shown and "breached" in shown


@pytest.mark.parametrize("key", ["equals_sign", "e"])
async def test_dialogs_are_overlays_over_the_visible_dashboard(key: str) -> None:
    app = TokentopApp(held(3), refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_drawn(pilot, app, 2)
        await pilot.press(key)
        await wait_until(pilot, lambda: isinstance(app.screen, InputModal))
        await pilot.pause(0.05)
        shown = screen_text(app)
        assert "Latency" in shown and "Events" in shown, shown


@pytest.mark.parametrize(("size", "least"), [((120, 40), 8), ((200, 60), 15)])
async def test_charts_and_events_fill_a_tall_terminal(size: tuple[int, int], least: int) -> None:
    app = TokentopApp(held(12), refresh=0.05)
    async with app.run_test(size=size) as pilot:
        await wait_drawn(pilot, app, 11)
        chart = app.query_one("#throughput-chart", Chart)
        await wait_until(pilot, lambda: chart.size.height >= least)
        # every row of the chart's height is drawn (caption + rows), none left blank
        await wait_until(pilot, lambda: len(str(chart.render()).splitlines())
                         == chart.size.height)
        assert app.query_one("#events").size.height >= 8


async def test_chart_caption_gives_the_span_of_the_data_shown() -> None:
    # 12 one-second Snapshots: 5 complete two-second buckets in a chart 50 columns wide
    app = TokentopApp(held(12), refresh=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_drawn(pilot, app, 11)
        caption = str(app.query_one("#throughput-chart", Chart).render()).splitlines()[0]
        assert caption.endswith("· last 10 s"), caption


async def test_the_simulator_is_described_on_screen() -> None:
    note = "simulator, tiny profile: 8 slots, KV 4,096 tokens, faults error_rate=0.05"
    snaps = make_snapshots(3)
    for s in snaps:
        s.target.simulated = True
        s.target.about = note  # the run says what its simulator is, in every Snapshot
    app = TokentopApp(ScriptedSource(snaps, hold=True), refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_drawn(pilot, app, 2)
        assert note in app.query_one("#gpu").plain
