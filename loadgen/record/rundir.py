"""The run directory: where a run's record lives, and how to read it back.

Layout (every run, TUI or headless):

    manifest.json        what ran: version, config (secrets removed), target, engine,
                         host, GPUs, start/end, status; replaced atomically (temp + rename)
    snapshots.jsonl      one Snapshot (loadgen.model.snapshot.to_json) per line, per tick
    latency.hlog         the interval histograms, standard HdrHistogram interval log
    events.jsonl         one Event per line (errors, SLO, outages, operator, recording)
    writer.lock          flock'd (exclusive) by the one process writing the run, for as
                         long as it writes; first line "pid N on HOST"; while held it also
                         reserves a little space for the final manifest on a full disk
    snapshots.000001.jsonl, latency.000001.hlog, events.000001.jsonl, …
                         later parts after rotation (by size or by hour); readers read
                         the unnumbered part first, then the numbered ones in order

Reading is forgiving where a crash can leave a mark and strict where it cannot:
a torn last line (the process died mid-write) or a corrupt line is skipped with a
warning; a Snapshot of an unknown format version is refused (SnapshotVersionError).
`RunReader.poll()` returns what is new since the last call, so the same reader
serves a finished directory, a crashed one and one that is still being written.
Whether it is still being written is known, not guessed: `run_state()` asks the
kernel whether a live process holds writer.lock (a killed writer's lock is gone).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from secrets import token_hex

import msgspec

from loadgen.model.snapshot import SNAPSHOT_VERSION, Snapshot, SnapshotVersionError, from_json
from loadgen.model.text import plain_all
from loadgen.model.urls import public_url

MANIFEST = "manifest.json"
WRITER_LOCK = "writer.lock"
# the manifest's "status" as the writer leaves it, and what a reader makes of "running"
RUNNING, FINISHED, RECORDING_STOPPED = "running", "finished", "recording stopped"
INTERRUPTED = "interrupted"  # says "running", but no live process holds writer.lock
STREAMS = {"snapshots": ".jsonl", "latency": ".hlog", "events": ".jsonl"}
MANIFEST_FORMAT = 1
# every file of a run directory is created with this mode less the user's umask (0644 under
# the usual 022), as any file the user makes: secrets never reach a run directory (scrub),
# so a mode is not what guards them; who may read a run's prompts and answers is the
# user's to say, by the umask or the directory chosen with --out
FILE_MODE = 0o666
# fields that hold a secret by what they are (RunConfig has none: secrets travel apart);
# a name that merely contains "token" (input_tokens, tokentop_version) is not one
SECRET_FIELDS = frozenset({"api_key", "apikey", "password", "passwd", "secret", "token",
                           "authorization", "metrics_token", "mqtt_password", "basic_auth",
                           "bearer_token", "access_token", "secret_key", "credentials",
                           "require_authorization"})

Warn = Callable[[str], None]


class RunDirError(Exception):
    """The directory is not a run directory (or cannot be read); the text is for the user."""


# ---- where ------------------------------------------------------------------------------


def data_home() -> Path:
    xdg = os.environ.get("XDG_DATA_HOME")
    return Path(xdg) if xdg else Path.home() / ".local" / "share"


def default_run_dir(run_id: str, now: float | None = None) -> Path:
    """$XDG_DATA_HOME/tokentop/runs/YYYYmmdd-HHMMSS-<run_id> (default ~/.local/share/…)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return data_home() / "tokentop" / "runs" / f"{stamp}-{run_id}"


def part_path(run_dir: Path, stream: str, index: int) -> Path:
    suffix = STREAMS[stream]
    return run_dir / (f"{stream}{suffix}" if index == 0 else f"{stream}.{index:06d}{suffix}")


def parts(run_dir: Path, stream: str) -> list[Path]:
    """Every part of one stream, in write order."""
    suffix = STREAMS[stream]
    pat = re.compile(rf"^{stream}(?:\.(\d{{6}}))?{re.escape(suffix)}$")
    found = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(run_dir):
            m = pat.match(entry.name)
            if m:
                found.append((int(m.group(1) or 0), Path(entry.path)))
    return [p for _, p in sorted(found)]


# ---- the manifest -----------------------------------------------------------------------


def scrub(value, secrets: Iterable[str] = ()):
    """A copy fit to write: secret fields removed, every known secret value cut out of every
    string, and URLs without their userinfo (defence in depth: none should be there)."""
    if isinstance(value, dict):
        return {k: "[removed]" if str(k).lower() in SECRET_FIELDS else scrub(v, secrets)
                for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, str):
        for secret in secrets:
            if secret:
                value = value.replace(secret, "[removed]")
        return public_url(value) if "://" in value and "@" in value else value
    return value


def write_json_atomic(path: Path, data: dict) -> None:
    """Write, fsync, rename over, fsync the directory: a reader sees the old or the new file."""
    raw = json.dumps(data, indent=2, default=str).encode() + b"\n"
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _create_temp(path: Path) -> tuple[int, str]:
    """A new temporary file beside `path` with FILE_MODE less the umask (tempfile.mkstemp
    would make it 0600, and the rename would keep that: one file unlike the others)."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                           FILE_MODE), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def read_manifest(run_dir: Path) -> dict:
    path = Path(run_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        if parts(Path(run_dir), "snapshots"):
            return {}  # the manifest never made it; the snapshots still tell the story
        if not Path(run_dir).is_dir():
            raise RunDirError(f"{run_dir} is not a directory") from None
        raise RunDirError(f"{run_dir} is not a tokentop run directory "
                          "(no manifest.json, no snapshots.jsonl)") from None
    except (OSError, ValueError) as e:
        raise RunDirError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


# ---- is anyone writing it? --------------------------------------------------------------


def writer_alive(run_dir: Path | str) -> bool:
    """Whether a live process holds the run's writer lock (the Recorder holds it, exclusive,
    from create/resume to close). The kernel drops a flock when its holder dies, kill -9
    and OOM kills included, so this is a fact where a heartbeat's age would be a guess."""
    try:
        fd = os.open(Path(run_dir) / WRITER_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: recorded before writer.lock existed, or never started
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released by the close below
    except BlockingIOError:
        return True
    except OSError:
        return False  # a file system without flock: no writer can hold it either
    finally:
        os.close(fd)
    return False


def run_state(run_dir: Path | str) -> str:
    """RUNNING (a live writer), INTERRUPTED (the manifest says running, but its writer is
    gone: killed, crashed, or the machine went down), else the status the writer left
    (FINISHED, RECORDING_STOPPED). Raises RunDirError when it is no run directory."""
    alive = writer_alive(run_dir)  # first: a writer leaves its last status, then the lock
    status = read_manifest(Path(run_dir)).get("status") or RUNNING  # {}: manifest never made
    if status != RUNNING:
        return status
    return RUNNING if alive else INTERRUPTED


def still_written(run_dir: Path | str) -> bool:
    """Whether more Snapshots may still come (what a follower waits for)."""
    try:
        return run_state(run_dir) == RUNNING
    except RunDirError:
        return False


# ---- reading ----------------------------------------------------------------------------


class _VersionOnly(msgspec.Struct):
    v: int = SNAPSHOT_VERSION


_version_only = msgspec.json.Decoder(_VersionOnly)


def decode_line(line: bytes) -> Snapshot:
    """One Snapshot line, its strings plain (a recording is outside text: another tokentop's,
    an older one's, an edited one); SnapshotVersionError for a format we do not know, else
    DecodeError."""
    try:
        snap = from_json(line)
    except msgspec.DecodeError:
        with contextlib.suppress(msgspec.DecodeError):
            v = _version_only.decode(line).v
            if v != SNAPSHOT_VERSION:
                raise SnapshotVersionError(
                    f"snapshot format version {v} is not supported "
                    f"(this tokentop reads {SNAPSHOT_VERSION})"
                ) from None
        raise
    # JSON holds no raw C0 byte: any other control or format character in a string is an
    # escape (\u001b, \n), DEL, or not ASCII; a line with none has nothing to clean (most
    # lines: it saves the walk, twice the decode's time, on a 72-hour replay)
    if b"\\" in line or b"\x7f" in line or not line.isascii():
        plain_all(snap)
    return snap


def _stderr_warn(message: str) -> None:
    import sys

    print(f"tokentop: warning: {message}", file=sys.stderr)


class RunReader:
    """Reads a stream (snapshots by default) of a run directory, part after part.

    `poll()` returns the complete lines written since the last call (decoded), and
    keeps a partial last line back until its end arrives. `finish()` says whether a
    partial line is left over: at the end of a crashed run that is the torn line.
    """

    def __init__(self, run_dir: Path | str, *, warn: Warn | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.warn = warn or _stderr_warn
        self.warnings: list[str] = []
        self._index = 0  # position in parts()
        self._path: Path | None = None
        self._file = None
        self._pending = b""
        self._line_no = 0

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        self.warn(message)

    def _open_next(self) -> bool:
        names = parts(self.run_dir, "snapshots")
        if self._index >= len(names):
            return False
        if self._file is not None:
            self._file.close()
        self._path = names[self._index]
        self._file = open(self._path, "rb")  # noqa: SIM115 - kept open across polls
        self._pending = b""
        self._line_no = 0
        return True

    def poll(self) -> list[Snapshot]:
        out: list[Snapshot] = []
        while True:
            if self._file is None and not self._open_next():
                return out
            for line in self._file:
                if not line.endswith(b"\n"):
                    self._pending += line
                    break
                line, self._pending = self._pending + line, b""
                self._line_no += 1
                snap = self._decode(line)
                if snap is not None:
                    out.append(snap)
            # at the end of this part: is there a next one? (rotation)
            if len(parts(self.run_dir, "snapshots")) > self._index + 1:
                # read whatever was appended before the rotation, then move on
                rest = self._file.read()
                for line in (self._pending + rest).splitlines(keepends=True):
                    if line.endswith(b"\n"):
                        self._line_no += 1
                        snap = self._decode(line)
                        if snap is not None:
                            out.append(snap)
                    elif line.strip():
                        self._warn(f"{self._path}: incomplete line {self._line_no + 1} "
                                   "skipped (the writer stopped in the middle of it)")
                self._pending = b""
                self._index += 1
                self._file.close()
                self._file = None
                continue
            return out

    def _decode(self, line: bytes) -> Snapshot | None:
        if not line.strip():
            return None
        try:
            return decode_line(line)
        except msgspec.DecodeError as e:
            self._warn(f"{self._path}: line {self._line_no} is not a valid snapshot, "
                       f"skipped ({e})")
            return None

    def finish(self) -> None:
        """No more data will come: a partial last line is a torn line; warn about it."""
        if self._pending.strip():
            self._warn(f"{self._path}: the last line is incomplete (the run was interrupted "
                       f"while writing it): skipped, {len(self._pending)} bytes")
        self._pending = b""

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def iter_snapshots(run_dir: Path | str, *, warn: Warn | None = None) -> Iterator[Snapshot]:
    """Every Snapshot of a run directory as it is now, in order, in bounded memory."""
    with RunReader(run_dir, warn=warn) as reader:
        while batch := reader.poll():
            yield from batch
        reader.finish()


async def follow_snapshots(
    run_dir: Path | str, *, warn: Warn | None = None, poll_s: float = 0.25,
    stop_when_finished: bool = True,
) -> AsyncIterator[Snapshot]:
    """tail -f: every Snapshot so far, then new ones as they are written, until no live
    writer is left (finished, recording stopped, or killed), or forever with
    stop_when_finished=False."""
    import asyncio

    with RunReader(run_dir, warn=warn) as reader:
        while True:
            batch = reader.poll()
            for snap in batch:
                yield snap
            if batch:
                continue
            if stop_when_finished and not still_written(run_dir):
                for snap in reader.poll():  # what came between the last poll and the end
                    yield snap
                reader.finish()
                return
            await asyncio.sleep(poll_s)


def read_events(run_dir: Path | str, *, warn: Warn | None = None) -> Iterator[dict]:
    """Lines of events.jsonl (all parts); torn or corrupt lines skipped with a warning."""
    warn = warn or _stderr_warn
    for path in parts(Path(run_dir), "events"):
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except ValueError:
                    warn(f"{path}: line {n} is not a valid event, skipped")


def last_snapshot(run_dir: Path | str, *, warn: Warn | None = None) -> Snapshot | None:
    """The last good Snapshot, read from the end of the last part (cheap on big files)."""
    for path in reversed(parts(Path(run_dir), "snapshots")):
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            chunk = 1 << 16
            while True:
                start = max(0, size - chunk)
                f.seek(start)
                data = f.read(size - start)
                lines = data.split(b"\n")
                # the first piece may be a partial line unless we read from the start
                candidates = lines if start == 0 else lines[1:]
                torn = not data.endswith(b"\n") and data.strip()
                for i in range(len(candidates) - 1, -1, -1):
                    line = candidates[i]
                    if not line.strip():
                        continue
                    if torn and i == len(candidates) - 1:
                        if warn:
                            warn(f"{path}: the last line is incomplete: skipped")
                        continue
                    try:
                        return decode_line(line + b"\n")
                    except msgspec.DecodeError:
                        continue
                if start == 0:
                    break
                chunk *= 4
    return None


def first_snapshot(run_dir: Path | str) -> Snapshot | None:
    for snap in iter_snapshots(run_dir, warn=lambda _m: None):
        return snap
    return None
