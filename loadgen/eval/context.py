"""Strong scaling and context length (the eval's `context` phase): an input-length and an
output-length ladder at a fixed concurrency; TTFT and prefill tok/s against input length,
ITL against context, the longest prompt served.
"""

from __future__ import annotations

from loadgen.eval.phase_run import Eval
from loadgen.eval.results import PhaseResult, skipped


async def run(ev: Eval) -> PhaseResult:
    """The context phase's result."""
    if not ev.phases.context.enabled:
        return skipped("disabled in the plan")
    return skipped("not built yet")
