"""What a headless run loads: nothing of the console, the plots, the SDK, MQTT or the
simulator's server (issue 28: a headless run's start-up CPU is mostly imports, and the test
suite alone spawns hundreds of these processes).

The run is real (the command line's own `main`, against a real `tokentop sim` process); the
process writes the names in its sys.modules as it exits, and the test reads them. A module
on the list below appears there only if some module on the path imports it, so a top-level
import added back fails this test, whatever the timing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import ROOT, start_sim_process

# loaded by none of these paths: the console (textual, rich), plots, the openai SDK (--client
# openai only), MQTT (--publish only)
NEVER = ("textual", "rich", "matplotlib", "openai", "aiomqtt", "paho")
# and not by a run against a server: the embedded simulator's server (aiohttp.web) and the
# Prometheus endpoint (--prometheus-port only, also aiohttp.web)
NOT_HEADLESS = (*NEVER, "aiohttp.web", "loadgen.sim.program", "loadgen.sim.server",
                "loadgen.run.prometheus", "loadgen.fleet.publisher", "tui.app")

# runs `tokentop ARGS…` in this process and, at its exit, writes sys.modules to argv[1]
_RUN = """
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from tui.cli import main
sys.exit(main(sys.argv[2:]))
"""
# imports a command's entry path and writes sys.modules to argv[1]
_IMPORT = """
import importlib, json, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules)))
"""


@pytest.fixture(scope="module")
def sim_url():
    proc, port = start_sim_process()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def loaded(path, forbidden: tuple[str, ...]) -> list[str]:
    """The forbidden packages (or any module inside them) among the names written to `path`."""
    names = json.loads(path.read_text())
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


def test_a_headless_run_loads_nothing_it_does_not_use(sim_url, tmp_path):
    modules, summary = tmp_path / "modules.json", tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(modules), "run", "--headless", "--url", sim_url,
         "-c", "1", "--duration", "0.5", "--output-tokens", "8", "--out",
         str(tmp_path / "run"), "--json", str(summary)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    # the run did its work (requests served and recorded), so the list is of a whole run
    assert json.loads(summary.read_text())["requests"]["ok"] > 0
    assert (tmp_path / "run" / "snapshots.jsonl").stat().st_size > 0
    assert loaded(modules, NOT_HEADLESS) == []


def test_sim_and_calibrate_load_no_console_plots_sdk_or_mqtt(tmp_path):
    modules = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT, str(modules), "tui.commands.sim", "loadgen.sim.program",
         "tui.commands.calibrate", "loadgen.analysis.calibrate"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert loaded(modules, NEVER) == []
