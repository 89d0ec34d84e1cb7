"""Screens beside the main one: the small input modal (`=`, `e`) and the detail screens
(latency distribution `d`, GPUs `g`, errors `x`, the raw Snapshot `v`).

Detail screens are drawn by the app at its refresh tick, like the main screen,
and only while they are on top.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar, Protocol, cast

import msgspec
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, Static
from textual_plotext import PlotextPlot

from loadgen.model import hdr, units
from loadgen.model.snapshot import Event, GpuSample, Snapshot, to_json
from tui.format import MUTED, NO_SAMPLES, literal, tidy
from tui.view import View
from tui.widgets.header_bar import HeaderBar
from tui.widgets.latency_panel import CO_ROWS, ROWS, WINDOW_NAMES

# ------------------------------------------------------------------------- input modal



class _Redraws(Protocol):
    """The app a detail screen lives in (tui.app.TokentopApp): it redraws on demand."""

    def redraw_now(self) -> None: ...

class InputModal(ModalScreen[str | None]):
    """One line of input; `check(text)` returns an error to show (and keep asking) or None."""

    DEFAULT_CSS = """
    InputModal {
        align: center middle;
    }
    InputModal > Vertical {
        width: 60;
        max-width: 95%;
        height: auto;
        padding: 0 1;
        border: round $primary;
        border-title-color: $primary;
        background: $surface;
    }
    InputModal #input-error {
        color: $error;
        text-style: bold;
        height: auto;
    }
    InputModal #input-hint {
        color: $foreground-muted;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(
        self,
        title: str,
        hint: str,
        check: Callable[[str], str | None],
        *,
        value: str = "",
        placeholder: str = "",
        keep_empty: bool = False,
    ) -> None:
        super().__init__()
        self._title = title
        self._hint = hint
        self._check = check
        self._value = value
        self._placeholder = placeholder
        # enter on an empty field keeps what is set (the placeholder shows it): nothing to
        # delete before typing, nothing selected that a key could replace
        self._keep_empty = keep_empty

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = self._title
            # no select-on-focus: focus coming back (a click, a toast, the terminal's focus)
            # would select what was typed, and the next key would replace it all
            yield Input(value=self._value, placeholder=self._placeholder, id="input",
                        select_on_focus=False)
            yield Static("", id="input-error")
            yield Static(f"{self._hint} · enter: apply · escape: cancel", id="input-hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text and self._keep_empty:
            self.dismiss(None)
            return
        error = self._check(text)
        if error:
            self.query_one("#input-error", Static).update(Content(error))
            return
        self.dismiss(text)

    def action_cancel(self) -> None:
        self.dismiss(None)


# ------------------------------------------------------------------------- detail screens


class DetailScreen(Screen[None]):
    """A full screen of detail, redrawn by the app at its tick; escape goes back."""

    DEFAULT_CSS = """
    DetailScreen {
        background: $background;
    }
    DetailScreen .detail-title {
        height: 1;
        padding: 0 1;
        border-top: solid $primary;
        color: $primary;
        text-style: bold;
    }
    DetailScreen .detail-body {
        height: auto;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    DetailScreen VerticalScroll {
        height: 1fr;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", tooltip="back to the main screen"),
    ]
    TITLE = ""

    def __init__(self) -> None:
        super().__init__()
        self._markup: str | None = None

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        with VerticalScroll(id="detail-scroll"):
            yield Static(self.TITLE, classes="detail-title")
            yield Static("", classes="detail-body", id="detail-body")
            yield from self.compose_extra()
        yield Footer(compact=True)

    def compose_extra(self) -> ComposeResult:
        yield from ()

    def on_mount(self) -> None:
        self.query_one("#detail-scroll").focus()
        cast(_Redraws, self.app).redraw_now()

    def draw(self, view: View | None) -> None:
        """Redraw from the app's view of this refresh (None: no Snapshot yet)."""
        markup = self.render_detail(view) if view is not None else \
            f"[{MUTED}]waiting for the first Snapshot[/]"
        if markup != self._markup:
            self._markup = markup
            self.query_one("#detail-body", Static).update(tidy(markup))

    @property
    def plain(self) -> str:
        return str(self.query_one("#detail-body", Static).render())

    def render_detail(self, view: View) -> str:
        raise NotImplementedError

    def action_back(self) -> None:
        self.dismiss(None)


PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99)
# the `d` screen's rows: the latencies, then (open loop) the corrected ones and the lag
CO_MEANING = {m: f"{label} co" if m != "lag" else "lag" for m, label in CO_ROWS}
DIST_ROWS = (*ROWS, *CO_MEANING.items())
DIST_LABEL_W = 8
# x positions of the HDR percentile plot: 1 / (1 - p), on a log axis
X = [1.0 / (1.0 - p / 100.0) for p in PERCENTILES]
X_LABELS = ["P50", "P90", "P99", "P99.9", "P99.99"]


class DistributionScreen(DetailScreen):
    """The HDR percentile curve of the chosen window: latency (log) against percentile (log)."""

    TITLE = "Latency distribution"

    def compose_extra(self) -> ComposeResult:
        yield PlotextPlot(id="distribution-plot")

    DEFAULT_CSS = """
    DistributionScreen #distribution-plot {
        height: 1fr;
        min-height: 10;
    }
    """

    def curves(self, view: View) -> dict[str, list[int | None]]:
        dense = view.dense
        return {m: hdr.percentile_curve(dense[m], PERCENTILES) for m, _ in DIST_ROWS
                if m in dense}

    def render_detail(self, view: View) -> str:
        curves = self.curves(view)
        name = WINDOW_NAMES.get(view.window, view.window)
        header = f"{'':{DIST_LABEL_W}}" + "".join(f"{x:>9}" for x in X_LABELS)
        lines = [f"[{MUTED}]window: {name} (w cycles) · values in the HDR way (3 digits)[/]",
                 f"[{MUTED}]{header}[/]"]
        co = any(m in curves for m, _ in CO_ROWS)
        for metric, label in DIST_ROWS:
            if metric in CO_MEANING and not co:
                continue  # closed loop: there is no intended send time to correct from
            if metric == CO_ROWS[0][0]:
                lines.append(f"[{MUTED}]open loop, from the intended send time (coordinated "
                             "omission corrected), and how late the schedule sent:[/]")
            values = curves.get(metric, [None] * len(PERCENTILES))
            cells = "".join(units.ms(v, missing=NO_SAMPLES).rjust(9) for v in values)
            lines.append(f"[b]{label:<{DIST_LABEL_W}}[/]{cells}")
        self._plot(curves)
        return "\n".join(lines)

    def _plot(self, curves: dict[str, list[int | None]]) -> None:
        key = repr(curves)
        if getattr(self, "_plotted", None) == key:
            return
        self._plotted = key
        widget = self.query_one(PlotextPlot)
        plt = widget.plt
        plt.clear_data()
        plt.clear_figure()
        any_data = False
        for metric, label in DIST_ROWS:
            pts = [(x, v / 1000.0) for x, v in zip(X, curves.get(metric, []), strict=False)
                   if v is not None]
            if pts:
                any_data = True
                plt.plot([p[0] for p in pts], [p[1] for p in pts], label=label, marker="braille")
        plt.xscale("log")
        plt.xticks(X, X_LABELS)
        if any_data:
            plt.yscale("log")
        plt.ylabel("ms")
        plt.title("percentile curve (log scales)")
        widget.refresh()


def gpu_detail(g: GpuSample) -> list[str]:
    sim = " [$accent](simulated)[/]" if g.simulated else ""
    lines = [f"[b]GPU {g.index}[/] {literal(g.name)}{sim}"]
    if g.lost:
        lines.append(f"  [b $error]lost: {literal(g.message or 'fell off the bus')}[/]")
        return lines

    def row(label: str, value: str) -> str:
        return f"  [{MUTED}]{label:<14}[/]{value}"

    if g.uuid:
        lines.append(row("uuid", literal(g.uuid)))
    lines.append(row("memory", units.bytes_pair(g.memory_used_bytes, g.memory_total_bytes)))
    lines.append(row("utilisation", units.pct(g.utilization_pct, whole=100)))
    pw = units.NA if g.power_w is None else f"{g.power_w:.0f} W"
    limit = "" if g.power_limit_w is None else f" of {g.power_limit_w:.0f} W"
    lines.append(row("power", pw + limit))
    temp = units.NA if g.temperature_c is None else f"{g.temperature_c:.0f} °C"
    lines.append(row("temperature", temp))
    lines.append(row("energy", units.NA if g.energy_j is None else f"{g.energy_j / 3.6e6:.3f} kWh"))
    sm = units.NA if g.sm_clock_mhz is None else f"{g.sm_clock_mhz:.0f} MHz"
    mem = units.NA if g.mem_clock_mhz is None else f"{g.mem_clock_mhz:.0f} MHz"
    lines.append(row("clocks", f"SM {sm} · memory {mem}"))
    reasons = units.NA if g.throttle_reasons is None else (", ".join(g.throttle_reasons) or "none")
    lines.append(row("clock events", literal(reasons)))
    if g.pcie_tx_kbs is not None or g.pcie_rx_kbs is not None:
        tx = units.NA if g.pcie_tx_kbs is None else f"{g.pcie_tx_kbs / 1024:.1f} MB/s"
        rx = units.NA if g.pcie_rx_kbs is None else f"{g.pcie_rx_kbs / 1024:.1f} MB/s"
        lines.append(row("PCIe", f"tx {tx} · rx {rx}"))
    if g.ecc_corrected is not None or g.ecc_uncorrected is not None:
        lines.append(row("ECC", f"corrected {units.count(g.ecc_corrected)} · "
                                f"uncorrected {units.count(g.ecc_uncorrected)}"))
    if g.mig:
        lines.append(row("MIG", literal(", ".join(g.mig))))
    for p in g.processes or []:
        used = units.bytes_(p.used_bytes)
        lines.append(row("process", f"{p.pid} {literal(p.name or '')} {used}"))
    if g.message:
        lines.append(row("note", f"[$warning]{literal(g.message)}[/]"))
    return lines


class GpuScreen(DetailScreen):
    TITLE = "GPUs"

    def render_detail(self, view: View) -> str:
        snap = view.snap
        status = snap.gpu
        head = f"[{MUTED}]source[/] {literal(status.source)}"
        if status.driver:
            head += f"  [{MUTED}]driver[/] {literal(status.driver)}"
        if status.poll_ms is not None:
            head += f"  [{MUTED}]poll[/] {units.ms(units.us_of_ms(status.poll_ms))}"
        tpj = snap.efficiency.tokens_per_joule if snap.efficiency else None
        head += f"  [{MUTED}]tokens per joule[/] {units.NA if tpj is None else f'{tpj:.2f}'}"
        lines = [head]
        if status.message:
            lines.append(f"[$warning]{literal(status.message)}[/]")
        for g in status.gpus:
            lines.append("")
            lines.extend(gpu_detail(g))
        return "\n".join(lines)


def error_lines(snap: Snapshot | None, ten_errors: dict[str, int], ten_s: float,
                messages: Iterable[Event]) -> list[str]:
    total = snap.counters.errors if snap else {}
    kinds = sorted(set(total) | set(ten_errors), key=lambda k: -total.get(k, 0))
    lines = [f"[{MUTED}]{'kind':<22}{'run total':>12}{'last 10 s':>12}{'per s':>9}[/]"]
    if not kinds:
        lines.append(f"[{MUTED}]no errors in this run[/]")
    for k in kinds:
        recent = ten_errors.get(k, 0)
        rate = units.rate(recent / ten_s) if ten_s > 0 else units.NA
        colour = "$error" if recent else "$foreground"
        lines.append(f"[{colour}]{literal(k):<22}[/]{units.count(total.get(k, 0)):>12}"
                     f"{recent:>12}{rate:>9}")
    if snap is not None:
        c = snap.counters
        lines.append("")
        lines.append(f"[{MUTED}]requests[/] ok {units.count(c.requests_ok)} · failed "
                     f"{units.count(c.requests_failed)} · cancelled "
                     f"{units.count(c.requests_cancelled)}")
    lines.append("")
    lines.append("[b]last messages[/]")
    shown = list(messages)
    if not shown:
        lines.append(f"[{MUTED}]none yet[/]")
    for e in shown:
        lines.append(f"[{MUTED}]{units.clock(e.t)}[/] [$error]{literal(e.message)}[/]")
    return lines


class ErrorsScreen(DetailScreen):
    TITLE = "Errors by kind"

    def render_detail(self, view: View) -> str:
        ten = view.stats.get("10s")
        lines = error_lines(view.snap, ten.errors if ten else {},
                            ten.seconds if ten else 0.0, view.error_events)
        return "\n".join(lines)


def snapshot_text(snap: Snapshot | None) -> str:
    """The whole Snapshot as indented JSON, histograms shortened to their size."""
    if snap is None:
        return "no Snapshot yet"
    data = msgspec.json.decode(to_json(snap))
    data["hist"] = {m: f"<{len(b)} bytes of encoded histogram>" for m, b in data["hist"].items()}
    return msgspec.json.format(msgspec.json.encode(data), indent=2).decode()


class SnapshotScreen(DetailScreen):
    TITLE = "The latest Snapshot"

    def render_detail(self, view: View) -> str:
        return literal(snapshot_text(view.snap))


DETAIL_SCREENS: dict[str, type[DetailScreen]] = {
    "distribution": DistributionScreen,
    "gpus": GpuScreen,
    "errors": ErrorsScreen,
    "snapshot": SnapshotScreen,
}
