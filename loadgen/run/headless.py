"""A run without a screen (`tokentop run --headless`, `tokentop agent`): a Session that
says a progress line a second on stderr and stops in order on Ctrl-C / SIGTERM.

An agent is the same run with `cfg.publish` set (loadgen.run.sinks.Publish); exit
codes are the session's (loadgen.run.summary), the reason always one line on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from loadgen.run.config import RunConfig
from loadgen.run.secrets import Secrets
from loadgen.run.session import Session, stop_on_signals
from loadgen.run.sinks import ProgressLines


async def run_headless(cfg: RunConfig, secrets: Secrets | None = None, *,
                       json_path: Path | None = None, record: bool = True,
                       out: TextIO | None = None) -> int:
    stream = out or sys.stderr

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    session = Session(cfg, secrets, sinks=[ProgressLines(say)], record=record,
                      json_path=json_path, say=say)
    stop_on_signals(session, say)
    return await session.run()
