"""A real mosquitto broker for tests: a free 127.0.0.1 port, a generated config, torn down after.
Also the helpers the fleet tests share: agents in-process or as real processes, a raw subscriber.

    async with Mosquitto(tmp_path) as broker:             # anonymous clients allowed
    async with Mosquitto(tmp_path, users={"u": "pw"}):    # password file, allow_anonymous false

`stop()` / `start()` restart it on the same port (the broker-restart test).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiomqtt

from loadgen.fleet.link import BrokerSettings, parse_broker_url
from loadgen.run.config import PublishTo, RunConfig
from loadgen.run.headless import run_headless
from loadgen.run.secrets import Secrets

ROOT = Path(__file__).resolve().parent.parent  # the project

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mosquitto:
    def __init__(self, tmp: Path, *, users: dict[str, str] | None = None,
                 persistence: bool = True) -> None:
        self.dir = Path(tmp) / f"mosquitto-{free_port()}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.users = users
        self.persistence = persistence
        self.proc: subprocess.Popen | None = None
        self.log = self.dir / "mosquitto.log"
        self.conf = self.dir / "mosquitto.conf"
        self._write_config()

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def url_for(self, user: str) -> str:
        return f"mqtt://{user}@127.0.0.1:{self.port}"

    def _write_config(self) -> None:
        # run as root (containers), mosquitto would drop to user "mosquitto", which cannot
        # write this test's directory: stay the user that started it
        user = pwd.getpwuid(os.geteuid()).pw_name
        lines = [f"user {user}", f"listener {self.port} 127.0.0.1", "log_dest stderr",
                 "log_type error",
                 "log_type warning", "log_type notice", "log_type information"]
        if self.persistence:
            lines += ["persistence true", f"persistence_location {self.dir}/"]
        else:
            lines += ["persistence false"]
        if self.users:
            pw = self.dir / "passwd"
            pw.touch()
            for user, password in self.users.items():
                subprocess.run([MOSQUITTO_PASSWD, "-b", str(pw), user, password], check=True,
                               capture_output=True, timeout=10)
            pw.chmod(0o600)
            lines += [f"password_file {pw}", "allow_anonymous false"]
        else:
            lines += ["allow_anonymous true"]
        self.conf.write_text("\n".join(lines) + "\n")

    async def start(self) -> None:
        self._logf = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=self._logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.log.read_text()[-2000:]}")
            try:
                _, w = await asyncio.open_connection("127.0.0.1", self.port)
                w.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        self.proc.kill()
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {START_TIMEOUT_S} s")

    async def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            await asyncio.to_thread(self.proc.wait, 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait, 10)
        self.proc = None
        self._logf.close()

    async def __aenter__(self) -> Mosquitto:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()


# ---- fleet test helpers ----------------------------------------------------------------------


def small_run(url: str, **kw) -> RunConfig:
    base = dict(url=url, concurrency=3, workers=1, input_tokens="16", output_tokens="12",
                tick=0.5, drain_grace=2.0)
    base.update(kw)
    return RunConfig(**base)


def settings(url: str, password: str | None = None, keepalive: int = 5) -> BrokerSettings:
    s = parse_broker_url(url)
    s.password = password
    s.keepalive = keepalive
    return s


def start_agent(cfg: RunConfig, broker: BrokerSettings, name: str, *, fleet: str = "t",
                tmp: Path | None = None, record: bool | None = None,
                max_backoff: float = 1.0, **publish) -> asyncio.Task:
    """An agent (a headless run that publishes) as an asyncio task in this process (its
    load workers are processes); `publish` takes PublishTo's fields (remote_control, …)."""
    out = open(os.devnull, "w")  # noqa: SIM115 - the agent's progress lines are not checked here
    if tmp is not None:
        cfg.out = str(tmp / f"run-{name}")
    cfg.publish = PublishTo(broker=broker.display, fleet=fleet, name=name,
                            keepalive=broker.keepalive, max_backoff=max_backoff, **publish)
    secrets = Secrets(mqtt_password=broker.password)
    task = asyncio.create_task(run_headless(
        cfg, secrets, record=tmp is not None if record is None else record, out=out))
    task.add_done_callback(lambda _t: out.close())
    return task


def agent_process(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """`tokentop agent …` (as `python -m tui.cli agent …`), a real process in its own process
    group."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "tui.cli", "agent", *args], cwd=ROOT, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(10)


async def until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Bounded wait; fails the test with `what` rather than hanging."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class Recorder:
    """A plain aiomqtt subscriber that keeps every message under a topic filter."""

    def __init__(self, broker: BrokerSettings, filt: str = "tokentop/#") -> None:
        self.broker = broker
        self.filt = filt
        self.messages: list[tuple[str, bytes, bool]] = []
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()

    async def __aenter__(self) -> Recorder:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 10)
        return self

    async def _run(self) -> None:
        b = self.broker
        async with aiomqtt.Client(b.host, b.port, username=b.username, password=b.password,
                                  protocol=aiomqtt.ProtocolVersion.V5) as client:
            await client.subscribe(self.filt, qos=1)
            self._ready.set()
            async for m in client.messages:
                self.messages.append((str(m.topic), bytes(m.payload), bool(m.retain)))

    async def __aexit__(self, *exc) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    def payloads(self, suffix: str) -> list[tuple[str, bytes]]:
        return [(t, p) for t, p, _ in self.messages if t.endswith(suffix)]
