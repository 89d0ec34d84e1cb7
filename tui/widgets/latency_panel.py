"""Latency: TTFT / ITL / TPOT / E2E percentiles over the last 10 s (and 1 m when tall)."""

from __future__ import annotations

from loadgen.hdr import Summary
from loadgen.windows import WindowStats
from tui.format import NO_SAMPLES, fmt_ms
from tui.widgets.panel import Panel, View

MUTED = "$foreground-muted"
ROWS = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E"))
NARROW_COLS = (("p50", "P50"), ("p90", "P90"), ("p99", "P99"), ("max", "max"))
# with room to spare, the far tail and the mean and sample count join in
WIDE_COLS = (*NARROW_COLS[:3], ("p99.9", "P99.9"), ("max", "max"), ("mean", "mean"))
LABEL_W = 5
COL_W = 8
WIDE_AT = LABEL_W + COL_W * len(WIDE_COLS) + 8


def _cell(summary: Summary | None, key: str) -> str:
    value = summary.get(key) if summary else None
    text = fmt_ms(value, missing=NO_SAMPLES).rjust(COL_W)
    # P99 is what an SLO usually names: make it the column the eye lands on
    return f"[b]{text}[/]" if key == "p99" and value is not None else text


def table(stats: WindowStats | None, cols: tuple[tuple[str, str], ...], wide: bool) -> list[str]:
    header = f"{'':{LABEL_W}}" + "".join(name.rjust(COL_W) for _, name in cols)
    if wide:
        header += "n".rjust(COL_W)
    lines = [f"[{MUTED}]{header}[/]"]
    for metric, label in ROWS:
        summary = stats.latency.get(metric) if stats else None
        line = f"[b]{label.ljust(LABEL_W)}[/]" + "".join(_cell(summary, k) for k, _ in cols)
        if wide:
            count = summary.get("count", 0) if summary else 0
            line += f"[{MUTED}]{count:>{COL_W},}[/]"
        lines.append(line)
    return lines


class LatencyPanel(Panel):
    TITLE = "Latency"

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        wide = width >= WIDE_AT
        cols = WIDE_COLS if wide else NARROW_COLS
        lines = table(view.stats.get("10s"), cols, wide)
        title = f"{self.TITLE} · last 10 s"
        if self._tall():
            lines.append(f"[{MUTED}]last 1 min[/]")
            lines.extend(table(view.stats.get("1m"), cols, wide)[1:])
        return title, "\n".join(lines)

    def _tall(self) -> bool:
        # the screen carries a "-tall" class (App.VERTICAL_BREAKPOINTS) when there are rows to spare
        return self.is_attached and self.screen.has_class("-tall")
