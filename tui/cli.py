"""The `tokentop` command: pick the subcommand's module (tui/commands/) and run it.

    tokentop [--url URL] [--model M] [-c N] …   the live console (embedded simulator without --url)
    tokentop run --headless --duration S …     the same engine without a screen
    tokentop sim --port 8000                    the simulator alone

Options alone (or none) are the console. Bad input is one line on stderr and exit
code 2, never a traceback; Ctrl-C is exit code 130. A reader that stops reading
(`tokentop report DIR | head`) ends the output, not the command: it goes on (a report
still writes its files) and exits as it would have, without a word about the pipe.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from tui.commands import COMMANDS, CONSOLE, entry


class ReaderGone:
    """sys.stdout, but a closed pipe (EPIPE) is the end of the output rather than an error:
    from then on what is written is dropped. The descriptor is pointed at /dev/null too, so
    the interpreter's last flush at exit has nowhere to fail."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._inner.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._inner.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._inner.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, buffer …
        return getattr(self._inner, name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not isinstance(sys.stdout, ReaderGone) and sys.stdout is not None:
        sys.stdout = ReaderGone(sys.stdout)  # type: ignore[assignment]
    try:
        if argv and argv[0] in COMMANDS:
            return entry(COMMANDS[argv[0]])(argv[1:])
        if argv and not argv[0].startswith("-"):
            print(f"tokentop: unknown command {argv[0]!r}; the commands are: "
                  f"{', '.join(COMMANDS)} (or options alone for the console)", file=sys.stderr)
            return 2
        return entry(CONSOLE)(argv)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
