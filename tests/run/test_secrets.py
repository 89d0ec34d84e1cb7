"""Secrets reach the server and nothing else: not a run file, a summary, a line on stderr,
an MQTT payload, a process's argv or environment.

The simulator here wants credentials (`require_authorization`), so a run that succeeds
proves they were sent; then every byte the run produced is searched for them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import subprocess
import sys
import time
from pathlib import Path

import psutil
from mosquitto import Mosquitto, Recorder, settings
from support import running_sim

from loadgen.record.rundir import read_manifest

SMALL = ["--workers", "1", "-c", "2", "--input-tokens", "8", "--output-tokens", "8",
         "--tick", "0.25", "--drain-grace", "1", "--duration", "2"]


def authenticated(sim) -> bool:
    """Requests were answered, and none was refused for its credentials."""
    return sim.server.unauthorized == 0 and sum(sim.model.metrics.success.values()) > 0


def everything_written(*roots: Path) -> bytes:
    """The bytes of every file under `roots` (run directories, summaries)."""
    out = b""
    for root in roots:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for p in files:
            out += p.read_bytes()
    return out


def descendants_text(proc: subprocess.Popen) -> bytes:
    """argv and environment of `proc`'s children (workers, run process), while they live."""
    out = b""
    for child in psutil.Process(proc.pid).children(recursive=True):
        for name in ("cmdline", "environ"):
            with contextlib.suppress(OSError):  # it exited meanwhile
                out += Path(f"/proc/{child.pid}/{name}").read_bytes()
    return out


async def run_watching_children(args: list[str]) -> tuple[int, str, bytes]:
    """`tokentop ARGS`, and what its children's argv and environments held mid-run."""
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    seen = b""
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        seen += descendants_text(proc)
        await asyncio.sleep(0.2)
    out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    return proc.returncode, out + err, seen


async def test_url_credentials_authenticate_and_are_written_nowhere(tmp_path):
    password = "pw-Secret-9137"
    basic = "Basic " + base64.b64encode(f"ops:{password}".encode()).decode()
    async with running_sim(require_authorization=basic) as sim:
        url = sim.url.replace("http://", f"http://ops:{password}@")
        run, summary = tmp_path / "run", tmp_path / "summary.json"
        code, output, children = await run_watching_children(
            ["run", "--headless", "--url", url, *SMALL, "--out", str(run), "--json",
             str(summary)])
        assert code == 0, output
        assert authenticated(sim)  # the credentials were sent, and accepted
        written = everything_written(run, summary) + output.encode() + children
        assert children, "the run's child processes were seen"
        for secret in (password, base64.b64encode(f"ops:{password}".encode())):
            assert (secret if isinstance(secret, bytes) else secret.encode()) not in written
        assert read_manifest(run)["config"]["url"] == sim.url  # the public URL is kept


async def test_the_api_key_travels_on_pipes_only(tmp_path):
    key = "sk-never-anywhere-4242"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    async with running_sim(require_authorization=f"Bearer {key}") as sim, \
            Mosquitto(tmp_path, users={"ops": "mqtt-pw-0077"}) as broker:
        password_file = tmp_path / "mqtt-pw"
        password_file.write_text("mqtt-pw-0077\n")
        async with Recorder(settings(broker.url_for("ops"), "mqtt-pw-0077")) as mqtt:
            run = tmp_path / "run"
            code, output, children = await run_watching_children(
                ["agent", "--broker", broker.url_for("ops"), "--mqtt-password-file",
                 str(password_file), "--fleet", "t", "--name", "a", "--url", sim.url,
                 "--api-key-file", str(key_file), *SMALL, "--out", str(run)])
            assert code == 0, output
            assert authenticated(sim)
            payloads = b"".join(p for _, p, _ in mqtt.messages)
        assert mqtt.messages, "the agent published"
    written = everything_written(run) + output.encode() + children + _inflated(payloads)
    for secret in (key, "mqtt-pw-0077"):
        assert secret.encode() not in written
    m = read_manifest(run)
    # redacted by what is secret, not by a word in a field's name
    assert m["tokentop_version"] != "[removed]" and m["config"]["input_tokens"] == "8"


def _inflated(payloads: bytes) -> bytes:
    """Compressed Snapshot payloads as plain text too (a secret must not hide in zlib)."""
    import zlib

    try:
        return payloads + zlib.decompress(payloads)
    except zlib.error:
        return payloads


def test_a_bad_key_file_says_what_is_wrong_with_it(tmp_path):
    for name, text, words in (("empty", "\n", "is empty"),
                              ("two-lines", "sk-one\nsk-two\n", "holds more than one line"),
                              ("cr", "sk-one\rX\n", "holds more than one line")):
        f = tmp_path / name
        f.write_text(text)
        done = subprocess.run([sys.executable, "-m", "tui.cli", "run", "--headless",
                               "--url", "http://127.0.0.1:9/v1", "--api-key-file", str(f)],
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done.stderr
        assert f"--api-key-file {f} {words}" in done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
