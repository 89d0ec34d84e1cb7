"""The tokentop console: draws Snapshots from a SnapshotSource and sends Control messages back.

The app never measures anything. Load runs elsewhere (worker processes, a
replay, a fleet agent); this process only reads Snapshots, folds them into
windows, and redraws at most once per `refresh` seconds, so a slow terminal
or a slow SSH link can never show up as inter-token latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Grid
from textual.screen import Screen
from textual.widgets import Footer

from loadgen.snapshot import Control, Snapshot
from loadgen.source import SnapshotSource, SourceError
from loadgen.windows import SnapshotWindows
from themes import DEFAULT_THEME, MONO_THEME, THEME_NAMES, register_themes
from tui.help_screen import HelpScreen
from tui.widgets import (
    GpuPanel,
    HeaderBar,
    HostPanel,
    LatencyPanel,
    LoadPanel,
    Panel,
    ThroughputPanel,
    View,
)

# the windows the panels read; computed once per refresh, shared by all panels
SHOWN_WINDOWS = ("10s", "1m", "run")
# how long `q` waits for in-flight requests to drain before it gives up and exits
CLOSE_TIMEOUT_S = 30.0

CONCURRENCY_KEYS: tuple[tuple[str, str, int], ...] = (
    ("plus", "+", 1),
    ("minus", "-", -1),
    ("right_square_bracket", "]", 10),
    ("left_square_bracket", "[", -10),
)


def _concurrency_binding(key: str, display: str, step: int) -> Binding:
    return Binding(
        key,
        f"add_concurrency({step})",
        f"{step:+d}".replace("-", "−"),
        key_display=display,
        tooltip=f"concurrency {step:+d}",
    )


def pick_theme(requested: str | None, no_color: bool) -> str:
    if requested:
        return requested
    return MONO_THEME if no_color else DEFAULT_THEME


class TokentopApp(App[None]):
    # absolute, so that a subclass in another module (a test, a plugin) still finds it
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "tokentop"
    # the grid reflows from two columns to three; tall screens show the 1 m latency too
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-short"), (36, "-tall")]
    BINDINGS: ClassVar[list[BindingType]] = [
        *(_concurrency_binding(*k) for k in CONCURRENCY_KEYS),
        Binding("question_mark", "help", "Help", key_display="?", tooltip="this help"),
        Binding("q", "quit", "Quit", tooltip="stop the load cleanly and quit"),
    ]

    def __init__(
        self, source: SnapshotSource, *, theme: str | None = None, refresh: float = 0.5
    ) -> None:
        # Textual removes NO_COLOR from the environment in App.__init__: read it first
        no_color = bool(os.environ.get("NO_COLOR"))
        super().__init__()
        self.source = source
        self.refresh_s = refresh
        self.windows = SnapshotWindows()
        register_themes(self)
        self._requested_theme = pick_theme(theme, no_color)
        self.theme = (
            self._requested_theme if self._requested_theme in self.available_themes
            else DEFAULT_THEME
        )
        self.error: str | None = None
        self.ended = False  # the source's iterator finished (or failed)
        self.drawn_seq: int | None = None  # seq of the Snapshot on screen, for tests and debugging
        self._dirty = False
        self._quitting = False
        self._source_closed = False

    # ---------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield HeaderBar(self._description(), id="header")
        with Grid(id="panels"):
            yield LoadPanel(id="load")
            yield LatencyPanel(id="latency")
            yield ThroughputPanel(id="throughput")
            yield HostPanel(id="host")
            yield GpuPanel(id="gpu")
        yield Footer()

    def on_mount(self) -> None:
        if self._requested_theme != self.theme:
            self.notify(
                f"unknown theme {self._requested_theme!r}; using {self.theme}. "
                f"Themes: {', '.join(THEME_NAMES)}",
                severity="warning",
            )
        self.set_interval(self.refresh_s, self._refresh_screen, name="refresh")
        self._consume()

    def _description(self) -> str:
        return getattr(self.source, "description", "") or ""

    # --------------------------------------------------------------- source

    @work(exclusive=True, exit_on_error=False, group="source")
    async def _consume(self) -> None:
        """Start the source and fold every Snapshot into the windows; drawing happens on a timer."""
        try:
            await self.source.start()
            async for snap in self.source.snapshots():
                self._take(snap)
        except SourceError as exc:
            self._fail(str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any other failure is shown in words, never as a traceback
            self._fail(f"source failed: {type(exc).__name__}: {exc}")
        self.ended = True
        self._dirty = True
        self._refresh_screen()

    def _take(self, snap: Snapshot) -> None:
        self.windows.add(snap)
        self._dirty = True

    def _fail(self, message: str) -> None:
        self.error = message
        self.notify(message, title="source error", severity="error", timeout=10)

    # -------------------------------------------------------------- drawing

    def _refresh_screen(self) -> None:
        """Redraw every panel in one batch, only if something new arrived since the last draw."""
        if not self._dirty:
            return
        self._dirty = False
        snap = self.windows.last
        header = self.query_one(HeaderBar)
        with self.batch_update():
            header.show(snap, description=self._description(), ended=self.ended, error=self.error)
            if snap is not None:
                view = View(snap=snap, stats={w: self.windows.stats(w) for w in SHOWN_WINDOWS})
                for panel in self.query(Panel):
                    panel.show(view)
                self.drawn_seq = snap.seq

    # -------------------------------------------------------------- actions

    async def action_add_concurrency(self, step: int) -> None:
        msg = Control(op="add_concurrency", value=float(step), source="key")
        try:
            await self.source.control(msg)
        except Exception as exc:  # a refused control is news for the operator, not a crash
            self.notify(f"concurrency {step:+d} failed: {exc}", severity="error")
            return
        self.notify(f"concurrency {step:+d}", timeout=2)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.BINDINGS))

    async def action_quit(self) -> None:
        """Stop the load cleanly, then exit; a second `q` while draining exits at once."""
        if self._quitting:
            self.exit()
            return
        self._quitting = True
        self.notify("stopping the load…", timeout=CLOSE_TIMEOUT_S)
        await self._close_source()
        self.exit()

    async def _close_source(self) -> None:
        if self._source_closed:
            return
        self._source_closed = True
        # exiting anyway: the user asked to leave, and a failed drain must not trap them
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.source.close(), CLOSE_TIMEOUT_S)

    async def on_unmount(self) -> None:
        # any other way out (ctrl+c, a crash in Textual) still stops the load
        await self._close_source()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Put the console's own keys in the command palette beside Textual's (whose "Quit" is
        our action_quit, so it drains the load too)."""
        yield from super().get_system_commands(screen)
        for _key, display, step in CONCURRENCY_KEYS:
            yield SystemCommand(
                f"Concurrency {step:+d}",
                f"Change the target concurrency by {step:+d} (key {display})",
                partial(self.action_add_concurrency, step),
            )
        yield SystemCommand("Help", "List the keys (key ?)", self.action_help)
