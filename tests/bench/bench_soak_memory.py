"""Compressed soak: is the consuming process' RSS flat? Prints the slope in MB/hour.

Not a test: it prints figures and asserts nothing. Run it as

    python tests/bench/bench_soak_memory.py [--seconds 240 | --minutes 30] [--tick 0.05]
                                            [--concurrency 64] [--no-record] [--no-windows]
                                            [--no-trim] [--tracemalloc] [--malloc-info P]

A simulator runs in its own process (`tokentop sim`, fast steps, many
slots). This process is the consumer a long run has: the Coordinator (merging
worker intervals into Snapshots), SnapshotWindows (10 s / 1 min / 10 min / run
windows, as the console and the headless loop keep them) and the Recorder
writing a run directory with rotation — the headless loop, sped up: a tick of
0.05 s is 10× the Snapshots per hour of the default 0.5 s, at a high request
rate. RSS of this process (and of its load workers, apart) is sampled every 2 s;
the least-squares slope after the warm-up is the figure. Time is compressed for
the windows: Snapshot times are scaled by 0.5 / tick, so the windows see a
0.5 s-tick run and the 10-minute window is full after ~66 s (the warm-up).
It also prints the recording's bytes per Snapshot and per hour at 2 Hz.

Only the tick is compressed: the probes still sample once a real second. Growth driven
by Snapshots shows in the "per hour of a 0.5 s-tick run" figure; growth driven by wall
time (probes) would be the "per real hour" one, so that one is the bound to quote.

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
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

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


def _rss(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


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
    if len(samples) < 2:
        return float("nan")
    t = np.array([s[0] for s in samples]) / 3600.0
    y = np.array([s[1] for s in samples]) / 1e6
    return float(np.polyfit(t, y, 1)[0])


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


async def soak(args: argparse.Namespace, url: str, out: Path) -> None:
    cfg = RunConfig(url=url, concurrency=args.concurrency, workers=args.workers, tick=args.tick,
                    output_tokens="16", input_tokens="32", duration=args.seconds,
                    drain_grace=1.0, out=str(out))
    coord = Coordinator(cfg)
    if args.no_trim:
        coord._heap = HeapTrimmer(every_s=float("inf"))
    recording = Recording.open(config=msgspec.to_builtins(cfg), run_id=coord.run_id,
                               out=str(out), record=not args.no_record)
    await coord.start()
    me = psutil.Process()
    windows = SnapshotWindows()
    watch = Watch(coord.parsed.slos)  # the session's derived events, as a real run has them
    room = int(args.seconds / 2) + 600  # a sample every 2 s, the drain and some spare
    samples, workers, traced, heap = Series(room), Series(room), Series(room), Series(room)
    t0 = time.monotonic()
    start = time.time()
    compress = NOMINAL_TICK / args.tick
    # warm-up: the 10-minute window full (in compressed time), and at least a quarter
    warm_from = max(args.seconds / 4, 660.0 / compress)
    first_trace: tracemalloc.Snapshot | None = None
    last_trace: tracemalloc.Snapshot | None = None
    warm_malloc = end_malloc = ""
    warm_maps: dict[str, int] = {}
    end_maps: dict[str, int] = {}
    next_sample = t0
    n = 0
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
            n += 1
            now = time.monotonic()
            if now >= next_sample:
                next_sample += 2.0
                samples.append((now - t0, me.memory_info().rss))
                # the pool's own processes: not children(recursive=True), a walk over all of
                # /proc (whose transient dicts would be this process' allocations too), which
                # would also count the simulator
                kids = sum(_rss(w.proc.pid) for w in coord.pool.workers)
                workers.append((now - t0, kids))
                heap.append((now - t0, heap_bytes()))
                if args.tracemalloc:
                    traced.append((now - t0, tracemalloc.get_traced_memory()[0]))
                    if first_trace is None and now - t0 >= warm_from:
                        first_trace = tracemalloc.take_snapshot()
                if not warm_malloc and now - t0 >= warm_from:
                    warm_malloc = malloc_text()
                    warm_maps = rss_by_mapping()
                    if args.malloc_info:
                        malloc_info(f"{args.malloc_info}.warm.xml")
                        pymalloc_stats(f"{args.malloc_info}.warm.pymalloc.txt")
                if len(samples) % 15 == 0:
                    print(f"  {now - t0:6.0f} s  rss {samples[-1][1] / 1e6:7.1f} MB  "
                          f"heap {heap[-1][1] / 1e6:6.1f} MB  "
                          f"workers {kids / 1e6:7.1f} MB  snapshots {n}  "
                          f"requests {snap.counters.requests_ok}", flush=True)
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
    run = windows.stats("run")
    warm = [s for s in samples if s[0] >= warm_from]
    warm_w = [s for s in workers if s[0] >= warm_from]
    if len(warm) < 4:
        print(f"no slope: the warm-up (the 10-minute window full) takes {warm_from:.0f} s at "
              f"tick {args.tick} s; run longer than that (--seconds)")
        return
    print(f"snapshots {n} in {samples[-1][0]:.0f} s (tick {args.tick} s), requests "
          f"{run.requests_ok} ok ({run.req_s or 0:.0f}/s), {run.output_tokens} tokens")
    print(f"consumer RSS: start {samples[0][1] / 1e6:.1f} MB, after warm-up "
          f"{warm[0][1] / 1e6:.1f} MB, end {samples[-1][1] / 1e6:.1f} MB")
    real = slope_mb_h(warm)
    print(f"consumer RSS slope after warm-up ({warm_from:.0f} s): {real:+.2f} MB per real "
          f"hour = {real / compress:+.2f} MB per hour of a {NOMINAL_TICK} s-tick run "
          f"({len(warm)} samples)")
    half = [s for s in warm if s[0] >= (warm[0][0] + warm[-1][0]) / 2]
    late = slope_mb_h(half)
    print(f"consumer RSS slope over the last half ({half[0][0]:.0f} s on): {late:+.2f} MB per "
          f"real hour = {late / compress:+.2f} MB per hour of a {NOMINAL_TICK} s-tick run")
    print(f"load workers RSS slope after warm-up: {slope_mb_h(warm_w):+.2f} MB/hour")
    warm_h = [s for s in heap if s[0] >= warm_from]
    print(f"malloc heap slope after warm-up: {slope_mb_h(warm_h) / compress:+.2f} MB per hour "
          f"of a {NOMINAL_TICK} s-tick run; last half "
          f"{slope_mb_h(warm_h[len(warm_h) // 2:]) / compress:+.2f}")
    print(f"malloc after warm-up: {warm_malloc}")
    print(f"malloc at the end:    {end_malloc}; the coordinator trimmed the heap "
          f"{coord._heap.trims}×")
    print_mapping_growth(warm_maps, end_maps)
    if args.tracemalloc:
        warm_t = [s for s in traced if s[0] >= warm_from]
        print(f"tracemalloc: traced {warm_t[0][1] / 1e6:.1f} → {warm_t[-1][1] / 1e6:.1f} MB, "
              f"slope {slope_mb_h(warm_t) / compress:+.2f} MB per hour of a {NOMINAL_TICK} "
              "s-tick run (Python-level; RSS rising with this flat is the allocator)")
        if first_trace is not None and last_trace is not None:
            print_growth(first_trace, last_trace, args.top)
    if recording.recorder is not None:
        rec = recording.recorder
        per = rec.bytes_written / max(1, n)
        fsync_ms = rec.fsync_s_total / max(1, rec.fsyncs) * 1e3
        print(f"recording: {rec.bytes_written / 1e6:.1f} MB, {per:.0f} B/snapshot "
              f"(snapshots + hlog) → {per * 7200 / 1e6:.1f} MB/hour at 2 Hz with this "
              f"load; fsync {rec.fsyncs}× costing {fsync_ms:.2f} ms each")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=240.0)
    p.add_argument("--minutes", type=float, help="overrides --seconds, e.g. 30")
    p.add_argument("--tick", type=float, default=0.05)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--no-windows", action="store_true",
                   help="leave the windows and the watch out (to tell their share)")
    p.add_argument("--tracemalloc", action="store_true",
                   help="trace Python allocations (slower): the traced total's slope, and the "
                   "sites that grew most between the warm-up's end and the load's end")
    p.add_argument("--frames", type=int, default=4, help="traceback depth for --tracemalloc")
    p.add_argument("--top", type=int, default=15, help="sites printed by --tracemalloc")
    p.add_argument("--malloc-info", metavar="PREFIX",
                   help="write glibc's malloc_info XML and CPython's allocator statistics "
                   "after the warm-up and at the end (PREFIX.warm.xml, PREFIX.end.xml, …)")
    p.add_argument("--no-trim", action="store_true",
                   help="without the coordinator's periodic malloc_trim (the figure before it)")
    args = p.parse_args()
    if args.tracemalloc:
        tracemalloc.start(args.frames)
    if args.minutes:
        args.seconds = args.minutes * 60.0
    port = free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "sim", "--host", "127.0.0.1", "--port", str(port),
         "--slots", "256", "--step-overhead-ms", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["XDG_DATA_HOME"] = tmp
            asyncio.run(soak(args, f"http://127.0.0.1:{port}/v1", Path(tmp) / "run"))
    finally:
        sim.terminate()
        sim.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
