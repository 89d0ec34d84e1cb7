"""The recorder: a sink that makes every run a durable run directory (see loadgen.record.rundir).

Per tick, `write(snapshot)` appends one line to snapshots.jsonl, one hlog line per
metric present to latency.hlog and the tick's events to events.jsonl. Each file
gets the whole tick in one `write(2)` on an O_APPEND descriptor (no user-space
buffer), so a `kill -9` at any moment loses nothing that a write returned for
and cannot tear a line; an OS crash or power loss loses at most `fsync_s` (1 s)
plus one tick, because the three files are fsync'd at most that far apart.

Rotation keeps every file bounded: all three streams move to a new part together
when the snapshot part passes `rotate_bytes` or has been open `rotate_s`.

Errors are `RecordingError`, with a sentence for the user ("disk full while
writing …: recording stopped"). After one, the recorder writes nothing more but the
manifest's final state (status "recording stopped" and why), for which it frees the
space writer.lock holds; whether the load stops is the caller's choice (`Recording`
below does the usual).

One writer a directory: the Recorder holds writer.lock (flock, exclusive) from
create/resume to close, so a second writer (`--resume` of a run that still runs)
is refused in one line, and readers know a killed writer from a live one
(rundir.run_state): the kernel lets go of a dead process's lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import platform
import socket
import time
from pathlib import Path

import msgspec

from loadgen import __version__
from loadgen.model.snapshot import Event, Snapshot, to_json
from loadgen.record import hlog
from loadgen.record.rundir import (
    FILE_MODE,
    MANIFEST,
    MANIFEST_FORMAT,
    RECORDING_STOPPED,
    RUNNING,
    STREAMS,
    WRITER_LOCK,
    RunDirError,
    default_run_dir,
    last_snapshot,
    part_path,
    parts,
    read_manifest,
    scrub,
    write_json_atomic,
)

ROTATE_BYTES = 256 * 1024 * 1024  # snapshot part size that starts a new part
ROTATE_S = 3600.0  # … or its age
FSYNC_S = 1.0  # fsync at most this far apart (≤ 2 s data at risk on power loss)
ON_DISK_FULL = ("stop", "continue")
RESERVE_BYTES = 64 * 1024  # held in writer.lock: room for the final manifest on a full disk
LOCK_WAIT_S = 0.2  # a reader's probe holds the lock for microseconds; a writer for the run

_event_encoder = msgspec.json.Encoder()


class RecordingError(Exception):
    """Recording cannot go on; str(e) is the message for the user."""


def _why(e: OSError, action: str, path: Path) -> str:
    if e.errno == errno.ENOSPC:
        return f"disk full while {action} {path}"
    if e.errno == errno.EDQUOT:
        return f"disk quota exceeded while {action} {path}"
    if e.errno == errno.EFBIG:
        return f"file size limit reached while {action} {path}"
    if e.errno == errno.EROFS:
        return f"read-only file system: cannot go on {action} {path}"
    return f"cannot go on {action} {path}: {e.strerror or e}"


class WriterLock:
    """writer.lock, held exclusive while this process writes the run (rundir.writer_alive).

    Its first line names the holder, for the refusal a second writer gets. While held it
    also keeps RESERVE_BYTES allocated: on a full disk, freeing them is what lets the
    final manifest still be written."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / WRITER_LOCK
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                              FILE_MODE)
        except OSError as e:
            raise RecordingError(_why(e, "opening", self.path) + ": recording not started") \
                from None
        if not self._take():
            owner = self._owner()
            os.close(self.fd)
            raise RecordingError(f"{run_dir} is being written by another tokentop ({owner}): "
                                 "one writer a run directory; let that run end, or stop it, "
                                 "first")
        self._stamp = f"pid {os.getpid()} on {socket.gethostname()}\n".encode()
        with contextlib.suppress(OSError):  # best effort: a full disk must not stop the start
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, self._stamp, 0)
            os.posix_fallocate(self.fd, len(self._stamp), RESERVE_BYTES)

    def _take(self) -> bool:
        """Lock, retrying briefly past readers' probes; False if another writer holds it."""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
            except OSError:
                return True  # no flock on this file system: write unlocked rather than not

    def _owner(self) -> str:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            line = os.pread(self.fd, 200, 0).split(b"\n", 1)[0].decode().strip()
            if line:
                return line
        return "another process"

    def free_reserve(self) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, len(self._stamp))

    def release(self) -> None:
        """Unlock (by closing): from here on readers see no live writer."""
        if self.fd >= 0:
            self.free_reserve()
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class _Stream:
    def __init__(self, run_dir: Path, name: str, index: int) -> None:
        self.run_dir, self.name = run_dir, name
        self.index = index
        self.path = part_path(run_dir, name, index)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                          FILE_MODE)
        self.size = os.fstat(self.fd).st_size

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.size += n

    def fsync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _truncate_torn_tail(path: Path) -> int:
    """Cut a partial last line (left by a crash); returns the bytes removed."""
    with open(path, "r+b") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return 0
        pos = size
        while pos > 0:
            step = min(65536, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = pos - step + nl + 1
                break
            pos -= step
        else:
            keep = 0
        if keep < size:
            f.truncate(keep)
        return size - keep


def claim(run_dir: Path | str) -> WriterLock:
    """writer.lock of a run directory about to be resumed, taken before anything in it is
    read (a second writer is refused before it reads a line), then its torn tails cut and
    its latency log mended, so what is read next is whole. The caller releases the lock, or
    hands it to Recorder.resume. RecordingError in words."""
    run_dir = Path(run_dir)
    if not (run_dir / MANIFEST).exists() and not parts(run_dir, "snapshots"):
        try:  # not a run directory: its words, and no writer.lock left in it
            read_manifest(run_dir)
        except RunDirError as e:
            raise RecordingError(f"cannot resume: {e}") from None
    lock = WriterLock(run_dir)
    try:
        index = last_part(run_dir)
        for name in STREAMS:
            path = part_path(run_dir, name, index)
            if path.exists():
                _truncate_torn_tail(path)
        _mend_hlog(run_dir, index, read_manifest(run_dir).get("start_time"))
    except (OSError, RunDirError) as e:
        lock.release()
        raise RecordingError(_why(e, "resuming", run_dir) + ": recording not resumed"
                             if isinstance(e, OSError) else f"cannot resume: {e}") from None
    return lock


def last_part(run_dir: Path) -> int:
    """The index of the parts written last (the three streams rotate together)."""
    return max((len(found) - 1 for name in STREAMS if (found := parts(run_dir, name))),
               default=0)


class _Tick(msgspec.Struct):
    """What a Snapshot line tells the latency log (the rest of it is not decoded)."""

    t: float
    interval: float
    hist: dict[str, str] = msgspec.field(default_factory=dict)


_decode_tick = msgspec.json.Decoder(_Tick).decode


def _mend_hlog(run_dir: Path, index: int, start_time: float | None) -> None:
    """Append the latency lines of recorded ticks that the log of part `index` lacks.

    A tick's Snapshot line is written before its latency lines, so a full disk or a kill
    between the two leaves the log short of the last tick's lines, or of some of them (the
    torn one already cut): the Snapshot still holds those histograms, and the log gets
    them back in the same bytes the recorder would have written. A log that disagrees with
    its Snapshots before that point is left as it is."""
    snapshots = part_path(run_dir, "snapshots", index)
    latency = part_path(run_dir, "latency", index)
    if start_time is None or not snapshots.exists():
        return
    have = latency.read_bytes() if latency.exists() else b""
    if hlog.LEGEND.encode() not in have:  # its header never made it whole
        have = _hlog_header(start_time)
        latency.write_bytes(have)
    kept = hlog.tag_lines(have)
    missing: list[bytes] = []
    seen = 0  # latency lines the Snapshots so far account for
    with open(snapshots, "rb") as f:
        for raw in f:
            try:
                tick = _decode_tick(raw)
            except msgspec.DecodeError:
                continue  # a reader skips it too
            if seen + len(tick.hist) <= len(kept) and not missing:
                seen += len(tick.hist)
                continue
            lines = hlog.tick_lines(tick.hist, tick.t, tick.interval, start_time)
            lines_of = lines.splitlines(keepends=True)
            if not missing:  # the tick the log stops in: what it has must be its start
                have_of = len(kept) - seen
                if kept[seen:] != lines_of[:have_of]:
                    return
                lines_of = lines_of[have_of:]
            missing += lines_of
    if missing:
        with open(latency, "ab") as f:
            f.write(b"".join(missing))


def _hlog_header(start_time: float) -> bytes:
    return hlog.header(start_time, f"tokentop {__version__} latency log, µs")


def host_info() -> dict:
    info: dict = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    with contextlib.suppress(Exception):
        import psutil

        info["mem_total_bytes"] = psutil.virtual_memory().total
    return info


class Recorder:
    """Writes one run directory. `create()` for a new run, `resume()` to continue one."""

    def __init__(self, run_dir: Path, manifest: dict, lock: WriterLock, *, index: int = 0,
                 rotate_bytes: int = ROTATE_BYTES, rotate_s: float = ROTATE_S,
                 fsync_s: float = FSYNC_S) -> None:
        self.run_dir = run_dir
        self.manifest = manifest
        self._lock = lock
        self.rotate_bytes, self.rotate_s, self.fsync_s = rotate_bytes, rotate_s, fsync_s
        self.failed: str | None = None
        self.closed = False
        self._streams: dict[str, _Stream] = {}
        self._part_started = time.monotonic()
        self._last_fsync = time.monotonic()
        self._dirty = False
        self._start_time: float | None = manifest.get("start_time")
        self._engine_known = manifest.get("engine") is not None
        self._target_known = manifest.get("target") is not None
        self.bytes_written = 0
        self.fsync_s_total = 0.0
        self.fsyncs = 0
        try:
            self._open(index)
        except OSError as e:
            self._close_streams()
            lock.release()
            raise RecordingError(_why(e, "opening", run_dir) + ": recording not started") \
                from None

    # ---- create / resume -----------------------------------------------------------------

    @classmethod
    def create(cls, out_dir: Path | str | None, config: dict, *, run_id: str,
               **kw) -> Recorder:
        """A new run directory (default: under $XDG_DATA_HOME/tokentop/runs); `config` is the
        run's configuration as plain data (secrets are scrubbed again here all the same)."""
        run_dir = Path(out_dir) if out_dir else default_run_dir(run_id)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RecordingError(f"cannot create the run directory {run_dir}: "
                                 f"{e.strerror or e}") from None
        lock = WriterLock(run_dir)  # first: a live writer's directory is refused as such
        if parts(run_dir, "snapshots"):
            lock.release()
            raise RecordingError(f"{run_dir} already holds a run; use --resume {run_dir} to "
                                 "continue it, or choose another --out")
        manifest = {
            "format": "tokentop-run",
            "format_version": MANIFEST_FORMAT,
            "tokentop_version": __version__,
            "run_id": run_id,
            "status": RUNNING,
            "created": time.time(),
            "start_time": None,
            "end_time": None,
            "config": scrub(config),
            "target": None,
            "engine": None,
            "host": host_info(),
            "gpus": None,
            "gpu_source": None,
            "rotation": {"bytes": kw.get("rotate_bytes", ROTATE_BYTES),
                         "seconds": kw.get("rotate_s", ROTATE_S)},
            "resumes": [],
            "recording_stopped": None,
            "summary": None,
        }
        try:
            write_json_atomic(run_dir / MANIFEST, manifest)
        except OSError as e:
            lock.release()
            raise RecordingError(_why(e, "writing", run_dir / MANIFEST)
                                 + ": recording not started") from None
        return cls(run_dir, manifest, lock, **kw)

    @classmethod
    def resume(cls, run_dir: Path | str, *, lock: WriterLock | None = None,
               **kw) -> Recorder:
        """Append to an existing run directory, under `lock` (claim()'s, taken before the
        directory was read) or a lock taken now; torn tails are cut (claim())."""
        run_dir = Path(run_dir)
        lock = lock or claim(run_dir)
        try:
            return cls._resume(run_dir, lock, **kw)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _resume(cls, run_dir: Path, lock: WriterLock, **kw) -> Recorder:
        manifest = read_manifest(run_dir)  # again, now that no one else can change it
        last = last_snapshot(run_dir, warn=lambda _m: None)
        try:
            manifest.setdefault("resumes", []).append(
                {"at": time.time(), "after_seq": last.seq if last else None,
                 "after_t": last.t if last else None}
            )
            manifest["status"] = RUNNING
            manifest["end_time"] = None
            write_json_atomic(run_dir / MANIFEST, manifest)
        except OSError as e:
            raise RecordingError(_why(e, "resuming", run_dir) + ": recording not resumed") \
                from None
        return cls(run_dir, manifest, lock, index=last_part(run_dir), **kw)

    # ---- writing -------------------------------------------------------------------------

    def _open(self, index: int) -> None:
        self._close_streams()
        for name in STREAMS:
            self._streams[name] = _Stream(self.run_dir, name, index)
        self._part_started = time.monotonic()
        hl = self._streams["latency"]
        if hl.size == 0 and self._start_time is not None:
            hl.write(_hlog_header(self._start_time))

    def write(self, snap: Snapshot) -> None:
        """Append one tick; raises RecordingError (once) when it cannot."""
        if self.failed is not None or self.closed:
            return
        path = self.run_dir
        try:
            if self._start_time is None:
                self._first(snap)
            self._manifest_updates(snap)
            if self._rotation_due():
                self._rotate()
            data = to_json(snap) + b"\n"
            path = self._streams["snapshots"].path
            self._streams["snapshots"].write(data)
            hl = self._hlog_lines(snap)
            if hl:
                path = self._streams["latency"].path
                self._streams["latency"].write(hl)
            if snap.events:
                ev = b"".join(
                    _event_encoder.encode({"seq": snap.seq, "elapsed": round(snap.elapsed, 3),
                                           **msgspec.to_builtins(e)}) + b"\n"
                    for e in snap.events
                )
                path = self._streams["events"].path
                self._streams["events"].write(ev)
            self.bytes_written += len(data) + len(hl)
            self._dirty = True
            now = time.monotonic()
            if now - self._last_fsync >= self.fsync_s:
                self._fsync(now)
        except OSError as e:
            self._stopped(_why(e, "writing", path) + ": recording stopped")
            raise RecordingError(self.failed) from None

    def _stopped(self, why: str) -> None:
        """Recording failed: say so in the manifest now (the process may not live to close),
        in the space writer.lock kept for it; if even that fails, the lock tells the truth."""
        self.failed = why
        self.manifest["status"] = RECORDING_STOPPED
        self.manifest["recording_stopped"] = why
        self._lock.free_reserve()
        with contextlib.suppress(OSError):
            write_json_atomic(self.run_dir / MANIFEST, self.manifest)

    def _first(self, snap: Snapshot) -> None:
        self._start_time = snap.t - snap.elapsed
        self.manifest["start_time"] = self._start_time
        hl = self._streams["latency"]
        if hl.size == 0:
            hl.write(_hlog_header(self._start_time))

    def _manifest_updates(self, snap: Snapshot) -> None:
        changed = False
        if not self._target_known:
            self.manifest["target"] = msgspec.to_builtins(snap.target)
            self.manifest["gpu_source"] = snap.gpu.source
            self.manifest["gpus"] = [
                {"index": g.index, "name": g.name, "uuid": g.uuid, "simulated": g.simulated,
                 "memory_total_bytes": g.memory_total_bytes}
                for g in snap.gpu.gpus
            ]
            self._target_known = changed = True
        if not self._engine_known and snap.server is not None and snap.server.engine:
            self.manifest["engine"] = snap.server.engine
            self._engine_known = changed = True
        if changed:
            write_json_atomic(self.run_dir / MANIFEST, self.manifest)

    def _hlog_lines(self, snap: Snapshot) -> bytes:
        if not snap.hist:
            return b""
        assert self._start_time is not None
        return hlog.tick_lines(snap.hist, snap.t, snap.interval, self._start_time)

    def _rotation_due(self) -> bool:
        s = self._streams["snapshots"]
        if s.size == 0:
            return False
        return (s.size >= self.rotate_bytes
                or time.monotonic() - self._part_started >= self.rotate_s)

    def _rotate(self) -> None:
        index = self._streams["snapshots"].index + 1
        self._fsync(time.monotonic())
        self._open(index)

    def _fsync(self, now: float) -> None:
        t0 = time.perf_counter()
        for s in self._streams.values():
            s.fsync()
        self.fsync_s_total += time.perf_counter() - t0
        self.fsyncs += 1
        self._last_fsync = now
        self._dirty = False

    # ---- the end -------------------------------------------------------------------------

    def close(self, summary: dict | None = None, *, status: str = "finished") -> None:
        """fsync, close the files, write the final manifest (status, end, summary), then let
        go of writer.lock: in that order, so a reader never sees no writer and "running".
        After a failure the status stays "recording stopped" (the record is incomplete)."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.failed is None:
                self._fsync(time.monotonic())
        except OSError:
            pass
        self._close_streams()
        self.manifest["status"] = status if self.failed is None else RECORDING_STOPPED
        self.manifest["end_time"] = time.time()
        if self.failed is not None:
            self.manifest["recording_stopped"] = self.failed
        if summary is not None:
            self.manifest["summary"] = scrub(summary)
        try:
            write_json_atomic(self.run_dir / MANIFEST, self.manifest)
        except OSError as e:
            if self.failed is None:
                raise RecordingError(_why(e, "writing", self.run_dir / MANIFEST)) from None
        finally:
            self._lock.release()

    def abandon(self) -> None:
        """Close without a final manifest (the directory is about to be removed)."""
        self.closed = True
        self._close_streams()
        self._lock.release()

    def _close_streams(self) -> None:
        for s in self._streams.values():
            s.close()
        self._streams = {}


# ---- the usual policy, shared by the headless loop and the console's engine ------------------


class Recording:
    """A Recorder plus the --on-disk-full policy, as the run loops use it.

    `take(snap)` records one tick (adding "recording to …" to the first one); when
    recording fails it adds an error Event to that Snapshot (so the console and the
    stderr lines show it) and sets `stop_load` under the default policy.
    """

    def __init__(self, recorder: Recorder | None, on_disk_full: str = "stop",
                 notice: str | None = None) -> None:
        if on_disk_full not in ON_DISK_FULL:
            raise RecordingError(f"--on-disk-full must be stop or continue, not {on_disk_full!r}")
        self.recorder = recorder
        self.on_disk_full = on_disk_full
        self.stop_load = False
        self.error: str | None = None
        self._notice = notice
        self._first = True

    @classmethod
    def open(cls, *, config: dict, run_id: str, out: str | None = None,
             resume: str | None = None, on_disk_full: str = "stop", record: bool = True,
             lock: WriterLock | None = None, **kw) -> Recording:
        """Create the run directory (`out`, or the default one), or continue `resume` (under
        `lock` when claim() took it already; released here when the recording fails).

        Raises RecordingError when that fails and the policy is "stop"; under
        "continue" the run goes on unrecorded, and the first Snapshot says so."""
        policy = on_disk_full or "stop"
        if not record:
            if lock is not None:
                lock.release()
            return cls(None, policy)
        try:
            if resume:
                rec = Recorder.resume(resume, lock=lock, **kw)
            else:
                rec = Recorder.create(out, config, run_id=run_id, **kw)
        except RecordingError as e:
            if policy == "stop":
                raise
            r = cls(None, policy)
            r.error = f"{e}; the load runs without recording (--on-disk-full=continue)"
            return r
        return cls(rec, policy, notice=f"recording to {rec.run_dir}")

    @property
    def run_dir(self) -> Path | None:
        return self.recorder.run_dir if self.recorder else None

    @property
    def active(self) -> bool:
        return self.recorder is not None and self.recorder.failed is None

    def take(self, snap: Snapshot) -> Event | None:
        """Record `snap`; returns the error Event when recording just failed."""
        if self._first:
            self._first = False
            if self._notice:
                snap.events.append(Event(t=snap.t, kind="record", message=self._notice))
            if self.error:
                ev = Event(t=snap.t, kind="record", level="error", message=self.error)
                snap.events.append(ev)
                return ev
        if self.recorder is None or self.recorder.failed is not None:
            return None
        try:
            self.recorder.write(snap)
        except RecordingError as e:
            if self.on_disk_full == "continue":
                self.error = f"{e}; the load goes on without recording (--on-disk-full=continue)"
            else:
                self.error = f"{e}; stopping the load (--on-disk-full=continue keeps it running)"
                self.stop_load = True
            ev = Event(t=snap.t, kind="record", level="error", message=self.error)
            snap.events.append(ev)
            return ev
        return None

    def discard(self, summary: dict | None = None) -> None:
        """The run never started: remove a directory this run created and left empty of
        Snapshots (a resumed one is only closed)."""
        rec = self.recorder
        if rec is None:
            return
        if rec.manifest.get("resumes") or rec.bytes_written:
            self.close(summary)
            return
        rec.abandon()
        import shutil

        shutil.rmtree(rec.run_dir, ignore_errors=True)
        self.recorder = None

    def close(self, summary: dict | None = None) -> str | None:
        """Finish the directory; returns an error message instead of raising."""
        if self.recorder is None:
            return None
        try:
            self.recorder.close(summary)
        except RecordingError as e:
            return str(e)
        return None
