"""The `tokentop` command: pick the subcommand's module (tui/commands/) and run it.

    tokentop [--url URL] [--model M] [-c N] …   the live console (embedded simulator without --url)
    tokentop run --headless --duration S …     the same engine without a screen
    tokentop sim --port 8000                    the simulator alone

Options alone (or none) are the console. Bad input is one line on stderr and exit
code 2, never a traceback; Ctrl-C is exit code 130.
"""

from __future__ import annotations

import sys

from tui.commands import COMMANDS, CONSOLE, entry


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
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
