"""The eval's phases, named once: their order, what each measures and whether it loads the
server. The battery runs them in this order, the plan has a table for each, eval.json keeps
a result for each and the matrix has a section for each; each of those is built from this
list or checked against it by a test (tests/eval/test_results.py, tests/eval/test_plan.py).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

Phase = Literal["conformance", "baseline", "ramp", "batch", "context", "interference", "priority",
                "long_tail", "faults", "leaks", "memory", "efficiency", "scaling"]
PHASES: tuple[Phase, ...] = get_args(Phase)


class About(NamedTuple):
    what: str  # what the phase measures, in a line
    loads: bool  # it puts load on the server (the others compute from what those recorded)


ABOUT: dict[Phase, About] = {
    "conformance": About("what the target supports of the OpenAI API, each check yes, no or "
                         "partial with its evidence (a few short requests)", loads=False),
    "baseline": About("a fixed load: req/s, tok/s, TTFT / ITL / E2E P50–P99.9, errors, SLO "
                      "verdicts", loads=True),
    "ramp": About("a sweep (loadgen.analysis.sweep): the knee and the max goodput", loads=True),
    "batch": About("static batching: N requests submitted at once (total tok/s, time to the "
                   "last token) beside the dynamic baseline, and the latency fluctuation "
                   "(ITL / TPOT P99 ÷ P50, interquartile range) at each ramp step", loads=True),
    "context": About("strong scaling: an input-length and an output-length ladder at a fixed "
                     "concurrency: TTFT and prefill tok/s against input length, ITL against "
                     "context, the longest prompt served", loads=True),
    "interference": About("the baseline load with a neighbour on the host (CPU, memory "
                          "bandwidth, disk I/O, --neighbor-cmd): TTFT / ITL / tok/s against "
                          "the same load alone", loads=True),
    "priority": About("priority classes (--mix): the plan's classes at a load past the knee, "
                      "each class's TTFT / ITL / goodput / SLO verdict, with its priority "
                      "sent and without", loads=True),
    "long_tail": About("a soak at a fraction of the knee: the intervals whose tail breaks out, "
                       "drift", loads=True),
    "faults": About("the baseline load through a fault-injecting proxy (loadgen.eval.proxy) on "
                    "the plan's schedule: success rate, errors and recovery under each fault",
                    loads=True),
    "leaks": About("the long tail's server RSS and GPU memory slopes (MB/h), judged past "
                   "min_soak", loads=False),
    "memory": About("GPU memory per billion parameters, the KV cache's capacity in tokens and "
                    "its bytes per token, where the server states them", loads=False),
    "efficiency": About("output tokens per joule and requests/s per watt, at the baseline and "
                        "the knee", loads=False),
    "scaling": About("the load on 1, 2 … N targets at once: throughput against N × one",
                     loads=True),
}
LOADED: tuple[Phase, ...] = tuple(p for p in PHASES if ABOUT[p].loads)
