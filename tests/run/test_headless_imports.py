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


# runs `tokentop ARGS…` in this process and, at its exit, writes what the start-up left set
_RUN_STATE = """
import atexit, gc, json, os, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps({
    "blas": os.environ.get("OPENBLAS_NUM_THREADS"), "omp": os.environ.get("OMP_NUM_THREADS"),
    "gc": gc.isenabled(), "frozen": gc.get_freeze_count()})))
from tui.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("omp", [None, "3"])
def test_a_headless_run_starts_one_blas_thread_and_collects_again(sim_url, tmp_path, omp):
    """numpy's OpenBLAS would start a spinning thread a core (CPU for nothing: the run does
    not multiply matrices), unless the user chose a count; collection is off only while
    the run's modules load (loadgen.worker.limits, tui.commands.console)."""
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
    if omp:
        env["OMP_NUM_THREADS"] = omp
    state = tmp_path / "state.json"
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_STATE, str(state), "run", "--headless", "--url", sim_url,
         "-c", "1", "--duration", "0.3", "--output-tokens", "8", "--out", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(state.read_text())
    assert (got["blas"], got["omp"]) == ((None, omp) if omp else ("1", None))
    assert got["gc"] is True and got["frozen"] > 0


def test_one_blas_thread_keeps_a_count_the_user_chose():
    from loadgen.worker.limits import one_blas_thread

    for chosen in ({"OPENBLAS_NUM_THREADS": "4"}, {"GOTO_NUM_THREADS": "2"},
                   {"OMP_NUM_THREADS": "8"}):
        env = dict(chosen)
        one_blas_thread(env)
        assert env == chosen
    env = {"PATH": "/bin"}
    one_blas_thread(env)
    assert env == {"PATH": "/bin", "OPENBLAS_NUM_THREADS": "1"}


def test_importing_the_worker_module_leaves_collection_on():
    """Only the worker process (`python -m loadgen.worker.main`) holds collection off while
    it imports; a test or tool that imports the module is left as it was."""
    proc = subprocess.run(
        [sys.executable, "-c", "import gc, loadgen.worker.main; print(gc.isenabled())"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "True", proc.stderr
