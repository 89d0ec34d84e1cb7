"""A run without a screen (`tokentop run --headless`, `tokentop agent`): a Session that
says a progress line a second on stderr and stops in order on Ctrl-C / SIGTERM (a second
one stops at once: loadgen.run.session.stop_on_signals).

An agent is the same run with `cfg.publish` set (loadgen.run.sinks.Publish); exit
codes are the session's (loadgen.run.summary), the reason always one line on stderr.

A --url that does not answer at start is waited for (a server still loading its model),
but at most HEADLESS_WAIT_S: nobody watches a script, and a wrong URL must end it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from loadgen.model.notice import Notice, as_line
from loadgen.run.config import RunConfig
from loadgen.run.secrets import Secrets
from loadgen.run.session import Session, stop_on_signals
from loadgen.run.sinks import ProgressLines
from loadgen.run.summary import EXIT_UNUSABLE

HEADLESS_WAIT_S = 60.0  # how long a headless run waits for a --url that does not answer


def idle_load(cfg: RunConfig) -> str | None:
    """Why `cfg` would never send a request without someone to raise the load, or None.
    The console may start at 0 streams (`+` adds them); a fleet agent under remote
    control may too (the fleet console sets its load); a run with no one at the keys not."""
    steered = cfg.publish is not None and cfg.publish.remote_control
    if cfg.ramp or cfg.auto_ramp or cfg.trace or steered:
        return None
    if cfg.mode == "closed" and cfg.concurrency == 0:
        return "--concurrency 0 would send nothing: give -c 1 or more"
    if cfg.mode == "open" and cfg.rate == 0:
        return "--rate 0 would send nothing: give a rate above 0"
    return None


def line_say(stream: TextIO) -> Callable[[Notice], None]:
    """Each notice as one line on `stream`."""

    def say(notice: Notice) -> None:
        # a terminal gone (SIGHUP) fails each write: the run goes on to its recorded end
        with contextlib.suppress(OSError):
            print(as_line(notice), file=stream, flush=True)

    return say


async def run_headless(cfg: RunConfig, secrets: Secrets | None = None, *,
                       json_path: Path | None = None, record: bool = True,
                       out: TextIO | None = None,
                       wait: float | None = HEADLESS_WAIT_S) -> int:
    say = line_say(out or sys.stderr)
    if (idle := idle_load(cfg)) is not None:
        say(Notice("outcome", idle))
        return EXIT_UNUSABLE
    session = Session(cfg, secrets, sinks=[ProgressLines(say)], record=record,
                      json_path=json_path, say=say,
                      wait=wait if cfg.wait is None else cfg.wait)
    stop_on_signals(session, say)
    return await session.run()
