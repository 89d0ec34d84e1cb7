"""`tokentop fleet`: every agent of a fleet on one screen, and the full console for any of them.

    tokentop fleet --broker mqtt://broker:1883 [--fleet lab]

The table lists agents (online, stale, offline) with their headline numbers;
the first row is the fleet, its P99s taken from the agents' interval
histograms added together (exact, not an average of P99s). Keys:

    enter     open the selected agent in the full console (q there comes back here);
              on the fleet row: every agent merged into one console (exact percentiles)
    + - ] [   its concurrency ±1 / ±10          p  pause / resume it
    a         send those to every agent instead  q  quit (ctrl+c too)

Why the agent view is the ordinary console run after the fleet app (not a
screen inside it): `TokentopApp` is an App with its own layout, keys, help
and CSS; running it with a `FleetAgentSource` shows an agent exactly as a
local run, with nothing copied. Both apps run one after the other on the
same event loop (`App.run_async`), so the one `FleetMonitor` (MQTT
connection, registry, windows) lives on across the switch.
"""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.notifications import SeverityLevel
from textual.widgets import Footer, Static

from loadgen.fleet.link import BrokerSettings
from loadgen.fleet.monitor import FleetMonitor
from loadgen.model.source import SourceError
from themes import DEFAULT_THEME, register_themes
from tui.format import literal
from tui.widgets.fleet_table import FLEET_KEY, FleetTable


class FleetApp(App[str | None]):
    """Returns the name of the agent to open (enter), or None (q)."""

    TITLE = "tokentop fleet"
    CSS = """
    #fleet-header { height: 1; padding: 0 1; background: $panel; }
    FleetTable { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Open", tooltip="full console of the selected agent"),
        Binding("plus", "concurrency(1)", "+1", key_display="+"),
        Binding("minus", "concurrency(-1)", "−1", key_display="-"),
        Binding("right_square_bracket", "concurrency(10)", "+10", key_display="]"),
        Binding("left_square_bracket", "concurrency(-10)", "−10", key_display="["),
        Binding("p", "pause", "Pause/resume"),
        Binding("a", "toggle_all", "All agents"),
        Binding("q", "quit_fleet", "Quit"),
        # as q, as in htop (Textual's own ctrl+c only says "press ctrl+q")
        Binding("ctrl+c", "quit_fleet", "Quit", show=False, priority=True),
    ]

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """A toast, never read as markup: what it says may quote a server, an agent, a file
        (a model id of "[red]x[/red]" is shown as written)."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def __init__(self, monitor: FleetMonitor, *, refresh: float = 1.0,
                 theme: str | None = None) -> None:
        super().__init__()
        self.monitor = monitor
        self.refresh_s = refresh
        self.all_agents = False
        self.replies: list[dict] = []  # every control reply, for tests and the record
        self._drawn_version = -1
        register_themes(self)
        self.theme = theme if theme in self.available_themes else DEFAULT_THEME

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-header")
        yield FleetTable(id="fleet")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(self.refresh_s, self._redraw, name="refresh")
        self._redraw()
        self.query_one(FleetTable).focus()

    def _redraw(self) -> None:
        if not self.is_running:  # shutting down: the widgets are being taken down
            return
        m = self.monitor
        link = "connected" if m.connected else f"[red]{literal(m.last_error or 'connecting…')}[/]"
        target = "[b reverse] ALL AGENTS [/]" if self.all_agents else "selected agent"
        self.query_one("#fleet-header", Static).update(
            f"fleet [b]{m.fleet}[/b] · {m.settings.display} · {link} · control: {target}")
        self.query_one(FleetTable).show(m.rows(), m.aggregate())

    # ---- keys ------------------------------------------------------------------------------

    def _target(self) -> str | None:
        if self.all_agents:
            return "all"
        key = self.query_one(FleetTable).selected_key()
        if key is None or key == FLEET_KEY:
            self.notify("select an agent (or press a to control all agents)",
                        severity="warning")
            return None
        return key

    def action_open(self) -> None:
        key = self.query_one(FleetTable).selected_key()
        if key is None:
            self.notify("select an agent (or the fleet row) to open its console",
                        severity="warning")
            return
        self.exit(key)  # FLEET_KEY: the whole fleet merged into one console

    def on_data_table_row_selected(self, _event: FleetTable.RowSelected) -> None:
        self.action_open()  # the table takes enter for itself and says so with this message

    def action_toggle_all(self) -> None:
        self.all_agents = not self.all_agents
        self.notify("controls go to every agent" if self.all_agents
                    else "controls go to the selected agent", timeout=3)
        self._redraw()

    def action_concurrency(self, step: int) -> None:
        target = self._target()
        if target is not None:
            self._send(target, "add_concurrency", float(step))

    def action_pause(self) -> None:
        target = self._target()
        if target is None:
            return
        if target == "all":
            running = any(r.load_state == "running" for r in self.monitor.rows())
        else:
            row = next((r for r in self.monitor.rows() if r.name == target), None)
            running = row is not None and row.load_state == "running"
        self._send(target, "pause" if running else "resume", None)

    def action_quit_fleet(self) -> None:
        self.exit(None)

    @work(group="control")
    async def _send(self, target: str, op: str, value: float | None) -> None:
        try:
            replies = await self.monitor.control(target, op, value)
        except SourceError as e:
            self.notify(str(e), severity="error")
            return
        self.replies += replies
        if not replies:
            self.notify(f"{op}: no agent is online", severity="warning")
        for r in replies:
            what = f"{op} {value:+g}" if value is not None else op
            if r.get("applied"):
                self.notify(f"{r.get('agent')}: {what} applied", timeout=3)
            else:
                self.notify(f"{r.get('agent')}: {what} refused: {r.get('reason')}",
                            severity="warning", timeout=6)


# ---- running it ---------------------------------------------------------------------------


async def run_fleet(settings: BrokerSettings, fleet: str, *, refresh: float = 1.0,
                    theme: str | None = None, stale_after: float = 5.0) -> int:
    """The fleet table, and the full console for whichever agent (or the merged fleet) is
    opened from it, one after the other on one FleetMonitor, until the table is quit."""
    from loadgen.fleet.merged import FleetMergedSource
    from tui.app import TokentopApp

    monitor = FleetMonitor(settings, fleet, stale_after=stale_after)
    await monitor.start(wait=5.0)
    try:
        while True:
            choice = await FleetApp(monitor, refresh=refresh, theme=theme).run_async()
            if not choice:
                return 0
            source = FleetMergedSource(monitor) if choice == FLEET_KEY else monitor.source(choice)
            await TokentopApp(source, theme=theme).run_async()
    finally:
        await monitor.close()
