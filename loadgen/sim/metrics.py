"""The simulator's Prometheus /metrics, under vLLM's names.

Rendered by hand rather than through prometheus_client: the engine observes
one latency per token per sequence, and prometheus_client's Histogram takes a
lock and scans its buckets linearly on every observation. Here an observation
is a bisect and two additions, and a run of equal values (every sequence that
decoded in the same step has the same gap) is one observation with a count.
The output is the Prometheus text format, which prometheus_client's parser reads.
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

# The /metrics dialects the simulator can speak (loadgen.sim.dialects renders them).
DIALECTS = ("vllm", "sglang", "tgi", "llamacpp", "trtllm", "triton")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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
    """Counters and histograms the engine updates; gauges are passed in at render time."""

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

    def render(self, model_name: str, *, running: int, waiting: int, kv_usage: float,
               prefix: tuple[int, int] | None = None) -> str:
        """vLLM's exposition; `prefix`: the prefix cache's (queries, hits) in tokens, as
        vLLM v1's prefix_cache_* counters (None: no prefix cache)."""
        label = f'model_name="{_escape(model_name)}"'
        out: list[str] = []
        scalars = (
            ("vllm:num_requests_running", "gauge",
             "Number of requests in model execution batches.", running),
            ("vllm:num_requests_waiting", "gauge",
             "Number of requests waiting to be processed.", waiting),
            ("vllm:kv_cache_usage_perc", "gauge",
             "KV-cache usage. 1 means 100 percent usage.", kv_usage),
            ("vllm:num_preemptions_total", "counter",
             "Cumulative number of preemption from the engine.", self.preemptions),
            ("vllm:prompt_tokens_total", "counter",
             "Number of prefill tokens processed.", self.prompt_tokens),
            ("vllm:generation_tokens_total", "counter",
             "Number of generation tokens processed.", self.generation_tokens),
        )  # fmt: skip
        if prefix is not None:
            scalars += (
                ("vllm:prefix_cache_queries_total", "counter",
                 "Prefix cache queries, in terms of number of queried tokens.", prefix[0]),
                ("vllm:prefix_cache_hits_total", "counter",
                 "Prefix cache hits, in terms of number of cached tokens.", prefix[1]),
            )  # fmt: skip
        for name, kind, doc, value in scalars:
            _header(out, name, kind, doc)
            out.append(f"{name}{{{label}}} {float(value)!r}")
        name = "vllm:request_success_total"
        _header(out, name, "counter", "Count of successfully processed requests.")
        for reason, n in self.success.items():
            out.append(f'{name}{{{label},finished_reason="{reason}"}} {float(n)!r}')
        histograms = (
            ("vllm:time_to_first_token_seconds",
             "Histogram of time to first token in seconds.", self.ttft),
            ("vllm:inter_token_latency_seconds",
             "Histogram of inter-token latency in seconds.", self.itl),
            ("vllm:e2e_request_latency_seconds",
             "Histogram of e2e request latency in seconds.", self.e2e),
            ("vllm:request_queue_time_seconds",
             "Histogram of time spent in WAITING phase for request.", self.queue),
        )  # fmt: skip
        for name, doc, hist in histograms:
            _header(out, name, "histogram", doc)
            _histogram(out, name, label, hist)
        out.append("")
        return "\n".join(out)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _header(out: list[str], name: str, kind: str, doc: str) -> None:
    out.append(f"# HELP {name} {doc}")
    out.append(f"# TYPE {name} {kind}")


def _histogram(out: list[str], name: str, label: str, hist: Histogram) -> None:
    cumulative = 0
    for edge, n in zip(hist.edges, hist.counts, strict=False):
        cumulative += n
        out.append(f'{name}_bucket{{{label},le="{edge!r}"}} {float(cumulative)!r}')
    out.append(f'{name}_bucket{{{label},le="+Inf"}} {float(hist.count)!r}')
    out.append(f"{name}_count{{{label}}} {float(hist.count)!r}")
    out.append(f"{name}_sum{{{label}}} {hist.sum!r}")
