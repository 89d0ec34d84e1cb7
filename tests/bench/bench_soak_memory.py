"""Compressed soak: is RSS flat? The consumer's, each load worker's and the simulator's, in MB
per hour, with the report written as it goes.

Not a test: it prints figures and asserts nothing. Run it as

    python tests/bench/bench_soak_memory.py --hours 2 --out soak.md   # 2 run-hours, ~12 min
    python tests/bench/bench_soak_memory.py --hours 72 --out soak.md  # the 72-hour claim, ~7.2 h

`--hours H` is H hours of a default (0.5 s tick) run, compressed: a tick of 0.05 s is 10×
the Snapshots per hour, so 2 run-hours take 12 minutes of wall time (printed at the start);
`--seconds` / `--minutes` give the wall time instead. The run is bounded (the load stops at
its duration; a drain of a second) and interruptible: Ctrl-C (or SIGTERM) stops the load,
drains, and writes the report so far; a second one cuts the drain short. The report
(--out, markdown) is rewritten atomically every --report-every seconds (a minute), so a
run killed outright still leaves the last minute's figures.

A simulator runs in its own process (`tokentop sim`, fast steps, many
slots). This process is the consumer a long run has: the Coordinator (merging
worker intervals into Snapshots), SnapshotWindows (10 s / 1 min / 10 min / run
windows, as the console and the headless loop keep them) and the Recorder
writing a run directory with rotation — the headless loop, sped up: a tick of
0.05 s is 10× the Snapshots per hour of the default 0.5 s, at a high request
rate. RSS of this process, of each load worker and of the simulator is sampled every
2 s; the least-squares slope after the warm-up is the figure. Time is compressed for
the windows: Snapshot times are scaled by 0.5 / tick, so the windows see a
0.5 s-tick run and the 10-minute window is full after ~66 s. The warm-up is a quarter of
the planned wall time (at least that 10-minute window, at most 30 real minutes).
It also gives the recording's bytes per Snapshot and per run-hour (2 Hz).

Only the tick is compressed: the probes still sample once a real second. Growth driven
by Snapshots shows in the "per run-hour" figure (a real hour's slope divided by the
compression the run achieved: Snapshots × 0.5 s over the wall time, lower than 0.5 / tick
when a busy machine makes ticks late); growth driven by wall time (probes) would be the
"per real hour" one, so that one is the bound to quote.

To tell what grows: the slope over the last half apart from the whole (fill slows down,
a leak does not); glibc's own figures (mallinfo2: heap size, in use, free) and RSS by
mapping ([heap], anonymous maps, libraries) between the warm-up's end and the load's end;
--tracemalloc for the Python-level total and the sites that grew most (RSS rising while
that total is flat is the allocator: holes in the heap, not objects kept); --malloc-info
for glibc's free chunks by size; --no-windows / --no-record to take parts out; --no-trim
to run without the coordinator's periodic malloc_trim (loadgen.run.heap), for a before
and after in one session.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loadgen.model.windows import SnapshotWindows
from loadgen.record.recorder import Recording
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.run.heap import HeapTrimmer
from loadgen.run.watch import Watch

NOMINAL_TICK = 0.5  # the default tick: 2 Snapshots a second
GOAL_MB_H = 0.5  # the memory goal: the consumer's RSS grows under this per hour of real run
SAMPLE_EVERY_S = 2.0  # RSS samples, in real seconds
REPORT_EVERY_S = 60.0  # the report's rewrites
WARM_CAP_S = 1800.0  # the warm-up: a quarter of the run, at most this
OVERRUN_S = 120.0  # a stop past the planned duration, should the run's own one not come
MAX_ROWS = 60  # the report's sample table


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Series:
    """(t, value) samples in an array sized up front: appending allocates nothing that
    stays, so the bench's own bookkeeping does not add to the RSS it measures (a list of
    tuples grows ~0.2 MB per real hour a series at one sample every 2 s)."""

    def __init__(self, capacity: int) -> None:
        self.data = np.zeros((capacity, 2))
        self.n = 0

    def append(self, point: tuple[float, float]) -> None:
        if self.n < len(self.data):
            self.data[self.n] = point
            self.n += 1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[float, float]:
        t, v = self.data[: self.n][i]
        return float(t), float(v)

    def __iter__(self):
        return ((float(t), float(v)) for t, v in self.data[: self.n])


def slope_mb_h(samples: list[tuple[float, float]]) -> float:
    """Least squares, in closed form: np.polyfit would page OpenBLAS into this process the
    first time a report is written, a step in the very RSS measured (~1 MB)."""
    if len(samples) < 2:
        return float("nan")
    t = np.array([s[0] for s in samples]) / 3600.0
    y = np.array([s[1] for s in samples]) / 1e6
    dt = t - t.mean()
    return float((dt * (y - y.mean())).sum() / (dt * dt).sum())


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None:
            libc.mallinfo2.restype = _Mallinfo2
            libc.fopen.restype = ctypes.c_void_p
            libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
            libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
            libc.fclose.argtypes = [ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):  # not glibc, or a glibc before 2.33
        return None


LIBC = _libc()


def malloc_info(path: str) -> None:
    """glibc's malloc_info(3) XML (free chunks by size, per arena) into `path`."""
    if LIBC is None:
        return
    libc_file = LIBC.fopen(path.encode(), b"w")
    LIBC.malloc_info(0, libc_file)
    LIBC.fclose(libc_file)


def pymalloc_stats(path: str) -> None:
    """CPython's object allocator (arenas, pools, blocks by size class) into `path`: it
    writes to the C stderr, so that is pointed at the file meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def heap_bytes() -> int:
    """What glibc's heaps hold from the system (in use or not), mmapped blocks apart."""
    return LIBC.mallinfo2().arena if LIBC is not None else 0


def malloc_text() -> str:
    """glibc's own view of its heap: what the heap holds (arena), how much of that is in
    use, how much is free but kept (fragmentation holds it), and what is mmapped apart."""
    if LIBC is None:
        return "malloc stats unavailable (not glibc ≥ 2.33)"
    m = LIBC.mallinfo2()
    return (f"heap {m.arena / 1e6:.1f} MB ({m.uordblks / 1e6:.1f} in use, "
            f"{m.fordblks / 1e6:.1f} free in {m.ordblks} chunks), mmapped {m.hblkhd / 1e6:.1f} "
            f"MB in {m.hblks}")


def _anon_kind(span: str) -> str:
    """An anonymous map: glibc's thread arenas start on a 64 MiB boundary; the rest is
    CPython's object arenas, large (mmapped) blocks and stacks."""
    if int(span.split("-")[0], 16) % (64 << 20) == 0:
        return "[anon: glibc thread arenas]"
    return "[anon]"


def rss_by_mapping() -> dict[str, int]:
    """Resident bytes by what is mapped (/proc/self/smaps): the brk heap, anonymous maps
    (CPython's object arenas, thread arenas, large blocks), each file (libraries)."""
    out: dict[str, int] = {}
    name = "?"
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                first = line.split(maxsplit=1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's header line
                    parts = line.split()
                    name = parts[5] if len(parts) > 5 else _anon_kind(first)
                elif first == "Rss:":
                    out[name] = out.get(name, 0) + int(line.split()[1]) * 1024
    except OSError:
        return {}
    return out


def print_mapping_growth(before: dict[str, int], after: dict[str, int]) -> None:
    diff = sorted(((after.get(k, 0) - before.get(k, 0), k) for k in set(before) | set(after)),
                  reverse=True)
    grown = [f"{Path(k).name} {d / 1e6:+.2f}" for d, k in diff if abs(d) >= 50_000]
    print(f"RSS change by mapping (MB, ≥ 0.05): {', '.join(grown) or 'none'}")


def print_growth(first: tracemalloc.Snapshot, last: tracemalloc.Snapshot, top: int) -> None:
    """The allocation sites that grew most between two points after the warm-up."""
    diff = last.compare_to(first, "traceback")
    diff.sort(key=lambda d: d.size_diff, reverse=True)
    print(f"tracemalloc: the {top} sites that grew most after the warm-up "
          f"(net {sum(d.size_diff for d in diff) / 1e3:+.1f} kB):")
    for d in diff[:top]:
        frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}"
                             for f in reversed(d.traceback))  # the allocating line first
        print(f"  {d.size_diff / 1e3:+9.1f} kB  {d.count_diff:+6d} blocks  {frames}")


@dataclass(frozen=True)
class Plan:
    """How long, how compressed, and where the warm-up ends (all in real seconds)."""

    seconds: float
    tick: float

    @property
    def compress(self) -> float:
        return NOMINAL_TICK / self.tick

    @property
    def run_hours(self) -> float:
        return self.seconds * self.compress / 3600.0

    @property
    def warm_from(self) -> float:
        # the 10-minute window full (in compressed time), and a quarter of the run, so what
        # fills (windows, the heap's first holes) is over before the slope starts
        return max(660.0 / self.compress, min(self.seconds / 4, WARM_CAP_S))


class Proc:
    """One process' RSS, sampled by pid. The psutil handle is kept: making one a sample
    would be this process' allocations too."""

    def __init__(self, name: str, pid: int, room: int) -> None:
        self.name, self.pid = name, pid
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._proc = None
        self.series = Series(room)

    def sample(self, t: float) -> float:
        rss = 0.0
        if self._proc is not None:
            try:
                rss = float(self._proc.memory_info().rss)
            except psutil.Error:  # it has exited: its line says so, not a zero slope
                self._proc = None
        if rss:
            self.series.append((t, rss))
        return rss


class Slopes(NamedTuple):
    whole: float  # MB per real hour, after the warm-up
    half: float  # MB per real hour, over the last half of that
    n: int


def slopes(series: Series, warm_from: float) -> Slopes:
    warm = [s for s in series if s[0] >= warm_from]
    if len(warm) < 4:
        return Slopes(float("nan"), float("nan"), len(warm))
    mid = (warm[0][0] + warm[-1][0]) / 2
    return Slopes(slope_mb_h(warm), slope_mb_h([s for s in warm if s[0] >= mid]), len(warm))


def _mb(series: Series, i: int) -> str:
    return f"{series[i][1] / 1e6:.1f}" if len(series) else "–"


def _after_warm_mb(series: Series, warm_from: float) -> str:
    warm = [s for s in series if s[0] >= warm_from]
    return f"{warm[0][1] / 1e6:.1f}" if warm else "–"


def _fmt(x: float) -> str:
    return "–" if x != x else f"{x:+.2f}"  # NaN: not enough samples after the warm-up yet


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Soak:
    """What the run has measured so far, and the report it writes from that."""

    def __init__(self, args: argparse.Namespace, plan: Plan, sim_pid: int) -> None:
        self.args, self.plan = args, plan
        self.room = int(plan.seconds / SAMPLE_EVERY_S) + 600  # the drain and some spare
        self.consumer = Proc("consumer (coordinator, windows, watch, recorder)", os.getpid(),
                             self.room)
        self.sim = Proc("simulator (`tokentop sim`)", sim_pid, self.room)
        self.workers: list[Proc] = []
        self.heap, self.traced = Series(self.room), Series(self.room)
        self.status = "running"
        self.started = time.time()
        self.t0 = time.monotonic()
        self.load_at_start = os.getloadavg()
        self.snapshots = self.requests_ok = 0
        self.last_t = 0.0  # the last sample's time
        self.elapsed = 0.0  # the last Snapshot's (real seconds since the first tick)
        self.recording: Recording | None = None
        self.notes: list[str] = []  # malloc figures etc., for the report's end

    @property
    def procs(self) -> list[Proc]:
        return [self.consumer, *self.workers, self.sim]

    def sample(self, now: float) -> None:
        t = now - self.t0
        self.last_t = t
        for p in self.procs:
            p.sample(t)
        self.heap.append((t, heap_bytes()))
        if self.args.tracemalloc:
            self.traced.append((t, tracemalloc.get_traced_memory()[0]))

    def achieved_compress(self) -> float:
        """Run-seconds per real second as achieved: late ticks on a busy machine lower it."""
        if not self.elapsed:
            return self.plan.compress
        return self.snapshots * NOMINAL_TICK / self.elapsed

    def progress_line(self) -> str:
        parts = [f"{self.last_t:6.0f} s", f"snapshots {self.snapshots}",
                 f"consumer {_mb(self.consumer.series, -1)} MB",
                 f"heap {_mb(self.heap, -1)} MB"]
        parts += [f"w{i} {_mb(w.series, -1)} MB" for i, w in enumerate(self.workers)]
        parts += [f"sim {_mb(self.sim.series, -1)} MB", f"requests {self.requests_ok}"]
        return "  " + "  ".join(parts)

    # ---- the report ----------------------------------------------------------------------

    def report(self) -> str:
        return "\n".join([*self._head(), "", *self._rss_table(), "", *self._recording_lines(),
                          "", *self._samples_table(), "", *self.notes, ""])

    def write(self, path: Path) -> None:
        """Atomically: a reader (or a kill -9 mid-write) sees the last report or this one."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.report())
        os.replace(tmp, path)

    def _head(self) -> list[str]:
        plan, c = self.plan, self.achieved_compress()
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        start = " ".join(f"{x:.2f}" for x in self.load_at_start)
        return [
            f"# Soak memory: {self.status}",
            "",
            f"Command: `{shlex.join(['python', *sys.argv])}`",
            f"Started {_utc(self.started)}; this report {_utc(time.time())}.",
            f"Host: {os.cpu_count()} cores; load average (1, 5, 15 min) {start} at the start, "
            f"{load} now. Not an isolated machine: other processes share the CPU, so ticks "
            "can be late and the achieved compression lower than planned.",
            f"Plan: {plan.run_hours:.2f} run-hours (0.5 s tick) at tick {plan.tick} s = "
            f"{plan.compress:.0f}× compressed = {plan.seconds:.0f} s of wall time; warm-up "
            f"until {plan.warm_from:.0f} s; load: --concurrency {self.args.concurrency}, "
            f"{self.args.workers} workers.",
            f"Elapsed {self.elapsed:.0f} s of {plan.seconds:.0f} s; {self.snapshots} Snapshots "
            f"= {self.snapshots * NOMINAL_TICK / 3600:.2f} run-hours (achieved compression "
            f"{c:.1f}×); {self.requests_ok} requests ok.",
            "",
            "Slopes: least squares over the samples after the warm-up (every "
            f"{SAMPLE_EVERY_S:.0f} s); MB per run-hour = MB per real hour ÷ {c:.1f}; "
            "the per-real-hour one is the bound (probes sample by wall time, not by tick). "
            f"The goal: the consumer's under {GOAL_MB_H} MB per hour of real run."
            + ("" if self.last_t >= plan.warm_from else
               f" No slope yet: they start after the warm-up ({plan.warm_from:.0f} s)."),
        ]

    def _rss_table(self) -> list[str]:
        c, warm = self.achieved_compress(), self.plan.warm_from
        rows = [("RSS, MB", "start", "after warm-up", "now", "MB/run-h", "MB/real h",
                 "last half MB/run-h", "last half MB/real h", "samples")]
        named = [(f"{p.name}, pid {p.pid}", p.series) for p in self.procs]
        named.insert(1, ("consumer's C heap (mallinfo2 arena)", self.heap))
        if self.args.tracemalloc:
            named.insert(2, ("consumer's Python objects (tracemalloc)", self.traced))
        for name, series in named:
            s = slopes(series, warm)
            rows.append((name, _mb(series, 0), _after_warm_mb(series, warm), _mb(series, -1),
                         _fmt(s.whole / c), _fmt(s.whole), _fmt(s.half / c), _fmt(s.half),
                         str(s.n)))
        return _table(rows)

    def _recording_lines(self) -> list[str]:
        rec = self.recording.recorder if self.recording is not None else None
        if rec is None:
            return ["Recording: off (--no-record)."]
        per = rec.bytes_written / max(1, self.snapshots)
        return [f"Recording: {rec.bytes_written / 1e6:.1f} MB written, {per:.0f} B a Snapshot "
                f"(snapshots + hlog) = {per * 3600 / NOMINAL_TICK / 1e6:.1f} MB per run-hour "
                f"(2 Hz, this load); fsync {rec.fsyncs}×."]

    def _samples_table(self) -> list[str]:
        """About a row a minute, at most MAX_ROWS rows (evenly spread over a long run)."""
        n = len(self.consumer.series)
        step = max(int(REPORT_EVERY_S / SAMPLE_EVERY_S), -(-n // MAX_ROWS))
        rows = [("real s", "consumer MB", *(f"worker {i} MB" for i in range(len(self.workers))),
                 "simulator MB")]
        for i in [*range(0, n, step), *([n - 1] if n and (n - 1) % step else [])]:
            t = self.consumer.series[i][0]
            rows.append((f"{t:.0f}", *(_mb_at(p.series, t) for p in self.procs)))
        return ["Samples:", "", *_table(rows)]


def _mb_at(series: Series, t: float) -> str:
    """The sample nearest to t (the processes are sampled together, so usually t's own)."""
    if not len(series):
        return "–"
    times = series.data[: series.n, 0]
    return f"{series.data[int(np.abs(times - t).argmin()), 1] / 1e6:.1f}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return lines


async def soak(args: argparse.Namespace, plan: Plan, url: str, out: Path, state: Soak) -> None:
    cfg = RunConfig(url=url, concurrency=args.concurrency, workers=args.workers, tick=args.tick,
                    output_tokens="16", input_tokens="32", duration=plan.seconds,
                    drain_grace=1.0, out=str(out))
    coord = Coordinator(cfg)
    if args.no_trim:
        coord._heap = HeapTrimmer(every_s=float("inf"))
    recording = Recording.open(config=msgspec.to_builtins(cfg), run_id=coord.run_id,
                               out=str(out), record=not args.no_record)
    state.recording = recording
    _on_signals(state, coord)
    await coord.start()
    state.workers = [Proc(f"load worker {w.index}", w.proc.pid, state.room)
                     for w in coord.pool.workers]
    windows = SnapshotWindows()
    watch = Watch(coord.parsed.slos)  # the session's derived events, as a real run has them
    state.t0 = time.monotonic()
    start = time.time()
    compress = plan.compress
    first_trace: tracemalloc.Snapshot | None = None
    last_trace: tracemalloc.Snapshot | None = None
    warm_malloc = end_malloc = ""
    warm_maps: dict[str, int] = {}
    end_maps: dict[str, int] = {}
    next_sample, next_report = state.t0, state.t0 + args.report_every
    try:
        async for snap in coord.snapshots():
            # time compression: the windows see the Snapshots of a 0.5 s-tick run, so the
            # 10-minute window fills (and then holds steady) within a minute of real time
            snap.elapsed *= compress
            snap.t = start + (snap.t - start) * compress
            snap.interval *= compress
            recording.take(snap)
            if not args.no_windows:
                windows.add(snap)
                watch.observe(snap, windows)
                for name in ("10s", "1m", "10m", "run"):  # what a redraw asks for
                    windows.stats(name)
            state.snapshots += 1
            state.requests_ok = snap.counters.requests_ok
            now = time.monotonic()
            state.elapsed = now - state.t0
            if now - state.t0 > plan.seconds + OVERRUN_S and state.status == "running":
                coord.request_stop("past the planned duration")  # a bound beside duration's
            if now < next_sample:
                continue
            next_sample += SAMPLE_EVERY_S
            state.sample(now)
            warmed = now - state.t0 >= plan.warm_from
            if args.tracemalloc and first_trace is None and warmed:
                first_trace = tracemalloc.take_snapshot()
            if not warm_malloc and warmed:
                warm_malloc = malloc_text()
                warm_maps = rss_by_mapping()
                if args.malloc_info:
                    malloc_info(f"{args.malloc_info}.warm.xml")
                    pymalloc_stats(f"{args.malloc_info}.warm.pymalloc.txt")
            if len(state.consumer.series) % 15 == 0:
                print(state.progress_line(), flush=True)
            if now >= next_report:
                next_report += args.report_every
                state.write(args.out)
            if not end_malloc and snap.load.state != "running":  # the load's end, not the drain
                end_malloc = malloc_text()
                end_maps = rss_by_mapping()
                if args.malloc_info:
                    malloc_info(f"{args.malloc_info}.end.xml")
                    pymalloc_stats(f"{args.malloc_info}.end.pymalloc.txt")
                if first_trace is not None:
                    last_trace = tracemalloc.take_snapshot()
    finally:
        await coord.close()
        recording.close()
        if state.status == "running":
            state.status = "finished"
    state.notes = [f"malloc after warm-up: {warm_malloc or 'not reached'}",
                   f"malloc at the load's end: {end_malloc or 'not reached'}; the coordinator "
                   f"trimmed the heap {coord._heap.trims}×"]
    state.write(args.out)
    print_summary(state, windows)
    if warm_maps and end_maps:  # both ends reached (not so for a run stopped in its warm-up)
        print_mapping_growth(warm_maps, end_maps)
    if first_trace is not None and last_trace is not None:
        print_growth(first_trace, last_trace, args.top)


def _on_signals(state: Soak, coord: Coordinator) -> None:
    """Ctrl-C / SIGTERM: stop the load and drain (the report follows); a second: no drain."""
    def stop() -> None:
        if state.status == "running":
            state.status = "interrupted (the report covers the run so far)"
            print("\n  stopping: the load ends, then the report is written "
                  "(again to cut the drain short)", flush=True)
            coord.request_stop("interrupted")
        else:
            coord.cut_drain_short()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)


def print_summary(state: Soak, windows: SnapshotWindows) -> None:
    run = windows.stats("run")
    c = state.achieved_compress()
    rate = state.requests_ok / state.elapsed if state.elapsed else 0.0
    print(f"snapshots {state.snapshots} in {state.elapsed:.0f} s (tick {state.plan.tick} s, "
          f"achieved {c:.1f}×), requests {state.requests_ok} ok ({rate:.0f} a real second), "
          f"{run.output_tokens} output tokens in the run window")
    for name, series in [(p.name, p.series) for p in state.procs] + [("C heap", state.heap)]:
        s = slopes(series, state.plan.warm_from)
        print(f"{name}: {_mb(series, 0)} → {_mb(series, -1)} MB; after warm-up "
              f"{_fmt(s.whole / c)} MB/run-hour ({_fmt(s.whole)} per real hour), last half "
              f"{_fmt(s.half / c)} ({_fmt(s.half)})")
    print(*state._recording_lines(), *state.notes, sep="\n")
    print(f"report: {state.args.out}")


def wall_seconds(args: argparse.Namespace) -> float:
    if args.hours is not None:
        return args.hours * 3600.0 * args.tick / NOMINAL_TICK
    if args.minutes is not None:
        return args.minutes * 60.0
    return args.seconds


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Compressed soak of the headless loop against a simulator: RSS of the "
        "consumer, each load worker and the simulator, slopes in MB per run-hour and per real "
        "hour, the report rewritten as it goes. Ctrl-C stops it and writes the report so far.",
        epilog="The figure to quote is the consumer's MB per real hour after the warm-up (the "
        "bound); the last half's slope beside the whole tells a heap still filling (it falls) "
        "from a leak (it does not). A busy machine makes ticks late: the report says the "
        "compression achieved and the load average.")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--hours", type=float,
                        help="run-hours: hours of a 0.5 s-tick run, compressed by 0.5 / --tick "
                        "(2 at the default tick take 12 minutes of wall time)")
    length.add_argument("--minutes", type=float, help="wall time in minutes")
    length.add_argument("--seconds", type=float, default=240.0,
                        help="wall time in seconds (default 240)")
    p.add_argument("--tick", type=float, default=0.05,
                   help="the run's tick in seconds (default 0.05: 10× the Snapshots per hour "
                   "of the default 0.5)")
    p.add_argument("--out", type=Path,
                   default=Path(tempfile.gettempdir()) / "tokentop-soak-memory.md",
                   help="the report (markdown), rewritten atomically as the run goes (default "
                   "%(default)s)")
    p.add_argument("--report-every", type=float, default=REPORT_EVERY_S, metavar="S",
                   help="seconds between rewrites of the report (default 60)")
    p.add_argument("--concurrency", type=int, default=64,
                   help="closed-loop streams (default 64)")
    p.add_argument("--workers", type=int, default=2, help="load worker processes (default 2)")
    p.add_argument("--no-record", action="store_true",
                   help="leave the recorder out (to tell its share)")
    p.add_argument("--no-windows", action="store_true",
                   help="leave the windows and the watch out (to tell their share)")
    p.add_argument("--tracemalloc", action="store_true",
                   help="trace Python allocations (slower): the traced total's slope, and the "
                   "sites that grew most between the warm-up's end and the load's end")
    p.add_argument("--frames", type=int, default=4,
                   help="traceback depth for --tracemalloc (default 4)")
    p.add_argument("--top", type=int, default=15,
                   help="sites printed by --tracemalloc (default 15)")
    p.add_argument("--malloc-info", metavar="PREFIX",
                   help="write glibc's malloc_info XML and CPython's allocator statistics "
                   "after the warm-up and at the end (PREFIX.warm.xml, PREFIX.end.xml, …)")
    p.add_argument("--no-trim", action="store_true",
                   help="without the coordinator's periodic malloc_trim (the figure before it)")
    args = p.parse_args()
    if args.tick <= 0 or wall_seconds(args) <= 0 or args.report_every <= 0:
        p.error("--tick, the length and --report-every must be above zero")
    return args


def start_sim() -> tuple[subprocess.Popen, int]:
    """The simulator in a session of its own, so a Ctrl-C meant for the bench does not end
    it before the drain."""
    port = free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "sim", "--host", "127.0.0.1", "--port", str(port),
         "--slots", "256", "--step-overhead-ms", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(100):  # 10 s at most
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    return sim, port


def main() -> int:
    args = parse_args()
    if args.tracemalloc:
        tracemalloc.start(args.frames)
    plan = Plan(seconds=wall_seconds(args), tick=args.tick)
    print(f"{plan.run_hours:.2f} run-hours at tick {plan.tick} s ({plan.compress:.0f}× "
          f"compressed) take {plan.seconds:.0f} s of wall time ({plan.seconds / 60:.1f} min), "
          f"plus a few seconds to start and drain; warm-up until {plan.warm_from:.0f} s; "
          f"report: {args.out} (every {args.report_every:.0f} s)", flush=True)
    sim, port = start_sim()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["XDG_DATA_HOME"] = tmp
            state = Soak(args, plan, sim.pid)
            asyncio.run(soak(args, plan, f"http://127.0.0.1:{port}/v1", Path(tmp) / "run",
                             state))
    finally:
        sim.terminate()
        sim.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
