"""`tokentop agent` against a broker that says no, and one that goes away and comes back
(issue 17): refused credentials at start are a configuration error (exit 2, one line, the run
never starts); a broker restart is an outage the agent rides out and recovers from promptly,
saying "online" again at once."""

from __future__ import annotations

import asyncio
import time

import msgspec
from mosquitto import Mosquitto, Recorder, agent_process, kill_group, settings, until

PASSWORD = "pw-Qx4-right-one"
WRONG = "pw-Vb9-wrong-one"


def _agent_args(broker: str, name: str, sim_url: str, *extra: str) -> list[str]:
    return ["--broker", broker, "--fleet", "t", "--name", name, "--url", sim_url,
            "--workers", "1", "-c", "2", "--output-tokens", "8", "--no-record", *extra]


async def test_refused_credentials_at_start_exit_2_and_the_right_ones_publish(sim, tmp_path):
    async with Mosquitto(tmp_path, users={"ops": PASSWORD}) as broker:
        wrong = tmp_path / "wrong-password"
        wrong.write_text(WRONG + "\n")
        right = tmp_path / "right-password"
        right.write_text(PASSWORD + "\n")
        env = {"TOKENTOP_MQTT_PASSWORD": ""}
        # the wrong password: the run does not start (it would run its 20 s and exit 0)
        started = time.monotonic()
        proc = agent_process(_agent_args(broker.url_for("ops"), "bad-pw", sim.url,
                                         "--duration", "20", "--mqtt-password-file", str(wrong)),
                             env=env)
        try:
            stdout, stderr = await asyncio.to_thread(proc.communicate, timeout=60)
        finally:
            kill_group(proc)
        took = time.monotonic() - started
        out = (stdout + stderr).decode()
        assert proc.returncode == 2, out
        assert took < 15, f"refused credentials took {took:.1f} s to be reported"
        lines = stderr.decode().strip().splitlines()
        assert len(lines) == 1, out
        assert "refused the credentials for user 'ops'" in lines[0]
        assert "mqtt://ops@127.0.0.1" in lines[0] and "--mqtt-password-file" in lines[0]
        assert "Traceback" not in out and WRONG not in out and PASSWORD not in out

        # the right password: runs, exits 0, and its snapshots are on the broker
        async with Recorder(settings(broker.url_for("ops"), PASSWORD)) as raw:
            proc = agent_process(_agent_args(broker.url_for("ops"), "good-pw", sim.url,
                                             "--duration", "2", "--mqtt-password-file",
                                             str(right)), env=env)
            try:
                stdout, stderr = await asyncio.to_thread(proc.communicate, timeout=60)
            finally:
                kill_group(proc)
            assert proc.returncode == 0, stderr.decode()
            await until(lambda: len(raw.payloads("/good-pw/snapshot")) >= 2, 10,
                        "the agent's snapshots")
            assert PASSWORD.encode() not in stdout + stderr


OUTAGE_S = 20.0  # long enough that a backoff doubling to 30 s waits ~5-18 s past the restart


async def test_broker_restart_agent_back_promptly_and_online_again(sim, tmp_path):
    # no persistence: after the restart the broker holds no retained status but what the
    # agent publishes again
    broker = Mosquitto(tmp_path, persistence=False)
    await broker.start()
    proc = agent_process(_agent_args(broker.url, "phoenix", sim.url, "--duration", "90",
                                     "--mqtt-keepalive", "5"))
    try:
        async with Recorder(settings(broker.url)) as before:
            await until(lambda: len(before.payloads("/phoenix/snapshot")) >= 2, 30,
                        "snapshots before the restart")
        await broker.stop()
        await asyncio.sleep(OUTAGE_S)  # the outage itself; nothing is asserted on the clock
        assert proc.poll() is None, "the agent should ride out the outage"
        await broker.start()
        up = time.monotonic()
        async with Recorder(settings(broker.url)) as after:
            await until(lambda: after.payloads("/phoenix/snapshot"), 30,
                        "snapshots after the restart")
            back_in = time.monotonic() - up
            await until(lambda: after.payloads("/phoenix/status"), 10, "the status")
            status = msgspec.json.decode(after.payloads("/phoenix/status")[-1][1])
            assert status["state"] == "online"
        print(f"agent republished {back_in:.2f} s after the broker restart")
        assert back_in < 5.0, f"the agent took {back_in:.1f} s to come back"
        # a reader that arrives now gets the retained status: "online", not the will
        async with Recorder(settings(broker.url), "tokentop/t/phoenix/status") as late:
            await until(lambda: late.messages, 10, "the retained status")
            _topic, payload, retained = late.messages[-1]
            assert retained and msgspec.json.decode(payload)["state"] == "online"
    finally:
        kill_group(proc)
        await broker.stop()
