"""Interference (the eval's `interference` phase): the baseline load with a neighbour on
the same host (busy CPU processes, memory-bandwidth copies, fsync'd writes, or
--neighbor-cmd), against the same load alone; tokentop's own client pinned apart.

The client (this process, every thread of it, and the load workers each run starts, which
inherit the affinity of the thread that starts them) runs on the first quarter of the cores
this process may use (at least one), the neighbour (loadgen.eval.neighbor, which pins itself
before it starts anything) on the rest. The server is not ours to move: its affinity is
read and recorded. The client's affinity is put back when the phase ends.

What a neighbour used is the OS's figure: wait4's rusage of the neighbour (which counts the
workers it reaped), and psutil's view of its process tree while it runs (CPU time and
/proc/PID/io write_bytes), so a row can say the neighbour really ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from loadgen.analysis.report import soak_report
from loadgen.eval.phase_run import Eval, baseline_load, load_text, phase_cfg, run_session
from loadgen.eval.plan import Interference
from loadgen.eval.results import (
    InterferenceFigures,
    InterferenceRun,
    NeighborUse,
    PhaseResult,
    done,
    skipped,
)
from loadgen.model.text import plain
from probes.process import find_listener

READY_S = 15.0  # a neighbour that has not said "ready" by then did not start
STOP_GRACE_S = 5.0  # after SIGTERM to its group, then SIGKILL
SAMPLE_EVERY_S = 0.25  # psutil's look at the neighbour's processes
BOUND_MARGIN_S = 60.0  # a neighbour stops itself this long after its run should have ended
LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
AGAIN = "alone_after"  # the run alone after the neighbours' (InterferenceRun.neighbor)


async def run(ev: Eval) -> PhaseResult:
    """The interference phase's result: the load alone, then beside each neighbour."""
    p = ev.phases.interference
    if not p.enabled:
        return skipped("disabled in the plan")
    client, neighbor = split_cores(sorted(os.sched_getaffinity(0)))
    server, server_why = server_cores(ev.url)
    out = ev.out / "interference"
    out.mkdir(parents=True, exist_ok=True)
    runs: list[InterferenceRun] = []
    before = pin_client(client) if neighbor else None
    try:
        runs.append(await _load(ev, "alone", None))
        for kind in neighbors_of(p, ev.neighbor_cmd):
            spec = _spec(kind, p, ev.neighbor_cmd, neighbor, out)
            if isinstance(spec, str):  # it cannot run: its rows say why
                runs.append(InterferenceRun(neighbor=kind, what="", why=spec))
                continue
            runs.append(await _beside(ev, kind, spec, neighbor))
        # alone once more: a host that changed under the phase (a clock, a cache, another
        # job) shows as alone before and after differing, and the matrix flags the
        # neighbours' rows, whose changes it would otherwise take for theirs
        runs.append(await _load(ev, AGAIN, None))
    finally:
        if before is not None:
            pin_client(before)
    figures = InterferenceFigures(
        client_cores=client, neighbor_cores=neighbor, server_cores=server,
        server_why=server_why, placement=placement(client, neighbor, server), runs=runs)
    return done(figures, str(out))


# ---- where each runs -------------------------------------------------------------------


def split_cores(cores: list[int]) -> tuple[list[int], list[int]]:
    """(the client's, the neighbour's): the client the first quarter, at least one; the
    neighbour the rest. One core: the client keeps it and the neighbour has none (it then
    runs unpinned, on the same core: said in the placement)."""
    if len(cores) < 2:
        return cores, []
    k = max(1, len(cores) // 4)
    return cores[:k], cores[k:]


def pin_client(cores: list[int] | set[int]) -> set[int]:
    """Every thread of this process on `cores` (sched_setaffinity binds one thread: the
    loop's executor threads and the probes' must follow too); the main thread's affinity
    before, to put back."""
    before = os.sched_getaffinity(0)
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.sched_setaffinity(int(tid), set(cores))
    return before


def server_cores(url: str) -> tuple[list[int] | None, str]:
    """The server process' cores (the process listening on the URL's port here), or None
    with why."""
    u = urlsplit(url)
    if (u.hostname or "") not in LOOPBACK:
        return None, f"the server is at {u.hostname}, not on this host: only the client shares it"
    port = u.port or (443 if u.scheme == "https" else 80)
    proc = find_listener(port)
    if proc is None:
        return None, f"no process seen listening on port {port}"
    try:
        return sorted(proc.cpu_affinity() or []), f"pid {proc.pid} listening on port {port}"
    except psutil.Error as e:
        return None, f"pid {proc.pid}: its affinity cannot be read ({type(e).__name__})"


def placement(client: list[int], neighbor: list[int], server: list[int] | None) -> str:
    """"client on cores 0-1, neighbour on 2-7, server: any"."""
    if not neighbor:
        return f"not pinned: one core ({cores_text(client)}) for the client, the neighbour " \
               "and the server alike"
    every = sorted({*client, *neighbor})
    where = "not seen" if server is None else (
        "any" if server == every else f"cores {cores_text(server)}")
    return f"client on cores {cores_text(client)}, neighbour on {cores_text(neighbor)}, " \
           f"server: {where}"


def cores_text(cores: list[int]) -> str:
    """[0, 1, 2, 5] as "0-2,5"."""
    parts: list[str] = []
    for c in sorted(cores):
        if parts and c == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{c}"
        else:
            parts.append(str(c))
    return ",".join(parts)


# ---- the neighbours --------------------------------------------------------------------


def neighbors_of(p: Interference, neighbor_cmd: str | None) -> list[str]:
    """The plan's neighbours in its order, once each, and "command" last when one is given
    and the plan leaves it out."""
    kinds = list(dict.fromkeys(p.neighbors))
    if (neighbor_cmd or p.command) and "command" not in kinds:
        kinds.append("command")
    return kinds


@dataclass
class Spec:
    """How to start one neighbour: its arguments to loadgen.eval.neighbor, in words."""

    args: list[str]
    what: str


def _spec(kind: str, p: Interference, neighbor_cmd: str | None, cores: list[int],
          out: Path) -> Spec | str:
    """The neighbour's Spec, or why it cannot run."""
    workers = p.cpu_workers or max(1, len(cores))
    if kind == "cpu":
        return Spec(["--workers", str(workers)], f"{workers} busy process"
                    f"{'es' if workers != 1 else ''}")
    if kind == "memory":
        return Spec(["--workers", str(workers), "--mb", str(p.memory_mb)],
                    f"{workers} × {p.memory_mb} MB array copies")
    if kind == "disk":
        return Spec(["--dir", str(out), "--block-kb", str(p.disk_block_kb)],
                    f"{p.disk_block_kb} KB writes with fsync under {out}")
    cmd = neighbor_cmd or p.command
    if not cmd:
        return "no command: give --neighbor-cmd CMD or the plan's command"
    # the text of --neighbor-cmd may hold a secret: only its origin is recorded
    return Spec(["--cmd", cmd], "--neighbor-cmd" if neighbor_cmd else f"the plan's command "
                f"({plain(cmd, 60)})")


@dataclass
class Neighbor:
    """One running neighbour in its own session (its process group is its pid)."""

    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)
    status: int | None = None  # wait4's, once reaped
    ended_at: float | None = None
    rusage_cpu_s: float | None = None
    seen: dict[int, tuple[float, int | None]] = field(default_factory=dict)  # pid: cpu, bytes
    io_why: str | None = None
    stop_asked: float | None = None  # when stop() found it still running

    @classmethod
    def start(cls, kind: str, spec: Spec, cores: list[int], max_s: float,
              log: Path) -> Neighbor:
        argv = [sys.executable, "-m", "loadgen.eval.neighbor", kind, "--max-seconds",
                f"{max_s:g}", *(["--cores", ",".join(map(str, cores))] if cores else []),
                *spec.args]
        with log.open("wb") as f:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        return cls(proc, log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def reap(self, block: bool = False) -> bool:
        """Whether it has exited (wait4 its status and rusage once it has)."""
        if self.status is not None:
            return True
        pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return False
        self.status, self.ended_at = status, time.monotonic()
        self.rusage_cpu_s = usage.ru_utime + usage.ru_stime
        self.proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait it
        return True

    async def ready(self) -> str | None:
        """None once it said "ready"; else why it did not start."""
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if b"ready" in self._log_bytes().splitlines():
                return None
            if self.reap():
                return f"it exited at start ({self.ended()})"
            await asyncio.sleep(0.05)
        return f"it did not start within {READY_S:g} s"

    def sample(self) -> None:
        """Each of its processes' CPU time and bytes written, as last seen (a worker that
        ends keeps its last figures)."""
        try:
            procs = [psutil.Process(self.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            return
        for proc in procs:
            try:
                t = proc.cpu_times()
                cpu = t.user + t.system
            except psutil.Error:
                continue
            written: int | None = None
            try:
                written = proc.io_counters().write_bytes
            except (psutil.Error, AttributeError, NotImplementedError) as e:
                self.io_why = f"/proc/PID/io not readable ({type(e).__name__})"
            self.seen[proc.pid] = (cpu, written)

    async def watch(self) -> None:
        while not self.reap():
            self.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def stop(self) -> None:
        """SIGTERM to its group, SIGKILL after STOP_GRACE_S; reaped either way, and what is
        left of its group killed."""
        if not self.reap():
            self.stop_asked = time.monotonic()
            self.sample()
            _kill_group(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while not self.reap() and time.monotonic() < deadline:
                self.sample()  # its figures up to its last moments (/proc goes with it)
                await asyncio.sleep(0.02)
            if not self.reap():
                _kill_group(self.pid, signal.SIGKILL)
                self.reap(block=True)
        _kill_group(self.pid, signal.SIGKILL)  # a descendant the shell left behind

    def ended(self) -> str:
        code = self.proc.returncode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"code {code}"
        last = [ln for ln in self._log_bytes().decode(errors="replace").splitlines()
                if ln.strip() and ln.strip() != "ready"][-1:]
        return how + (f": {plain(last[0], 160)}" if last else "")

    def _log_bytes(self) -> bytes:
        try:
            return self.log.read_bytes()
        except OSError:
            return b""

    def use(self) -> NeighborUse:
        """What it used, by the OS: wait4's rusage, or the tree as psutil last saw it when
        that is more (processes its shell did not reap: killed with the group)."""
        seen_cpu = sum(cpu for cpu, _ in self.seen.values()) if self.seen else None
        cpu = max(c for c in (self.rusage_cpu_s, seen_cpu) if c is not None) \
            if self.rusage_cpu_s is not None or seen_cpu is not None else None
        written = [b for _, b in self.seen.values() if b is not None]
        seconds = (self.ended_at or time.monotonic()) - self.started
        early = self.ended_at is not None and self.stop_asked is None
        return NeighborUse(
            cpu_s=cpu, disk_write_bytes=sum(written) if written else None,
            disk_why=None if written else (self.io_why or "its processes were not seen"),
            seconds=round(seconds, 2),
            ended=f"ended early after {seconds:.1f} s, {self.ended()}" if early else "stopped")


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# ---- the runs --------------------------------------------------------------------------


async def _beside(ev: Eval, kind: str, spec: Spec, cores: list[int]) -> InterferenceRun:
    """The load beside one neighbour: it starts, says ready, the load runs, it stops."""
    p = ev.phases.interference
    bound = float(p.warmup) + float(p.duration) + BOUND_MARGIN_S
    out = ev.out / "interference"
    neighbor = Neighbor.start(kind, spec, cores, bound, out / f"neighbor-{kind}.log")
    watching: asyncio.Task | None = None
    try:
        why = await neighbor.ready()
        if why is not None:
            ev.say(f"  interference: the {kind} neighbour did not start: {why}")
            return InterferenceRun(neighbor=kind, what=spec.what,
                                   why=f"the neighbour did not start: {why}")
        ev.say(f"  interference: {kind} neighbour ({spec.what}) on, pid {neighbor.pid}")
        watching = asyncio.create_task(neighbor.watch())
        result = await _load(ev, kind, spec.what)
    finally:
        if watching is not None:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        await neighbor.stop()
        for left in out.glob("neighbor-disk-*"):  # a disk neighbour killed before its own
            left.unlink(missing_ok=True)  # clean-up leaves its file
    result.use = neighbor.use()
    if result.use.ended != "stopped":
        ev.say(f"  interference: the {kind} neighbour {result.use.ended}")
        result.why = f"the neighbour {result.use.ended}: the run was partly alone"
    return result


async def _load(ev: Eval, kind: str, what: str | None) -> InterferenceRun:
    """One run of the baseline's load (the phase's duration and warm-up), its figures."""
    p, b = ev.phases.interference, ev.phases.baseline
    workers = ev.cfg.workers or max(1, len(os.sched_getaffinity(0)) - 1)
    cfg = phase_cfg(ev, f"interference.{kind}", duration=float(p.duration),
                    warmup=float(p.warmup), workers=workers, **baseline_load(ev))
    run_dir = await run_session(ev, f"interference {kind}", cfg, here=True)
    r, _ = soak_report(run_dir, warnings=[])
    measured = r.measured_requests
    return InterferenceRun(
        neighbor=kind, what=what or "", load=load_text(b.mode, b.concurrency, b.rate),
        requests=measured.ok + measured.failed if measured is not None else None,
        ttft_ms=r.latency_ms.get("ttft"), itl_ms=r.latency_ms.get("itl"),
        output_tok_s=r.rates.output_tok_s, error_rate=r.rates.error_rate,
        run_dir=str(run_dir))
