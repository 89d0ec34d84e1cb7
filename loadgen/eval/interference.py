"""Interference (the eval's `interference` phase): the baseline load with a neighbour on
the same host (busy CPU threads, memory-bandwidth copies, fsync'd writes, or
--neighbor-cmd), against the same load alone; tokentop's own client pinned apart.
"""

from __future__ import annotations

from loadgen.eval.phase_run import Eval
from loadgen.eval.results import PhaseResult, skipped


async def run(ev: Eval) -> PhaseResult:
    """The interference phase's result."""
    if not ev.phases.interference.enabled:
        return skipped("disabled in the plan")
    return skipped("not built yet")
