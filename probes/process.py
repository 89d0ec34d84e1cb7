"""The inference server's process through psutil: found by pid, by listening port, or by name.

vLLM, SGLang and TGI start worker processes, so RSS, CPU, threads and open
descriptors are summed over the server process and all its children. The RSS
trend (MB/hour, least squares over a sliding window) is what a soak report
reads to tell a leak from noise.

Finding the process:

* `pid`: that process, as long as it lives.
* `port`: the process listening on that local TCP port. `psutil.net_connections`
  cannot name the owner of another user's socket without privileges (pid None,
  or AccessDenied on macOS), so the fallback scans each visible process's own
  sockets, skipping the ones it may not read. When the listener's parent is a
  known launcher (text-generation-launcher starts a router that listens), the
  launcher is watched instead so that its model shards count too.
* `name`: a process whose name or first arguments match one of the patterns
  (by default the engines' launchers); the topmost match wins (a worker whose
  parent also matches is not picked).

When the process exits (a server restart), it is looked for again, at most
every `REFIND_PERIOD_S`, and its RSS trend starts afresh.

`sample()` never raises; it returns None when no process is watched, with the
reason in `message`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterable
from urllib.parse import urlsplit

import numpy as np
import psutil

from loadgen.model.snapshot import Event, ProcessSample
from loadgen.model.text import plain
from loadgen.model.trend import MIN_SLOPE_SPAN_S

log = logging.getLogger(__name__)

# Process names / first arguments of the engines' servers and launchers.
DEFAULT_NAMES = (
    "vllm",
    "sglang",
    "text-generation-launcher",
    "text-generation-router",
    "trtllm-serve",
    "tritonserver",
    "llama-server",
)
# Launchers whose child listens on the port: watch the launcher (and so every child).
_LAUNCHERS = ("text-generation-launcher",)

NAME_LIMIT = 64  # characters of a process's name kept
REFIND_PERIOD_S = 5.0  # how often to look for a process that is not (or no longer) there
CHILDREN_PERIOD_S = 5.0  # how often to list children (a walk over all of /proc)


class RssTrend:
    """RSS slope in MB/hour by least squares over a sliding window of (t, rss) points;
    None until the points span loadgen.model.trend's MIN_SLOPE_SPAN_S, the rule the
    report's slopes follow too (a shorter slope is start-up growth, not a leak)."""

    def __init__(
        self,
        window_s: float = 1800.0,
        max_points: int = 2048,
        min_points: int = 10,
        min_span_s: float = MIN_SLOPE_SPAN_S,
    ) -> None:
        self.window_s = window_s
        self.min_points = min_points
        self.min_span_s = min_span_s
        self._points: deque[tuple[float, float]] = deque(maxlen=max_points)

    def add(self, t: float, rss_bytes: float) -> None:
        self._points.append((t, float(rss_bytes)))
        while self._points and self._points[0][0] < t - self.window_s:
            self._points.popleft()

    def clear(self) -> None:
        self._points.clear()

    def __len__(self) -> int:
        return len(self._points)

    def slope_mb_h(self) -> float | None:
        """MB (10^6 bytes) per hour; None until the window holds enough points and time."""
        if len(self._points) < self.min_points:
            return None
        data = np.asarray(self._points, dtype=np.float64)
        t = data[:, 0] - data[0, 0]
        if t[-1] < self.min_span_s:
            return None
        y = data[:, 1] / 1e6
        t_mean = t.mean()
        dt = t - t_mean
        denom = float(np.dot(dt, dt))
        if denom <= 0.0:
            return None
        slope_per_s = float(np.dot(dt, y - y.mean())) / denom
        return slope_per_s * 3600.0


class ProcessProbe:
    """Watches the inference server's process tree. `sample()` blocks for a few ms at most."""

    def __init__(
        self,
        pid: int | None = None,
        port: int | None = None,
        name: str | None = None,
        *,
        names: Iterable[str] | None = None,
        trend: RssTrend | None = None,
    ) -> None:
        """Look for `pid`, else the listener on local TCP `port`, else a process called `name`.

        With none of the three given, the engines' usual names (DEFAULT_NAMES) are
        looked for; pass `names=()` to disable that.
        """
        self.pid = pid
        self.port = port
        if name is not None:
            self.names: tuple[str, ...] = (name,)
        elif names is not None:
            self.names = tuple(names)
        elif pid is None and port is None:
            self.names = DEFAULT_NAMES
        else:
            self.names = ()
        self.message: str | None = None  # why no process is watched, in words
        self.trend = trend if trend is not None else RssTrend()
        self._proc: psutil.Process | None = None
        self._found_by: str | None = None
        self._children: dict[int, psutil.Process] = {}
        self._children_due = 0.0
        self._find_due = 0.0
        self._pid_gone = False
        self._cpu_primed = False
        self._events: list[Event] = []

    # -- public ------------------------------------------------------------------

    def pids(self) -> list[int]:
        """The watched process and its known children (for GpuProbe.set_server_pids)."""
        if self._proc is None:
            return []
        return [self._proc.pid, *self._children]

    def drain_events(self) -> list[Event]:
        """ "server process found / exited" events since the last call."""
        events, self._events = self._events, []
        return events

    def sample(self) -> ProcessSample | None:
        try:
            return self._sample()
        except Exception as exc:  # psutil on an odd platform: never crash the console
            log.debug("process probe failed: %s", exc, exc_info=True)
            self.message = f"process probe failed: {exc}"
            return None

    # -- finding -------------------------------------------------------------------

    def _ensure(self) -> psutil.Process | None:
        proc = self._proc
        if proc is not None:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    return proc
            except psutil.Error:
                pass
            self._lost(proc)
        now = time.monotonic()
        if now < self._find_due:
            return None
        self._find_due = now + REFIND_PERIOD_S
        found = self._find()
        if found is None:
            return None
        proc, how = found
        self._proc, self._found_by = proc, how
        self._cpu_primed = False
        self._children.clear()
        self._children_due = 0.0
        self.trend.clear()
        self.message = None
        self._event(f"server process {proc.pid} ({_name(proc) or '?'}) found by {how}")
        return proc

    def _lost(self, proc: psutil.Process) -> None:
        self._event(f"server process {proc.pid} exited", level="warn")
        if self.pid is not None and proc.pid == self.pid:
            self._pid_gone = True  # a pid is never reused for "the server"
        self._proc = None
        self._children.clear()
        self.trend.clear()
        self._find_due = 0.0  # look for its successor at once

    def _find(self) -> tuple[psutil.Process, str] | None:
        reasons: list[str] = []
        if self.pid is not None and not self._pid_gone:
            try:
                return psutil.Process(self.pid), "pid"
            except psutil.NoSuchProcess:
                self._pid_gone = True
                reasons.append(f"no process with pid {self.pid}")
            except psutil.Error as exc:
                reasons.append(f"pid {self.pid}: {exc}")
        elif self.pid is not None:
            reasons.append(f"process {self.pid} has exited")
        if self.port is not None:
            proc = find_listener(self.port)
            if proc is not None:
                return _launcher_of(proc), "port"
            reasons.append(f"no visible process listens on TCP port {self.port}")
        if self.names:
            proc = find_by_name(self.names)
            if proc is not None:
                return proc, "name"
            reasons.append("no process named " + " / ".join(self.names))
        self.message = "; ".join(reasons) or "no server process to look for"
        return None

    # -- sampling ------------------------------------------------------------------

    def _sample(self) -> ProcessSample | None:
        proc = self._ensure()
        if proc is None:
            return None
        now = time.monotonic()
        if now >= self._children_due:
            self._children_due = now + CHILDREN_PERIOD_S
            self._refresh_children(proc)
        try:
            with proc.oneshot():
                rss = proc.memory_info().rss
                # The first reading of a Process object has nothing to compare with.
                cpu_main = proc.cpu_percent(interval=None)
                first, self._cpu_primed = not self._cpu_primed, True
                threads = proc.num_threads()
                fds = _fds(proc)
                name = _name(proc)
        except psutil.NoSuchProcess:
            self._lost(proc)
            return None
        except psutil.AccessDenied as exc:
            self.message = f"process {proc.pid}: access denied ({exc.msg or 'not ours'})"
            return ProcessSample(pid=proc.pid, name=_name(proc), found_by=self._found_by)
        cpu = cpu_main
        gone: list[int] = []
        for pid, child in self._children.items():
            try:
                with child.oneshot():
                    rss += child.memory_info().rss
                    cpu += child.cpu_percent(interval=None)  # 0.0 on a child's first reading
                    threads += child.num_threads()
                    child_fds = _fds(child)
                    fds = None if fds is None or child_fds is None else fds + child_fds
            except psutil.NoSuchProcess:
                gone.append(pid)
            except psutil.AccessDenied:
                continue
        for pid in gone:
            self._children.pop(pid, None)
        self.trend.add(time.time(), rss)
        return ProcessSample(
            pid=proc.pid,
            name=name,
            found_by=self._found_by,
            rss_bytes=int(rss),
            cpu_pct=None if first else float(cpu),
            threads=int(threads),
            open_files=fds,
            children=len(self._children),
            rss_slope_mb_h=self.trend.slope_mb_h(),
        )

    def _refresh_children(self, proc: psutil.Process) -> None:
        try:
            current = proc.children(recursive=True)
        except psutil.Error:
            return
        kept: dict[int, psutil.Process] = {}
        for child in current:
            # Keep the same Process object so its cpu_percent has a previous reading.
            kept[child.pid] = self._children.get(child.pid, child)
        self._children = kept

    def _event(self, message: str, level: str = "info") -> None:
        self._events.append(Event(t=time.time(), kind="probe", level=level, message=message))
        del self._events[:-100]


# -- finding helpers ------------------------------------------------------------------


def local_port(url: str) -> int | None:
    """The TCP port of `url` when its host is this machine (loopback or a local address)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None
    if not host or port is None:
        return None
    return port if is_local_host(host) else None


def is_local_host(host: str) -> bool:
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name other than ours: do not resolve (DNS may block); not local
    if ip.is_loopback or ip.is_unspecified:
        return True
    try:
        addrs = psutil.net_if_addrs()
    except Exception:
        return False
    ours = {a.address.split("%")[0] for nic in addrs.values() for a in nic}
    return str(ip) in ours


def find_listener(port: int) -> psutil.Process | None:
    """The process listening on local TCP `port`, or None (not there, or not visible to us)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError, OSError):
        conns = []
    unknown_owner = False
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            if c.pid is not None:
                try:
                    return psutil.Process(c.pid)
                except psutil.Error:
                    continue
            unknown_owner = True
    if conns and not unknown_owner:
        return None  # the table is complete and nobody listens there
    # Not privileged enough to see owners: ask each process we may look at.
    for proc in psutil.process_iter():
        try:
            for c in _connections(proc):
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
                    return proc
        except (psutil.Error, OSError):
            continue
    return None


def _connections(proc: psutil.Process) -> list:
    method = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6
    return method(kind="tcp")


def find_by_name(patterns: Iterable[str]) -> psutil.Process | None:
    """The topmost process whose name or leading arguments contain one of `patterns`."""
    pats = tuple(p.lower() for p in patterns if p)
    if not pats:
        return None
    skip = _own_family()
    matches: dict[int, psutil.Process] = {}
    parents: dict[int, int] = {}
    for proc in psutil.process_iter(["name", "cmdline", "ppid"]):
        if proc.pid in skip:
            continue
        info = proc.info
        words = [info.get("name") or ""]
        cmdline = info.get("cmdline") or []
        # argv[0], and for interpreters the module or script ("-m vllm.entrypoints…")
        words += [os.path.basename(a) for a in cmdline[:3]]
        text = " ".join(words).lower()
        if any(p in text for p in pats):
            matches[proc.pid] = proc
            parents[proc.pid] = info.get("ppid") or 0
    # The root of each matching tree: a match whose parent does not match.
    roots = [p for pid, p in matches.items() if parents[pid] not in matches]
    if not roots:
        return None
    roots.sort(key=lambda p: _create_time(p))
    return roots[0]


def _own_family() -> set[int]:
    """This process and its ancestors (a shell whose command line names the engine):
    never "the server". Children are not excluded: an embedded simulator is one."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in me.parents())
    return pids


def _launcher_of(proc: psutil.Process) -> psutil.Process:
    try:
        parent = proc.parent()
        if parent is not None:
            text = " ".join([parent.name(), *parent.cmdline()[:2]]).lower()
            if any(name in text for name in _LAUNCHERS):
                return parent
    except psutil.Error:
        pass
    return proc


def _create_time(proc: psutil.Process) -> float:
    try:
        return proc.create_time()
    except psutil.Error:
        return float("inf")


def _name(proc: psutil.Process) -> str | None:
    """The process's name, plain: whoever started it chose it (escape sequences included)."""
    try:
        return plain(proc.name(), NAME_LIMIT)
    except psutil.Error:
        return None


def _fds(proc: psutil.Process) -> int | None:
    """Open descriptors (files, sockets, pipes): what leaks when a server leaks handles."""
    try:
        if hasattr(proc, "num_fds"):
            return proc.num_fds()
        return proc.num_handles()  # Windows
    except psutil.Error:
        return None
