"""The embedded simulator: an OpenAI-compatible server that models an LLM engine.

Continuous batching over a slot limit, a KV-cache token budget with preemption,
prefill cost per prompt token, decode step time that grows with the batch,
vLLM-style /metrics and a simulated GPU at /sim/gpu. `tokentop` with no target
starts one (`python -m loadgen.sim --port 0 --announce --exit-with-parent`);
tests start one in-process with `await start_sim(SimConfig(...))`.
"""

from loadgen.sim.model import SimConfig
from loadgen.sim.server import (
    RunningSim,
    add_sim_arguments,
    config_from_args,
    run_sim_forever,
    start_sim,
)

__all__ = [
    "RunningSim",
    "SimConfig",
    "add_sim_arguments",
    "config_from_args",
    "run_sim_forever",
    "start_sim",
]
