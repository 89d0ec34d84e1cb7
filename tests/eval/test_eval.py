"""`tokentop eval` through the command line against real simulator processes, with a tiny
plan (seconds, not hours): every row of the matrix filled or explained, each proxy fault
judged against the proxy's own record, the scaling row with two simulator replicas (the
second replica's own token counter the truth), a killed eval resumed at its phase, two
evals compared, and a chaos kill and restart whose MTTR matches the real downtime (the
kill's timestamp to when the restarted simulator listens, within the probes' 250 ms)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import ROOT, WAIT_S, start_sim_process, tokentop

from loadgen.eval.chaos import PROBE_EVERY_S
from loadgen.eval.phases import PHASES
from loadgen.record.rundir import last_snapshot
from probes.process import find_listener

# each test runs whole evals (a minute or so each, the module's first one longer)
pytestmark = pytest.mark.timeout(420)

PLAN = """
version = 1
slo = "ttft<2s,ttft_p99<4s,error_rate<50%"
fault_settle = "5s"  # the simulator recovers at once: the least a plan may say
[phases.baseline]
concurrency = 4
duration = "3s"
warmup = "1s"
input_tokens = {input_tokens}
output_tokens = 16
[phases.ramp]
steps = [1, 2, 4]
step_duration = "2s"
step_warmup = "0.5s"
[phases.batch]
requests = 8
timeout = "30s"
[phases.context]
concurrency = 2
input_ladder = [64, 256]
output_ladder = [32]
fixed_output = 16
fixed_input = 64
step_duration = "1s"
step_warmup = "0.5s"
[phases.interference]
neighbors = ["cpu"]
duration = "1s"
warmup = "0.5s"
[phases.priority]
classes = ["fast 50% out=8 priority=0 slo=ttft_p99<4s", "slow 50% priority=5"]
load = "baseline"
factor = 1.0
duration = "1s"
warmup = "0.5s"
[phases.memory]
[phases.long_tail]
fraction = 0.5
duration = "4s"
bucket = "2s"
{faults}
[phases.scaling]
enabled = {scaling}
targets = {targets}
per_target = "baseline"
duration = "3s"
warmup = "1s"
"""
FAULTS = """
[[phases.faults]]
at = "1s"
fault = "latency"
ms = 100
for = "2s"
[[phases.faults]]
at = "4s"
fault = "blackhole"
seconds = 3
[[phases.faults]]
at = "8s"
fault = "reset"
probability = 1.0
for = "1s"
"""


def write_plan(path: Path, *, targets: list[str] | None = None, faults: str = FAULTS,
               input_tokens: int = 32, only_faults: bool = False,
               off: tuple[str, ...] = ()) -> Path:
    """The tiny plan; `only_faults`: every phase off but the faults; `off`: these off."""
    text = PLAN.format(input_tokens=input_tokens, faults=faults or "",
                       scaling="true" if targets else "false", targets=json.dumps(targets or []))
    if not faults:
        text = text.replace("[phases.scaling]", "[phases]\nfaults = []\n[phases.scaling]", 1)
    if only_faults:
        off = ("baseline", "ramp", "batch", "context", "interference", "priority", "long_tail",
               "leaks", "memory", "efficiency")
    for phase in off:
        if f"[phases.{phase}]" in text:
            text = text.replace(f"[phases.{phase}]\n", f"[phases.{phase}]\nenabled = false\n")
        else:
            text += f"\n[phases.{phase}]\nenabled = false\n"
    path.write_text(text)
    return path


def eval_argv(url: str, plan: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tui.cli", "eval", f"--url={url}", f"--plan={plan}",
            f"--out={out}", "--workers=1", *extra]


@pytest.fixture(scope="module")
def sims():
    procs = [start_sim_process() for _ in range(2)]
    yield [f"http://127.0.0.1:{port}/v1" for _, port in procs]
    for proc, _ in procs:
        proc.stdin.close()
        proc.wait(10)


@pytest.fixture(scope="module")
def full(sims, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("eval")
    plan = write_plan(tmp / "plan.toml", targets=sims)
    out = tmp / "out"
    done = subprocess.run(eval_argv(sims[0], plan, out), capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


def test_every_row_is_filled_or_explained(full):
    out, done = full
    state = json.loads((out / "eval.json").read_text())
    assert state["finished"] is True
    assert {r["dimension"] for r in state["rows"]} >= {
        "latency & throughput", "pressure ramp", "long tail", "stability under faults",
        "leaks", "efficiency", "scaling"}
    for row in state["rows"]:
        assert row["value"] is not None or row["note"], row
    by_id = {r["id"]: r for r in state["rows"]}
    # the plan's whole-run thresholds judge the rows of what they measure
    assert by_id["baseline.ttft.p99"]["verdict"] == "PASS"
    assert by_id["baseline.ttft.p99"]["limit"] == "< 4.00 s"
    assert by_id["baseline.error_rate"]["verdict"] == "PASS"
    # each latency row says how many requests it is over: the run's own count of them
    baseline = state["phases"]["baseline"]["figures"]
    assert by_id["baseline.ttft.p50"]["samples"] == baseline["latency_ms"]["ttft"]["count"] > 0
    assert "pressure ramp" in done.stdout and f"wrote {out / 'eval.md'}" in done.stdout
    md = (out / "eval.md").read_text()
    assert "TTFT P99" in md
    for png in ("faults.png", "ramp/sweep.png"):
        assert (out / png).stat().st_size > 1000, png
        assert png in md


def test_each_fault_against_the_proxys_record(full):
    out, _ = full
    phase = json.loads((out / "eval.json").read_text())["phases"]["faults"]
    faults = phase["figures"]
    by_kind = {f["fault"]: f for f in faults["faults"]}
    hole = by_kind["blackhole"]
    truth = hole["end"] - hole["start"]  # the proxy's own record of it
    assert truth == pytest.approx(3.0, abs=0.05)
    assert hole["silence_s"] == pytest.approx(truth, abs=0.5)
    assert hole["requests_failed"] == 0  # held, not dropped: streams resume after it
    # every reset the proxy made is one failed request, and nothing else failed
    run = last_snapshot(phase["run_dir"])
    assert faults["proxy"]["resets"] > 0
    assert run.counters.requests_failed == faults["proxy"]["resets"]
    assert set(run.counters.errors) <= {"stream_broken", "connect"}
    assert by_kind["latency"]["requests_failed"] == 0


def test_scaling_on_two_replicas_against_the_second_ones_counter(full, sims):
    out, _ = full
    scaling = json.loads((out / "eval.json").read_text())["phases"]["scaling"]["figures"]
    rows = {r["targets"]: r for r in scaling["rows"]}
    assert sorted(rows) == [1, 2]
    # the second replica served only the two-target run: its own count of what it generated
    # is the truth for that run's tokens
    metrics = _scrape(sims[1])
    second = last_snapshot(rows[2]["run_dirs"][1])
    assert second.counters.output_tokens == pytest.approx(
        metrics["vllm:generation_tokens_total"], rel=0.01)
    assert 0.7 <= rows[2]["efficiency"] <= 1.3  # two independent replicas: about 2 × one


def _scrape(url: str) -> dict[str, float]:
    import asyncio

    from support import scrape

    return asyncio.run(scrape(url.removesuffix("/v1") + "/metrics"))


def test_a_killed_eval_resumes_at_its_phase_and_compare_says_what_differs(full, sims,
                                                                          tmp_path):
    # the phases between the ramp and the long tail are not what a resume is about: off
    plan = write_plan(tmp_path / "plan.toml", faults="", input_tokens=48,
                      off=("batch", "context", "interference", "priority"))
    out = tmp_path / "out"
    proc = subprocess.Popen(eval_argv(sims[0], plan, out), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "ramp" not in _phases(out):
            assert time.monotonic() < deadline and proc.poll() is None, "the ramp never ended"
            time.sleep(0.2)
        # the long tail's first try is under way once its run directory holds a line
        first_try = out / "runs" / "long_tail"
        while not any(first_try.glob("*.jsonl*")):
            assert time.monotonic() < deadline and proc.poll() is None, "no long tail began"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)  # during the long tail
    finally:
        proc.wait(10)
    kept = _phases(out)
    assert set(kept) == set(PHASES[:PHASES.index("long_tail")])  # the phases before it
    again = subprocess.run(eval_argv(sims[0], plan, out), capture_output=True, text=True,
                           timeout=240, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert again.returncode == 2 and "holds an eval already" in again.stderr
    resume = [a for a in eval_argv(sims[0], plan, out) if "--plan" not in a]
    again = subprocess.run([*resume, "--repeat=2"], capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert again.returncode == 2 and "without --repeat" in again.stderr  # its plan is kept
    again = subprocess.run(resume,
                           capture_output=True, text=True, timeout=240,
                           stdin=subprocess.DEVNULL, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "baseline: done before, kept" in again.stderr
    assert "ramp: done before, kept" in again.stderr
    state = json.loads((out / "eval.json").read_text())
    assert state["finished"] and state["phases"]["baseline"] == kept["baseline"]
    assert (out / "runs" / "long_tail").exists() and (out / "runs" / "long_tail.try2").exists()

    shown = tokentop("eval", "compare", str(full[0]), str(out))
    assert shown.returncode == 0, shown.stderr
    assert "the workloads differ: input_tokens is '32'" in shown.stdout
    assert "requests/s" in shown.stdout and "%" in shown.stdout
    lone = tokentop("eval", "compare", str(out))
    assert lone.returncode == 2 and "two eval directories" in lone.stderr


def _phases(out: Path) -> dict:
    try:
        return json.loads((out / "eval.json").read_text())["phases"]
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_chaos_kill_and_restart_mttr_matches_the_real_downtime(tmp_path):
    port = _free_port()
    marker = tmp_path / "listening"
    first = subprocess.Popen([sys.executable, "-m", "tui.cli", "sim", "--port", str(port),
                              "--announce"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, text=True, cwd=ROOT)
    assert first.stdout.readline().startswith("TOKENTOP_SIM_LISTENING")
    # the restart: three seconds down (past OUTAGE_MIN_S, so the load sees an outage too),
    # then a new simulator; the marker file is written when it listens, so its time is when
    # the server was back (the truth for the downtime)
    restart = (f"sleep 3; {sys.executable} -m tui.cli sim --port {port} --announce "
               f"| (read line; touch {marker}; cat > /dev/null)")
    plan = write_plan(tmp_path / "plan.toml", faults="", only_faults=True)
    # long answers (about 1.5 s each here): an MTTR that waited for a whole request of the
    # load to succeed again would read that much more than the downtime
    plan.write_text(plan.read_text().replace("output_tokens = 16", "output_tokens = 200"))
    out = tmp_path / "out"
    try:
        done = subprocess.run(eval_argv(f"http://127.0.0.1:{port}/v1", plan, out,
                                        f"--chaos-restart-cmd={restart}"),
                              capture_output=True, text=True, timeout=180,
                              stdin=subprocess.DEVNULL, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        assert first.wait(WAIT_S) == -signal.SIGKILL  # the eval killed it
        phase = json.loads((out / "eval.json").read_text())["phases"]["faults"]
        assert phase["status"] == "done", phase
        chaos = phase["figures"]["chaos"]
        assert chaos["killed"] and chaos["pid"] == first.pid
        # the truth: the kill's own timestamp and when the restarted simulator listened
        # again. The MTTR is to the first token after that: a probe starts every 250 ms, and
        # a one-token answer of the simulator takes a few ms more
        downtime = marker.stat().st_mtime - chaos["killed_at"]
        assert downtime - 0.05 <= chaos["mttr_s"] <= downtime + PROBE_EVERY_S + 0.15, (
            chaos["mttr_s"], downtime)
        # one MTTR for the kill: the outage it caused is not in the outages' MTTR as well
        faults = phase["figures"]
        assert any(o["start"] <= chaos["killed_at"] + chaos["mttr_s"]
                   and o["end"] >= chaos["killed_at"] for o in faults["outages"]), (faults, chaos)
        assert faults["mttr_s"] == {"client": None, "server": None, "any": None}
        rows = {r["figure"]: r for r in json.loads((out / "eval.json").read_text())["rows"]}
        assert rows["MTTR after a kill and restart"]["value"] == chaos["mttr_s"]
        assert "a probe every 250 ms" in rows["MTTR after a kill and restart"]["note"]
        seen = rows["MTTR of the outages seen"]
        assert seen["value"] is None and seen["note"].startswith("no outage but the kill's:")
        assert restart not in (out / "eval.json").read_text()  # the command may hold secrets
    finally:
        if first.poll() is None:
            first.kill()
        again = find_listener(port)  # the restarted simulator, and the shell around it
        if again is not None:
            # the shell may end (a zombie) as soon as its simulator does: read it first
            with contextlib.suppress(psutil.Error):
                shell = again.parent()
                ours = shell is not None and str(marker) in " ".join(shell.cmdline())
                again.kill()
                if ours:
                    shell.kill()


DCGM = (ROOT / "tests" / "fixtures" / "metrics" / "dcgm-exporter.txt").read_text()


def _fixture_mean(field: str) -> float:
    """The fixture's own values of a DCGM field over its GPUs (the truth, read here)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in DCGM.splitlines()
              if line.startswith(field + "{")]
    return sum(values) / len(values)


async def test_dcgm_activity_in_the_efficiency_rows(sims, tmp_path):
    import asyncio

    from aiohttp import web

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text=DCGM)

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    plan = write_plan(tmp_path / "plan.toml", faults="", only_faults=True)
    text = plan.read_text()
    for phase in ("baseline", "efficiency"):  # only these two
        text = text.replace(f"[phases.{phase}]\nenabled = false\n", f"[phases.{phase}]\n")
    plan.write_text(text)
    out = tmp_path / "out"
    try:
        done = await asyncio.to_thread(
            subprocess.run, eval_argv(sims[0], plan, out,
                                      f"--dcgm-url=http://127.0.0.1:{port}/metrics"),
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=ROOT)
    finally:
        await runner.cleanup()
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "eval.json").read_text())
    dcgm = state["phases"]["baseline"]["figures"]["dcgm"]
    assert dcgm["sm_active"] == pytest.approx(_fixture_mean("DCGM_FI_PROF_SM_ACTIVE"))
    assert dcgm["tensor_active"] == pytest.approx(_fixture_mean("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"))
    assert dcgm["dram_active"] == pytest.approx(_fixture_mean("DCGM_FI_PROF_DRAM_ACTIVE"))
    rows = {r["figure"]: r for r in state["rows"]}
    assert rows["SM activity (baseline, DCGM)"]["value"] == pytest.approx(
        100 * _fixture_mean("DCGM_FI_PROF_SM_ACTIVE"))
    # the fixture's energy counters stand still: no figure, and it says why
    tpj = rows["output tokens per joule (baseline, DCGM)"]
    assert tpj["value"] is None and tpj["note"]
