"""`python -m loadgen.sim`: the simulator as tokentop's child, told what to be on stdin.

Not a command for people (that is `tokentop sim`, whose flags tui/commands/sim.py
reads): the parent writes one SimLaunch JSON line on stdin (loadgen/sim/launch.py),
this process announces `TOKENTOP_SIM_LISTENING <port>` on stdout once it listens,
and exits when stdin reaches EOF, so it never outlives its parent. A launch line
that cannot be used is one line on stderr and exit code 2.
"""

from __future__ import annotations

import logging
import sys

from loadgen.sim.launch import LaunchError, read_launch
from loadgen.sim.program import serve_forever


def main() -> int:
    try:
        launch = read_launch()
    except LaunchError as e:
        print(f"tokentop sim: {e}", file=sys.stderr)
        return 2
    # stdout is reserved for the announce line; everything else goes to stderr.
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    return serve_forever(launch.config, host=launch.host, port=launch.port, announce=True,
                         exit_with_parent=True)


if __name__ == "__main__":
    sys.exit(main())
