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
    about: str = ""  # one line for `tokentop --help`


COMMANDS: dict[str, Command] = {
    "run": Command("console", "run_main", "one run: the console, or --headless lines"),
    "sweep": Command("sweep", about="raise the load step by step; find the knee"),
    "eval": Command("eval", about="the evaluation battery of a serving framework"),
    "replay": Command("replay", about="the console, fed from a run directory"),
    "report": Command("report", about="a soak report of a run directory"),
    "compare": Command("compare", about="runs or sweeps side by side"),
    "agent": Command("agent", about="a headless run that publishes to an MQTT fleet"),
    "fleet": Command("fleet", about="the console of a fleet of agents"),
    "sim": Command("sim", about="the simulated OpenAI-compatible server alone"),
    "calibrate": Command("calibrate", about="measure tokentop's own timing error here"),
    "probe": Command("probe", about="what tokentop sees of a server, GPUs and host, once"),
}
CONSOLE = Command("console")  # no subcommand: the live console


def entry(command: Command) -> Callable[[list[str]], int]:
    """The function that runs `command` with its arguments (the subcommand name removed)."""
    module = importlib.import_module(f"{__name__}.{command.module}")
    return getattr(module, command.function)
