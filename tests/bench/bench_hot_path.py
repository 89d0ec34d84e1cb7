"""What a headless run costs per generated token, and what its start-up costs (issue 28).

Not a test: it prints figures and asserts nothing about speed. Run it as

    python tests/bench/bench_hot_path.py [--streams 1,8,64,256] [--seconds 10] [--workers N]
        [--sim-cpu 0] [--client-cpus 1] [--itl-ms auto] [--json FILE] [--imports]

For each stream count a fresh exact-timing simulator (`tokentop sim --exact-ttft-ms
--exact-itl-ms`: no scheduler, one token a chunk, every chunk sent at its deadline) runs
pinned to `--sim-cpu`, and the real command line, `python -m tui.cli run --headless -c N
--duration S`, runs pinned to `--client-cpus` (its load workers inherit the pinning). This
process sits on the simulator's core, so its polling never takes the client's. The
inter-token gap is 1 ms a stream, longer where the streams together would ask more than
`--max-tok-s` of the one simulator core (auto), so the server is not the limit; its CPU
share over the window is printed, to show whether it was.

How the CPU is counted, and why so:
* Steady state: user+sys of the client's processes (psutil, /proc) read at the edges of a
  window inside the load (from `warm` after the simulator saw the first request until one
  second before the run stops), every process alive at both edges, so nothing exits inside
  it; the parent (coordinator) and its descendants (the load workers) apart. Tokens over
  the same window are the simulator's own `vllm:generation_tokens_total` scraped at the
  same edges. The workers' self-reported `cpu_s` is not used: it reaches only the parent.
* Whole run: the client's rusage from os.wait4 when it exits, which on Linux holds its
  own CPU and that of every descendant it waited for (the workers), exit included. The
  last sample of the live tree is printed beside it, as a check that no worker went
  unreaped (then the total would be short).
* Start-up: the tree's CPU when the simulator first sees a request (GET /sim/arrivals
  polled every 5 ms: the figure may be up to one poll late, ~10 ms of CPU at most).
* "not steady": the whole run's CPU less what the steady cost per token explains for all
  the tokens the simulator sent: start-up, ramp, drain and exit together.

Generated tokens are given twice: the run's own summary (`tokens.output` plus the drain's
`output_tokens`) and the simulator's counter at the end; the two should agree.

`--imports` adds `python -X importtime` of the headless path: the parent of a one-second
run against the simulator, and a load worker's module imports, top 10 by cumulative time,
and the packages that take the most import time themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadgen.model import units  # noqa: E402
from loadgen.model.text import plain  # noqa: E402

ANNOUNCE = "TOKENTOP_SIM_LISTENING "
TTFT_MS = 1.0  # the exact simulator's time to first token: short, so streams flow at once
OUTPUT_TOKENS = 256
INPUT_TOKENS = 128
POLL_S = 0.005  # first-arrival poll
SAMPLE_S = 0.1  # the client tree's CPU is read this often (its pids known for the kill)
START_DEADLINE_S = 30.0  # the client's exec to its first request
EXIT_DEADLINE_S = 40.0  # the run's stop to its exit (drain grace 10 s, then the workers)
TAIL_S = 1.0  # the window ends this long before the run's stop


class Window(msgspec.Struct):
    """One reading of the client tree and the simulator at a moment."""

    t: float  # perf_counter
    parent_s: float  # the parent's own user+sys
    children_s: dict[int, float]  # per live descendant, user+sys
    sim_tokens: float
    sim_cpu_s: float

    @property
    def children_total(self) -> float:
        return sum(self.children_s.values())


class StreamsResult(msgspec.Struct):
    """The figures of one stream count."""

    streams: int
    workers: int  # descendants of the client seen in the window
    itl_ms: float
    seconds: float
    tokens_run: int  # the run's summary: tokens.output + drain.output_tokens
    tokens_sim: int  # the simulator's generation_tokens_total at the end
    window_s: float
    window_tokens: int  # the simulator's, over the window
    tok_s: float  # over the window
    us_per_token: float  # client tree, the window
    us_parent: float
    us_workers: float
    client_cpu_pct: float  # client tree over the window, % of one core
    sim_cpu_pct: float  # the simulator over the window, % of one core
    startup_cpu_s: float  # exec to the first request the simulator saw
    total_cpu_s: float  # wait4 rusage: the whole run, workers included
    last_sampled_cpu_s: float  # the live tree's last sample before the exit (a check)
    not_steady_cpu_s: float  # total - us_per_token × tokens_sim
    whole_us_per_token: float  # total / tokens_sim
    exit_code: int


class ImportLine(msgspec.Struct):
    module: str
    depth: int
    self_us: int
    cumulative_us: int


class Imports(msgspec.Struct):
    parent_total_us: int
    parent_top: list[ImportLine]
    parent_packages: dict[str, int]  # root package → self µs, the heaviest
    worker_total_us: int
    worker_top: list[ImportLine]
    worker_packages: dict[str, int]


class Bench(msgspec.Struct):
    argv: list[str]
    sim_cpu: int
    client_cpus: list[int]
    cores: int
    load_average: list[float]  # at the start: this machine is shared
    results: list[StreamsResult]
    imports: Imports | None = None


# ---- the simulator ------------------------------------------------------------------------


def pinned(cpus: set[int]) -> Callable[[], None]:
    """A preexec_fn: the child and every thread and process it starts run on `cpus`."""
    return lambda: os.sched_setaffinity(0, cpus)


def read_line(stream, deadline: float) -> str:
    """One line of a child's stdout, or "" past the deadline (a readline alone may block)."""
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([stream], [], [], left)[0]:
        return ""
    return stream.readline()


def start_sim(cpu: int, itl_ms: float) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "sim", "--host", "127.0.0.1", "--port", "0",
         "--announce", "--exit-with-parent", "--exact-ttft-ms", f"{TTFT_MS}",
         "--exact-itl-ms", f"{itl_ms}", "--slots", "4096", "--kv-tokens", "10000000"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, preexec_fn=pinned({cpu}))  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = read_line(proc.stdout, deadline)
        if line.startswith(ANNOUNCE):
            return proc, int(line[len(ANNOUNCE):])
        if not line and proc.poll() is not None:
            break
    stop_sim(proc)
    raise SystemExit("bench: the simulator did not announce its port within 20 s")


def stop_sim(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError):
        assert proc.stdin is not None
        proc.stdin.close()  # --exit-with-parent: EOF is its stop
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class SimClient:
    """GETs to the simulator on one keep-alive connection, made afresh after an error."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def get(self, path: str) -> bytes:
        for _ in range(2):  # one retry: a keep-alive connection the server closed
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                self.conn.request("GET", path)
                resp = self.conn.getresponse()
                body = resp.read()
                if resp.status == 200:
                    return body
                raise SystemExit(f"bench: GET {path} answered {resp.status}")
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
        raise SystemExit(f"bench: the simulator does not answer GET {path}")

    def generated(self) -> float:
        text = self.get("/metrics").decode()
        found = re.findall(r"^vllm:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M)
        if not found:
            raise SystemExit("bench: no vllm:generation_tokens_total on the simulator's /metrics")
        return sum(float(v) for v in found)

    def arrived(self) -> bool:
        return bool(json.loads(self.get("/sim/arrivals")))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


# ---- the client -----------------------------------------------------------------------------


class Tree:
    """The client process and its descendants, as psutil sees them; every pid ever seen is
    kept, so that the end can kill whatever is still alive."""

    def __init__(self, pid: int) -> None:
        self.parent = psutil.Process(pid)
        self.seen: dict[int, psutil.Process] = {}
        self.last_total = 0.0

    def read(self) -> tuple[float, dict[int, float]]:
        """The parent's user+sys and each live descendant's (the parent's reaped children
        are in its children_* times, not here)."""
        with self.parent.oneshot():
            own = sum(self.parent.cpu_times()[:2])
            kids = self.parent.children(recursive=True)
        out: dict[int, float] = {}
        for p in kids:
            self.seen.setdefault(p.pid, p)
            with contextlib.suppress(psutil.Error):  # one that exits between the two calls
                out[p.pid] = sum(p.cpu_times()[:2])
        self.last_total = own + sum(out.values())
        return own, out

    def kill_all(self) -> None:
        for p in [self.parent, *self.seen.values()]:
            with contextlib.suppress(psutil.Error):
                if p.is_running():
                    p.kill()


def window(tree: Tree, sim: SimClient, sim_proc: psutil.Process) -> Window:
    own, kids = tree.read()
    return Window(t=time.perf_counter(), parent_s=own, children_s=kids,
                  sim_tokens=sim.generated(), sim_cpu_s=sum(sim_proc.cpu_times()[:2]))


def client_argv(port: int, streams: int, seconds: float, out: Path, workers: int | None
                ) -> list[str]:
    argv = [sys.executable, "-m", "tui.cli", "run", "--headless",
            "--url", f"http://127.0.0.1:{port}/v1", "-c", str(streams),
            "--duration", f"{seconds:g}", "--input-tokens", str(INPUT_TOKENS),
            "--output-tokens", str(OUTPUT_TOKENS), "--wait", "10",
            "--out", str(out / "run"), "--json", str(out / "summary.json")]  # fmt: skip
    if workers is not None:
        argv += ["--workers", str(workers)]
    return argv


def wait_exit(pid: int, tree: Tree, deadline: float) -> tuple[int, float] | None:
    """The client's exit code and rusage CPU (its own and its reaped descendants'), or None
    past the deadline; the tree sampled meanwhile."""
    while time.monotonic() < deadline:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
        with contextlib.suppress(psutil.Error):
            tree.read()
        time.sleep(SAMPLE_S)
    return None


def tail_of(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-5:]
    except OSError:
        return ""
    return "\n".join("    " + plain(line, 200) for line in lines)


def auto_itl(streams: int, max_tok_s: float) -> float:
    """1 ms a stream, longer where the streams together would ask more than max_tok_s."""
    return max(1.0, streams * 1000.0 / max_tok_s)


def run_one(args: argparse.Namespace, streams: int) -> StreamsResult:
    itl = args.itl_ms if args.itl_ms is not None else auto_itl(streams, args.max_tok_s)
    sim_proc, port = start_sim(args.sim_cpu, itl)
    sim = SimClient(port)
    tree: Tree | None = None
    client: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="bench_hot_path_") as tmp:
        out = Path(tmp)
        log = out / "client.log"
        try:
            with open(log, "wb") as logf:
                client = subprocess.Popen(
                    client_argv(port, streams, args.seconds, out, args.workers), cwd=ROOT,
                    stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                    preexec_fn=pinned(set(args.client_cpus)))
            tree = Tree(client.pid)
            return measure(args, streams, itl, client, tree, sim,
                           psutil.Process(sim_proc.pid), out)
        except SystemExit as e:
            raise SystemExit(f"{e}\n  the client's last lines:\n{tail_of(log)}") from None
        finally:
            if client is not None and client.returncode is None:
                stop_client(client)
            if tree is not None:
                tree.kill_all()
            sim.close()
            stop_sim(sim_proc)


def stop_client(client: subprocess.Popen[bytes]) -> None:
    """As Ctrl-C would (the run drains and stops its workers), then a kill past 15 s."""
    with contextlib.suppress(ProcessLookupError):
        client.send_signal(signal.SIGINT)
    try:
        client.wait(15)
    except subprocess.TimeoutExpired:
        client.kill()
        client.wait(5)


def measure(args: argparse.Namespace, streams: int, itl: float, client: subprocess.Popen[bytes],
            tree: Tree, sim: SimClient, sim_proc: psutil.Process, out: Path) -> StreamsResult:
    # start-up: the tree's CPU when the simulator sees the first request
    deadline = time.monotonic() + START_DEADLINE_S
    while not sim.arrived():
        if client.poll() is not None:
            raise SystemExit(f"bench: the client exited ({client.returncode}) before a request")
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: no request within {START_DEADLINE_S:g} s of the start")
        time.sleep(POLL_S)
    own, kids = tree.read()
    startup = own + sum(kids.values())
    first = time.perf_counter()
    warm = max(1.0, 0.15 * args.seconds)
    a = sample_at(first + warm, client, tree, sim, sim_proc)
    b = sample_at(first + args.seconds - TAIL_S, client, tree, sim, sim_proc)
    ended = wait_exit(client.pid, tree, time.monotonic() + args.seconds + EXIT_DEADLINE_S)
    if ended is None:
        raise SystemExit(f"bench: the client did not exit within {EXIT_DEADLINE_S:g} s of its stop")
    code, total = ended
    client.returncode = code  # reaped here by wait4 (Popen must not wait for it again)
    summary = json.loads((out / "summary.json").read_text())
    tokens_run = summary["tokens"]["output"] + (summary.get("drain") or {}).get("output_tokens", 0)
    tokens_sim = sim.generated()
    return figures(streams, itl, args.seconds, a, b, startup=startup, total=total,
                   last=tree.last_total, tokens=(tokens_run, tokens_sim), code=code)


def sample_at(when: float, client: subprocess.Popen[bytes], tree: Tree, sim: SimClient,
              sim_proc: psutil.Process) -> Window:
    """Sleep until perf_counter reads `when` (reading the tree meanwhile), then a Window."""
    while (left := when - time.perf_counter()) > 0:
        if client.poll() is not None:
            raise SystemExit(f"bench: the client exited ({client.returncode}) mid-run")
        tree.read()
        time.sleep(min(SAMPLE_S, left))
    return window(tree, sim, sim_proc)


def figures(streams: int, itl: float, seconds: float, a: Window, b: Window, *, startup: float,
            total: float, last: float, tokens: tuple[int, float], code: int) -> StreamsResult:
    both = a.children_s.keys() & b.children_s.keys()  # alive at both edges
    parent = b.parent_s - a.parent_s
    workers = sum(b.children_s[p] - a.children_s[p] for p in both)
    n = b.sim_tokens - a.sim_tokens
    wall = b.t - a.t
    per = (parent + workers) / n * 1e6 if n else float("nan")
    tokens_run, tokens_sim = tokens
    return StreamsResult(
        streams=streams, workers=len(both), itl_ms=itl, seconds=seconds,
        tokens_run=int(tokens_run), tokens_sim=int(tokens_sim), window_s=wall,
        window_tokens=int(n), tok_s=n / wall,
        us_per_token=per, us_parent=parent / n * 1e6 if n else float("nan"),
        us_workers=workers / n * 1e6 if n else float("nan"),
        client_cpu_pct=(parent + workers) / wall * 100.0,
        sim_cpu_pct=(b.sim_cpu_s - a.sim_cpu_s) / wall * 100.0,
        startup_cpu_s=startup, total_cpu_s=total, last_sampled_cpu_s=last,
        not_steady_cpu_s=total - per * 1e-6 * tokens_sim,
        whole_us_per_token=total / tokens_sim * 1e6 if tokens_sim else float("nan"),
        exit_code=code)  # fmt: skip


# ---- imports --------------------------------------------------------------------------------

IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def import_lines(stderr: str) -> list[ImportLine]:
    out = []
    for line in stderr.splitlines():
        if m := IMPORT_LINE.match(line):
            out.append(ImportLine(module=m[4], depth=(len(m[3]) - 1) // 2,
                                  self_us=int(m[1]), cumulative_us=int(m[2])))
    return out


def heaviest(lines: list[ImportLine]) -> tuple[int, list[ImportLine], dict[str, int]]:
    """Total (the top-level imports' cumulative), the top 10 by cumulative, and the root
    packages with the most import time of their own."""
    packages: dict[str, int] = {}
    for ln in lines:
        root = ln.module.split(".")[0]
        packages[root] = packages.get(root, 0) + ln.self_us
    top_packages = dict(sorted(packages.items(), key=lambda kv: -kv[1])[:10])
    top = sorted(lines, key=lambda ln: -ln.cumulative_us)[:10]
    return sum(ln.cumulative_us for ln in lines if ln.depth == 0), top, top_packages


def measure_imports(args: argparse.Namespace) -> Imports:
    sim_proc, port = start_sim(args.sim_cpu, 1.0)
    try:
        with tempfile.TemporaryDirectory(prefix="bench_hot_path_") as tmp:
            argv = client_argv(port, 1, 1.0, Path(tmp), args.workers)
            parent = subprocess.run(
                [argv[0], "-X", "importtime", *argv[1:]], cwd=ROOT, capture_output=True,
                text=True, timeout=60, stdin=subprocess.DEVNULL,
                preexec_fn=pinned(set(args.client_cpus)))
    finally:
        stop_sim(sim_proc)
    worker = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import loadgen.worker.main"], cwd=ROOT,
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        preexec_fn=pinned(set(args.client_cpus)))
    p_total, p_top, p_pk = heaviest(import_lines(parent.stderr))
    w_total, w_top, w_pk = heaviest(import_lines(worker.stderr))
    return Imports(parent_total_us=p_total, parent_top=p_top, parent_packages=p_pk,
                   worker_total_us=w_total, worker_top=w_top, worker_packages=w_pk)


def print_imports(im: Imports) -> None:
    for who, total, top, packages in (
        ("headless parent (a 1 s run)", im.parent_total_us, im.parent_top, im.parent_packages),
        ("load worker (its module's imports)", im.worker_total_us, im.worker_top,
         im.worker_packages),
    ):
        print(f"\nimports of the {who}: {total / 1000:.0f} ms in all; top 10 by cumulative")
        for ln in top:
            print(f"  {ln.cumulative_us / 1000:>7.1f} ms  {'  ' * ln.depth}{ln.module}")
        print("  packages by their own import time: " + ", ".join(
            f"{name} {us / 1000:.0f} ms" for name, us in packages.items()))


# ---- the table ------------------------------------------------------------------------------


def print_header(args: argparse.Namespace) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"exact-timing simulator on cpu {args.sim_cpu}, client (parent and workers) on cpus "
          f"{','.join(map(str, args.client_cpus))}; {args.seconds:g} s a run, "
          f"{INPUT_TOKENS} in / {OUTPUT_TOKENS} out, one token a chunk; load average {load}")
    print(f"{'streams':>7} {'ITL ms':>6} {'tok run':>9} {'tok sim':>9} {'tok/s':>7} "
          f"{'µs/tok':>7} {'parent':>7} {'workers':>7} {'client':>7} {'sim':>5} "
          f"{'start s':>7} {'total s':>7} {'whole':>7} {'steady':>7}")


def print_row(r: StreamsResult) -> None:
    steady = 1.0 - r.not_steady_cpu_s / r.total_cpu_s if r.total_cpu_s else None
    print(f"{r.streams:>7} {r.itl_ms:>6.2f} {units.count(r.tokens_run):>9} "
          f"{units.count(r.tokens_sim):>9} {units.rate(r.tok_s):>7} {r.us_per_token:>7.1f} "
          f"{r.us_parent:>7.1f} {r.us_workers:>7.1f} {units.pct(r.client_cpu_pct, whole=100):>7} "
          f"{units.pct(r.sim_cpu_pct, whole=100):>5} {r.startup_cpu_s:>7.2f} "
          f"{r.total_cpu_s:>7.2f} {r.whole_us_per_token:>7.1f} {units.pct(steady):>7}")
    notes = []
    if r.tokens_run != r.tokens_sim:
        notes.append(f"the run counted {r.tokens_run - r.tokens_sim:+,} tokens against the sim")
    if r.total_cpu_s < r.last_sampled_cpu_s - 0.05:
        notes.append(f"wait4's total {r.total_cpu_s:.2f} s is below the last live sample "
                     f"{r.last_sampled_cpu_s:.2f} s: a worker went unreaped")
    if r.exit_code != 0:
        notes.append(f"the run exited {r.exit_code}")
    for note in notes:
        print(f"{'':>7} ! {note}")


def print_legend() -> None:
    print("µs/tok, parent, workers: client CPU per token over the steady window (the sim's "
          "tokens); client, sim: % of one core over it;\nstart s: the client tree's CPU from "
          "exec to the first request; total s: the whole run (wait4); whole: total / all the "
          "tokens;\nsteady: the share of the total that the steady cost per token explains "
          "(the rest: start-up, ramp, drain, exit)")


# ---- the command ----------------------------------------------------------------------------


def int_list(text: str, what: str, minimum: int) -> list[int]:
    """A comma-separated list of whole numbers for a flag, or its error in words."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what} such as 1,8, got {text!r}") from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"expected {what} of {minimum} or more, got {text!r}")
    return values


def cpu_list(text: str) -> list[int]:
    return int_list(text, "cpu numbers", 0)


def stream_list(text: str) -> list[int]:
    return int_list(text, "stream counts", 1)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=stream_list, default=[1, 8, 64, 256])
    p.add_argument("--seconds", type=float, default=10.0, help="--duration of each run (≥ 4)")
    p.add_argument("--workers", type=int, default=None, help="passed to the run (default: its own)")
    p.add_argument("--sim-cpu", type=int, default=0)
    p.add_argument("--client-cpus", type=cpu_list, default=[1])
    p.add_argument("--itl-ms", type=float, default=None,
                   help="the simulator's inter-token gap (default: auto, see --max-tok-s)")
    p.add_argument("--max-tok-s", type=float, default=20000.0,
                   help="auto ITL: at most this many tokens a second from the simulator")
    p.add_argument("--json", type=Path, default=None, help="save the figures here")
    p.add_argument("--imports", action="store_true", help="also python -X importtime")
    args = p.parse_args()
    usable = os.sched_getaffinity(0)
    wanted = {args.sim_cpu, *args.client_cpus}
    if not wanted <= usable:
        p.error(f"cpus {sorted(wanted - usable)} are not usable here (usable: {sorted(usable)})")
    if args.sim_cpu in args.client_cpus:
        p.error("--sim-cpu must not be one of --client-cpus")
    if args.seconds < 4:
        p.error("--seconds must be at least 4 (a warm-up and a tail around the window)")
    return args


def main() -> None:
    args = parse_args()
    os.sched_setaffinity(0, {args.sim_cpu})  # this process's polling stays off the client
    bench = Bench(argv=sys.argv[1:], sim_cpu=args.sim_cpu, client_cpus=args.client_cpus,
                  cores=os.cpu_count() or 0,
                  load_average=list(os.getloadavg()), results=[])
    print_header(args)
    try:
        for n in args.streams:
            r = run_one(args, n)
            bench.results.append(r)
            print_row(r)
        print_legend()
        if args.imports:
            bench.imports = measure_imports(args)
            print_imports(bench.imports)
    except KeyboardInterrupt:
        print("bench: interrupted; the figures so far are kept", file=sys.stderr)
    if args.json is not None:
        args.json.write_bytes(msgspec.json.format(msgspec.json.encode(bench)))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
