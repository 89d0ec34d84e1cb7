"""`tokentop agent` as a real process: the last will when it is killed, auth, no secrets out."""

from __future__ import annotations

import asyncio
import os
import signal

import aiomqtt
import pytest
from mosquitto import Mosquitto, Recorder, agent_process, kill_group, settings, until

from loadgen.fleet.monitor import FleetMonitor

PASSWORD = "pw-Zq7-not-for-logs"


async def test_killed_agent_shows_offline_via_its_will(sim, tmp_path):
    async with Mosquitto(tmp_path) as broker:
        monitor = FleetMonitor(settings(broker.url), "t")
        await monitor.start(wait=10)
        proc = agent_process(["--broker", broker.url, "--fleet", "t", "--name", "victim",
                              "--url", sim.url, "--workers", "1", "-c", "2",
                              "--output-tokens", "8", "--mqtt-keepalive", "2", "--no-record"])
        try:
            await until(lambda: "victim" in monitor.agents
                        and monitor.agents["victim"].last is not None, 30, "victim's snapshots")
            assert monitor.rows()[0].state == "online"
            os.kill(proc.pid, signal.SIGKILL)
            # keepalive 2 s: the broker gives up after 1.5 × 2 s and publishes the will
            await until(lambda: monitor.rows()[0].state == "offline", 10, "the last will")
            status = monitor.agents["victim"].status
            assert status["state"] == "offline" and status["reason"] == "connection lost"
            assert status["run_id"] == monitor.agents["victim"].run_id
        finally:
            kill_group(proc)
            await monitor.close()


async def test_stale_when_snapshots_stop_but_no_will_yet(sim, tmp_path):
    async with Mosquitto(tmp_path) as broker:
        monitor = FleetMonitor(settings(broker.url), "t", stale_after=1.0)
        await monitor.start(wait=10)
        proc = agent_process(["--broker", broker.url, "--fleet", "t", "--name", "frozen",
                              "--url", sim.url, "--workers", "1", "-c", "1",
                              "--output-tokens", "8", "--mqtt-keepalive", "30", "--no-record"])
        try:
            await until(lambda: "frozen" in monitor.agents
                        and monitor.agents["frozen"].last is not None, 30, "snapshots")
            os.killpg(proc.pid, signal.SIGSTOP)  # alive, connected, silent
            await until(lambda: monitor.rows()[0].state == "stale", 5, "stale")
        finally:
            kill_group(proc)
            await monitor.close()


async def test_auth_on_refuses_anonymous_and_keeps_the_password_out(sim, tmp_path):
    users = {"agent": PASSWORD, "viewer": "viewer-pw"}
    async with Mosquitto(tmp_path, users=users) as broker:
        # an anonymous client is refused by the broker
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client("127.0.0.1", broker.port, timeout=5):
                pass
        # so is a wrong password, and the monitor says why in words
        wrong = FleetMonitor(settings(broker.url_for("viewer"), "nope"), "t", max_backoff=1.0)
        await wrong.start()
        await until(lambda: wrong.last_error is not None, 10, "a refusal")
        assert "not authorized" in wrong.last_error and "nope" not in wrong.last_error
        await wrong.close()

        viewer = settings(broker.url_for("viewer"), "viewer-pw")
        monitor = FleetMonitor(viewer, "t")
        await monitor.start(wait=10)
        assert monitor.connected
        pwfile = tmp_path / "mqtt-password"
        pwfile.write_text(PASSWORD + "\n")
        async with Recorder(viewer) as raw:
            # the password from the environment …
            env_agent = agent_process(
                ["--broker", broker.url_for("agent"), "--fleet", "t", "--name", "env-pw",
                 "--url", sim.url, "--workers", "1", "-c", "2", "--output-tokens", "8",
                 "--duration", "2", "--no-record"],
                env={"TOKENTOP_MQTT_PASSWORD": PASSWORD})
            # … or from a file
            file_agent = agent_process(
                ["--broker", broker.url_for("agent"), "--fleet", "t", "--name", "file-pw",
                 "--url", sim.url, "--workers", "1", "-c", "2", "--output-tokens", "8",
                 "--duration", "2", "--no-record", "--mqtt-password-file", str(pwfile)],
                env={"TOKENTOP_MQTT_PASSWORD": ""})
            try:
                outs = await asyncio.gather(asyncio.to_thread(env_agent.communicate, timeout=60),
                                            asyncio.to_thread(file_agent.communicate, timeout=60))
            finally:
                kill_group(env_agent)
                kill_group(file_agent)
            await until(lambda: all(monitor.agents.get(n) is not None
                                    and monitor.agents[n].status.get("reason") == "stopped"
                                    for n in ("env-pw", "file-pw")), 10, "both agents stopped")
        try:
            for proc, (stdout, stderr) in zip((env_agent, file_agent), outs, strict=True):
                assert proc.returncode == 0, stderr.decode()
                assert b"publishing to mqtt://agent@127.0.0.1" in stderr
                assert PASSWORD.encode() not in stdout + stderr
            for n in ("env-pw", "file-pw"):
                assert monitor.agents[n].received >= 3
            assert len(raw.messages) > 10
            for _topic, payload, _retained in raw.messages:
                assert PASSWORD.encode() not in payload
                if payload[:1] != b"{":
                    import zlib

                    assert PASSWORD.encode() not in zlib.decompress(payload)
        finally:
            await monitor.close()


def test_password_in_the_url_is_refused_and_bad_input_is_one_line(tmp_path):
    import subprocess
    import sys

    def agent(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tui.cli", "agent", *args],
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    p = agent("--broker", f"mqtt://agent:{PASSWORD}@127.0.0.1:1883", "--no-record")
    assert p.returncode == 2
    assert "do not put the broker password in the URL" in p.stderr
    assert PASSWORD not in p.stderr and "Traceback" not in p.stderr
    p = agent("--broker", "mqtt://127.0.0.1:1883", "--name", "a/b", "--no-record")
    assert p.returncode == 2 and "bad agent name 'a/b'" in p.stderr
    p = agent("--broker", "http://127.0.0.1", "--no-record")
    assert p.returncode == 2 and "bad broker" in p.stderr
    missing = tmp_path / "nope"
    p = agent("--broker", "mqtt://u@127.0.0.1", "--mqtt-password-file", str(missing))
    assert p.returncode == 2 and "cannot read --mqtt-password-file" in p.stderr
