"""Hostile text over MQTT, through a real mosquitto: commands sent to an agent with remote
control (a note full of escape sequences, a megabyte note, 1e308 and 1e309, a hostile op), and
a hostile agent seen by the fleet monitor. The truth is the bytes: the replies and Snapshots
as published (read raw, not through tokentop's decoder) and the agent's recorded events."""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path

import aiomqtt
from mosquitto import Mosquitto, Recorder, settings, small_run, start_agent, until
from support import FIXTURES

from loadgen.fleet.monitor import FleetMonitor

TITLE = "PWNED"
NOTE = f"\x1b]0;{TITLE}\x07\x1b[2Jmark-words\x07 [red]x[/red]\x9b2J"
HOSTILE_OP = f"\x1b]0;{TITLE}\x07" + "y" * 5000


def _controls(text: str) -> list[str]:
    """The C0 and C1 control characters in `text` (ESC, BEL, CSI, …)."""
    return [repr(c) for c in text if ord(c) < 32 or 0x7f <= ord(c) <= 0x9f]


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _snapshot_json(payload: bytes) -> dict:
    """A published Snapshot as JSON, read here (zlib or not) without tokentop's decoder."""
    return json.loads(payload if payload[:1] == b"{" else zlib.decompress(payload))


async def _publish(broker, topic: str, payloads: list[bytes], retain: bool = False) -> None:
    async with aiomqtt.Client(broker.host, broker.port) as client:
        for p in payloads:
            await client.publish(topic, p, qos=1, retain=retain)


async def test_hostile_commands_get_short_replies_and_the_note_is_recorded_plain(sim,
                                                                                 tmp_path):
    commands = [
        json.dumps({"id": "note", "op": "mark", "note": NOTE}).encode(),
        json.dumps({"id": "huge", "op": "mark", "note": "x" * 1_000_000}).encode(),
        b'{"id": "e308", "op": "set_concurrency", "value": 1e308}',
        b'{"id": "e309", "op": "set_concurrency", "value": 1e309}',
        b'{"id": "rate", "op": "set_rate", "value": -1e309}',
        json.dumps({"id": "op", "op": HOSTILE_OP}).encode(),
    ]
    async with Mosquitto(tmp_path) as broker:
        b = settings(broker.url)
        async with Recorder(b, "tokentop/t/#") as raw:
            agent = start_agent(small_run(sim.url, concurrency=1, duration=4.0), b, "ctl",
                                tmp=tmp_path, remote_control=True, max_concurrency=8)
            await until(lambda: raw.payloads("/ctl/snapshot"), 30, "the agent's first snapshot")
            await _publish(b, "tokentop/t/ctl/control", commands)
            await until(lambda: len(raw.payloads("/control/reply")) >= len(commands), 10,
                        "a reply to every command")
            assert await asyncio.wait_for(agent, 60) == 0
            await until(lambda: any(b"mark-words" in _z(p) for _, p in
                                    raw.payloads("/ctl/snapshot")), 5, "the mark published")
    replies = {r["id"]: r for _, p in raw.payloads("/control/reply")
               for r in [json.loads(p)]}
    for r in replies.values():  # every reply as published: plain, short
        assert not [c for s in _strings(r) for c in _controls(s)], r
        assert len(json.dumps(r)) < 1000, r["id"]
    assert replies["note"]["applied"] is True
    assert "left out" in replies["note"]["reason"]
    assert replies["huge"]["applied"] is False
    assert replies["huge"]["reason"] == ("the note is 1000000 characters long: at most 200 are "
                                         "taken")
    assert replies["e308"]["reason"] == ("1e+308 streams is over this agent's "
                                         "--max-concurrency 8")
    assert replies["e309"]["applied"] is False
    assert replies["e309"]["reason"].startswith("set_concurrency: 'value' is too large a number")
    assert replies["rate"]["reason"].startswith("set_rate: 'value' is too large a number")
    assert replies["op"]["reason"].startswith("unknown or not remotely allowed op ")
    assert len(replies["op"]["reason"]) < 300 and len(replies["op"]["op"]) <= 80

    marks = [e["message"] for _, p in raw.payloads("/ctl/snapshot")
             for e in _snapshot_json(p)["events"] if "mark-words" in e["message"]]
    assert marks == ["mark: mark-words [red]x[/red]"]
    recorded = (tmp_path / "run-ctl" / "events.jsonl").read_text()
    [line] = [json.loads(x) for x in recorded.splitlines() if "mark-words" in x]
    assert line["message"] == "mark: mark-words [red]x[/red]"
    assert "\\u00" not in recorded and not _controls(recorded.replace("\n", ""))


def _z(payload: bytes) -> bytes:
    return payload if payload[:1] == b"{" else zlib.decompress(payload)


async def test_a_hostile_agent_is_shown_plain_and_a_hostile_name_not_at_all(tmp_path: Path):
    line = (FIXTURES / "formats" / "run-v1" / "snapshots.jsonl").read_text().splitlines()[0]
    snap = json.loads(line)
    snap["target"]["model"] = f"\x1b]0;{TITLE}\x07[red]x[/red]"
    snap["events"] = [{"t": snap["t"], "kind": "run", "level": "info",
                       "message": f"hi\x1b]2;{TITLE}\x1b\\ there"}]
    status = {"state": "online", "target": "http://x\x1b[2J/v1", "model": "m" * 10_000}
    async with Mosquitto(tmp_path) as broker:
        b = settings(broker.url)
        monitor = FleetMonitor(b, "t")
        await monitor.start(wait=10)
        try:
            await _publish(b, "tokentop/t/evil/status", [json.dumps(status).encode()],
                           retain=True)
            await _publish(b, "tokentop/t/evil/snapshot", [json.dumps(snap).encode()])
            # (mosquitto itself refuses a topic with a control character in it)
            await _publish(b, "tokentop/t/bad name [b]x/status",
                           [json.dumps(status).encode()])
            await until(lambda: "evil" in monitor.agents and monitor.agents["evil"].last
                        and monitor.bad_payloads >= 1, 10, "the agents' messages")
            evil = monitor.agents["evil"]
            assert evil.last.target.model == "[red]x[/red]"
            assert [e.message for e in evil.last.events] == ["hi there"]
            assert evil.status["target"] == "http://x/v1"
            assert len(evil.status["model"]) == 200
            assert list(monitor.agents) == ["evil"]  # a name no agent can have: not shown
            row = monitor.rows()[0]
            assert not _controls(f"{row.name}{row.target}{row.model}")
        finally:
            await monitor.close()
