"""The fleet table: one row per agent and a fleet row whose P99s come from merged histograms."""

from __future__ import annotations

from textual.widgets import DataTable

from loadgen.fleet.monitor import AgentRow
from loadgen.model import units
from tui.format import literal

FLEET_KEY = "__fleet__"
COLUMNS = (
    ("agent", "agent"), ("state", "state"), ("target", "target"), ("conc", "concurrency"),
    ("inflight", "in flight"), ("tok_s", "out tok/s"), ("req_s", "req/s"),
    ("ttft", "TTFT p99"), ("itl", "ITL p99"), ("err_s", "err/s"), ("seen", "last seen"),
)
STATE_STYLE = {"online": "green", "stale": "yellow", "offline": "red", "unknown": "dim"}


def _seen(s: float | None) -> str:
    if s is None:
        return "never"
    # an age in whole units, like the console's window names (10 s, 1 min): the cell is
    # redrawn every second, and a tenth would only flicker
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def cells(row: AgentRow, *, fleet: bool = False) -> tuple[str, ...]:
    state = row.state if fleet else f"[{STATE_STYLE.get(row.state, '')}]{row.state}[/]"
    if not fleet and row.load_state in ("paused", "draining", "stopped") \
            and row.state != "offline":
        state += f" ({row.load_state})"
    if row.mode == "open" and row.rate is not None:
        conc = f"{row.rate:g}/s"
    else:
        conc = units.count(row.concurrency)
    target = row.target or ("" if fleet else units.NA)
    if len(target) > 32:
        target = "…" + target[-31:]
    target = literal(target)  # a cell's string is markup; the target is the agent's word
    name = f"[b]fleet ({row.agents})[/b]" if fleet else row.name
    return (name, state, target, conc, units.count(row.in_flight), units.rate(row.out_tok_s),
            units.rate(row.req_s), units.ms(row.ttft_p99_us), units.ms(row.itl_p99_us),
            units.rate(row.err_s), _seen(row.last_seen_s))


class FleetTable(DataTable):
    """Rows keyed by agent name, updated in place so the cursor stays on its agent."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show(self, rows: list[AgentRow], fleet: AgentRow) -> None:
        wanted = [FLEET_KEY] + [r.name for r in rows]
        present = [str(k.value) for k in self.rows]
        if present != wanted:
            selected = self.selected_key()
            self.clear()
            self.add_row(*cells(fleet, fleet=True), key=FLEET_KEY)
            for r in rows:
                self.add_row(*cells(r), key=r.name)
            if selected in wanted:
                self.move_cursor(row=wanted.index(selected))
            return
        for key, row, is_fleet in [(FLEET_KEY, fleet, True)] + [(r.name, r, False) for r in rows]:
            for (col, _label), value in zip(COLUMNS, cells(row, fleet=is_fleet), strict=True):
                self.update_cell(key, col, value)

    def selected_key(self) -> str | None:
        if self.row_count == 0:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        except Exception:
            return None
        return None if key.value is None else str(key.value)
