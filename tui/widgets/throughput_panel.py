"""Throughput: token and request rates per window, per-user speed, goodput, and a chart."""

from __future__ import annotations

from collections.abc import Mapping

from textual.app import ComposeResult

from loadgen.model import units
from loadgen.model.snapshot import Counters
from loadgen.model.windows import WindowStats
from tui.format import MUTED, first_fit
from tui.view import View
from tui.widgets.chart import Chart
from tui.widgets.panel import Panel

LABEL_W = 10
COL_W = 9
EST = " [$warning]est.[/]"
# below this many columns the 1 m window is left out (10 s and whole run stay)
WIDE_AT = 46


def _row(label: str, values: list[str], estimated: bool = False) -> str:
    cells = "".join(v.rjust(COL_W) for v in values)
    return f"[{MUTED}]{label.ljust(LABEL_W)}[/]{cells}" + (EST if estimated else "")


def per_user(s: WindowStats | None) -> float | None:
    """What one user sees stream in, tokens per second: the median of 1 / TPOT over the
    window's completed requests, the summary's per_user_tok_s p50 (windows.per_user_tok_s)."""
    return s.user_tok_s["p50"] if s else None


def rate_rows(stats: Mapping[str, WindowStats], windows: list[str], goodput: bool,
              width: int = 10**6) -> list[str]:
    picked = [stats.get(w) for w in windows]
    estimated = any(s is not None and s.tokens_estimated for s in picked)
    header = f"{'':{LABEL_W}}" + "".join(w.rjust(COL_W) for w in windows)
    rows = [
        f"[{MUTED}]{header}[/]",
        _row("out tok/s", [units.rate(s.output_tok_s if s else None) for s in picked], estimated),
        _row("in tok/s", [units.rate(s.input_tok_s if s else None) for s in picked]),
        _row("req/s", [units.rate(s.req_s if s else None) for s in picked]),
        _row("user tok/s", [units.rate(per_user(s)) for s in picked]),
    ]
    if goodput:
        rows.append(_row("goodput", [units.rate(s.goodput_req_s if s else None) for s in picked]))
    else:
        label = 'goodput'.ljust(LABEL_W)
        rows.append(first_fit(width, f"[{MUTED}]{label}n/a: no per-request --slo[/]",
                              f"[{MUTED}]{label}n/a: per-request --slo[/]",
                              f"[{MUTED}]{label}n/a (--slo)[/]"))
    return rows


def prompt_row(run: WindowStats | None, lengths: str | None = None) -> list[str]:
    """Prompt tokens a request as the server counted them, beside the asked length (a chat
    template adds tokens the asked length does not have); only when the server counts."""
    if run is None or run.input_per_request is None or run.input_asked_per_request is None:
        return []
    server, asked = run.input_per_request, run.input_asked_per_request
    approx = " approx." if lengths == "approx" else ""  # no tokenizer: ~one token a word
    text = f"{server:,.0f}/req · asked {asked:,.0f}{approx}"
    if run.input_differs:
        text = f"[$warning]{text} ({(server - asked) / asked:+.0%})[/]"
    return [f"[{MUTED}]{'prompt'.ljust(LABEL_W)}[/]{text}"]


def total_rows(c: Counters, compact: bool, width: int = 10**6) -> list[str]:
    """Run totals; compact (narrow) is one line, failures being in the Load panel already."""
    failed = f"[$error]{units.count(c.requests_failed)}[/]" if c.requests_failed else "0"
    est = EST if c.estimated_output_tokens else ""
    if compact:
        label = f"[{MUTED}]{'total'.ljust(LABEL_W)}[/]"
        req, tok = units.count(c.requests_ok), units.count(c.output_tokens)
        return [first_fit(width, f"{label}{req} req · {tok} tok{est}",
                          f"{label}{req} req · {tok} tok", f"{label}{tok} tok{est}")]
    return [
        f"[{MUTED}]{'requests'.ljust(LABEL_W)}[/]{units.count(c.requests_ok)} ok · {failed} failed",
        f"[{MUTED}]{'tokens'.ljust(LABEL_W)}[/]{units.count(c.output_tokens)} out"
        f" · {units.count(c.input_tokens)} in{est}",
    ]


class ThroughputPanel(Panel):
    TITLE = "Throughput"

    def compose_extra(self) -> ComposeResult:
        yield Chart("out_tok_s", "out tok/s", rows=4, classes="chart", id="throughput-chart")

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        wide = width >= WIDE_AT
        windows = ["10s", "1m", "run"] if wide else ["10s", "run"]
        goodput = view.slos is not None and view.slos.per_request is not None
        lines = rate_rows(view.stats, windows, goodput, width)
        compact = not (wide and self._tall())
        lines += total_rows(view.snap.counters, compact, width)
        if not compact:
            lines += prompt_row(view.stats.get("run"), view.snap.target.lengths)
        return self.TITLE, "\n".join(lines)

    def show_extra(self, view: View, width: int) -> None:
        # a redraw may come before the panel's children are mounted (a screen coming up)
        chart = next(iter(self.query(Chart)), None)
        if chart is not None and chart.display:
            chart.show(view.history, width)
