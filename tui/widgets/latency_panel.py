"""Latency: TTFT / ITL / TPOT / E2E percentiles over the window the user picks (`w`).

With --slo, a cell is red when its limit is broken and green when met: a
whole-run threshold (`ttft_p99<1s`) colours its own cell; a per-request limit
(`ttft<500ms`) colours the P99 cell of that metric when no threshold names it.
Colour is never the only sign: a breached cell carries "!", and the SLO line
under the table says PASS or FAIL and which limit is breached, in words.
"""

from __future__ import annotations

from textual.app import ComposeResult

from loadgen.model import units
from loadgen.model.hdr import Summary
from loadgen.model.slo import Slos, holds
from loadgen.model.text import plain
from loadgen.model.windows import WindowStats
from tui.format import MUTED, NO_SAMPLES, cells, first_fit, literal
from tui.view import View
from tui.widgets.chart import Chart
from tui.widgets.panel import Panel, keep_within

ROWS = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E"))
# a reasoning model's run: time to the first answer token joins, under TTFT
REASONING_ROWS = (ROWS[0], ("ttfa", "TTFA"), *ROWS[1:])
COLS = (("p50", "P50"), ("p90", "P90"), ("p99", "P99"), ("p99.9", "P99.9"), ("max", "max"))
# narrow: the least telling columns go first (max still shows the tail beyond P99)
NARROW_COLS = (COLS[0], COLS[1], COLS[2], COLS[4])
NARROWEST_COLS = (COLS[0], COLS[2], COLS[4])
# open loop: latencies from the intended send time (coordinated omission corrected) and the
# schedule's lag (how late each request went out), in the Snapshot's names
CO_ROWS = (("ttft_co", "TTFT"), ("e2e_co", "E2E"), ("lag", "lag"))
# with room to spare, the mean and the sample count join in
WIDE_COLS = (*COLS, ("mean", "mean"))
LABEL_W = 4
COL_W = 8
WIDE_AT = LABEL_W + COL_W * len(WIDE_COLS) + 8
# marks a cell that breaks its SLO, beside the red (see `?` help)
BREACH = "!"
EST = " [$warning]est.[/]"
WINDOW_NAMES = {"10s": "10 s", "1m": "1 min", "10m": "10 min", "run": "whole run"}


def slo_limit(slos: Slos | None, metric: str, stat: str) -> tuple[str, float] | None:
    """(op, µs) that the cell (metric, stat) must meet, or None."""
    if slos is None:
        return None
    for th in slos.thresholds:
        if th.metric == metric and th.stat == stat:
            return th.op, th.value
    per = slos.per_request
    if stat == "p99" and per is not None:
        limit = getattr(per, f"{metric}_us", None)
        if limit is not None:
            return "<=", limit
    return None


def cell(summary: Summary | None, metric: str, key: str, slos: Slos | None) -> str:
    value = summary.get(key) if summary else None
    text = units.ms(value, missing=NO_SAMPLES)
    limit = slo_limit(slos, metric, key)
    if limit is not None and value is not None:
        ok = holds(value, limit[0], limit[1])
        colour = "$success" if ok else "$error"
        # a breach is marked in the text too: a mono theme (or a colour-blind eye) has no red
        text = text.rjust(COL_W) if ok else f"{BREACH}{text}".rjust(COL_W)
        return f"[b {colour}]{text}[/]" if key == "p99" else f"[{colour}]{text}[/]"
    text = text.rjust(COL_W)
    # P99 is what an SLO usually names: make it the column the eye lands on
    return f"[b]{text}[/]" if key == "p99" and value is not None else text


def table(
    stats: WindowStats | None,
    cols: tuple[tuple[str, str], ...],
    wide: bool,
    slos: Slos | None = None,
    rows: tuple[tuple[str, str], ...] | None = None,
    heading: bool = True,
) -> list[str]:
    header = f"{'':{LABEL_W}}" + "".join(name.rjust(COL_W) for _, name in cols)
    if wide:
        header += "n".rjust(COL_W)
    lines = [f"[{MUTED}]{header}[/]"] if heading else []
    for metric, label in rows or shown_rows(stats):
        summary = stats.latency.get(metric) if stats else None
        line = f"[b]{label.ljust(LABEL_W)}[/]" + "".join(
            cell(summary, metric, k, slos) for k, _ in cols
        )
        if wide:
            count = summary.get("count", 0) if summary else 0
            line += f"[{MUTED}]{count:>{COL_W},}[/]"
        if metric == "itl" and stats is not None and stats.itl_estimated:
            # no per-chunk usage and no tokenizer: each request's count was split over its
            # chunks by their text (or, with no usage at all, one token a chunk)
            line += EST
        lines.append(line)
    return lines


def shown_rows(stats: WindowStats | None) -> tuple[tuple[str, str], ...]:
    ttfa = stats.latency.get("ttfa") if stats else None
    return REASONING_ROWS if ttfa and ttfa.get("count") else ROWS


def columns(width: int, stats: WindowStats | None) -> tuple[tuple[tuple[str, str], ...], bool]:
    """(columns, with the count) that fit `width`: mean and count with room to spare;
    P99.9 goes first when narrow (max still shows the tail), then P90."""
    est = cells(EST) if stats is not None and stats.itl_estimated else 0
    if width >= WIDE_AT:
        return WIDE_COLS, True
    for cols in (COLS, NARROW_COLS, NARROWEST_COLS):
        if LABEL_W + COL_W * len(cols) + est <= width:
            return cols, False
    return NARROWEST_COLS, False


def co_present(stats: WindowStats | None) -> bool:
    """Open loop measured from the intended send time: the corrected figures exist."""
    return stats is not None and any(
        (stats.latency.get(m) or {}).get("count") for m, _ in CO_ROWS)


def co_rows(stats: WindowStats | None, cols: tuple[tuple[str, str], ...], wide: bool,
            width: int) -> list[str]:
    """The coordinated-omission corrected rows under their caption (open loop, tall)."""
    caption = first_fit(width, f"[{MUTED}]from the intended send time (coordinated omission):[/]",
                        f"[{MUTED}]corrected for coordinated omission:[/]",
                        f"[{MUTED}]CO-corrected:[/]")
    return [caption, *table(stats, cols, wide, rows=CO_ROWS, heading=False)]


def co_line(stats: WindowStats | None, width: int) -> str:
    """The corrected P99s in one line (a short screen): TTFT and E2E from the intended send
    time, and how late the schedule sent (lag)."""
    def p99(metric: str) -> str:
        summary = stats.latency.get(metric) if stats else None
        return units.ms(summary.get("p99") if summary else None, missing=NO_SAMPLES)

    ttft, e2e, lag = (f"[b]{p99('ttft_co')}[/]", f"[b]{p99('e2e_co')}[/]", p99("lag"))
    return first_fit(
        width,
        f"[{MUTED}]CO-corrected P99[/] TTFT {ttft}  E2E {e2e}  [{MUTED}]lag[/] {lag}",
        f"[{MUTED}]CO P99[/]  TTFT {ttft}  E2E {e2e}  [{MUTED}]lag[/] {lag}",
        f"[{MUTED}]CO P99[/] TTFT {ttft} E2E {e2e} [{MUTED}]lag[/] {lag}",
        f"[{MUTED}]CO P99[/] TTFT {ttft} E2E {e2e}",
        f"[{MUTED}]CO P99[/] TTFT {ttft}",
    )


def slo_checks(slos: Slos, stats: WindowStats | None) -> list[tuple[str, bool | None]]:
    """(limit as text, met?) for every latency limit, judged on the window's cells as the
    table colours them (None: no samples yet)."""
    checks: list[tuple[str, str, str]] = []
    per = slos.per_request
    if per is not None:
        for metric in ("ttft", "tpot", "e2e"):
            v = getattr(per, f"{metric}_us", None)
            if v is not None:
                checks.append((f"{metric}<{units.ms(v).replace(' ', '')}", metric, "p99"))
    checks += [(th.text, th.metric, th.stat) for th in slos.thresholds if th.stat is not None]
    out: list[tuple[str, bool | None]] = []
    for text, metric, stat in checks:
        summary = stats.latency.get(metric) if stats else None
        value = summary.get(stat) if summary else None
        limit = slo_limit(slos, metric, stat)
        met = None if value is None or limit is None else holds(value, limit[0], limit[1])
        out.append((text, met))
    return out


def slo_line(slos: Slos | None, width: int, stats: WindowStats | None = None) -> str | None:
    """The verdict in words first (PASS / FAIL), then each limit with ok / breach."""
    if slos is None or (slos.per_request is None and not slos.thresholds):
        return None
    checks = slo_checks(slos, stats)
    if any(met is False for _, met in checks):
        verdict = "[b $error]SLO FAIL[/]"
    elif checks and all(met for _, met in checks):
        verdict = "[b $success]SLO PASS[/]"
    else:
        verdict = f"[{MUTED}]SLO[/]"
    words = {True: "ok", False: "breach", None: "no data"}
    parts = [
        f"[$error]{text} breach[/]" if met is False else f"[{MUTED}]{text} {words[met]}[/]"
        for text, met in checks
    ]
    line = f"{verdict} " + f"[{MUTED}],[/] ".join(parts)
    breached = [text for text, met in checks if met is False]
    # a narrow panel: the verdict and the breached limits only, else how many
    short = verdict + (f" [$error]{', '.join(breached)}[/]" if breached else "")
    many = f"{verdict} [$error]{len(breached)} limits breached[/]"
    return first_fit(width, line, short, many if len(breached) > 1 else short)


def class_line(name: str, stats: WindowStats | None, slos: Slos | None, width: int) -> str:
    """One --mix class over the window: its TTFT P50 / P99, its ITL P99 and its SLO verdict
    (as the run's line words it), so the classes' tails sit side by side."""
    def stat(metric: str, key: str) -> str:
        summary = stats.latency.get(metric) if stats else None
        return units.ms(summary.get(key) if summary else None, missing=NO_SAMPLES)

    checks = slo_checks(slos, stats) if slos is not None else []
    verdict = ""
    if any(met is False for _, met in checks):
        verdict = " [b $error]SLO FAIL[/]"
    elif checks and all(met for _, met in checks):
        verdict = " [$success]SLO ok[/]"
    label = f"[b]{literal(plain(name, 24))}[/]"  # from the bus or a recording: untrusted
    ttft = f"{stat('ttft', 'p50')} / [b]{stat('ttft', 'p99')}[/]"
    return first_fit(
        width,
        f"{label} [{MUTED}]TTFT P50/P99[/] {ttft}  [{MUTED}]ITL P99[/] {stat('itl', 'p99')}"
        f"{verdict}",
        f"{label} [{MUTED}]TTFT[/] {ttft}{verdict}",
        f"{label} [{MUTED}]P99[/] [b]{stat('ttft', 'p99')}[/]{verdict}",
    )


class LatencyPanel(Panel):
    TITLE = "Latency"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._slo_limit: float | None = None

    def compose_extra(self) -> ComposeResult:
        yield Chart("ttft_p99", "TTFT P99 ms (10 s)", rows=4, colour="$primary",
                    fmt=lambda ms: units.ms(units.us_of_ms(ms), missing=NO_SAMPLES),
                    limit=lambda: self._slo_limit,
                    classes="chart", id="latency-chart")

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        stats = view.stats.get(view.window)
        cols, wide = columns(width, stats)
        lines = [(line, 0) for line in table(stats, cols, wide, view.slos)]
        slo = slo_line(view.slos, width, stats)
        if slo:
            lines.append((slo, 0))
        if co_present(stats):  # open loop: under the verdict, which judges the table above
            if self._tall():
                lines += [(line, 1) for line in co_rows(stats, cols, wide, width)]
            else:
                lines.append((co_line(stats, width), 1))
        # --mix: a line a class under the run's verdict, left out before the table is
        lines += [(class_line(name, stats_c, view.class_slos.get(name), width), 1)
                  for name, stats_c in view.classes.items()]
        title = f"{self.TITLE} · {WINDOW_NAMES.get(view.window, view.window)} (w)"
        limit = slo_limit(view.slos, "ttft", "p99")
        self._slo_limit = limit[1] / 1000.0 if limit else None  # the chart is in ms
        return title, "\n".join(keep_within(lines, self.line_budget()))

    def show_extra(self, view: View, width: int) -> None:
        # a redraw may come before the panel's children are mounted (a screen coming up)
        chart = next(iter(self.query(Chart)), None)
        if chart is not None and chart.display:
            chart.show(view.history, width)
