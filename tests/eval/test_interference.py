"""The interference phase (loadgen.eval.interference) through the real `tokentop eval` on the
embedded simulator: the load alone, beside a cpu neighbour (one busy process on core 1, the
client on core 0), beside a memory neighbour that cannot start (an array no machine has),
and beside --neighbor-cmd (a shell with two sleeping children). The truth is the OS's,
read by this test while the eval runs (psutil: every process' affinity and CPU time), the
recordings' own per-tick histograms and counters (hdrh, numpy), and the process table after
the eval (nothing left behind); never what the phase computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from hdrh.histogram import HdrHistogram
from support import ROOT, only_phases

from loadgen.eval import interference
from loadgen.eval.results import read_eval

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                reason="pinning needs two cores")

PLAN = only_phases("""
version = 1
[phases.baseline]
enabled = false
concurrency = 4
input_tokens = 32
output_tokens = 16
[phases.interference]
enabled = true
neighbors = ["cpu", "memory", "disk"]
duration = "2s"
warmup = "0.5s"
memory_mb = 100000000
disk_block_kb = 64
""")
# two children in the command's group, told apart from anyone else's by their lengths
COMMAND = "sleep 41.7 & sleep 42.3 & wait"
EVAL_TIMEOUT_S = 60.0
SAMPLE_S = 0.1


class Seen:
    """What the OS showed while the eval ran, by this test's own look every SAMPLE_S."""

    def __init__(self) -> None:
        self.client: set[frozenset[int]] = set()  # the eval's affinity beside a neighbour
        self.workers: set[frozenset[int]] = set()  # its load workers' then
        self.neighbors: dict[int, tuple[str, frozenset[int], float]] = {}  # pid: kind, cpus, cpu
        self.server: set[frozenset[int]] = set()
        self.command_children: set[int] = set()
        self.written: dict[int, int] = {}  # the disk neighbour's /proc/PID/io write_bytes

    def look(self, eval_pid: int) -> None:
        try:
            tree = psutil.Process(eval_pid).children(recursive=True)
        except psutil.Error:
            return
        beside = False
        for proc in tree:
            try:
                cmd = proc.cmdline()
                cpus = frozenset(proc.cpu_affinity())
                t = proc.cpu_times()
            except psutil.Error:
                continue
            if "loadgen.eval.neighbor" in cmd or cmd[:2] == ["/bin/sh", "-c"]:
                kind = cmd[cmd.index("loadgen.eval.neighbor") + 1] if "loadgen.eval.neighbor" \
                    in cmd else "command"
                self.neighbors[proc.pid] = (kind, cpus, t.user + t.system)
                beside = True
                if kind == "disk":
                    with contextlib.suppress(psutil.Error):
                        self.written[proc.pid] = proc.io_counters().write_bytes
            elif cmd[:1] == ["sleep"]:
                self.command_children.add(proc.pid)
                self.neighbors[proc.pid] = ("command", cpus, t.user + t.system)
            elif "loadgen.worker.main" in cmd:
                self.workers.add(cpus)
            elif "loadgen.sim" in cmd:
                self.server.add(cpus)
        if beside:
            with contextlib.suppress(psutil.Error):
                self.client.add(frozenset(psutil.Process(eval_pid).cpu_affinity()))

    def cpu_of(self, kind: str) -> float:
        return sum(c for k, _, c in self.neighbors.values() if k == kind)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One eval of the phase, watched from outside; (its eval.json, what was seen, wall s)."""
    tmp = tmp_path_factory.mktemp("interference")
    plan = tmp / "plan.toml"
    plan.write_text(PLAN)
    seen = Seen()

    async def go() -> tuple[int, str]:
        with (tmp / "stderr.log").open("wb") as log:
            return await watched(log)

    async def watched(log) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tui.cli", "eval", "--plan", str(plan), "--out",
            str(tmp / "out"), "--headless", "--tick", "0.25", "--neighbor-cmd", COMMAND,
            cwd=ROOT, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        try:
            deadline = time.monotonic() + EVAL_TIMEOUT_S
            while proc.returncode is None and time.monotonic() < deadline:
                seen.look(proc.pid)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), SAMPLE_S)
            assert proc.returncode is not None, "the eval did not end in time"
            return proc.returncode, (tmp / "stderr.log").read_text(errors="replace")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    t0 = time.monotonic()
    code, err = asyncio.run(go())
    wall = time.monotonic() - t0
    assert code == 0, err[-2000:]
    try:
        yield read_eval(tmp / "out"), seen, wall
    finally:  # nothing of a neighbour outlives the test, whatever it asserted
        for pid in [*seen.neighbors, *seen.command_children]:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def _figures(ran):
    state, _, _ = ran
    result = state.phases.interference
    assert result is not None and result.status == "done", result
    return result.figures


def _run(figures, kind):
    return next(r for r in figures.runs if r.neighbor == kind)


def test_the_client_and_its_workers_ran_on_core_0_and_the_neighbour_on_the_rest(ran):
    _, seen, _ = ran
    f = _figures(ran)
    every = sorted(os.sched_getaffinity(0))  # what the eval inherited from this test
    assert f.client_cores == every[:max(1, len(every) // 4)]
    assert f.neighbor_cores == [c for c in every if c not in f.client_cores]
    # as the OS showed them while a neighbour ran: the eval, its workers, every neighbour
    assert seen.client == {frozenset(f.client_cores)}
    assert seen.workers and seen.workers <= {frozenset(f.client_cores)}
    cpu_pids = {cpus for kind, cpus, _ in seen.neighbors.values() if kind == "cpu"}
    assert cpu_pids == {frozenset(f.neighbor_cores)}
    # the embedded simulator (the server) was left where it was: everywhere
    assert seen.server == {frozenset(every)} and f.server_cores == every
    assert f.placement == (f"client on cores {interference.cores_text(f.client_cores)}, "
                           f"neighbour on {interference.cores_text(f.neighbor_cores)}, "
                           "server: any")


def test_the_neighbours_cpu_time_is_what_the_os_measured(ran):
    _, seen, _ = ran
    f = _figures(ran)
    cpu = _run(f, "cpu")
    assert cpu.use is not None and cpu.use.ended == "stopped"
    workers = len(f.neighbor_cores)  # cpu_workers = 0: one per neighbour core
    assert cpu.what == f"{workers} busy process" + ("es" if workers != 1 else "")
    # psutil's last look at its processes came at most SAMPLE_S (and the stop) before the end
    truth = seen.cpu_of("cpu")
    assert truth > 0.3 * cpu.use.seconds  # it really ran (a shared core: not all of it)
    assert truth - 0.05 <= cpu.use.cpu_s <= truth + workers * (SAMPLE_S + 0.3) + 0.1
    assert cpu.use.cpu_s <= workers * cpu.use.seconds + 0.1
    # the command's shell and its two sleeps: alive all along, hardly any CPU
    command = _run(f, "command")
    assert command.what == "--neighbor-cmd"  # the command's text is not recorded
    assert command.use is not None and command.use.ended == "stopped"
    assert command.use.cpu_s is not None and command.use.cpu_s < 0.5
    assert seen.command_children, "the command's children were never seen"


def test_a_neighbour_that_cannot_start_is_said_and_the_eval_goes_on(ran):
    f = _figures(ran)
    memory = _run(f, "memory")
    assert memory.why.startswith("the neighbour did not start: it exited at start (code 1")
    assert "cannot allocate 100000000 MB" in memory.why
    assert memory.output_tok_s is None and memory.use is None
    state, _, _ = ran
    rows = {r["id"]: r for r in state.rows}
    assert rows["interference.memory.output_tok_s"]["value"] is None
    assert "did not start" in rows["interference.memory.output_tok_s"]["note"]
    assert [r.neighbor for r in f.runs] == ["alone", "cpu", "memory", "disk", "command",
                                            "alone_after"]


def test_the_disk_neighbour_wrote_what_the_kernel_counted_and_left_no_file(ran):
    _, seen, _ = ran
    disk = _run(_figures(ran), "disk")
    assert disk.use is not None and disk.use.ended == "stopped"
    truth = sum(seen.written.values())  # this test's last look, before the neighbour's end
    # the eval's last look may come before this test's, by at most the one block the
    # neighbour finishes after its SIGTERM
    assert disk.use.disk_write_bytes is not None
    assert disk.use.disk_write_bytes >= truth - 64 * 1024
    assert truth >= 64 * 1024, "the kernel counted no fsync'd block (a filesystem that hides them?)"
    out = Path(disk.run_dir).parent.parent
    assert not list((out / "interference").glob("neighbor-disk-*"))


def _recorded(run_dir: str) -> tuple[float, float]:
    """(output tok/s, ITL P99 in ms) of a run's recording, read here from snapshots.jsonl by
    the README's window: from the tick after the one warm-up ends in; tok/s to the first
    draining tick (its cumulative token counter), latencies to the end (the drain's
    requests are the long ones: each tick's ITL histogram, merged by hdrh)."""
    ticks = [json.loads(line) for line in
             (Path(run_dir) / "snapshots.jsonl").read_text().splitlines() if line.strip()]
    first = next(i for i, t in enumerate(ticks) if not t["load"]["warmup"]) + 1
    last = next(i for i, t in enumerate(ticks) if t["load"]["state"] == "draining")
    tokens = np.array([t["counters"]["output_tokens"] for t in ticks])
    seconds = np.sum([t["interval"] for t in ticks[first:last + 1]])
    itl = HdrHistogram(1, 3_600_000_000, 3)
    for t in ticks[first:]:
        if t["hist"].get("itl"):
            itl.add(HdrHistogram.decode(t["hist"]["itl"]))
    return float((tokens[last] - tokens[first - 1]) / seconds), \
        itl.get_value_at_percentile(99) / 1000.0


def test_the_rows_are_the_recordings_figures_and_their_change_against_alone(ran):
    state, _, _ = ran
    f = _figures(ran)
    rows = {r["id"]: r for r in state.rows}
    recorded = {k: _recorded(_run(f, k).run_dir) for k in ("alone", "cpu", "command",
                                                            "alone_after")}
    for kind, (tok_s, itl_p99) in recorded.items():
        assert rows[f"interference.{kind}.output_tok_s"]["value"] == pytest.approx(tok_s, rel=1e-3)
        assert rows[f"interference.{kind}.itl.p99"]["value"] == pytest.approx(itl_p99, rel=1e-3)
        assert rows[f"interference.{kind}.ttft.p99"]["value"] > 0
    for kind in ("cpu", "command", "alone_after"):
        for key in ("ttft.p99", "itl.p99", "output_tok_s"):
            value = rows[f"interference.{kind}.{key}"]["value"]
            alone = rows[f"interference.alone.{key}"]["value"]
            change = float(np.round((value - alone) / alone * 100, 1))
            got = re.match(r"([+-][\d.]+) % against alone", rows[f"interference.{kind}.{key}"]
                           ["note"])
            assert got and float(got[1]) == pytest.approx(change, abs=0.051)
    assert rows["interference.cpu.cpu_s"]["value"] == _run(f, "cpu").use.cpu_s
    assert rows["interference.placement"]["note"].startswith(f.placement)


def _drifted(tok_s_after: float, itl_p99_after: float) -> dict[str, tuple[str, ...]]:
    """The flags of each row of a phase whose load alone ran at 1000 tok/s and 20 ms ITL
    P99 before the neighbours and at these after them."""
    from loadgen.eval.matrix import rows
    from loadgen.eval.results import InterferenceFigures, InterferenceRun, Results, done

    def alone(kind: str, tok_s: float, itl: float) -> InterferenceRun:
        return InterferenceRun(neighbor=kind, what="", load="4 streams", requests=100,
                               ttft_ms={"p99": 50.0}, itl_ms={"p99": itl}, output_tok_s=tok_s)

    cpu = InterferenceRun(neighbor="cpu", what="1 busy process", load="4 streams",
                          requests=100, ttft_ms={"p99": 60.0}, itl_ms={"p99": 25.0},
                          output_tok_s=900.0)
    f = InterferenceFigures(client_cores=[0], neighbor_cores=[1], server_cores=None,
                            server_why="", placement="client on cores 0, neighbour on 1",
                            runs=[alone("alone", 1000.0, 20.0), cpu,
                                  alone("alone_after", tok_s_after, itl_p99_after)])
    return {r.id: r.flags for r in rows(Results(interference=done(f)))
            if r.id.startswith("interference.")}


def test_a_host_that_changed_under_the_phase_flags_the_neighbours_rows():
    # alone after: 1250 tok/s (+25 %), ITL the same: the neighbours' rows carry the drift
    flags = _drifted(1250.0, 20.0)
    assert flags["interference.cpu.output_tok_s"] == (
        "the host drifted: alone before and after the neighbours differ by 25 %",)
    assert flags["interference.cpu.itl.p99"] == flags["interference.cpu.output_tok_s"]
    assert flags["interference.alone.output_tok_s"] == ()  # alone is the reference
    assert flags["interference.alone_after.output_tok_s"] == ()
    # ITL P99 30 % higher after, tok/s 5 %: the larger says it
    assert _drifted(1050.0, 26.0)["interference.cpu.ttft.p99"] == (
        "the host drifted: alone before and after the neighbours differ by 30 %",)
    # within 10 % on both: no flag
    assert all(not v for v in _drifted(1080.0, 21.0).values())


def test_no_neighbour_is_left_behind_and_the_phase_stays_in_time(ran):
    _, seen, wall = ran
    assert seen.neighbors
    deadline = time.monotonic() + 5.0
    alive = list(seen.neighbors)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.05)
    assert not alive, f"left behind: {alive}"
    assert wall < EVAL_TIMEOUT_S


def test_pinning_binds_every_thread_and_puts_them_back():
    """pin_client against the OS: every thread of this process on the cores, then back."""
    import threading

    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    try:
        before = os.sched_getaffinity(0)
        old = interference.pin_client([min(before)])
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        assert all(os.sched_getaffinity(t) == {min(before)} for t in tids)
        interference.pin_client(old)
        assert all(os.sched_getaffinity(t) == before for t in tids)
    finally:
        stop.set()
        helper.join(timeout=5)


def test_a_neighbour_that_dies_early_says_how(tmp_path):
    """A command that exits by itself after "ready": its end is said, with its code and its
    last words, and it is not called stopped."""
    spec = interference.Spec(["--cmd", "echo bye >&2; exit 3"], "a short command")
    n = interference.Neighbor.start("command", spec, [], 10.0, tmp_path / "n.log")
    try:
        assert asyncio.run(n.ready()) is None  # the wrapper said ready before its exec
        deadline = time.monotonic() + 10.0
        while not n.reap() and time.monotonic() < deadline:
            time.sleep(0.02)
        asyncio.run(n.stop())
        use = n.use()
        assert use.ended.startswith("ended early after") and use.ended.endswith("code 3: bye")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(n.pid, 9)
