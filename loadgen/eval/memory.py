"""Memory efficiency (the eval's `memory` phase): GPU memory per billion parameters, the KV
cache's capacity in tokens and its bytes per token, from what the server states and the
baseline's GPU samples; where the server does not say, the row says why.
"""

from __future__ import annotations

from loadgen.eval.phase_run import Eval
from loadgen.eval.results import PhaseResult, skipped


async def run(ev: Eval) -> PhaseResult:
    """The memory phase's result."""
    if not ev.phases.memory.enabled:
        return skipped("disabled in the plan")
    return skipped("not built yet")
