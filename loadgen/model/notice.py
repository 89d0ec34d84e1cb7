"""What a run says to the person who started it, typed: a `Notice` is a kind and its text.

A Session, its sinks and the waits before it say things (where it records, that the
target does not answer yet, a progress line a second, the events as they happen). Each
front end decides what to do with them by kind — the headless run prints them, the
eval indents and thins them, the console's run process forwards them to the console —
so rewording a message breaks nothing downstream: nothing branches on the wording.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import msgspec

NoticeKind = Literal[
    "waiting",  # the target does not answer yet: the run waits for it (said once)
    "up",  # the target answers after a wait: the run starts
    "recording",  # where the run records (or resumes)
    "progress",  # the progress line (ProgressLines, once a period)
    "event",  # a run event as it happens (a warning, an error, a recovery)
    "stopping",  # a signal asked the run to stop
    "outcome",  # the run's last line: its exit reason and P50/P99
    "publish",  # the MQTT link
    "serving",  # the Prometheus endpoint: where it serves the run's figures
    "warning",  # anything else the user should know (a bad recorded line, a file unwritten)
]
NOTICE_KINDS: tuple[NoticeKind, ...] = get_args(NoticeKind)


class Notice(msgspec.Struct, frozen=True):
    kind: NoticeKind
    text: str  # one line, without the "tokentop: " a terminal front end puts before it


Say = Callable[[Notice], None]

# why a run stopped, as the run says and records it; a console asking its run to stop
# carries the reason in the stop Control's note (run.session.asked_stop)
OPERATOR_STOP = "stopped by the operator"
TERMINAL_GONE = "the terminal went away"  # SIGHUP: SSH dropped, a terminal or tmux closed

# what a front end at a terminal appends to a waiting notice: its own way to give up
KEYS_TO_STOP = {"headless": "Ctrl-C to stop", "console": "q to quit"}


def as_line(notice: Notice, keys: str = KEYS_TO_STOP["headless"]) -> str:
    """A notice as a terminal shows it: `tokentop: <text>`, progress lines as they are, a
    waiting notice with the front end's way to stop (`keys`)."""
    if notice.kind == "progress":
        return notice.text
    if notice.kind == "waiting" and keys:
        return f"tokentop: {notice.text}, {keys}"
    return f"tokentop: {notice.text}"
