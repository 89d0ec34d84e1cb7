"""The publisher: payload format, broker URLs, and the backlog across a broker restart."""

from __future__ import annotations

import asyncio
import json
import zlib

import pytest
from mosquitto import Mosquitto, Recorder, settings, small_run, start_agent, until
from scripted_source import make_snapshots

from loadgen.fleet.link import BrokerError, parse_broker_url
from loadgen.fleet.monitor import FleetMonitor
from loadgen.fleet.publisher import SnapshotPublisher, decode_snapshot, encode_snapshot
from loadgen.model.snapshot import to_json
from loadgen.record.rundir import last_snapshot


def test_payload_is_zlib_of_the_snapshot_json_and_plain_json_is_read_too():
    snap = make_snapshots(3)[-1]
    payload = encode_snapshot(snap)
    assert payload[:1] == b"\x78"  # a zlib stream (RFC 1950)
    assert zlib.decompress(payload) == to_json(snap)
    assert len(payload) < len(to_json(snap)) * 0.7
    assert decode_snapshot(payload) == snap
    assert decode_snapshot(to_json(snap)) == snap
    with pytest.raises(ValueError):
        decode_snapshot(b"\x00garbage")


def test_broker_urls():
    s = parse_broker_url("mqtt://broker")
    assert (s.host, s.port, s.tls, s.username) == ("broker", 1883, False, None)
    s = parse_broker_url("mqtts://ops@broker.example:9883")
    assert (s.host, s.port, s.tls, s.username) == ("broker.example", 9883, True, "ops")
    assert parse_broker_url("mqtts://broker").port == 8883
    s.password = "hunter2"
    assert "hunter2" not in repr(s) and "hunter2" not in str(s) and "hunter2" not in s.display
    with pytest.raises(BrokerError, match="do not put the broker password in the URL"):
        parse_broker_url("mqtt://ops:hunter2@broker")
    with pytest.raises(BrokerError, match="bad broker"):
        parse_broker_url("http://broker")
    with pytest.raises(BrokerError, match="bad port"):
        parse_broker_url("mqtt://broker:99999")


async def test_backlog_is_bounded_then_caught_up_in_order(tmp_path):
    """Broker down from the start: the oldest fall out (counted), the rest arrive in order."""
    broker = Mosquitto(tmp_path)
    b = settings(broker.url)
    pub = SnapshotPublisher(b, fleet="t", agent="early", backlog=5, max_backoff=0.5)
    await pub.start()
    snaps = make_snapshots(12)
    for snap in snaps:
        pub.publish(snap)
    assert pub.backlog == 5 and pub.dropped == 7 and not pub.connected
    async with broker, Recorder(b, "tokentop/t/early/#") as raw:
        await until(lambda: len(raw.payloads("/snapshot")) >= 5, 15, "the catch-up")
        await until(lambda: any(json.loads(p).get("dropped") == 7
                                for _t, p in raw.payloads("/status")), 10, "dropped in status")
        await pub.close()
        await until(lambda: any(json.loads(p)["state"] == "offline"
                                for _t, p in raw.payloads("/status")), 5, "offline status")
    seqs = [decode_snapshot(p).seq for _t, p in raw.payloads("/snapshot")]
    assert seqs == [s.seq for s in snaps[-5:]]


async def test_broker_restart_mid_run_loses_no_snapshot(sim, tmp_path):
    async with Mosquitto(tmp_path) as broker:
        b = settings(broker.url, keepalive=5)
        monitor = FleetMonitor(b, "t", max_backoff=1.0)
        await monitor.start(wait=10)
        agent = start_agent(small_run(sim.url, duration=9.0), b, "steady", tmp=tmp_path)
        try:
            await until(lambda: "steady" in monitor.agents
                        and (monitor.agents["steady"].last_seq or 0) >= 3, 30, "snapshots")
            await broker.stop()
            await asyncio.sleep(2.5)  # the agent keeps running (and recording) meanwhile
            await broker.start()
            code = await asyncio.wait_for(agent, 60)
            assert code == 0
            st = monitor.agents["steady"]
            await until(lambda: st.status is not None and st.status.get("reason") == "stopped",
                        15, "the agent's clean offline status")
        finally:
            agent.cancel()
            await monitor.close()
    recorded = last_snapshot(tmp_path / "run-steady")
    assert recorded is not None
    # the fleet got every Snapshot the agent made, once each, in order
    assert st.first_seq == 0 and st.last_seq == recorded.seq
    assert st.received == recorded.seq + 1, (st.missing, st.duplicates)
    assert not st.missing
    assert st.status["dropped"] == 0
