"""The console through App.run_test() at the smallest size (80x24): panels, keys, errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import pytest
from scripted_source import ScriptedSource, make_snapshot, make_snapshots
from textual.pilot import Pilot
from textual.widget import Widget

from loadgen.model import units
from loadgen.model.snapshot import ServerMetrics
from loadgen.model.source import SourceStatus
from tui.app import TokentopApp
from tui.format import NO_SAMPLES
from tui.help_screen import HelpScreen
from tui.widgets import Panel

SIZE = (80, 24)
N = 12


async def wait_until(pilot: Pilot, cond: Callable[[], bool], tries: int = 300) -> None:
    """Bounded wait for the app to reach a state; fails the test rather than hanging."""
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.01)
    raise AssertionError("the app never reached the expected state")


async def wait_drawn(pilot: Pilot, app: TokentopApp, seq: int = N - 1) -> None:
    await wait_until(pilot, lambda: app.drawn_seq == seq)


def text(app: TokentopApp, selector: str) -> str:
    widget: Widget = app.query_one(selector)
    if isinstance(widget, Panel):
        return widget.plain
    return str(widget.render())


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Never read or write the real ~/.config; never inherit NO_COLOR."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("NO_COLOR", raising=False)


def held(n: int = N, **kwargs: object) -> ScriptedSource:
    return ScriptedSource(make_snapshots(n, **kwargs), hold=True)


async def test_panels_show_the_scripted_values() -> None:
    src = held()
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app)
        header = text(app, "#header")
        assert "running" in header and "simulated" in header and "0:00:12" in header
        latency = text(app, "#latency")
        # 100 TTFT samples from 40 to 400 ms with a cubic tail: P99 is in the 389 ms bucket
        assert "TTFT" in latency and "389 ms" in latency
        load = text(app, "#load")
        assert "concurrency 64" in load
        assert "waiting 7" in load and "running 57" in load
        assert "KV cache 62.5%" in text(app, "#host")
        assert "timeout 0.50/s" in load
        assert "61.1/80.0 GiB" in text(app, "#gpu")
        assert "GPU · simulated" in app.query_one("#gpu").border_title
        assert "2,000" in text(app, "#throughput")
        assert "21.0/64.0 GiB" in text(app, "#host")


@pytest.mark.parametrize(
    ("keys", "values"),
    [
        (["plus"], [1.0]),
        (["+"], [1.0]),
        (["minus"], [-1.0]),
        (["right_square_bracket"], [10.0]),
        (["left_square_bracket"], [-10.0]),
        (["+", "-", "]", "["], [1.0, -1.0, 10.0, -10.0]),
    ],
)
async def test_concurrency_keys_send_controls(keys: list[str], values: list[float]) -> None:
    src = held(2)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        await pilot.press(*keys)
        await wait_until(pilot, lambda: len(src.controls) == len(values))
        assert [c.value for c in src.controls] == values
        assert all(c.op == "add_concurrency" and c.source == "key" for c in src.controls)


async def test_help_opens_and_escape_closes_it() -> None:
    app = TokentopApp(held(2), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        keys = str(app.screen.query_one("#help-keys").render())
        for key in ("+", "-", "]", "[", "?", "q"):
            assert key in keys
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_q_closes_the_source_and_exits() -> None:
    src = held(2)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 1)
        await pilot.press("q")  # load is running: the first q only asks
        await pilot.pause(0.05)
        assert not src.closed and app.return_code is None
        assert any("press q again" in n.message for n in app._notifications)
        await pilot.press("q")
        await wait_until(pilot, lambda: app.return_code is not None)
    assert src.closed
    assert app.return_code == 0


class NewsEveryTick(ScriptedSource):
    """A run whose status has news at every look (a live run's header does): every tick of
    the console redraws."""

    def status(self) -> SourceStatus:
        return msgspec.structs.replace(super().status(), description=f"{time.monotonic()}")


class SlowToUnmount(Widget):
    """A widget that takes a while to go, so that the screens' teardown lasts some ticks."""

    async def on_unmount(self) -> None:
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            await asyncio.sleep(0.01)


async def test_leaving_draws_nothing_on_widgets_being_taken_down() -> None:
    # CI once saw a redraw during the screens' teardown look for the events panel already
    # removed (NoMatches), and the test's exit raise it
    src = NewsEveryTick(make_snapshots(3), hold=True)
    app = TokentopApp(src, refresh=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 2)
        await app.screen.mount(SlowToUnmount())
        # leaving run_test shuts the app down with its clock still going (no exit() first)
    assert src.closed


async def test_start_error_is_shown_and_q_still_quits() -> None:
    message = "cannot reach http://127.0.0.1:9/v1: connection refused"
    src = ScriptedSource([], start_error=message)
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.ended)
        await wait_until(pilot, lambda: message in text(app, "#header"))
        assert "error" in text(app, "#header")
        await pilot.press("q")
        await wait_until(pilot, lambda: app.return_code is not None)
    assert src.closed


async def test_no_gpu_message_in_words() -> None:
    snaps = make_snapshots(3, gpu_source="none", gpu_message="no NVIDIA driver found")
    app = TokentopApp(ScriptedSource(snaps, hold=True), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 2)
        assert "no NVIDIA driver found" in text(app, "#gpu")
        assert "simulated" not in text(app, "#header")


async def test_unknown_server_values_show_na() -> None:
    no_server = make_snapshot(0, server=False)
    unknown = make_snapshot(1)
    unknown.server = ServerMetrics(url="http://x/metrics", ok=True, waiting=None, running=None)
    failed = make_snapshot(2, server_ok=False)
    src = ScriptedSource([no_server, unknown, failed], delay=0.0, hold=True)
    app = TokentopApp(src, refresh=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app, 2)
        load = text(app, "#load")
        assert "n/a" in load and "connection refused" in load
        assert "KV cache n/a" in text(app, "#host")
    # the same rendering for a missing and an unknown server, directly
    from tui.widgets.load_panel import server_line

    assert server_line(None).count("n/a") == 2
    assert server_line(unknown.server).count("n/a") == 2


async def test_ended_source_shows_stopped() -> None:
    app = TokentopApp(ScriptedSource(make_snapshots(3)), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.ended and app.drawn_seq == 2)
        await wait_until(pilot, lambda: "stopped" in text(app, "#header"))


async def test_theme_defaults_and_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert TokentopApp(held(1)).theme == "tokentop-dark"
    assert TokentopApp(held(1), theme="tokentop-light").theme == "tokentop-light"
    monkeypatch.setenv("NO_COLOR", "1")
    assert TokentopApp(held(1)).theme == "tokentop-mono"


async def test_unknown_theme_falls_back_with_a_warning() -> None:
    app = TokentopApp(held(1), theme="nope")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == "tokentop-dark"
        assert any("unknown theme" in n.message for n in app._notifications)


def test_formatting() -> None:
    """The console prints figures with loadgen.model.units (tests/model/test_units.py has
    the rest); a window with no samples is its own "–"."""
    assert units.ms(None) == "n/a"
    assert units.ms(None, missing=NO_SAMPLES) == "–"
    assert units.ms(420) == "0.42 ms"
    assert units.ms(12_340) == "12.3 ms"
    assert units.ms(389_000) == "389 ms"
    assert units.ms(1_240_000) == "1.24 s"
    assert units.bytes_(None) == "n/a"
    assert units.bytes_(512) == "512 B"
    assert units.bytes_(80 * 1024**3) == "80.0 GiB"
    assert units.rate(None) == "n/a"
    assert units.rate(0.0) == "0.00"
    assert units.rate(1234.4) == "1,234"
    assert units.elapsed(3 * 3600 + 62) == "3:01:02"


class _BrokenSource(ScriptedSource):
    async def snapshots(self):  # type: ignore[override]
        yield make_snapshot(0)
        raise RuntimeError("worker process died")


async def test_unexpected_source_failure_is_shown_not_raised() -> None:
    app = TokentopApp(_BrokenSource([]), refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.ended)
        await wait_until(pilot, lambda: "worker process died" in text(app, "#header"))
        assert "stopped" in text(app, "#header")


async def test_user_text_with_brackets_is_shown_literally() -> None:
    # a trailing "[" is what textual.markup.escape misses; it must not eat the closing tag
    message = "bad target [http://[::1]:8000/v1 ["
    app = TokentopApp(ScriptedSource([], start_error=message), refresh=0.05)
    async with app.run_test(size=(120, 24)) as pilot:
        await wait_until(pilot, lambda: app.ended)
        await wait_until(pilot, lambda: message in text(app, "#header"))


async def test_a_replay_says_so_in_the_header() -> None:
    src = held()
    src.description = "replay: /runs/20261130-010203-abc"
    src.kind = "replay"  # the source says what it is; its description is only shown
    app = TokentopApp(src, refresh=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_drawn(pilot, app)
        assert text(app, "#header").startswith("tokentop  replay")
