"""The fleet over a real mosquitto: agents against the real simulator, an exact merge, control."""

from __future__ import annotations

import asyncio

import numpy as np
from mosquitto import Mosquitto, Recorder, settings, small_run, start_agent, until

from loadgen.fleet.monitor import FleetMonitor
from loadgen.fleet.publisher import decode_snapshot
from loadgen.fleet.remote import REMOTE_OFF
from loadgen.model import hdr


async def test_three_agents_merged_p99_is_the_p99_of_the_union(sim, tmp_path):
    async with Mosquitto(tmp_path) as broker:
        b = settings(broker.url)
        monitor = FleetMonitor(b, "t")
        await monitor.start(wait=10)
        async with Recorder(b, "tokentop/t/+/snapshot") as raw:
            # different loads, so the three latency distributions differ
            agents = [start_agent(small_run(sim.url, duration=3.0, concurrency=c,
                                            output_tokens=str(o)), b, f"gpu-{i}")
                      for i, (c, o) in enumerate([(1, 8), (3, 16), (6, 24)])]
            codes = await asyncio.wait_for(asyncio.gather(*agents), 60)
            assert codes == [0, 0, 0]
            await until(lambda: all(monitor.agents.get(f"gpu-{i}") is not None
                                    and monitor.agents[f"gpu-{i}"].state(0) == "offline"
                                    for i in range(3)), 10, "three offline statuses")
        try:
            union = {m: np.zeros(hdr.COUNTS_LEN, np.int64) for m in ("ttft", "itl", "e2e")}
            seen = set()
            for _topic, payload in raw.payloads("/snapshot"):
                snap = decode_snapshot(payload)
                if (snap.run_id, snap.seq) in seen:
                    continue
                seen.add((snap.run_id, snap.seq))
                for m in union:
                    if m in snap.hist:
                        union[m] += hdr.decode(snap.hist[m])
            for i in range(3):
                a = monitor.agents[f"gpu-{i}"]
                assert a.received == a.last_seq - a.first_seq + 1 and not a.missing
                assert a.status["reason"] == "stopped"
            # every agent's whole run is inside the 10 s window: the fleet histogram is the union
            for m, dense in union.items():
                merged = monitor.merged(m)
                assert merged.sum() == dense.sum() > 0
                assert np.array_equal(merged, dense)
                assert monitor.merged_summary(m)["p99"] == hdr.summarize(dense)["p99"]
            assert monitor.aggregate().ttft_p99_us == hdr.summarize(union["ttft"])["p99"]
        finally:
            await monitor.close()


async def test_control_applied_within_a_tick_refused_beyond_the_cap(sim, tmp_path):
    async with Mosquitto(tmp_path) as broker:
        b = settings(broker.url)
        monitor = FleetMonitor(b, "t")
        await monitor.start(wait=10)
        ctl = start_agent(small_run(sim.url, concurrency=2), b, "ctl",
                          remote_control=True, max_concurrency=8)
        ro = start_agent(small_run(sim.url, concurrency=1), b, "ro")
        try:
            await until(lambda: all(n in monitor.agents and monitor.agents[n].last is not None
                                    for n in ("ctl", "ro")), 30, "both agents' snapshots")
            [reply] = await monitor.control("ctl", "set_concurrency", 6)
            assert reply["applied"] is True, reply
            seq_at_reply = monitor.agents["ctl"].last_seq
            # the next Snapshot (within a tick) already carries the new target
            await until(lambda: monitor.agents["ctl"].last_seq > seq_at_reply, 3, "next tick")
            assert monitor.agents["ctl"].last.load.target_concurrency == 6
            assert any(e.message.endswith("(mqtt)") for s in monitor.agents["ctl"].recent
                       for e in s.events)

            [reply] = await monitor.control("ctl", "set_concurrency", 64)
            assert reply["applied"] is False
            assert reply["reason"] == "64 streams is over this agent's --max-concurrency 8"
            [reply] = await monitor.control("ctl", "add_concurrency", 3)
            assert reply["applied"] is False and "9 streams" in reply["reason"]
            [reply] = await monitor.control("ctl", "stop")
            assert reply["applied"] is False and "not remotely allowed" in reply["reason"]
            [reply] = await monitor.control("ctl", "set_concurrency", "lots")
            assert reply["applied"] is False and "needs a number" in reply["reason"]

            [reply] = await monitor.control("ro", "set_concurrency", 2)
            assert reply == {**reply, "applied": False, "reason": REMOTE_OFF}

            replies = await monitor.control("all", "pause")
            assert {r["agent"]: r["applied"] for r in replies} == {"ctl": True, "ro": False}
            seq_at_reply = monitor.agents["ctl"].last_seq
            await until(lambda: monitor.agents["ctl"].last_seq > seq_at_reply, 3, "next tick")
            assert monitor.agents["ctl"].last.load.state == "paused"
            [reply] = await monitor.control("ctl", "resume")
            assert reply["applied"] is True
            assert monitor.agents["ctl"].status["remote_control"] is True
            assert monitor.agents["ctl"].status["max_concurrency"] == 8
            assert monitor.agents["ro"].status["remote_control"] is False
        finally:
            for task in (ctl, ro):
                task.cancel()
            await asyncio.gather(ctl, ro, return_exceptions=True)
            await monitor.close()
