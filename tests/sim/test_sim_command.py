"""`tokentop sim` as a person runs it: one line saying where it listens, and ports it refuses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import pytest
from support import ROOT, tokentop

from tui.commands.sim import sim_parser

LISTENING = re.compile(r"^tokentop sim: listening on (http://127\.0\.0\.1:(\d+)/v1) \((.*)\)$")


def _first_line(stream, proc: subprocess.Popen, deadline_s: float = 20.0) -> str:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if line:
            return line.rstrip("\n")
        if proc.poll() is not None:
            break
    raise AssertionError("the simulator printed nothing")


def _sim(*flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "sim", "--host", "127.0.0.1", "--port", "0",
         "--exit-with-parent", *flags],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _stop(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.close()  # --exit-with-parent: EOF on stdin ends it
    proc.wait(timeout=20)


def _models(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/models", timeout=10) as r:
        return [m["id"] for m in json.load(r)["data"]]


def test_says_where_it_listens_with_the_real_port_profile_slots_and_faults():
    proc = _sim("--profile", "tiny", "--slots", "12", "--model", "m-under-test",
                "--fault-error-rate", "0.25")
    try:
        line = _first_line(proc.stdout, proc)
        m = LISTENING.match(line)
        assert m, line
        url, port, what = m.group(1), int(m.group(2)), m.group(3)
        assert port != 0
        # the printed URL is where the simulator really is: it answers there, as itself
        assert _models(url) == ["m-under-test"]
        assert what == ("tiny profile: 12 slots, KV 4,096 tokens, faults error_rate=0.25; "
                        "model m-under-test")
    finally:
        _stop(proc)


def test_no_faults_no_fault_list_and_announce_keeps_stdout_for_the_parent():
    proc = _sim("--announce")
    try:
        assert _first_line(proc.stdout, proc).startswith("TOKENTOP_SIM_LISTENING ")
        line = _first_line(proc.stderr, proc)
        assert LISTENING.match(line), line
        assert "default profile" in line and "no faults" in line
    finally:
        _stop(proc)


@pytest.mark.parametrize("port", ["99999", "65536", "-1", "eighty"])
def test_a_port_outside_0_to_65535_is_one_line_and_exit_2(port):
    proc = tokentop("sim", "--port", port, timeout=30)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("tokentop sim: ")
    assert "--port" in proc.stderr and "Traceback" not in proc.stderr


def test_the_ends_of_the_port_range_are_accepted():
    assert sim_parser().parse_args(["--port", "0"]).port == 0
    assert sim_parser().parse_args(["--port", "65535"]).port == 65535
