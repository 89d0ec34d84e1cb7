"""A neighbour workload for the eval's interference phase: `python -m loadgen.eval.neighbor
KIND --cores 1,2 --max-seconds S …`. It pins itself to --cores first (so every process it
starts inherits them), starts its load, prints "ready" on stdout, and runs until SIGTERM or
--max-seconds, whichever comes first. Its parent (loadgen.eval.interference) measures what
it used from the OS (wait4's rusage, /proc/PID/io), never from anything printed here.

  cpu      --workers N: N busy processes (processes, for parallelism in Python)
  memory   --workers N --mb M: N processes, each copying an M MB array into another
  disk     --dir D --block-kb K: K KB blocks written with fsync into a temp file under D,
           removed on the way out
  command  --cmd CMD: CMD run through /bin/sh (exec'd: the same process, its group the
           parent's to kill)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable

DISK_WRAP_BYTES = 256 * 2**20  # the disk neighbour's file is rewritten from 0 past this
IDLE_S = 0.05  # the parent's poll while its workers run


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cores:
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    deadline = time.monotonic() + args.max_seconds
    if args.kind == "command":
        cmd = args.cmd.strip()
        if not cmd:
            print("neighbor: command: nothing to run", file=sys.stderr)
            return 2
        print("ready", flush=True)
        os.execv("/bin/sh", ["/bin/sh", "-c", cmd])  # keeps the pid: the parent waits it
    if args.kind == "disk":
        return _disk(args.dir, args.block_kb * 1024, deadline)
    body = _spin if args.kind == "cpu" else _copier(args.mb)
    return _workers(args.workers, body, deadline)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadgen.eval.neighbor")
    p.add_argument("kind", choices=["cpu", "memory", "disk", "command"])
    p.add_argument("--cores", default="", help="comma-separated cores to pin to")
    p.add_argument("--max-seconds", type=float, required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--mb", type=int, default=64)
    p.add_argument("--dir", default=".")
    p.add_argument("--block-kb", type=int, default=1024)
    p.add_argument("--cmd", default="", help="the command neighbour's shell command")
    return p


def _stopping() -> Callable[[], bool]:
    """SIGTERM sets a flag: the parent's own loop ends and it reaps its workers (so their
    CPU time reaches its rusage, and so the eval's wait4)."""
    stop = [False]

    def on_term(signum, frame) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    return lambda: stop[0]


def _workers(n: int, body: Callable[[float], None], deadline: float) -> int:
    pids = []
    for _ in range(max(1, n)):
        pid = os.fork()
        if pid == 0:  # a worker: SIGTERM's default (the group's kill ends it at once)
            try:
                body(deadline)
            finally:
                os._exit(0)
        pids.append(pid)
    stopped = _stopping()
    print("ready", flush=True)
    while not stopped() and time.monotonic() < deadline:
        time.sleep(IDLE_S)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for pid in pids:
        os.waitpid(pid, 0)
    return 0


def _spin(deadline: float) -> None:
    n = 0
    while time.monotonic() < deadline:
        for _ in range(10_000):
            n += 1


def _copier(mb: int) -> Callable[[float], None]:
    """The source array made here, before "ready" (one that cannot be had fails the start,
    not a worker unseen), shared by the workers; each copies it into its own."""
    import numpy as np

    try:
        src = np.ones(mb * 2**20 // 8)
    except MemoryError:
        raise SystemExit(f"neighbor: memory: cannot allocate {mb} MB") from None

    def copy(deadline: float) -> None:
        dst = np.empty_like(src)
        while time.monotonic() < deadline:
            np.copyto(dst, src)
    return copy


def _disk(directory: str, block: int, deadline: float) -> int:
    stopped = _stopping()
    fd, path = tempfile.mkstemp(prefix="neighbor-disk-", dir=directory)
    try:
        data = os.urandom(block)
        written = 0
        print("ready", flush=True)
        while not stopped() and time.monotonic() < deadline:
            if written >= DISK_WRAP_BYTES:
                os.lseek(fd, 0, os.SEEK_SET)
                written = 0
            written += os.write(fd, data)
            os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
