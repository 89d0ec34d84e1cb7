"""The tokentop console: draws Snapshots from a SnapshotSource and sends Control messages back.

The app never measures anything. Load runs elsewhere (worker processes, a
replay, a fleet agent); this process only reads Snapshots, folds them into
windows and history rings, and redraws at most once per `refresh` seconds, in
one batch, only the panels whose text changed, so a slow terminal or a slow
SSH link can never show up as inter-token latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Grid
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer

from loadgen.eval.eval_process import WatchesEval
from loadgen.model import units
from loadgen.model.kinds import SourceKind
from loadgen.model.notice import KEYS_TO_STOP, TERMINAL_GONE, Notice
from loadgen.model.slo import SloError, Slos, parse_slos
from loadgen.model.snapshot import (
    Control,
    Counters,
    Event,
    HostSample,
    LoadState,
    Snapshot,
    Target,
    to_json,
)
from loadgen.model.source import RunOutcome, SnapshotSource, SourceError, SourceStatus
from loadgen.model.windows import WINDOWS, SnapshotWindows
from loadgen.worker.distributions import WorkloadError
from loadgen.worker.mix import parse_mix
from themes import DEFAULT_THEME, MONO_THEME, THEME_NAMES, register_themes
from tui.config import load_config, save_setting
from tui.event_log import EventLog, Logged
from tui.events_screen import EventsScreen
from tui.help_screen import HelpScreen
from tui.history import SHOWN_METRICS, History
from tui.screens import DETAIL_SCREENS, DetailScreen, InputModal
from tui.view import View
from tui.widgets import (
    EventsPanel,
    GpuPanel,
    HeaderBar,
    HostPanel,
    LatencyPanel,
    LoadPanel,
    Panel,
    ThroughputPanel,
)
from tui.widgets.events_panel import EVENTS_KEY
from tui.widgets.latency_panel import WINDOW_NAMES
from tui.widgets.phase_strip import PhaseStrip

# the latency windows `w` cycles through
WINDOW_CYCLE = tuple(WINDOWS)  # 10s, 1m, 10m, run
# the windows the panels always read; computed once per refresh, shared by all panels
BASE_WINDOWS = ("10s", "1m", "run")
# how long `q` waits for in-flight requests to drain before it gives up and exits
CLOSE_TIMEOUT_S = 30.0
# after the terminal hangs up: how long the load may take to stop before we exit anyway
HANGUP_CLOSE_S = 3.0
HANGUP_HARD_EXIT_S = 8.0
# a second `q` within this many seconds stops the load and quits
QUIT_CONFIRM_S = 10.0
# the errors the `x` screen lists, newest last
ERRORS_SHOWN = 12
# `m` to open loop: the req/s of at most this long at the load's current setting, and at least
MATCH_SPAN_S = 10.0
MATCH_MIN_S = 1.0

# key, shown key, step: closed loop changes concurrency, open loop changes the rate (req/s)
STEP_KEYS: tuple[tuple[str, str, int], ...] = (
    ("plus", "+", 1),
    ("minus", "-", -1),
    ("right_square_bracket", "]", 10),
    ("left_square_bracket", "[", -10),
)


def _step_binding(key: str, display: str, step: int) -> Binding:
    return Binding(
        key,
        f"step({step})",
        f"{step:+d}".replace("-", "−"),
        key_display=display,
        tooltip=f"concurrency {step:+d} (open loop: rate {step:+d} req/s)",
    )


def _is_error(e: Event) -> bool:
    return e.kind == "error" or e.level == "error"


def terminal_has_colours() -> bool:
    """False for a terminal that says it has fewer than 8 colours (or TERM=dumb)."""
    term = os.environ.get("TERM", "")
    if term == "dumb":
        return False
    try:
        import curses

        curses.setupterm(term or None)
        colours = curses.tigetnum("colors")
    except Exception:  # no terminfo: assume colours rather than guess grey
        return True
    return colours < 0 or colours >= 8


def pick_theme(
    requested: str | None, no_color: bool, remembered: str | None = None
) -> str:
    """--theme wins; then NO_COLOR (or a colourless terminal); then the config file."""
    if requested:
        return requested
    if no_color:
        return MONO_THEME
    return remembered or DEFAULT_THEME


class TokentopApp(App[None]):
    # absolute, so that a subclass in another module (a test, a plugin) still finds it
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "tokentop"
    # the grid reflows from two columns to three; tall screens show the charts
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [
        (0, "-narrow"), (120, "-wide"), (180, "-xwide")
    ]
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-short"), (36, "-tall")]
    # the footer shows as many as fit, in this order: help and quit first, so that they are
    # there at 80 columns (the help screen and the palette list them all)
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "help", key_display="?",
                tooltip="help: the keys, and what the colours mean"),
        Binding("q", "quit", "quit", tooltip="stop the load and quit (asks once if running)"),
        # as q, as in htop and every console: Textual's own ctrl+c only says "press ctrl+q"
        Binding("ctrl+c", "quit('ctrl+c')", "quit", show=False, priority=True,
                key_display="ctrl+c", tooltip="quit, as q (stops the load first)"),
        *(_step_binding(*k) for k in STEP_KEYS),
        Binding("equals_sign", "set_exact", "set", key_display="=",
                tooltip="type an exact concurrency (open loop: rate)"),
        Binding("m", "toggle_mode", "mode", tooltip="switch closed loop / open loop"),
        Binding("p", "pause", "pause", tooltip="pause / resume the load"),
        Binding("a", "auto_ramp", "auto", show=False,
                tooltip="auto-ramp: double the streams while the SLOs hold, settle at the edge"),
        Binding("w", "cycle_window", "window", tooltip="latency window: 10 s, 1 min, 10 min, run"),
        Binding("r", "reset", "reset", show=False, tooltip="reset the windows (start from now)"),
        Binding("t", "cycle_theme", "theme", show=False, tooltip="next theme (remembered)"),
        Binding("e", "mark", "mark", show=False, tooltip="mark an event with a note"),
        Binding("s", "save", "save", show=False,
                tooltip="save a screenshot (SVG) and the Snapshot (JSON)"),
        Binding("d", "detail('distribution')", "dist", show=False,
                tooltip="latency distribution (percentile curve)"),
        Binding("g", "detail('gpus')", "GPUs", show=False, tooltip="per-GPU detail"),
        Binding("x", "detail('errors')", "errors", show=False,
                tooltip="errors by kind, last messages"),
        Binding("v", "detail('snapshot')", "raw", show=False, tooltip="the full Snapshot as text"),
        Binding(EVENTS_KEY, "events", "events", show=False,
                tooltip="every event of the run, whole: filter (f), search (/); in a replay "
                "enter goes to it"),
        # replay keys: in the footer of a replay only (check_action), the load keys hidden
        Binding("1", "replay_speed(1)", "×1", tooltip="replay: real speed"),
        Binding("2", "replay_speed(10)", "×10", tooltip="replay: ten times faster"),
        Binding("3", "replay_speed(100)", "×100", tooltip="replay: a hundred times"),
        Binding("left", "seek_by(-30)", "−30 s", key_display="←", tooltip="replay: back 30 s"),
        Binding("right", "seek_by(30)", "+30 s", key_display="→",
                tooltip="replay: forward 30 s"),
        # p again: the live `pause` binding is off in a replay, so this one takes the key
        Binding("p", "replay_pause", "pause", tooltip="replay: pause / resume the replay"),
    ]

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """A toast, never read as markup: what it says may quote a server, an agent, a file
        (a model id of "[red]x[/red]" is shown as written)."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def __init__(
        self,
        source: SnapshotSource,
        *,
        theme: str | None = None,
        refresh: float = 0.5,
        slo: str | None = None,
        mix: list[str] | None = None,
        save_dir: Path | str | None = None,
    ) -> None:
        # Textual removes NO_COLOR from the environment in App.__init__: read it first
        no_color = bool(os.environ.get("NO_COLOR")) or not terminal_has_colours()
        super().__init__()
        self.source = source
        self.refresh_s = refresh
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.windows = SnapshotWindows()
        self.history = History()
        self.window = "10s"
        self._warnings: list[str] = []
        settings, warning = load_config()
        if warning:
            self._warnings.append(warning)
        remembered = settings.get("theme")
        register_themes(self)
        self._requested_theme = pick_theme(
            theme, no_color, remembered if isinstance(remembered, str) else None
        )
        self.theme = (
            self._requested_theme if self._requested_theme in self.available_themes
            else DEFAULT_THEME
        )
        self.slos: Slos | None = None
        if slo:
            try:
                self.slos = parse_slos(slo)
            except SloError as e:
                self._warnings.append(f"SLOs not shown: {e}")
        self.class_slos = self._class_slos(mix or [])
        self.error: str | None = None
        self.ended = False  # the source's iterator finished (or failed)
        self.drawn_seq: int | None = None  # seq of the Snapshot on screen, for tests and debugging
        # every event given, once (a replay sought back takes back what comes again)
        self.events = EventLog()
        self.error_events: deque[Event] = deque(maxlen=ERRORS_SHOWN)
        self.saved: list[Path] = []
        self._dirty = False
        self._quitting = False
        self._quit_asked_at: float | None = None
        self._source_closed = False
        self._close_timeout = CLOSE_TIMEOUT_S
        self._hangup = False
        # the source's status as last drawn (a change is news: a redraw), and how many of
        # the notices it said have been shown
        self._status: SourceStatus = source.status()
        self._said_shown = 0
        self._waiting_said: str | None = None

    # ---------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield HeaderBar(self._description(), id="header")
        if isinstance(self.source, WatchesEval):  # an eval: where it stands, under the header
            yield PhaseStrip(id="phase-strip")
        with Grid(id="panels"):
            yield LoadPanel(id="load")
            yield LatencyPanel(id="latency")
            yield ThroughputPanel(id="throughput")
            yield HostPanel(id="host")
            yield GpuPanel(id="gpu")
        yield EventsPanel(self.events, id="events")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        if self._requested_theme != self.theme:
            self.notify(
                f"unknown theme {self._requested_theme!r}; using {self.theme}. "
                f"Themes: {', '.join(THEME_NAMES)}",
                severity="warning",
            )
        for warning in self._warnings:
            self.notify(warning, severity="warning", timeout=10)
        self.set_interval(self.refresh_s, self._refresh_screen, name="refresh")
        if not self.is_headless:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_hangup)
        self._consume()

    def _description(self) -> str:
        waiting = self._status.waiting
        if waiting is not None:  # the run's own words, with the console's way out
            return f"{waiting.text}, {KEYS_TO_STOP['console']}"
        return self._status.description

    # --------------------------------------------------------------- source

    @work(exclusive=True, exit_on_error=False, group="source")
    async def _consume(self) -> None:
        """Start the source and fold every Snapshot in; drawing happens on a timer."""
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
        self._ended(self.source.status().outcome)
        self._dirty = True
        self._refresh_screen()

    def _ended(self, outcome: RunOutcome | None) -> None:
        """The run's end, as the run said it (or as its death was seen): an event, and for a
        run that died, the header's error line."""
        if outcome is None:
            return
        died = outcome.ending == "died"
        self._note("run", outcome.reason, level="error" if died else "info")
        if died:
            self._fail(outcome.reason)

    def _took_status(self, status: SourceStatus) -> None:
        """What the source says beside its Snapshots: the wait for the target (the header,
        a notice, the events: once each) and the run's other notices."""
        waiting = status.waiting.text if status.waiting is not None else None
        if waiting is not None and waiting != self._waiting_said:
            self._waiting_said = waiting
            text = f"{waiting}, {KEYS_TO_STOP['console']}"
            self.clear_notifications()
            self.notify(text, severity="warning", timeout=24 * 3600)
            self._note("run", text, level="warn")
        for notice in status.said[self._said_shown:]:
            self._said(notice)
        self._said_shown = len(status.said)

    def _said(self, notice: Notice) -> None:
        if notice.kind == "up":  # the target answers after a wait: the warning is over
            self.clear_notifications()
            self.notify(notice.text, timeout=5)
        self._note("run", notice.text, level="warn" if notice.kind == "warning" else "info")

    def _take(self, snap: Snapshot) -> None:
        """Fold one Snapshot in: windows, history rings, events. No drawing here."""
        last = self.windows.last
        if last is not None and snap.seq < last.seq:
            # a replay sought backwards: what the windows hold is from the future now, and
            # the events from here on come again
            self.windows = SnapshotWindows()
            self.history = History()
            self.events.rewind(snap.seq)
            self._recount_errors()
        self.windows.add(snap)
        self.history.add(snap, self.windows)
        self._add_events(snap.events, snap.seq, snap.elapsed)
        self._dirty = True

    @property
    def outage(self) -> bool:
        """The run says the server is unreachable (LoadState.outage_since)."""
        snap = self.windows.last
        return snap is not None and snap.load.outage_since is not None and not self.ended

    def _add_events(self, events: list[Event], seq: int | None, elapsed: float | None) -> None:
        if not events:
            return
        self.events.add(events, seq, elapsed)
        self.error_events.extend(e for e in events if _is_error(e))

    def _recount_errors(self) -> None:
        """The `x` screen's last errors, from the log as it stands (after a rewind)."""
        newest: list[Event] = []
        for entry in reversed(self.events.entries):
            if _is_error(entry.event):
                newest.append(entry.event)
                if len(newest) == ERRORS_SHOWN:
                    break
        self.error_events = deque(reversed(newest), maxlen=ERRORS_SHOWN)

    def _note(self, kind: str, message: str, level: str = "info", t: float | None = None) -> None:
        """An event the console itself raises (SLO breach, throttling, operator notes),
        logged with the Snapshot on screen."""
        last = self.windows.last
        self._add_events([Event(t=t or time.time(), kind=kind, level=level, message=message)],
                         last.seq if last is not None else None,
                         last.elapsed if last is not None else None)
        self._dirty = True

    def _fail(self, message: str) -> None:
        self.error = message
        self.notify(message, title="source error", severity="error", timeout=10)

    # ---------------------------------------------------------- derived state

    def _class_slos(self, mix: list[str]) -> dict[str, Slos | None]:
        """Each --mix class's SLOs, as its line is judged: its own, else the run's."""
        try:
            classes = parse_mix(mix)
        except WorkloadError as e:
            self._warnings.append(f"class SLOs not shown: {e}")
            return {}
        return {c.name: c.slos() if c.slo else self.slos for c in classes}

    def load_running(self) -> bool:
        snap = self.windows.last
        # a replay's recorded state is not a load this console could stop: q just quits
        if snap is None or self.ended or self._source_closed or self._is_replay():
            return False
        return snap.load.state in ("starting", "running", "draining")

    # -------------------------------------------------------------- drawing

    def redraw_now(self) -> None:
        self._dirty = True
        self._refresh_screen()

    def _refresh_screen(self) -> None:
        """Redraw in one batch, only if something new arrived since the last draw (a
        Snapshot, or news in the source's status)."""
        if not self.is_running:  # shutting down: the screens' widgets are being taken down
            return
        status = self.source.status()
        if status != self._status:
            self._status = status
            self._took_status(status)
            self._dirty = True
        self._show_eval()  # its clocks count down between Snapshots (and between phases)
        if not self._dirty:
            return
        self._dirty = False
        snap = self.windows.last
        # the topmost full screen: a dialog (modal overlay) over it leaves it showing, live
        screen = next(s for s in reversed(self.screen_stack) if not isinstance(s, ModalScreen))
        status = self._status
        with self.batch_update():
            view = None
            if snap is not None:
                names = dict.fromkeys((*BASE_WINDOWS, self.window))
                stats = {w: self.windows.stats(w, SHOWN_METRICS) for w in names}
                view = View(
                    snap=snap, stats=stats, window=self.window, history=self.history,
                    slos=self.slos, outage=self.outage,
                    dense=self.windows.dense(self.window),
                    error_events=tuple(self.error_events),
                    classes={n: w.stats(self.window, SHOWN_METRICS)
                             for n, w in self.windows.classes.items()},
                    class_slos=self.class_slos,
                )
            self.screen_stack[0].query_one(EventsPanel).show_log()
            for header in screen.query(HeaderBar):
                header.show(snap, description=self._description(), source_kind=status.kind,
                            ended=self.ended, error=self.error, outage=self.outage,
                            replay=status.replay)
            if isinstance(screen, DetailScreen):
                screen.draw(view)
            elif isinstance(screen, EventsScreen):
                screen.take_new()
            elif view is not None and screen is self.screen_stack[0]:
                for panel in screen.query(Panel):
                    panel.show(view)
            elif status.waiting is not None and status.waiting.host is not None \
                    and screen is self.screen_stack[0]:
                for panel in screen.query(HostPanel):
                    panel.show(self._host_view(status.waiting.host))
            if snap is not None:
                self.drawn_seq = snap.seq

    def _show_eval(self) -> None:
        if isinstance(self.source, WatchesEval):
            for strip in self.screen_stack[0].query(PhaseStrip):
                strip.show(self.source.eval_progress())

    def _eval_running(self) -> bool:
        """An eval under way: between its phases too, when no load runs."""
        if not isinstance(self.source, WatchesEval) or self.ended or self._source_closed:
            return False
        progress = self.source.eval_progress()
        return progress is None or progress.state == "running"

    def _host_view(self, host: HostSample) -> View:
        """A view with only the host in it, while no Snapshot has come (the run waits for its
        target and sends the host meanwhile): the host panel's, not the run's."""
        snap = Snapshot(run_id="", seq=-1, t=time.time(), elapsed=0.0, interval=0.0,
                        target=Target(url="", model=""), load=LoadState(),
                        counters=Counters(), host=host)
        return View(snap=snap, stats={}, window=self.window)

    def on_screen_resume(self) -> None:
        self.redraw_now()

    # -------------------------------------------------------------- actions

    @property
    def run_dir(self) -> Path | None:
        """Where the run records, as the source says (None: not recorded, or not yet)."""
        run_dir = self.source.status().run_dir
        return Path(run_dir) if run_dir is not None else None

    def _open_loop(self) -> bool:
        snap = self.windows.last
        return snap is not None and snap.load.mode == "open"

    async def _send(self, msg: Control, done: str | None) -> bool:
        try:
            await self.source.control(msg)
        except Exception as exc:  # a refused control is news for the operator, not a crash
            self.notify(f"{msg.op} failed: {exc}", severity="error")
            return False
        if done:
            self.notify(done, timeout=2)
        return True

    async def action_step(self, step: int) -> None:
        if self._open_loop():
            await self._send(Control(op="add_rate", value=float(step), source="key"),
                             f"rate {step:+d} req/s")
        else:
            await self._send(Control(op="add_concurrency", value=float(step), source="key"),
                             f"concurrency {step:+d}")

    # kept for scripts and the palette of older versions
    async def action_add_concurrency(self, step: int) -> None:
        await self._send(Control(op="add_concurrency", value=float(step), source="key"),
                         f"concurrency {step:+d}")

    def action_set_exact(self) -> None:
        open_loop = self._open_loop()
        what = "rate (requests per second)" if open_loop else "concurrency (streams)"
        snap = self.windows.last
        current = ""
        if snap is not None:
            current = (f"{snap.load.target_rate or 0:g}" if open_loop
                       else str(snap.load.target_concurrency))

        def check(text: str) -> str | None:
            try:
                value = float(text)
            except ValueError:
                return f"{text!r} is not a number"
            if value < 0 or value != value or value == float("inf"):
                return "must be a number of 0 or more"
            if not open_loop and not value.is_integer():
                return "concurrency is a whole number of streams"
            return None

        async def apply(text: str | None) -> None:
            if text is None:
                return
            value = float(text)
            op = "set_rate" if open_loop else "set_concurrency"
            shown = f"rate {value:g} req/s" if open_loop else f"concurrency {value:.0f}"
            await self._send(Control(op=op, value=value, source="key"), shown)

        self.push_screen(
            # empty, the current value as placeholder: typing starts a new number, enter alone
            # changes nothing
            InputModal(f"Set {what}", f"a number (now {current or 'unset'})", check,
                       placeholder=current, keep_empty=True),
            apply,
        )

    async def action_toggle_mode(self) -> None:
        """Switch loop mode at the load level the run has now, not the other mode's old
        setting: closed → open at the measured req/s, open → closed at the requests in flight."""
        to_open = not self._open_loop()
        new = "open" if to_open else "closed"
        level, how = self._matching_level(to_open)
        done = f"switching to {new} loop"
        if level is not None:
            op = "set_rate" if to_open else "set_concurrency"
            if not await self._send(Control(op=op, value=level, source="key"), None):
                return
            done += f" at {level:g} req/s ({how})" if to_open else f" at {level:g} streams ({how})"
        elif how:
            done += f" ({how})"
        await self._send(Control(op="set_mode", note=new, source="key"), done)

    def _matching_level(self, to_open: bool) -> tuple[float | None, str]:
        """The other mode's setting for the load as it runs, and how it was found, in words:
        the req/s of the last 10 s at the load's current setting (since it last changed, was
        paused or resumed: a rate across a paused or c=0 stretch is of no setting), or the
        streams in flight; None when nothing was measured yet."""
        snap = self.windows.last
        if snap is None:
            return None, ""
        if to_open:
            rate, seconds = self.windows.setting_rate(MATCH_SPAN_S)
            if not rate or seconds < MATCH_MIN_S:
                return None, "no rate measured at this load yet: the open loop keeps its own"
            return round(rate, 1), f"measured over the last {units.duration(seconds)} at this load"
        if not snap.load.in_flight:
            return None, ""
        return float(max(1, snap.load.in_flight)), "the requests in flight"

    async def action_replay_speed(self, factor: float) -> None:
        if self._is_replay():
            await self._send(Control(op="replay_speed", value=factor, source="key"),
                             f"replay speed ×{factor:g}")
            self.redraw_now()  # the header's ×N, even while paused (no Snapshot comes)

    async def action_seek_by(self, seconds: float) -> None:
        if not self._is_replay():
            return
        replay = self.source.status().replay
        if seconds > 0 and replay is not None and replay.at_end:
            self.notify("at the end of the recording", timeout=2)
            return
        await self._send(Control(op="seek_by", value=seconds, source="key"),
                         f"seek {seconds:+g} s")

    async def action_replay_pause(self) -> None:
        """The replay's own pause, whatever the recorded run was doing at that point."""
        replay = self.source.status().replay
        if replay is not None and replay.paused:
            await self._send(Control(op="resume", source="key"), "replay resumed")
        else:
            await self._send(Control(op="pause", source="key"), "replay paused")
        self.redraw_now()  # the header says "replay paused" now, not at the next Snapshot

    # a replay cannot change the load: these only toast there, so they leave its footer
    LOAD_ACTIONS = frozenset({"step", "add_concurrency", "set_exact", "toggle_mode", "pause",
                              "auto_ramp", "mark"})
    REPLAY_ACTIONS = frozenset({"replay_speed", "seek_by", "replay_pause"})

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Replay keys in a replay, load keys otherwise but in an eval (False: off and out of
        the footer; `p` then falls through to the binding that is on)."""
        if action in self.REPLAY_ACTIONS:
            return self._is_replay()
        if action in self.LOAD_ACTIONS:  # an eval's load is its plan's
            return not self._is_replay() and not isinstance(self.source, WatchesEval)
        return True

    @property
    def source_kind(self) -> SourceKind:
        return self._status.kind

    def _is_replay(self) -> bool:
        return self.source_kind == "replay"

    async def action_auto_ramp(self) -> None:
        # without --slo the run judges by the knee of the throughput curve: say so up front
        judged = ("while the SLOs hold" if self.slos is not None else
                  "while throughput rises (no --slo: judged by the throughput knee)")
        await self._send(Control(op="auto_ramp", source="key"),
                         f"auto-ramp: climbing {judged} (any load key stops it)")

    async def action_pause(self) -> None:
        snap = self.windows.last
        if snap is not None and snap.load.state == "paused":
            await self._send(Control(op="resume", source="key"), "resuming the load")
        else:
            await self._send(Control(op="pause", source="key"), "pausing the load")

    def action_cycle_window(self) -> None:
        i = WINDOW_CYCLE.index(self.window)
        self.window = WINDOW_CYCLE[(i + 1) % len(WINDOW_CYCLE)]
        self.notify(f"latency window: {WINDOW_NAMES[self.window]}", timeout=2)
        self.redraw_now()

    def action_reset(self) -> None:
        self.windows.reset()
        self.history.reset()
        self._note("operator", "windows reset (r): statistics start from now")
        self.notify("windows reset", timeout=2)
        self.redraw_now()

    def action_cycle_theme(self) -> None:
        i = THEME_NAMES.index(self.theme) if self.theme in THEME_NAMES else -1
        self.theme = THEME_NAMES[(i + 1) % len(THEME_NAMES)]
        warning = save_setting("theme", self.theme)
        if warning:
            self.notify(warning, severity="warning")
        else:
            self.notify(f"theme {self.theme}", timeout=2)

    def action_mark(self) -> None:
        async def apply(text: str | None) -> None:
            if text is not None:
                await self._send(Control(op="mark", note=text, source="key"), f"marked: {text}")

        self.push_screen(
            InputModal("Mark an event", "a note for the log (may be empty)", lambda _t: None),
            apply,
        )

    def action_save(self) -> None:
        # beside the run's own record when there is one, not wherever the shell happened to be
        folder = self.save_dir or self.run_dir or Path.cwd()
        stem = f"tokentop-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            svg = Path(self.save_screenshot(filename=f"{stem}.svg", path=str(folder)))
            paths = [svg]
            snap = self.windows.last
            if snap is not None:
                js = folder / f"{stem}.json"
                js.write_bytes(to_json(snap))
                paths.append(js)
        except OSError as e:
            self.notify(f"cannot save in {folder}: {e.strerror or e}", severity="error")
            return
        self.saved.extend(paths)
        self.notify("saved " + " and ".join(str(p) for p in paths), timeout=6)

    def action_detail(self, name: str) -> None:
        kind = DETAIL_SCREENS[name]
        if isinstance(self.screen, kind):
            return
        if isinstance(self.screen, DetailScreen):
            self.pop_screen()
        self.push_screen(kind())

    def action_events(self) -> None:
        if not isinstance(self.screen, EventsScreen):
            self.push_screen(EventsScreen(self.events,
                                          jump=self._jump_to if self._is_replay() else None))

    async def _jump_to(self, entry: Logged) -> None:
        """Enter on an event in a replay: the replay goes to the Snapshot that carried it,
        and the main screen shows the run as it was then."""
        assert entry.elapsed is not None
        at = units.elapsed(entry.elapsed)
        sent = await self._send(Control(op="seek", value=entry.elapsed, source="key"),
                                f"replay: to {at} ({units.clock(entry.event.t)})")
        if sent and isinstance(self.screen, EventsScreen):
            self.pop_screen()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.BINDINGS))

    async def action_quit(self, key: str = "q") -> None:
        """Stop the load cleanly, then exit. While load runs, the first `q` (or ctrl+c: the
        same) only asks; a `q` while draining exits at once."""
        if self._quitting:
            self.exit()
            return
        now = time.monotonic()
        asked = self._quit_asked_at is not None and now - self._quit_asked_at < QUIT_CONFIRM_S
        if (self.load_running() or self._eval_running()) and not asked:
            self._quit_asked_at = now
            what = (f"the eval is running: press {key} again to stop it (the same --out "
                    "resumes it) and quit" if self._eval_running() else
                    f"load is running: press {key} again to stop it and quit")
            self.notify(what, severity="warning", timeout=QUIT_CONFIRM_S)
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
            if self._hangup:  # the run records why it stopped: nobody pressed q
                await self.source.control(Control(op="stop", source="key", note=TERMINAL_GONE))
            await asyncio.wait_for(self.source.close(), self._close_timeout)

    def _on_hangup(self) -> None:
        """The terminal went away (SSH dropped, tmux killed): stop the load quickly and exit.
        A watchdog makes sure the process is gone within seconds whatever happens."""
        if self._hangup:
            return
        self._hangup = True
        self._close_timeout = HANGUP_CLOSE_S

        def hard_exit() -> None:
            time.sleep(HANGUP_HARD_EXIT_S)
            os._exit(129)

        threading.Thread(target=hard_exit, name="hangup-watchdog", daemon=True).start()
        self.exit(return_code=129)

    async def on_unmount(self) -> None:
        # any other way out (ctrl+c, a crash in Textual, a hang-up) still stops the load
        await self._close_source()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The console's own keys in the command palette beside Textual's, made from
        BINDINGS (one list: a key added there is in the palette too), only those that are
        on here (a replay's keys in a replay, the load's otherwise). Textual's own "Quit" is
        our action_quit, so it drains the load too."""
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            name = binding.action.partition("(")[0]
            if name == "quit" or not binding.tooltip or not self.check_action(name, ()):
                continue
            key = binding.key_display or binding.key
            title = binding.tooltip[0].upper() + binding.tooltip[1:]
            yield SystemCommand(title, f"key {key}", partial(self.run_action, binding.action))
