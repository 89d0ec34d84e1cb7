"""The embedded simulator: an OpenAI-compatible server that models an LLM engine.

Continuous batching over a slot limit, a KV-cache token budget with preemption,
prefill cost per prompt token, decode step time that grows with the batch,
vLLM-style /metrics and a simulated GPU at /sim/gpu. `tokentop sim` runs one
(flags parsed in tui/commands/sim.py); `tokentop` with no target starts one as
`python -m loadgen.sim`, its SimConfig as one JSON line on stdin (launch.py);
tests start one in-process with `await start_sim(SimConfig(...))`.

Also: `--profile` presets modelled on real deployments (presets.py), other
engines' /metrics names with `--metrics-dialect` (dialects.py), faults on
demand from `--fault-*` flags and `POST /sim/faults` (faults.py), exact-timing
mode (`--exact-ttft-ms`/`--exact-itl-ms`, every chunk stamped with
"tokentop_sent_ns") and k tokens per chunk (`--tokens-per-chunk`).

One process, on purpose: there is no `--workers N`. The model is one
scheduler (one slot limit, one KV budget, one queue); N processes behind
SO_REUSEPORT would each need a share of it, and the kernel's per-connection
hashing would then put the knee at a different place for every run. One
process on one core streams over 100k chunks/s (tests/bench/bench_sim.py),
more than any single load generator here can read.

Modules: program.py (start, announce, serve until stopped), server.py (the HTTP
handlers), exact.py (the exact-timing serving path), request.py (what a request may
say), chunks.py (the SSE bytes), words.py (the words written, the optional tokenizer),
model.py (SimConfig and the engine model), metrics.py (its counters and histograms),
dialects.py (/metrics in each engine's names), prefix_cache.py, gpu.py, faults.py,
presets.py (the profiles, and the simulator described in words), launch.py (the handover
to a child process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadgen.sim.model import SimConfig
    from loadgen.sim.program import RunningSim, serve_forever, start_sim

__all__ = ["RunningSim", "SimConfig", "serve_forever", "start_sim"]

# The names are loaded on first use (PEP 562), not here: a run against a real server imports
# loadgen.sim.model (SimConfig) and presets, and importing the package must not bring the
# server (aiohttp.web and the handlers) with it.
_HOMES = {"SimConfig": "loadgen.sim.model", "RunningSim": "loadgen.sim.program",
          "serve_forever": "loadgen.sim.program", "start_sim": "loadgen.sim.program"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
