"""The events screen (`l`): every event of the run, whole, newest at the bottom.

For a 72-hour soak the log is what the SRE reads, so: every event the console was given
(tui.event_log keeps them), each wrapped to the screen's width (nothing cut), filtered
by kind (`f`: errors, SLO, outages, operator, faults, by the typed kinds, never by the
wording), searched (`/`: the rows whose text contains what is typed), and in a replay
Enter on an event seeks the replay to it. The list is Textual's OptionList, which
draws only the rows on screen, so thousands of events scroll as fast as ten.
What an event says may quote a server or a recording: it is shown as written, never
read as markup.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.content import Content
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from loadgen.model import units
from tui.event_log import FILTER_TITLES, FILTERS, EventLog, FilterName, Logged, matches
from tui.format import MUTED
from tui.widgets.events_panel import KIND_W, event_style
from tui.widgets.header_bar import HeaderBar

Jump = Callable[[Logged], Awaitable[None]]
# the rows the list holds at most: the newest of those the filter and search keep. Each row
# is wrapped to learn its height (about 0.1 ms), so a soak's 100,000 would take seconds;
# the filter (f) and the search (/) reach any of them
ROWS_MAX = 2_000
SEARCH_PAUSE_S = 0.25  # the search applies once typing pauses this long (or on enter)


def row_content(entry: Logged) -> Content:
    """The run's elapsed time (a soak's hour 51 is easier found so than by the clock), the
    clock, the kind, the text: as the panel colours them. Built as Content, not parsed from
    markup: the text is never read as markup, and a soak's thousands of rows build in
    milliseconds (markup costs 30 times as much)."""
    e = entry.event
    at = units.elapsed(entry.elapsed) if entry.elapsed is not None else ""
    return Content.assemble(
        (f"{at:>9} {units.clock(e.t)} {e.kind[:KIND_W]:<{KIND_W}}", MUTED), " ",
        (e.message, event_style(e)))


class EventsScreen(Screen[None]):
    DEFAULT_CSS = """
    EventsScreen {
        background: $background;
    }
    EventsScreen #events-title {
        height: 2;  /* the rule and the line under it */
        padding: 0 1;
        border-top: solid $primary;
        color: $primary;
        text-style: bold;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    EventsScreen #events-list {
        height: 1fr;
        border: none;
        padding: 0 0;
        background: $background;
    }
    EventsScreen #events-search {
        dock: bottom;
        margin-bottom: 1;
        display: none;
    }
    EventsScreen #events-search.-shown {
        display: block;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back", tooltip="back to the main screen (or end the search)"),
        Binding("f", "next_filter", "filter", tooltip="next filter: all, errors, SLO, outages, "
                "operator, faults"),
        Binding("F", "previous_filter", "filter back", show=False, key_display="F"),
        Binding("slash", "search", "search", key_display="/",
                tooltip="search the events' text"),
        Binding("l", "back", "back", show=False),
    ]

    def __init__(self, log: EventLog, *, jump: Jump | None) -> None:
        """`jump`: seeks a replay to an event (None: a live run, which cannot go back)."""
        super().__init__()
        self.event_log = log
        self.jump = jump
        self.filter: FilterName = "all"
        self.search = ""
        self.shown: list[Logged] = []  # what the list holds, option for option
        self.left_out = 0  # older rows the filter and search keep, beyond ROWS_MAX
        self._generation = -1
        self._taken = 0  # how many of the log's entries the list has seen
        self._search_timer: Timer | None = None
        self._ready = False  # composed and mounted: the list exists

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield Static(id="events-title")
        yield OptionList(id="events-list")
        yield Input(id="events-search", placeholder="search: the events whose text holds "
                    "this (enter: keep it, escape: clear)")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._ready = True
        self.query_one(OptionList).focus()
        self.take_new()
        # the header is the app's to draw, at its next refresh: now, not at the next news
        redraw = getattr(self.app, "redraw_now", None)
        if callable(redraw):
            redraw()

    @property
    def options(self) -> OptionList:
        return self.query_one("#events-list", OptionList)

    # ---- the rows --------------------------------------------------------------------------

    def take_new(self) -> None:
        """Add the log's new events (all of them again after a rewind); the view stays at
        the bottom when it was there, so the newest keep coming into sight."""
        if not self._ready:  # pushed, not composed yet: on_mount takes them
            return
        log = self.event_log
        if log.generation != self._generation:
            self._rebuild()
            return
        fresh = [x for x in log.entries[self._taken:] if matches(x, self.filter, self.search)]
        self._taken = len(log.entries)
        if len(self.shown) + len(fresh) > ROWS_MAX * 3 // 2:  # trimmed now and then, not per row
            self._rebuild()
            return
        if fresh:
            at_end = self._at_end()
            self._append(fresh)
            if at_end:
                self.options.highlighted = len(self.shown) - 1
        self._title()

    def _rebuild(self) -> None:
        options = self.options
        old = options.highlighted
        was_end = self._at_end()
        self._generation = self.event_log.generation
        self._taken = len(self.event_log.entries)
        self.shown = []
        options.clear_options()
        kept = [x for x in self.event_log.entries if matches(x, self.filter, self.search)]
        self.left_out = max(0, len(kept) - ROWS_MAX)
        self._append(kept[self.left_out:])
        if self.shown:
            options.highlighted = (len(self.shown) - 1 if was_end or old is None
                                   else min(old, len(self.shown) - 1))
        self._title()

    def _append(self, entries: list[Logged]) -> None:
        self.shown += entries
        # Content from markup: the event's text is literal() inside it, never markup itself
        self.options.add_options([Option(row_content(x)) for x in entries])

    def _at_end(self) -> bool:
        highlighted = self.options.highlighted
        return highlighted is None or highlighted >= len(self.shown) - 1

    def _title(self) -> None:
        total = len(self.event_log) + self.event_log.dropped
        kept = len(self.shown) + self.left_out
        parts = [f"Events · {kept:,} of {total:,}" if kept != total else f"Events · {total:,}"]
        if self.left_out:
            parts.append(f"the newest {len(self.shown):,} listed (f, / narrow)")
        parts.append(f"f: {FILTER_TITLES[self.filter]}")
        if self.search:
            parts.append(f'/ "{self.search}"')
        if self.jump is not None:
            parts.append("enter: the replay to it")
        if self.event_log.dropped:
            parts.append(f"the oldest {self.event_log.dropped:,} let go: events.jsonl has them")
        self.query_one("#events-title", Static).update(Content(" · ".join(parts)))

    @property
    def plain_rows(self) -> list[str]:
        """The rows as shown, in words (for tests)."""
        return [str(self.options.get_option_at_index(i).prompt)
                for i in range(self.options.option_count)]

    # ---- keys ------------------------------------------------------------------------------

    def _set_filter(self, step: int) -> None:
        self.filter = FILTERS[(FILTERS.index(self.filter) + step) % len(FILTERS)]
        self._rebuild()

    def action_next_filter(self) -> None:
        self._set_filter(1)

    def action_previous_filter(self) -> None:
        self._set_filter(-1)

    def action_search(self) -> None:
        box = self.query_one("#events-search", Input)
        box.add_class("-shown")
        box.focus()

    def action_back(self) -> None:
        box = self.query_one("#events-search", Input)
        if box.has_class("-shown"):  # escape ends the search first, then leaves
            box.remove_class("-shown")
            box.value = ""
            self.options.focus()
            return
        self.dismiss(None)

    @on(Input.Changed, "#events-search")
    def _searched(self, _event: Input.Changed) -> None:
        # once typing pauses: each rebuild filters every event of the run
        if self._search_timer is not None:
            self._search_timer.stop()
        self._search_timer = self.set_timer(SEARCH_PAUSE_S, self._apply_search)

    def _apply_search(self) -> None:
        self._search_timer = None
        value = self.query_one("#events-search", Input).value
        if value != self.search:
            self.search = value
            self._rebuild()

    @on(Input.Submitted, "#events-search")
    def _search_kept(self, _event: Input.Submitted) -> None:
        self._apply_search()
        self.options.focus()  # the search stays; the arrows move in its rows

    @on(OptionList.OptionSelected, "#events-list")
    async def _selected(self, event: OptionList.OptionSelected) -> None:
        entry = self.shown[event.option_index]
        if self.jump is None:
            self.notify("a live run cannot go back in time: `tokentop replay DIR` can",
                        timeout=4)
            return
        if entry.elapsed is None:
            self.notify("this event came before the recording's first Snapshot", timeout=4)
            return
        await self.jump(entry)
