"""Which inference engine a /metrics page comes from, and where its numbers live.

Metric names change between engine releases, so the engine is recognised by
the names present, each common field lists the names it may go by (newest
first), and a field whose names are all absent stays None ("n/a"), never 0.

Names are matched on *sample* names: prometheus_client strips `_total` from a
counter's family name but not from its samples.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.samples import Sample

FIELDS = (
    "waiting",
    "running",
    "kv_cache_usage",
    "prompt_tokens_total",
    "generation_tokens_total",
    "preemptions_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "prefix_cache_hit_rate",
)


@dataclass(frozen=True)
class Pick:
    """Where one field comes from: the first of `names` that is present wins."""

    names: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)  # only samples with these label values
    # Counts add up over label sets (several models, data-parallel engines);
    # a 0..1 fraction is averaged so two half-full caches do not read "100 %".
    how: Literal["sum", "mean"] = "sum"


@dataclass(frozen=True)
class Hist:
    """A latency histogram: the first of `names` (without `_bucket`) present wins."""

    names: tuple[str, ...]
    to_ms: float = 1000.0  # bucket bounds are in seconds unless the engine says otherwise


# The common latency keys, as in ServerMetrics.latency_ms.
LATENCY_KEYS = ("ttft", "itl", "e2e", "queue")


@dataclass(frozen=True)
class Engine:
    name: str
    prefixes: tuple[str, ...]  # a sample name starting with one of these identifies the engine
    picks: dict[str, Pick]
    # latency key (LATENCY_KEYS) -> the server's own histogram of it
    histograms: dict[str, Hist] = field(default_factory=dict)


def _one(name: str, **kw: object) -> Pick:
    return Pick(names=(name,), **kw)  # type: ignore[arg-type]


def _trt(name: str, **kw: object) -> Pick:
    """trtllm-serve's name; Dynamo re-exports the same metrics as `trtllm:`."""
    return Pick(names=(f"trtllm_{name}", f"trtllm:{name}"), **kw)  # type: ignore[arg-type]


# Checked in this order: trtllm-serve's `trtllm_` must not be mistaken for Triton's
# `nv_trt_llm_` (different prefixes, so order only matters for mixed pages).
ENGINES: tuple[Engine, ...] = (
    Engine(
        "vllm",
        ("vllm:",),
        {
            "waiting": _one("vllm:num_requests_waiting"),
            "running": _one("vllm:num_requests_running"),
            "kv_cache_usage": Pick(
                ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), how="mean"
            ),
            "prompt_tokens_total": _one("vllm:prompt_tokens_total"),
            "generation_tokens_total": _one("vllm:generation_tokens_total"),
            "preemptions_total": _one("vllm:num_preemptions_total"),
            # V1's token counters (the hit rate over an interval is their differences'); V0
            # had a gauge of the block hit rate
            "prefix_cache_queries_total": _one("vllm:prefix_cache_queries_total"),
            "prefix_cache_hits_total": _one("vllm:prefix_cache_hits_total"),
            "prefix_cache_hit_rate": _one("vllm:gpu_prefix_cache_hit_rate", how="mean"),
        },
        {
            "ttft": Hist(("vllm:time_to_first_token_seconds",)),
            # renamed in vLLM V1; the old name measured the same per-token gap
            "itl": Hist(("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
            "e2e": Hist(("vllm:e2e_request_latency_seconds",)),
            "queue": Hist(("vllm:request_queue_time_seconds",)),
        },
    ),
    Engine(
        "sglang",
        ("sglang:",),
        {
            "waiting": _one("sglang:num_queue_reqs"),
            "running": _one("sglang:num_running_reqs"),
            "kv_cache_usage": _one("sglang:token_usage", how="mean"),
            "prompt_tokens_total": _one("sglang:prompt_tokens_total"),
            "generation_tokens_total": _one("sglang:generation_tokens_total"),
            "prefix_cache_hit_rate": _one("sglang:cache_hit_rate", how="mean"),
        },
        {
            "ttft": Hist(("sglang:time_to_first_token_seconds",)),
            "itl": Hist(
                ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
            ),
            "e2e": Hist(("sglang:e2e_request_latency_seconds",)),
            "queue": Hist(("sglang:queue_time_seconds",)),
        },
    ),
    Engine(
        "tgi",
        ("tgi_",),
        {
            "waiting": _one("tgi_queue_size"),
            "running": _one("tgi_batch_current_size"),
            # Histograms of tokens per request: their _sum is all tokens seen.
            "prompt_tokens_total": _one("tgi_request_input_length_sum"),
            "generation_tokens_total": _one("tgi_request_generated_tokens_sum"),
        },
        {
            # TGI has no TTFT histogram. Its per-token figure is each request's mean
            # time per token, the nearest it has to ITL.
            "itl": Hist(("tgi_request_mean_time_per_token_duration",)),
            "e2e": Hist(("tgi_request_duration",)),
            "queue": Hist(("tgi_request_queue_duration",)),
        },
    ),
    Engine(
        "triton",
        ("nv_trt_llm_",),
        {
            "waiting": _one("nv_trt_llm_request_metrics", labels={"request_type": "waiting"}),
            "running": _one("nv_trt_llm_request_metrics", labels={"request_type": "active"}),
            "kv_cache_usage": _one(
                "nv_trt_llm_kv_cache_block_metrics",
                labels={"kv_cache_block_type": "fraction"},
                how="mean",
            ),
        },
        {
            # Triton's histogram metrics (--metrics-config histogram_latencies=true), in ms.
            "ttft": Hist(("nv_inference_first_response_histogram_ms",), to_ms=1.0),
        },
    ),
    Engine(
        "trtllm",
        ("trtllm_", "trtllm:"),
        {
            "waiting": _trt("num_requests_waiting"),
            "running": _trt("num_requests_running"),
            "kv_cache_usage": _trt("kv_cache_utilization", how="mean"),
            "prompt_tokens_total": _trt("prompt_tokens_total"),
            "generation_tokens_total": _trt("generation_tokens_total"),
        },
        {
            "ttft": Hist(
                ("trtllm_time_to_first_token_seconds", "trtllm:time_to_first_token_seconds")
            ),
            "itl": Hist(
                (
                    "trtllm_inter_token_latency_seconds",
                    "trtllm:inter_token_latency_seconds",
                    "trtllm_time_per_output_token_seconds",
                    "trtllm:time_per_output_token_seconds",
                )
            ),
            "e2e": Hist(
                ("trtllm_e2e_request_latency_seconds", "trtllm:e2e_request_latency_seconds")
            ),
            "queue": Hist(
                ("trtllm_request_queue_time_seconds", "trtllm:request_queue_time_seconds")
            ),
        },
    ),
    Engine(
        "llamacpp",
        ("llamacpp:",),
        {
            "waiting": _one("llamacpp:requests_deferred"),
            "running": _one("llamacpp:requests_processing"),
            # llama.cpp removed its KV cache gauges upstream: left as n/a.
            "prompt_tokens_total": _one("llamacpp:prompt_tokens_total"),
            "generation_tokens_total": _one("llamacpp:tokens_predicted_total"),
        },
    ),
)


def detect_engine(sample_names: Iterable[str]) -> Engine | None:
    names = list(sample_names)
    for engine in ENGINES:
        if any(n.startswith(engine.prefixes) for n in names):
            return engine
    return None


def collect_histograms(
    engine: Engine, samples: list[Sample]
) -> dict[str, list[tuple[float, float]]]:
    """Each latency key's cumulative buckets [(upper bound in ms, count)], summed over label sets.

    Label sets (several engines of a data-parallel server, several models) add up
    bucket by bucket; the result is sorted by bound and ends with +Inf.
    """
    wanted: dict[str, tuple[str, float]] = {}  # sample name -> (key, to_ms), first name wins
    for key, hist in engine.histograms.items():
        for name in hist.names:
            wanted.setdefault(name + "_bucket", (key, hist.to_ms))
    found: dict[str, dict[str, dict[float, float]]] = {}  # key -> sample name -> le -> count
    for s in samples:
        hit = wanted.get(s.name)
        if hit is None:
            continue
        le = s.labels.get("le")
        if le is None:
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        by_le = found.setdefault(hit[0], {}).setdefault(s.name, {})
        by_le[bound] = by_le.get(bound, 0.0) + float(s.value)
    out: dict[str, list[tuple[float, float]]] = {}
    for key, hist in engine.histograms.items():
        per_name = found.get(key)
        if not per_name:
            continue
        # the first of the histogram's names that is present
        name = next(n + "_bucket" for n in hist.names if n + "_bucket" in per_name)
        buckets = sorted(per_name[name].items())
        if not buckets or buckets[-1][0] != float("inf"):
            continue  # not a whole histogram
        out[key] = [(le * hist.to_ms if le != float("inf") else le, n) for le, n in buckets]
    return out


def map_fields(engine: Engine, samples: list[Sample]) -> dict[str, float | None]:
    """The common fields for `engine` from all samples of one scrape."""
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    return {f: _pick(engine.picks.get(f), by_name) for f in FIELDS}


def _pick(pick: Pick | None, by_name: dict[str, list[Sample]]) -> float | None:
    if pick is None:
        return None
    for name in pick.names:
        values = [
            float(s.value)
            for s in by_name.get(name, ())
            if all(s.labels.get(k) == v for k, v in pick.labels.items())
        ]
        if values:
            total = sum(values)
            return total / len(values) if pick.how == "mean" else total
    return None
