"""Where a session's Snapshots go besides the recording: progress lines and MQTT (here), the
Prometheus endpoint (loadgen.run.prometheus, --prometheus-port).

A sink is told when the run has started (with a RunHandle: what it may know of the run
and ask of it, not the whole Session), sees every Snapshot (after the watch and the
recorder, so it sees the same events they do), may add its own part to the summary,
and is closed last. The console's pipe is a sink too (loadgen.run.run_process).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from loadgen.fleet.link import PASSWORD_ENV, BrokerError, BrokerSettings, parse_broker_url
from loadgen.fleet.remote import LoadNow, RemoteCaps, RemoteControl
from loadgen.model.notice import Notice, Say
from loadgen.model.snapshot import Control, Snapshot
from loadgen.model.windows import SnapshotWindows
from loadgen.run.config import FleetFrom, PublishTo
from loadgen.run.summary import progress_line

if TYPE_CHECKING:
    from loadgen.fleet.publisher import SnapshotPublisher


@dataclass(frozen=True)
class RunHandle:
    """What a sink may know of the run it serves, and ask of it."""

    run_id: str
    control: Callable[[Control], Awaitable[None]]  # steer the load (remote control)
    load_now: Callable[[], LoadNow]  # the load as it is set now (remote control's limits)
    mqtt_status: Callable[[], str] | None = None  # the MQTT link, for the progress line


class Sink(Protocol):
    async def start(self, run: RunHandle) -> None:
        """The target answered and the load is starting; raise SinkError to refuse."""

    def take(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        """One tick; must not block (the next tick is due)."""

    def finish(self, summary: dict) -> None:
        """The run is over: add this sink's part to the summary, if it has one."""

    async def close(self) -> None:
        """Release everything."""


class SinkError(Exception):
    """A sink cannot start; str(e) is the message for the user."""


# info events a headless run also prints as they happen: the good news after a bad one
# (a recovery ends an outage, a "stall over" a stall)
PRINTED_INFO = ("recovery", "stall", "slo", "gpu")


class ProgressLines:
    """A progress line every `every` seconds of the run (and every warning or error event
    as it happens, with the recoveries that end them). While the target is not up
    (loadgen.model.outage) the line says so at its end: how long the outage has lasted, or
    that it is degraded, and how many streams are stalled."""

    def __init__(self, say: Say, every: float = 1.0) -> None:
        self.say = say
        self.every = every
        self.suffix: Callable[[], str] | None = None
        self._last_period = -1

    async def start(self, run: RunHandle) -> None:
        self.suffix = run.mqtt_status  # an agent's line says how MQTT is doing

    def take(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        for ev in snap.events:
            if ev.level != "info":
                self.say(Notice("event", f"{ev.level}: {ev.message}"))
            elif ev.kind in PRINTED_INFO:
                self.say(Notice("event", ev.message))
        # the period the line falls in (rounded): int() would print the ticks at 0.5 s and
        # 1 s both as "[1s]"
        period = round(snap.elapsed / self.every)
        if period > self._last_period or snap.load.state == "stopped":
            self._last_period = period
            line = progress_line(snap, windows.stats("10s")) + health_text(snap)
            self.say(Notice("progress", f"{line} | {self.suffix()}" if self.suffix else line))

    def finish(self, summary: dict) -> None:
        pass

    async def close(self) -> None:
        pass


def health_text(snap: Snapshot) -> str:
    """The progress line's tail while the target is not up; nothing while it is."""
    ld = snap.load
    stalled = f" | {ld.stalled} of {ld.in_flight} stalled" if ld.stalled else ""
    if ld.health == "outage" and ld.outage_since is not None:
        return f" | OUTAGE for {snap.t - ld.outage_since:.0f} s{stalled}"
    if ld.health == "degraded":
        return f" | degraded{stalled}"
    return stalled


def broker_settings(p: PublishTo | FleetFrom, password: str | None) -> BrokerSettings:
    """The broker of `p`, with the password that travelled apart from it."""
    settings = parse_broker_url(p.broker)
    settings.password = password
    settings.ca_file, settings.cert_file, settings.key_file = p.ca_file, p.cert_file, p.key_file
    settings.keepalive = p.keepalive
    return settings


class Publish:
    """Every Snapshot to `tokentop/<fleet>/<name>/` (loadgen.fleet.publisher), with remote
    control when the agent allows it."""

    FIRST_CONNECT_WAIT_S = 5.0  # at start, how long the first connect may take to be judged

    def __init__(self, p: PublishTo, password: str | None, say: Say) -> None:
        self.p = p
        self.say = say
        try:
            self.settings = broker_settings(p, password)
        except BrokerError as e:
            raise SinkError(str(e)) from None
        self.publisher: SnapshotPublisher | None = None

    async def start(self, run: RunHandle) -> None:
        # the publisher (aiomqtt, paho) is loaded only by a run that publishes
        from loadgen.fleet.publisher import SnapshotPublisher

        p = self.p
        caps = RemoteCaps(p.max_concurrency, p.max_rate) if p.remote_control else None
        remote = RemoteControl(agent=p.name, caps=caps, apply=run.control, load=run.load_now)
        try:
            self.publisher = SnapshotPublisher(
                self.settings, fleet=p.fleet, agent=p.name, backlog=p.backlog,
                remote_control=p.remote_control,
                max_concurrency=p.max_concurrency if p.remote_control else None,
                on_control=remote.handle, max_backoff=p.max_backoff,
                on_state=self._on_state, run_id=run.run_id,
            )
        except BrokerError as e:
            raise SinkError(str(e)) from None
        remote.reply_to = self.publisher.reply
        await self.publisher.start()
        # credentials the broker refuses at start are a configuration error, not an outage: the
        # run does not start. A broker that does not answer (yet) is an outage: the run goes on.
        link = self.publisher.link
        if await link.first_outcome(self.FIRST_CONNECT_WAIT_S) and link.refused_at_start:
            await self.close()
            s = self.settings
            who = f"user {s.username!r}" if s.username else "anonymous clients (no user)"
            raise SinkError(f"the broker {s.display} refused the credentials for {who}: check "
                            f"--mqtt-password-file / ${PASSWORD_ENV}")

    def _on_state(self, state: str, _error: str | None) -> None:
        if state == "connected":
            self.say(Notice("publish", f"publishing to {self.settings.display} as "
                            f"{self.p.fleet}/{self.p.name}"))

    def take(self, snap: Snapshot, windows: SnapshotWindows) -> None:
        if self.publisher is not None:
            self.publisher.publish(snap)

    def status_text(self) -> str:
        """For the progress line: is the broker there, and what is held back."""
        pub = self.publisher
        if pub is None:
            return "mqtt not started"
        text = "mqtt ok" if pub.connected else f"mqtt down, backlog {pub.backlog}"
        return text + (f", dropped {pub.dropped}" if pub.dropped else "")

    def finish(self, summary: dict) -> None:
        pub = self.publisher
        if pub is None:
            return
        summary["mqtt"] = {"broker": self.settings.display, "fleet": self.p.fleet,
                           "agent": self.p.name, "published": pub.published,
                           "dropped": pub.dropped, "resent": pub.resent, "unsent": pub.backlog}

    async def close(self) -> None:
        if self.publisher is not None:
            await self.publisher.close("stopped")
            self.publisher = None

