"""Static batching (the eval's `batch` phase): N requests submitted at once, their total
tok/s and time to the last token, beside the dynamic baseline; and the latency fluctuation
under dynamic batching (ITL / TPOT P99 ÷ P50, interquartile range) at each ramp step.
"""

from __future__ import annotations

from loadgen.eval.phase_run import Eval
from loadgen.eval.results import PhaseResult, skipped


async def run(ev: Eval) -> PhaseResult:
    """The batch phase's result."""
    if not ev.phases.batch.enabled:
        return skipped("disabled in the plan")
    return skipped("not built yet")
