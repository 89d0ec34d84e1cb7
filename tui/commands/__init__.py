"""The command line: one module per subcommand, and the only place that parses flags.

Each module reads its arguments into typed values (RunConfig, SweepPlan,
BrokerSettings, SimConfig, …) and calls one plain function of loadgen/, probes/
or tui/ with them; nothing below this package sees argparse. `tui.cli.main`
only picks the module.

COMMANDS maps a subcommand to (module, function): modules are imported only when
their command runs, so `tokentop --help` does not load the simulator or textual.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple


class Command(NamedTuple):
    module: str  # under tui.commands
    function: str = "main"  # main(argv: list[str]) -> int


COMMANDS: dict[str, Command] = {
    "run": Command("console", "run_main"),
    "sweep": Command("sweep"),
    "eval": Command("eval"),
    "replay": Command("replay"),
    "report": Command("report"),
    "compare": Command("compare"),
    "agent": Command("agent"),
    "fleet": Command("fleet"),
    "sim": Command("sim"),
    "calibrate": Command("calibrate"),
    "probe": Command("probe"),
}
CONSOLE = Command("console")  # no subcommand: the live console


def entry(command: Command) -> Callable[[list[str]], int]:
    """The function that runs `command` with its arguments (the subcommand name removed)."""
    module = importlib.import_module(f"{__name__}.{command.module}")
    return getattr(module, command.function)
