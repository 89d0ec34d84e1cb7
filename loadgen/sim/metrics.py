"""The engine's counters and Prometheus-style histograms, as it updates them.

Kept by hand rather than through prometheus_client: the engine observes
one latency per token per sequence, and prometheus_client's Histogram takes a
lock and scans its buckets linearly on every observation. Here an observation
is a bisect and two additions, and a run of equal values (every sequence that
decoded in the same step has the same gap) is one observation with a count.
How they read at /metrics, in each engine's names, is loadgen.sim.dialects'.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Bucket edges as vLLM declares them (vllm/v1/metrics/loggers.py), so that
# dashboards and quantile estimates built for vLLM read the simulator alike.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# Token counts per request (TGI's request_input_length / request_generated_tokens).
TOKEN_BUCKETS = tuple(float(2**i) for i in range(0, 18))

FINISH_REASONS = ("stop", "length")


class Histogram:
    """A cumulative Prometheus histogram with fixed upper bounds (le)."""

    __slots__ = ("count", "counts", "edges", "sum")

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges = tuple(edges)
        self.counts = [0] * (len(self.edges) + 1)  # last slot: above every edge (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        # bisect_left puts a value equal to an edge in that edge's bucket (le is inclusive)
        self.counts[bisect_left(self.edges, value)] += n
        self.sum += value * n
        self.count += n


class EngineMetrics:
    """Counters and histograms the engine updates; its gauges (running, waiting, KV) are
    read from the engine itself when /metrics is rendered."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.arrived = 0  # requests accepted into the engine
        self.busy_slot_steps = 0  # sum over steps of the sequences running in it
        self.prefill_seconds = 0.0  # the prefill share of step time
        self.input_length = Histogram(TOKEN_BUCKETS)  # per finished request
        self.generated_per_request = Histogram(TOKEN_BUCKETS)  # per finished request
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS)

    def finished(self, reason: str, prompt_tokens: int, generated: int) -> None:
        self.success[reason] += 1
        self.input_length.observe(prompt_tokens)
        self.generated_per_request.observe(generated)
