"""The top line: run state, elapsed, load mode, engine, what we are pointed at, any source error.

In a replay it first says so, at what speed, whether the replay itself is paused, and
where it is in the recording (position / length); the run's own state is then labelled
"recorded: …" so that a paused recording is not taken for a paused replay."""

from __future__ import annotations

from textual.widgets import Static

from loadgen.model import units
from loadgen.model.kinds import SourceKind
from loadgen.model.snapshot import Snapshot
from loadgen.model.source import ReplayStatus
from tui.format import MUTED, first_fit, literal, tidy

STATE_COLOURS = {
    "running": "$success",
    "starting": "$primary",
    "paused": "$warning",
    "draining": "$warning",
    "stopped": "$foreground-muted",
    "error": "$error",
    "outage": "$error",
    "interrupted": "$error",
    "recording stopped": "$error",
}


def state_badge(state: str, label: str = "") -> str:
    colour = STATE_COLOURS.get(state, "$foreground")
    style = f"b reverse {colour}" if state == "outage" else f"b {colour}"
    return f"[{style}]● {literal(label + state)}[/]"


def fmt_clock(seconds: float, hours: bool) -> str:
    """m:ss, or h:mm:ss (both sides of position / length alike, so they line up)."""
    total = max(0, int(seconds))
    if hours:
        return units.elapsed(total)
    return f"{total // 60}:{total % 60:02d}"


def replay_markup(replay: ReplayStatus, elapsed: float) -> str:
    """`replay ×10  replay paused  1:44 / 5:52  end`: the replay's own state, apart from
    the recorded run's. `elapsed` is the Snapshot on screen (the position drawn)."""
    speed = "max" if replay.speed <= 0 else f"{replay.speed:g}"
    out = f"[b $accent]replay ×{speed}[/]"
    if replay.paused:
        out += "  [b reverse $warning] replay paused [/]"
    hours = replay.length >= 3600
    out += f"  {fmt_clock(elapsed, hours)} [{MUTED}]/[/] {fmt_clock(replay.length, hours)}"
    if replay.at_end and not replay.following:
        out += f"  [{MUTED}]end[/]"
    return out


def host_port(url: str) -> str:
    """The address of a URL without its scheme and path: 127.0.0.1:8000."""
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0] or url


def trouble(snap: Snapshot) -> str:
    """What loadgen.model.outage judges short of an outage: errors among successes, and
    streams that receive nothing (a frozen server)."""
    load = snap.load
    out = "  [b $warning]degraded[/]" if load.health == "degraded" else ""
    if load.stalled:
        out += f"  [b $warning]{load.stalled} of {load.in_flight} stalled[/]"
    return out


def load_mode(snap: Snapshot) -> str:
    load = snap.load
    if load.mode == "open":
        rate = "?" if load.target_rate is None else f"{load.target_rate:g}"
        return f"open {rate} req/s"
    return f"closed c={load.target_concurrency}"


def header_markup(
    snap: Snapshot | None,
    *,
    description: str,
    ended: bool,
    error: str | None,
    outage: bool = False,
    source_kind: SourceKind = "live",
    replay: ReplayStatus | None = None,
    width: int = 10**6,
) -> str:
    """State first: on a narrow terminal the URL is what gets cut, not the run state."""
    state = "error" if error and snap is None else "stopped" if ended else None
    if snap is None:
        badge = state_badge(state or "starting")
        line = f"[b]tokentop[/]  {badge}  [{MUTED}]{literal(description)}[/]"
    else:
        run_state = state or ("outage" if outage else snap.load.state)
        if replay is not None and replay.at_end and replay.ended not in (None, "finished") \
                and state is None:
            run_state = replay.ended  # the reader knows: "interrupted", "recording stopped"
        # what a replay shows is the recorded run's state; the console's own is unlabelled
        label = "recorded: " if source_kind == "replay" and state is None else ""
        sim = "  [b $accent]simulated[/]" if snap.target.simulated else ""
        warm = "  [b $warning]warm-up[/]" if snap.load.warmup else ""
        warm += trouble(snap) if not ended else ""
        engine = snap.server.engine if snap.server is not None and snap.server.engine else None
        eng = f"  [{MUTED}]engine[/] {literal(engine)}" if engine else ""
        # a replay or a fleet agent says so first: nobody should take it for a live run here
        tag = f"[b $accent]{source_kind}[/]  " if source_kind != "live" else ""
        elapsed = f"  {units.elapsed(snap.elapsed)}"
        if replay is not None:  # its position / length replaces the elapsed time
            tag, elapsed = f"{replay_markup(replay, snap.elapsed)}  ", ""
        head = (f"[b]tokentop[/]  {tag}{state_badge(run_state, label)}"
                f"{elapsed}  [{MUTED}]{literal(load_mode(snap))}[/]{warm}{sim}")
        model = f"[b]{literal(snap.target.model)}[/]"
        engine_name = f"  {literal(engine)}" if engine else ""
        url, short_url = literal(snap.target.url), literal(host_port(snap.target.url))
        # narrow: the words go first, then the URL's scheme and path; the address stays
        line = first_fit(
            width,
            f"{head}{eng}  {model} [{MUTED}]@[/] {url}",
            f"{head}{engine_name}  {model} [{MUTED}]@[/] {url}",
            f"{head}{engine_name}  {model} [{MUTED}]@[/] {short_url}",
            f"{head}  {model} [{MUTED}]@[/] {short_url}",
            f"{head}  {model}",
        )
    if error:
        line += f"\n[b $error]✖ {literal(error)}[/]"
    return line


class HeaderBar(Static):
    DEFAULT_CSS = """
    HeaderBar {
        dock: top;
        height: auto;
        padding: 0 1;
        background: $panel;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, description: str = "", *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self._markup: str | None = None
        self.show(None, description=description)

    def show(
        self,
        snap: Snapshot | None,
        *,
        description: str,
        ended: bool = False,
        error: str | None = None,
        outage: bool = False,
        source_kind: SourceKind = "live",
        replay: ReplayStatus | None = None,
    ) -> None:
        markup = header_markup(snap, description=description, ended=ended, error=error,
                               outage=outage, source_kind=source_kind, replay=replay,
                               width=self.content_size.width or 10**6)
        if markup != self._markup:
            # a layout pass only when the header's height changes (an error line comes or
            # goes): the clock changes the text every second, not the height
            lines = markup.count("\n")
            self.update(tidy(markup), layout=self._markup is None
                        or lines != self._markup.count("\n"))
            self._markup = markup
