"""Every panel says its most important figures whole at 80x24 and 120x40 (issue 24.2): what the
terminal shows (the compositor's cells, cropped to each panel) holds the key figures with
their units, no panel line is cut by an ellipsis, and the main screen never scrolls (a
scrollbar took two columns from every panel). And in open loop the coordinated-omission
corrected TTFT / E2E and the schedule lag are shown (issue 24.4), equal to what the run
recorded (its latency.hlog, read by HdrHistogram's own log reader)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hdrh.log import HistogramLogReader
from scripted_source import LATENCY_US, ScriptedSource, make_snapshots
from test_tui import wait_until
from textual.content import Content
from textual.pilot import Pilot
from textual.widget import Widget

from loadgen.model.slo import parse_slos
from loadgen.run.config import RunConfig
from loadgen.run.run_process import RunProcess
from loadgen.run.watch import WatchedSource
from tui.app import TokentopApp
from tui.screens import DistributionScreen
from tui.widgets.panel import Line, Panel

N = 12
SLO = "ttft_p99<300ms,tpot<50ms,e2e<10s"
SIZES = [((80, 24), 1), ((120, 40), 2)]
IDS = ["80x24", "120x40"]


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("NO_COLOR", raising=False)


def shown(app: TokentopApp, widget: Widget | None = None) -> str:
    """What the terminal shows now (the compositor's cells), cropped to `widget`'s region."""
    strips = app.screen._compositor.render_strips()
    if widget is None:
        return "\n".join(s.text for s in strips)
    r = widget.region
    return "\n".join(s.crop(r.x, r.x + r.width).text for s in strips[r.y:r.y + r.height])


async def scripted(pilot: Pilot, app: TokentopApp) -> None:
    await wait_until(pilot, lambda: app.drawn_seq == N - 1)
    app.redraw_now()
    await pilot.pause(0.05)


def ms_values(text: str) -> list[str]:
    return re.findall(r"\d[\d.,]* (?:ms|s)\b", text)


@pytest.mark.parametrize(("size", "gpus"), SIZES, ids=IDS)
async def test_key_figures_are_whole_on_screen(size: tuple[int, int], gpus: int) -> None:
    source = WatchedSource(ScriptedSource(make_snapshots(N, gpus=gpus), hold=True),
                           parse_slos(SLO))
    app = TokentopApp(source, refresh=0.05, slo=SLO)
    async with app.run_test(size=size) as pilot:
        await scripted(pilot, app)
        # the screen does not scroll: nothing below its last row, no scrollbar column
        screen = app.screen
        assert screen.virtual_size.height <= screen.size.height, "the main screen scrolls"
        assert not screen.show_vertical_scrollbar
        # no panel line is longer than its row (the ellipsis would have cut its end)
        for panel in app.query(Panel):
            for line in panel.query(Line):
                text = line.render()
                width = line.content_size.width
                assert isinstance(text, Content)
                assert text.cell_length <= width, f"#{panel.id} cut: {text.plain!r} > {width}"

        # Host: the server's TTFT P50 (its /metrics: 80 ms, scripted) and the client's, whole
        host = shown(app, app.query_one("#host"))
        assert "80.0 ms" in host, host
        # the values the script sent, in ms: the median as HDR ranks it (the 50th of 100)
        client_p50 = np.percentile(LATENCY_US["ttft"], 50, method="inverted_cdf") / 1000
        values = [float(v.split()[0]) for v in ms_values(host) if v.endswith("ms")]
        assert any(v != 80.0 and abs(v - client_p50) <= 0.01 * client_p50 for v in values), \
            f"the client's TTFT P50 (~{client_p50:.1f} ms) is not whole in the host panel:\n{host}"

        # Latency: every column, max included, each cell a number and its unit
        latency = shown(app, app.query_one("#latency"))
        header = next(line for line in latency.splitlines() if "P50" in line)
        assert header.split() == ["P50", "P90", "P99", "P99.9", "max"], header
        for label in ("TTFT", "ITL", "TPOT", "E2E"):
            row = next(line for line in latency.splitlines() if line.strip().startswith(label))
            assert len(ms_values(row)) == 5, f"{label} row cut: {row!r}"

        # Load: the errors are numbers with their unit, none cut
        load = shown(app, app.query_one("#load"))
        errors = next(line for line in load.splitlines() if "errors" in line)
        assert re.search(r"\d\.\d\d/s", errors) and "…" not in errors, errors

        # GPU: the whole name, each row's power and temperature
        gpu = shown(app, app.query_one("#gpu"))
        assert gpu.count("H100 80GB HBM3") == gpus, gpu
        assert gpu.count("/700 W") == gpus and "°C" in gpu and "…" not in gpu, gpu

        # Throughput: goodput's figures (per-request SLOs are given) and the totals
        throughput = shown(app, app.query_one("#throughput"))
        assert re.search(r"goodput\s+\d", throughput) and "tok" in throughput, throughput


async def test_open_loop_shows_the_corrected_latencies_as_recorded(sim, tmp_path: Path):
    """Open loop against the simulator: the latency panel (120x40: its rows) and the `d`
    screen show TTFT and E2E from the intended send time and the lag, over the whole run,
    equal to the run's own latency.hlog (HdrHistogram's reader, not tokentop's)."""
    cfg = RunConfig(url=sim.url, mode="open", rate=12.0, output_tokens="24", workers=1,
                    tick=0.25, duration=3.0, drain_grace=2.0, out=str(tmp_path / "runs"))
    app = TokentopApp(RunProcess(cfg), refresh=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.ended, tries=3000)
        for _ in range(4):  # 10s, 1m, 10m, run
            if app.window == "run":
                break
            await pilot.press("w")
        assert app.window == "run"
        app.redraw_now()
        await pilot.pause(0.1)
        (hlog,) = (tmp_path / "runs").rglob("latency*.hlog")
        truth = recorded(hlog, ("ttft_co", "e2e_co", "lag"))
        latency = shown(app, app.query_one("#latency"))
        caption = next(i for i, line in enumerate(latency.splitlines())
                       if "coordinated omission" in line)
        rows = latency.splitlines()[caption + 1:caption + 4]
        for (metric, hist), row in zip(truth.items(), rows, strict=True):
            label = {"ttft_co": "TTFT", "e2e_co": "E2E", "lag": "lag"}[metric]
            assert row.strip().startswith(label), row
            check_row(metric, hist, ms_values(row))
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, DistributionScreen))
        app.redraw_now()
        await pilot.pause(0.1)
        detail = app.screen.plain
        for metric, label in (("ttft_co", "TTFT co"), ("e2e_co", "E2E co"), ("lag", "lag")):
            row = next(line for line in detail.splitlines() if line.startswith(label))
            hist = truth[metric]
            for text, p in zip(ms_values(row)[:3], (50, 90, 99), strict=True):
                assert close(text, hist.get_value_at_percentile(p)), (metric, p, row)


def recorded(hlog: Path, tags: tuple[str, ...]) -> dict:
    """Every interval of each tag in the log, added up (µs)."""
    totals: dict = {}
    reader = HistogramLogReader(str(hlog), None)
    for _ in range(100_000):
        h = reader.get_next_interval_histogram()
        if h is None:
            break
        tag = h.get_tag()
        if tag in tags:
            if tag in totals:
                totals[tag].add(h)
            else:
                totals[tag] = h
    assert set(totals) == set(tags), f"the recording has {sorted(totals)}"
    return {t: totals[t] for t in tags}


def to_us(text: str) -> float:
    value, unit = text.split()
    return float(value.replace(",", "")) * (1000.0 if unit == "ms" else 1e6)


def close(text: str, true_us: float) -> bool:
    """A value as shown ("0.43 ms", "26.4 ms") is the HDR value (0.1 %) rounded to its last
    digit shown: within half a unit of that digit."""
    value, unit = text.split()
    decimals = len(value.partition(".")[2])
    half_unit_us = 0.5 * 10.0 ** -decimals * (1000.0 if unit == "ms" else 1e6)
    return abs(to_us(text) - true_us) <= half_unit_us + 0.001 * true_us + 1.0


def check_row(metric: str, hist, cells: list[str]) -> None:
    # the panel's columns at 120x40: P50 P90 P99 P99.9 max
    assert len(cells) == 5, (metric, cells)
    for text, p in zip(cells[:4], (50, 90, 99, 99.9), strict=True):
        assert close(text, hist.get_value_at_percentile(p)), (metric, p, cells)
    assert close(cells[4], hist.get_max_value()), (metric, "max", cells)
