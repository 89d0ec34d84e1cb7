"""`tokentop agent`: the headless engine on a load machine, publishing to an MQTT broker.

    tokentop agent --broker mqtt://broker:1883 --name gpu-07 --url http://127.0.0.1:8000/v1

It runs the Coordinator like `tokentop run --headless` (a progress line a
second on stderr, a JSON summary with --json), records the run directory
(loadgen.record.recorder) and publishes every Snapshot with loadgen.fleet.publisher. When
the broker is down it keeps running and recording; the publisher holds a
backlog and catches up after reconnecting.

Remote control is off unless the agent is started with
`--allow-remote-control`, and then only within the caps it sets itself
(`--max-concurrency`, `--max-rate`). Each command gets one reply on
`tokentop/<fleet>/<agent>/control/reply`: `{"id", "agent", "op", "applied",
"reason", "load"}`. Applied commands go through `Coordinator.control` with
source "mqtt", so they show in the next Snapshot.
"""

from __future__ import annotations

import math
import re
import socket
import sys
from collections import OrderedDict
from pathlib import Path
from typing import TextIO

import msgspec

from loadgen.fleet.link import BrokerError, BrokerSettings
from loadgen.fleet.publisher import DEFAULT_BACKLOG, TelemetryPublisher
from loadgen.model.snapshot import Control
from loadgen.model.windows import SnapshotWindows
from loadgen.run.config import ConfigError, RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.run.headless import (
    build_summary,
    exit_status,
    install_signal_handlers,
    progress_line,
)
from loadgen.run.preflight import TargetError

DEFAULT_MAX_CONCURRENCY = 64
DEFAULT_MAX_RATE = 50.0
REMOTE_OPS = ("set_concurrency", "add_concurrency", "set_rate", "add_rate", "set_mode",
              "pause", "resume", "mark")
REMOTE_OFF = "remote control is off on this agent (start it with --allow-remote-control)"


def default_name() -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0])[:64]
    return name.strip("-.") or "agent"


# ---- remote control -------------------------------------------------------------------------


class RemoteControl:
    """Checks each command against this agent's own rules, applies it, and answers."""

    def __init__(self, coord: Coordinator, *, agent: str, enabled: bool,
                 max_concurrency: int, max_rate: float) -> None:
        self.coord = coord
        self.agent = agent
        self.enabled = enabled
        self.max_concurrency = max_concurrency
        self.max_rate = max_rate
        self.publisher: TelemetryPublisher | None = None
        self._answered: OrderedDict[str, dict] = OrderedDict()  # QoS 1 may deliver twice

    async def handle(self, payload: bytes, _topic: str) -> None:
        try:
            cmd = msgspec.json.decode(payload)
        except msgspec.DecodeError:
            cmd = None
        cid = cmd.get("id") if isinstance(cmd, dict) else None
        if isinstance(cid, str) and cid in self._answered:
            self._send(self._answered[cid])
            return
        reply = await self.apply(cmd)
        if isinstance(cid, str):
            self._answered[cid] = reply
            while len(self._answered) > 256:
                self._answered.popitem(last=False)
        self._send(reply)

    def _send(self, reply: dict) -> None:
        if self.publisher is not None:
            self.publisher.reply(reply)

    async def apply(self, cmd: object) -> dict:
        if not isinstance(cmd, dict):
            return self._reply({}, False, "bad command: expected a JSON object "
                               '{"id": …, "op": …, "value": …}')
        why = self.refusal(cmd)
        if why is not None:
            return self._reply(cmd, False, why)
        op, value = cmd["op"], cmd.get("value")
        note = cmd.get("note") if isinstance(cmd.get("note"), str) else None
        await self.coord.control(Control(op=op, value=None if value is None else float(value),
                                         note=note, source="mqtt"))
        return self._reply(cmd, True, "applied")

    def refusal(self, cmd: dict) -> str | None:
        """Why this command is refused, in words; None when it may be applied."""
        if not self.enabled:
            return REMOTE_OFF
        op, value = cmd.get("op"), cmd.get("value")
        if op not in REMOTE_OPS:
            return (f"unknown or not remotely allowed op {op!r}: use one of "
                    f"{', '.join(REMOTE_OPS)}")
        if self.coord.state not in ("running", "paused"):
            return f"the run is {self.coord.state}"
        spec = self.coord.spec
        numeric = isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value)
        if op in ("set_concurrency", "add_concurrency", "set_rate", "add_rate") and not numeric:
            return f"{op} needs a number in 'value', got {value!r}"
        if op in ("set_concurrency", "add_concurrency"):
            if value != int(value):
                return f"{op} needs a whole number of streams, got {value!r}"
            n = int(value) + (spec.concurrency if op == "add_concurrency" else 0)
            if n < 0:
                return f"{n} streams is below 0"
            if n > self.max_concurrency:
                return f"{n} streams is over this agent's --max-concurrency {self.max_concurrency}"
        if op in ("set_rate", "add_rate"):
            r = float(value) + (spec.rate if op == "add_rate" else 0.0)
            if r < 0:
                return f"{r:g} req/s is below 0"
            if r > self.max_rate:
                return f"{r:g} req/s is over this agent's --max-rate {self.max_rate:g}"
        if op == "set_mode" and cmd.get("note") not in ("closed", "open"):
            return "set_mode needs 'note': closed or open"
        return None

    def _reply(self, cmd: dict, applied: bool, reason: str) -> dict:
        spec = self.coord.spec
        return {
            "id": cmd.get("id"),
            "agent": self.agent,
            "op": cmd.get("op"),
            "value": cmd.get("value"),
            "applied": applied,
            "reason": reason,
            "load": {"mode": spec.mode, "concurrency": spec.concurrency, "rate": spec.rate,
                     "state": self.coord.state},
        }


# ---- the run --------------------------------------------------------------------------------


async def run_agent(
    cfg: RunConfig,
    settings: BrokerSettings,
    *,
    fleet: str,
    name: str,
    api_key: str | None = None,
    allow_remote_control: bool = False,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    max_rate: float = DEFAULT_MAX_RATE,
    backlog: int = DEFAULT_BACKLOG,
    record: bool = True,
    json_path: Path | None = None,
    max_backoff: float = 30.0,
    out: TextIO = sys.stderr,
) -> int:
    """Run until the load stops (duration, requests, a signal); exit codes as headless."""
    if cfg.concurrency > max_concurrency and allow_remote_control:
        print(f"tokentop: --concurrency {cfg.concurrency} is over --max-concurrency "
              f"{max_concurrency}", file=out)
        return 2
    try:
        coord = Coordinator(cfg, api_key)
    except ConfigError as e:
        print(f"tokentop: {e}", file=out)
        return 2
    recording = _open_recording(cfg, coord.run_id, record, out)
    if recording is False:
        return 2
    control = RemoteControl(coord, agent=name, enabled=allow_remote_control,
                            max_concurrency=max_concurrency, max_rate=max_rate)

    def on_state(state: str, error: str | None) -> None:
        if state == "connected":
            print(f"tokentop: publishing to {settings.display} as {fleet}/{name}", file=out,
                  flush=True)

    try:
        pub = TelemetryPublisher(
            settings, fleet=fleet, agent=name, backlog=backlog,
            remote_control=allow_remote_control,
            max_concurrency=max_concurrency if allow_remote_control else None,
            on_control=control.handle, max_backoff=max_backoff, on_state=on_state,
            run_id=coord.run_id,
        )
    except BrokerError as e:
        print(f"tokentop: {e}", file=out)
        return 2
    control.publisher = pub
    try:
        await coord.start()
    except (TargetError, ConfigError) as e:
        print(f"tokentop: {e}", file=out)
        if recording:
            recording.close()
        return 2
    await pub.start()
    install_signal_handlers(coord, out)
    windows = SnapshotWindows()
    last_second = -1
    try:
        measuring = cfg.warmup == 0
        async for snap in coord.snapshots():
            if recording:
                recording.take(snap)
                if recording.stop_load:
                    coord.request_stop(recording.error)
            pub.publish(snap)
            windows.add(snap)
            if not measuring and not snap.load.warmup:
                windows.reset()
                measuring = True
            for ev in snap.events:
                if ev.level != "info":
                    print(f"tokentop: {ev.level}: {ev.message}", file=out)
            if int(snap.elapsed) > last_second or snap.load.state == "stopped":
                last_second = int(snap.elapsed)
                mqtt = "mqtt ok" if pub.connected else f"mqtt down, backlog {pub.backlog}"
                if pub.dropped:
                    mqtt += f", dropped {pub.dropped}"
                print(f"{progress_line(snap, windows.stats('10s'))} | {mqtt}", file=out,
                      flush=True)
    finally:
        await coord.close()
        await pub.close("stopped")
    summary = build_summary(cfg, windows)
    summary["mqtt"] = {"broker": settings.display, "fleet": fleet, "agent": name,
                       "published": pub.published, "dropped": pub.dropped,
                       "resent": pub.resent, "unsent": pub.backlog}
    code, reason = exit_status(summary)
    summary["exit"] = {"code": code, "reason": reason}
    if recording:
        err = recording.close(summary)
        if err:
            print(f"tokentop: {err}", file=out)
    if json_path is not None:
        try:
            tmp = json_path.with_name(json_path.name + ".tmp")
            tmp.write_bytes(msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n")
            tmp.replace(json_path)
        except OSError as e:
            print(f"tokentop: cannot write {json_path}: {e.strerror or e}", file=out)
            code = code or 1
    print(f"tokentop: {reason}", file=out)
    return code


def _open_recording(cfg: RunConfig, run_id: str, record: bool, out: TextIO):
    """The run directory (a Recording), None when not recording, False on error."""
    if not record:
        return None
    try:
        from loadgen.record.recorder import Recording, RecordingError
    except ImportError:  # recording is optional for the agent
        return None
    try:
        rec = Recording.open(cfg, run_id=run_id, record=True)
    except (RecordingError, ConfigError) as e:
        print(f"tokentop: {e}", file=out)
        return False
    if rec.run_dir is not None:
        print(f"tokentop: recording to {rec.run_dir}", file=out)
    return rec
