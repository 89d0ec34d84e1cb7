"""The one run loop: from a RunConfig to an exit code, for every front end.

The console's run process, `tokentop run --headless`, `tokentop agent`, each
sweep and each calibration go through a Session, so resume, recording and its
stop policy, the derived events (loadgen.run.watch), publishing, the summary and
the exit code are wired once and agree everywhere:

    session = Session(cfg, secrets, sinks=[ProgressLines(say)], say=say)
    code = await session.run()                 # start, every tick, finish

`say` takes a Notice (loadgen.model.notice): what the run says, typed by kind, so each
front end prints, indents, thins or forwards it without reading its wording.

or, to steer the run while it goes (sweep, calibrate):

    await session.start()
    async for snap in session.snapshots():
        await session.control(Control(op="set_concurrency", value=8))
    outcome = await session.finish()

Per tick, in this order: the coordinator builds the Snapshot; the windows take
it (warm-up excluded there); the watch adds SLO, GPU and efficiency facts; the
recorder writes it (a failure adds its event and, under --on-disk-full=stop,
stops the load and makes the exit code 4); then every sink sees it.

Before the load, a --url that does not answer yet may be waited for (`wait`: the front
end says how long), and a stop asked meanwhile ends the wait.

Sinks see a RunHandle (loadgen.run.sinks), not the Session: the run's id, its control,
its load now and the MQTT link's state. With --prometheus-port the Session serves its
figures too (loadgen.run.prometheus): bound before the run directory and the load, so a
port in use refuses the run in one line (exit code 2) and nothing has started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from loadgen.fleet.remote import LoadNow
from loadgen.model.kinds import EventKind, Level
from loadgen.model.notice import OPERATOR_STOP, TERMINAL_GONE, Notice, Say
from loadgen.model.outage import OutageTally
from loadgen.model.slo import Slos
from loadgen.model.snapshot import Control, Snapshot, SnapshotVersionError
from loadgen.model.source import RunOutcome
from loadgen.model.windows import SnapshotWindows
from loadgen.record.recorder import Recording, RecordingError, WriterLock, claim
from loadgen.record.rundir import iter_snapshots, scrub
from loadgen.run.config import ConfigError, RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.run.preflight import TargetError, check_url, wait_for_target
from loadgen.run.resume import resumed
from loadgen.run.secrets import Secrets
from loadgen.run.sinks import Publish, RunHandle, Sink, SinkError
from loadgen.run.summary import (
    EXIT_UNUSABLE,
    build_summary,
    exit_status,
    final_line,
    thresholds,
    write_json,
)
from loadgen.run.watch import Watch

if TYPE_CHECKING:
    from loadgen.run.prometheus import PrometheusEndpoint

log = logging.getLogger("tokentop.session")


HANGUP_GRACE_S = 2.0  # the drain nobody watches: a terminal gone, a console gone


def asked_stop(msg: Control) -> tuple[str, float | None]:
    """A stop the console asked for: its reason and its drain (None: --drain-grace). Its
    terminal gone, the console says so in the note (tui.app's hang-up), else it is the
    operator's."""
    if msg.note == TERMINAL_GONE:
        return TERMINAL_GONE, HANGUP_GRACE_S
    return OPERATOR_STOP, None


class SessionError(Exception):
    """The run cannot start; str(e) is the message for the user (exit code 2)."""


@dataclass
class Outcome:
    code: int
    reason: str
    summary: dict = field(default_factory=dict)

    def said(self) -> RunOutcome:
        """The end in words, as it travels (the console's pipe) and is shown."""
        return RunOutcome(code=self.code, reason=self.reason, line=final_line(self.summary),
                          run_dir=self.summary.get("run_dir"))


def _log_say(notice: Notice) -> None:
    log.info("%s: %s", notice.kind, notice.text)


class Session:
    """One run. `start()`, iterate `snapshots()` to the end, `finish()`; or just `run()`."""

    def __init__(self, cfg: RunConfig, secrets: Secrets | None = None, *,
                 sinks: Sequence[Sink] = (), record: bool = True,
                 json_path: Path | None = None, say: Say | None = None,
                 wait: float | None = 0.0) -> None:
        self.cfg = cfg
        # how long to wait for a --url that does not answer yet: 0 (the default) not at all,
        # None for ever; each front end says (headless: loadgen.run.headless.HEADLESS_WAIT_S)
        self.wait = wait
        self.secrets = secrets or Secrets()
        self.sinks: list[Sink] = list(sinks)
        self.record = record
        self.json_path = json_path
        self.say = say or _log_say
        self.windows = SnapshotWindows()
        self.outages = OutageTally()  # the summary's outages, by the one definition
        self.coord: Coordinator | None = None
        self.recording: Recording | None = None
        self.watch: Watch | None = None
        self.publish: Publish | None = None  # cfg.publish: the MQTT sink
        self.prometheus: PrometheusEndpoint | None = None  # cfg.prometheus_port
        self._recording_failed: str | None = None
        self._started_sinks: list[Sink] = []
        self._finished: Outcome | None = None
        self._stop_asked = asyncio.Event()  # also ends the wait for the target
        self._notes: list[tuple[EventKind, str, Level, float, dict]] = []  # note()s before start

    @property
    def run_id(self) -> str:
        assert self.coord is not None
        return self.coord.run_id

    @property
    def slos(self) -> Slos:
        assert self.coord is not None
        return self.coord.parsed.slos

    @property
    def workers(self) -> int:
        """How many load worker processes the run has."""
        assert self.coord is not None
        return self.coord.pool.n

    # ---- start ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume or create the run directory, reach the target, start the load and the
        sinks. Raises SessionError (in words) and leaves nothing running when it does."""
        try:
            self._prepare()
        except (ConfigError, RecordingError, SnapshotVersionError, SinkError) as e:
            self._release_endpoint()
            raise SessionError(str(e)) from None
        assert self.coord is not None and self.recording is not None
        try:
            await self._wait_for_target()
            await self.coord.start()
        except (TargetError, ConfigError) as e:
            self._release_endpoint()
            self.recording.discard({"error": str(e)})
            raise SessionError(str(e)) from None
        except BaseException:
            self._release_endpoint()
            raise
        if self.recording.run_dir is not None:
            verb = "resuming" if self.cfg.resume else "recording to"
            self.say(Notice("recording", f"{verb} {self.recording.run_dir}"))
        self.watch = Watch(self.coord.parsed.slos)
        try:
            await self._start_sinks()
        except SinkError as e:
            await self.coord.close()
            self.recording.discard({"error": str(e)})
            await self._close_sinks()
            self._release_endpoint()
            raise SessionError(str(e)) from None

    async def _wait_for_target(self) -> None:
        """A --url that does not answer yet (a server still starting) is waited for, probed
        every few seconds, until it answers, the wait is over, or a stop is asked."""
        if self.cfg.url is None or self.wait == 0:
            return  # the embedded simulator (the coordinator starts it), or no wait asked
        waiting = asyncio.create_task(wait_for_target(
            check_url(self.cfg.url), self.secrets.authorization(), self.say, self.wait,
            headers=self.secrets.other_headers()))
        stop = asyncio.create_task(self._stop_asked.wait())
        try:
            await asyncio.wait({waiting, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
        if not waiting.cancelled():
            waiting.result()  # raises TargetError when the wait is over
        elif self._stop_asked.is_set():
            raise TargetError(f"stopped while waiting for {self.cfg.url}")

    def _prepare(self) -> None:
        # a resumed run's writer.lock first: a second writer is refused before it reads
        lock = claim(self.cfg.resume) if self.cfg.resume and self.record else None
        try:
            self._prepare_under(lock)
        except BaseException:
            if lock is not None:
                lock.release()  # twice is harmless: Recording.open lets go of it on failure
            raise

    def _prepare_under(self, lock: WriterLock | None) -> None:
        resume = None
        if self.cfg.resume:
            self.cfg, resume = resumed(self.cfg)
            # the summary covers the whole run: what was recorded before the gap first
            def warn(message: str) -> None:
                self.say(Notice("warning", f"warning: {message}"))

            for old in iter_snapshots(self.cfg.resume, warn=warn):
                self.windows.add(old)
                self.outages.add(old)
        cfg = self.cfg
        if cfg.publish is not None:  # its settings are checked before anything is created
            self.publish = Publish(cfg.publish, self.secrets.mqtt_password, self.say)
            self.sinks.insert(0, self.publish)
        self.coord = Coordinator(cfg, self.secrets, resume=resume)
        if cfg.prometheus_port is not None:
            # bound here, before the run directory and the load: a port in use is refused
            # in words and nothing has started. Imported here: the endpoint's aiohttp.web
            # server is start-up CPU that a run without --prometheus-port does not pay
            from loadgen.run.prometheus import PrometheusEndpoint

            self.prometheus = PrometheusEndpoint(
                cfg.prometheus_host, cfg.prometheus_port, say=self.say,
                goodput=self.coord.parsed.slos.per_request is not None)
            self.sinks.append(self.prometheus)
        for kind, message, level, t, payload in self._notes:  # noted before the start
            self.coord.note(kind, message, level, t=t, **payload)
        self._notes = []
        self.recording = Recording.open(
            config=self._fit_to_write(msgspec.to_builtins(cfg)), run_id=self.coord.run_id,
            out=cfg.out, resume=cfg.resume, on_disk_full=cfg.on_disk_full,
            record=self.record, lock=lock)

    async def _start_sinks(self) -> None:
        handle = RunHandle(run_id=self.run_id, control=self.control, load_now=self.load_now,
                           mqtt_status=self.publish.status_text if self.publish else None)
        for sink in self.sinks:
            await sink.start(handle)
            self._started_sinks.append(sink)

    # ---- the loop ------------------------------------------------------------------------

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        """Every tick's Snapshot, after the windows, the watch, the recorder and the sinks
        took it; ends when the run has stopped and drained."""
        assert self.coord is not None and self.recording is not None and self.watch
        async for snap in self.coord.snapshots():
            self.windows.add(snap)
            self.outages.add(snap)
            self.watch.observe(snap, self.windows)
            self.recording.take(snap)
            if self.recording.stop_load and self._recording_failed is None:
                self._recording_failed = self.recording.error or "recording failed"
                self.coord.request_stop("recording failed")
            for sink in self._started_sinks:
                sink.take(snap, self.windows)
            yield snap

    async def control(self, msg: Control) -> None:
        if self.coord is not None:
            await self.coord.control(msg)

    def note(self, kind: EventKind, message: str, level: Level = "info", *,
             t: float | None = None, **payload) -> None:
        """Add an event to the run from code beside it (the eval's fault proxy): it goes
        with the next tick's Snapshot, so it is recorded (events.jsonl), published and
        shown like the run's own. Noted before start() it waits for the first tick.
        `t`: when it happened (default now); `payload`: Event's typed fields."""
        t = time.time() if t is None else t
        if self.coord is None:
            self._notes.append((kind, message, level, t, payload))
            return
        self.coord.note(kind, message, level, t=t, **payload)

    def request_stop(self, reason: str | None = None, *, grace: float | None = None) -> None:
        """Stop in order: in-flight requests get --drain-grace to finish, or `grace` s when
        given (the user's setting stays as recorded: this stop's is its own)."""
        self._stop_asked.set()
        if self.coord is not None:
            self.coord.request_stop(reason, grace=grace)

    def abort(self, reason: str) -> None:
        """Stop now: requests in flight are cancelled instead of drained (and counted as
        cancelled); the summary and the recording are still written by finish()."""
        self.request_stop(reason, grace=0.0)
        if self.coord is not None:
            self.coord.cut_drain_short()

    def load_now(self) -> LoadNow:
        """The load as it is set now (for remote control's limits)."""
        assert self.coord is not None
        spec = self.coord.spec
        return LoadNow(mode=spec.mode, concurrency=spec.concurrency, rate=spec.rate,
                       state=self.coord.state)

    # ---- finish --------------------------------------------------------------------------

    async def finish(self) -> Outcome:
        """Stop what still runs, then the summary, the exit code, the recording's close, the
        --json file and the sinks. Safe to call more than once."""
        if self._finished is not None:
            return self._finished
        assert self.coord is not None and self.recording is not None
        await self.coord.close()
        summary = build_summary(self.cfg, self.windows)
        summary["run_dir"] = str(self.recording.run_dir) if self.recording.run_dir else None
        summary["recording_error"] = self.recording.error
        summary["stability"] = self.outages.summary()
        summary["thresholds"] = thresholds(self.cfg, self.windows, summary["stability"])
        for sink in self._started_sinks:
            sink.finish(summary)
        summary = self._fit_to_write(summary)
        code, reason = exit_status(summary, self._recording_failed)
        summary["exit"] = {"code": code, "reason": reason}
        close_error = self.recording.close(summary)
        if close_error:
            self.say(Notice("warning", close_error))
        if self.json_path is not None:
            try:
                write_json(self.json_path, summary)
            except OSError as e:
                self.say(Notice("warning", f"cannot write {self.json_path}: {e.strerror or e}"))
                code = code or 1
        await self._close_sinks()
        self._finished = Outcome(code, reason, summary)
        return self._finished

    def _fit_to_write(self, data: dict) -> dict:
        """`data` with every secret of this run cut out: what goes on disk or to a user."""
        return scrub(data, self.secrets.values())

    def _release_endpoint(self) -> None:
        """The Prometheus endpoint's socket, when the run does not start (closing a started
        one is _close_sinks')."""
        if self.prometheus is not None:
            self.prometheus.release()

    async def _close_sinks(self) -> None:
        for sink in self._started_sinks:
            try:
                await sink.close()
            except Exception:  # one sink's trouble must not keep the others open
                log.exception("closing a sink failed")
        self._started_sinks = []

    async def run(self) -> int:
        """start → every tick → finish; the reason is said last. Returns the exit code."""
        try:
            await self.start()
        except SessionError as e:
            self.say(Notice("outcome", str(e)))
            return EXIT_UNUSABLE
        try:
            async for _ in self.snapshots():
                pass
        finally:
            outcome = await self.finish()
        self.say(Notice("outcome", outcome.said().line))
        return outcome.code


def stop_on_signals(session: Session, say: Say) -> None:
    """The first Ctrl-C / SIGTERM stops the load in order (in-flight requests drain for
    --drain-grace); a second one cuts the drain short: what is in flight is cancelled and
    the run ends at once, its summary and recording still written. SIGHUP (the terminal
    went away) stops it with a short drain, nobody watching: the run is still recorded
    and summed up, not killed where it stood."""
    loop = asyncio.get_running_loop()
    signals = 0

    def stop() -> None:
        nonlocal signals
        signals += 1
        if signals == 1 and (session.coord is None or session.coord.state == "starting"):
            say(Notice("stopping", "stopping before the run has started"))
            session.request_stop("stopped by a signal")
        elif signals == 1:
            say(Notice("stopping", f"stopping, letting in-flight requests finish (up to "
                       f"{session.cfg.drain_grace:g} s); Ctrl-C again to stop now"))
            session.request_stop("stopped by a signal")
        elif signals == 2:
            say(Notice("stopping", "stopping now, cancelling the requests in flight"))
            session.abort("stopped by a second signal")

    def hang_up() -> None:
        session.request_stop(TERMINAL_GONE, grace=HANGUP_GRACE_S)  # first: say may fail

    for sig, handler in ((signal.SIGINT, stop), (signal.SIGTERM, stop),
                         (signal.SIGHUP, hang_up)):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)
