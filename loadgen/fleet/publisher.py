"""Publishing Snapshots to MQTT: topics, payloads, and the backlog that rides out a broker outage.

Topics (one level per fleet and per agent; see `loadgen.fleet.link.topic`):

    tokentop/<fleet>/<agent>/snapshot       every Snapshot, QoS 0 live, QoS 1 when catching up
    tokentop/<fleet>/<agent>/events         the tick's events, QoS 1 (only ticks that have some)
    tokentop/<fleet>/<agent>/status         retained JSON, QoS 1; the last will says "offline"
    tokentop/<fleet>/<agent>/control        commands in (agents started with --allow-remote-control)
    tokentop/<fleet>/all/control            commands for every agent of the fleet
    tokentop/<fleet>/<agent>/control/reply  one reply per command: applied or refused, and why
    tokentop/<fleet>/<agent>/resend         a reader that saw a gap asks for those seqs again:
                                            {"run_id": …, "seqs": [[from, to], …]} (inclusive)

Snapshot payload: the Snapshot's JSON (`loadgen.model.snapshot.to_json`, versioned
by its `v` field) compressed as a zlib stream (RFC 1950; the first byte is
0x78, where plain JSON starts with `{`), labelled with the MQTT v5 content
type `application/json` and the user property `content-encoding: zlib`.
`decode_snapshot` reads both forms, so another tool may publish plain JSON.
Histograms inside are standard HdrHistogram V2 base64 blobs, so any
HdrHistogram library can read and merge them. Other topics carry plain JSON.

Delivery: while connected each Snapshot goes out at once (QoS 0). While the
broker is unreachable Snapshots wait in a bounded backlog (oldest dropped and
counted in `dropped`, which the status reports); after reconnecting the
backlog goes out in order at QoS 1 (acknowledged by the broker), and so do the
Snapshots sent at QoS 0 in the last 1.5 keepalives before the loss, which a
dying connection may have swallowed. A reader that was itself away (a broker
restart drops every session unless the broker persists them) asks on
`.../resend` for the seqs it is missing; the publisher keeps the last
`backlog` Snapshots it sent and sends those again at QoS 1. Readers
de-duplicate by (run_id, seq).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import aiomqtt
import msgspec
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from loadgen import __version__
from loadgen.fleet.link import BrokerSettings, MqttLink, check_level, topic
from loadgen.model.snapshot import Snapshot, from_json, to_json
from loadgen.model.text import plain_all

log = logging.getLogger("tokentop.publisher")

SNAPSHOT_QOS = 0
CATCHUP_QOS = 1
DEFAULT_BACKLOG = 1200  # Snapshots: 10 minutes at 2 Hz, about 2 MB
BATCH = 20  # catch-up publishes in flight at once
STATUS_EVERY_S = 5.0  # a changed `dropped` count is re-published at most this often
FLUSH_ON_CLOSE_S = 3.0
# while a run is live its publisher retries a lost broker at least this often (one TCP connect
# each): after a broker restart the agent is back, and "online" again, within seconds
LIVE_MAX_BACKOFF = 2.0
CONTENT_TYPE = "application/json"

_json = msgspec.json.Encoder()


def encode_snapshot(snap: Snapshot) -> bytes:
    """The snapshot payload: zlib (RFC 1950) of the Snapshot JSON."""
    return zlib.compress(to_json(snap), 6)


def decode_snapshot(payload: bytes | bytearray) -> Snapshot:
    """A snapshot payload, zlib-compressed or plain JSON, its text made plain; raises
    ValueError / msgspec errors."""
    data = bytes(payload)
    if data[:1] != b"{":
        try:
            data = zlib.decompress(data)
        except zlib.error as e:
            raise ValueError(f"snapshot payload is neither JSON nor zlib: {e}") from None
    # the bus is outside: every string of a Snapshot from it (another machine's model id,
    # its events' words) is made plain here, before a console shows or records it
    return plain_all(from_json(data))


def snapshot_properties() -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = CONTENT_TYPE
    props.UserProperty = [("content-encoding", "zlib")]
    return props


def json_properties() -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = CONTENT_TYPE
    return props


@dataclass
class _Item:
    seq: int
    data: bytes
    events: bytes | None
    qos: int


@dataclass
class _Msg:
    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False


ControlHandler = Any  # async (payload: bytes, topic: str) -> None


class SnapshotPublisher:
    """Publishes one run's Snapshots; `publish()` never blocks and never raises.

    The console (`--publish`) and the agent use it the same way:

        pub = SnapshotPublisher(settings, fleet="lab", agent="gpu-07")
        await pub.start()
        pub.publish(snapshot)     # each tick
        await pub.close()         # flushes for a moment, says "offline", disconnects

    `on_control` (the agent's) is called with every command that arrives on
    its control topics; `reply()` sends the answer.
    """

    def __init__(
        self,
        settings: BrokerSettings,
        *,
        fleet: str,
        agent: str,
        backlog: int = DEFAULT_BACKLOG,
        remote_control: bool = False,
        max_concurrency: int | None = None,
        on_control: ControlHandler | None = None,
        min_backoff: float = 0.5,
        max_backoff: float = 30.0,
        on_state: Any = None,
        run_id: str | None = None,
    ) -> None:
        self.fleet = check_level("fleet", fleet)
        self.agent = check_level("agent", agent)
        self.settings = settings
        self.capacity = max(1, backlog)
        self.remote_control = remote_control
        self.max_concurrency = max_concurrency
        self.on_control = on_control
        self.since = time.time()
        self.run_id: str | None = run_id  # known up front, the last will names the run
        self.target: str | None = None
        self.model: str | None = None
        # counters, for the status and the tests
        self.dropped = 0  # Snapshots that fell out of a full backlog
        self.published = 0  # Snapshot publishes done (resends included)
        self.resent = 0  # Snapshots sent again after a connection loss
        self._queue: deque[_Item] = deque()
        self._urgent: deque[_Msg] = deque(maxlen=256)
        self._recent: deque[tuple[float, _Item]] = deque()
        self._sent: deque[_Item] = deque(maxlen=self.capacity)  # for resend requests
        self._wake = asyncio.Event()
        self._closing = False
        self._closing_at = 0.0
        self._close_reason = "stopped"
        self._status_sent: dict | None = None
        self._status_at = 0.0
        self.link = MqttLink(
            settings,
            identifier=f"tokentop-{self.fleet}-{self.agent}-{os.getpid()}",
            will=self._will(),
            min_backoff=min_backoff,
            max_backoff=min(max_backoff, LIVE_MAX_BACKOFF),
            on_state=on_state,
        )
        self._task: asyncio.Task | None = None

    # ---- topics and payloads ----------------------------------------------------------------

    def topic(self, kind: str) -> str:
        return topic(self.fleet, self.agent, kind)

    def status(self, state: str = "online", reason: str | None = None) -> dict:
        out = {
            "state": state,
            "agent": self.agent,
            "fleet": self.fleet,
            "run_id": self.run_id,
            "target": self.target,
            "model": self.model,
            "pid": os.getpid(),
            "since": self.since,
            "t": time.time(),
            "dropped": self.dropped,
            "remote_control": self.remote_control,
            "max_concurrency": self.max_concurrency,
            "version": __version__,
        }
        if reason is not None:
            out["reason"] = reason
        return out

    def _will(self) -> aiomqtt.Will:
        payload = _json.encode({"state": "offline", "reason": "connection lost",
                                "agent": self.agent, "fleet": self.fleet,
                                "run_id": self.run_id, "pid": os.getpid()})
        return aiomqtt.Will(self.topic("status"), payload, qos=1, retain=True)

    # ---- the caller's side ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the connection loop; returns at once (the broker may come later)."""
        if self._task is None:
            self._task = asyncio.create_task(self.link.run(self._session), name="mqtt-publisher")

    @property
    def connected(self) -> bool:
        return self.link.connected.is_set()

    @property
    def backlog(self) -> int:
        return len(self._queue)

    def publish(self, snap: Snapshot) -> None:
        """Queue one Snapshot (and its events); never blocks, never raises."""
        if self._closing:
            return
        try:
            self._note_run(snap)
            events = None
            if snap.events:
                events = _json.encode({"agent": self.agent, "run_id": snap.run_id,
                                       "seq": snap.seq, "t": snap.t, "events": snap.events})
            live = self.connected and not self._queue
            item = _Item(snap.seq, encode_snapshot(snap), events,
                         SNAPSHOT_QOS if live else CATCHUP_QOS)
        except Exception:  # a bad snapshot must not stop the run that produced it
            log.exception("cannot encode snapshot %s", getattr(snap, "seq", "?"))
            return
        if len(self._queue) >= self.capacity:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(item)
        self._wake.set()

    def reply(self, payload: dict) -> None:
        """Queue a control reply (QoS 1, ahead of Snapshots)."""
        self._urgent.append(_Msg(self.topic("control/reply"), _json.encode(payload)))
        self._wake.set()

    def _note_run(self, snap: Snapshot) -> None:
        if snap.run_id != self.run_id or snap.target.url != self.target:
            self.run_id, self.target, self.model = snap.run_id, snap.target.url, snap.target.model
            self.link.will = self._will()
            self._status_changed()
        elif self.dropped != (self._status_sent or {}).get("dropped", 0) \
                and time.monotonic() - self._status_at >= STATUS_EVERY_S:
            self._status_changed()

    def _status_changed(self) -> None:
        if any(m.topic == self.topic("status") for m in self._urgent):
            return
        self._urgent.append(_Msg(self.topic("status"), b"", retain=True))  # filled when sent
        self._wake.set()

    async def close(self, reason: str = "stopped") -> None:
        """Flush what is queued (a few seconds at most), publish "offline", disconnect."""
        if self._task is None:
            return
        self._closing = True
        self._closing_at = time.monotonic()
        self._close_reason = reason
        self.link.stop_retrying()
        self._wake.set()
        try:
            if self.connected:
                await asyncio.wait_for(asyncio.shield(self._task), FLUSH_ON_CLOSE_S + 2.0)
        except TimeoutError:
            pass
        finally:
            if not self._task.done():
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._queue:
            log.warning("%d snapshots were still queued at close (broker unreachable)",
                        len(self._queue))

    # ---- one connection ---------------------------------------------------------------------

    async def _session(self, client: aiomqtt.Client) -> None:
        subs = [(self.topic("resend"), 1)]
        if self.on_control is not None:
            subs += [(self.topic("control"), 1), (topic(self.fleet, "all", "control"), 1)]
        await client.subscribe(subs)  # first: whoever sees "online" may send a command at once
        await self._send_status(client, "online")  # on every (re)connect: replaces the will
        tasks = [asyncio.create_task(self._sender(client)),
                 asyncio.create_task(self._receiver(client))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                    await t
            if not self._closing:
                self._requeue_recent()

    async def _send_status(self, client: aiomqtt.Client, state: str,
                           reason: str | None = None) -> None:
        status = self.status(state, reason)
        await client.publish(self.topic("status"), _json.encode(status), qos=1, retain=True,
                             properties=json_properties())
        self._status_sent = status
        self._status_at = time.monotonic()

    async def _receiver(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:  # raises MqttError when the connection goes
            if str(message.topic) == self.topic("resend"):
                self._resend(bytes(message.payload))
                continue
            if self.on_control is None:
                continue
            try:
                await self.on_control(bytes(message.payload), str(message.topic))
            except Exception:  # a bad command is answered by the handler; a bug is logged
                log.exception("control handler failed")

    async def _sender(self, client: aiomqtt.Client) -> None:
        while True:
            while self._urgent:
                msg = self._urgent[0]
                if msg.topic == self.topic("status"):
                    await self._send_status(client, "online")
                else:
                    await client.publish(msg.topic, msg.payload, qos=msg.qos, retain=msg.retain,
                                         properties=json_properties())
                self._urgent.popleft()
            flushing = self._closing and time.monotonic() - self._closing_at < FLUSH_ON_CLOSE_S
            if self._queue and (flushing or not self._closing):
                await self._send_batch(client)
                continue
            if self._closing:
                await self._send_status(client, "offline", self._close_reason)
                return
            self._wake.clear()
            await self._wake.wait()

    async def _send_batch(self, client: aiomqtt.Client) -> None:
        first = self._queue[0]
        batch = [first]
        if first.qos == CATCHUP_QOS:  # catching up: several in flight, still in order
            for it in self._queue:
                if it is first:
                    continue
                if it.qos != CATCHUP_QOS or len(batch) >= BATCH:
                    break
                batch.append(it)
        props = snapshot_properties()
        await asyncio.gather(*(self._send_item(client, it, props) for it in batch))
        now = time.monotonic()
        for it in batch:
            if self._queue and self._queue[0] is it:
                self._queue.popleft()
            self.published += 1
            if not self._sent or self._sent[-1].seq < it.seq:
                self._sent.append(it)
            if it.qos == SNAPSHOT_QOS:
                self._recent.append((now, it))
        horizon = now - self._resend_window()
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()

    async def _send_item(self, client: aiomqtt.Client, it: _Item, props: Properties) -> None:
        await client.publish(self.topic("snapshot"), it.data, qos=it.qos, properties=props)
        if it.events is not None:
            await client.publish(self.topic("events"), it.events, qos=1,
                                 properties=json_properties())

    def _resend(self, payload: bytes) -> None:
        """A reader asks for seqs it missed: queue those still held, oldest first, at QoS 1."""
        try:
            req = msgspec.json.decode(payload)
            if req.get("run_id") != self.run_id:
                return
            ranges = [(int(a), int(b)) for a, b in req.get("seqs", [])][:100]
        except (msgspec.DecodeError, AttributeError, TypeError, ValueError):
            return
        queued = {it.seq for it in self._queue}
        again = [it for it in self._sent if it.seq not in queued
                 and any(a <= it.seq <= b for a, b in ranges)]
        for it in reversed(again):
            it.qos = CATCHUP_QOS
            self._queue.appendleft(it)
        if again:
            self.resent += len(again)
            self._wake.set()

    def _resend_window(self) -> float:
        return 1.5 * self.settings.keepalive + 2.0

    def _requeue_recent(self) -> None:
        """After a loss: what went out at QoS 0 lately may not have arrived; send it again
        (QoS 1) before the backlog, and everything queued goes at QoS 1 too."""
        horizon = time.monotonic() - self._resend_window()
        recent = [it for t, it in self._recent if t >= horizon]
        self._recent.clear()
        queued = {id(it) for it in self._queue}
        recent = [it for it in recent if id(it) not in queued]
        room = self.capacity - len(self._queue)
        recent = recent[-room:] if room > 0 else []
        for it in self._queue:
            it.qos = CATCHUP_QOS
        for it in reversed(recent):
            it.qos = CATCHUP_QOS
            self._queue.appendleft(it)
        self.resent += len(recent)
        if self._status_sent is not None:
            self._status_changed()  # say "online" again after the reconnect, with `dropped`
