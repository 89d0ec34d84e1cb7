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
class Engine:
    name: str
    prefixes: tuple[str, ...]  # a sample name starting with one of these identifies the engine
    picks: dict[str, Pick]


def _one(name: str, **kw: object) -> Pick:
    return Pick(names=(name,), **kw)  # type: ignore[arg-type]


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
        },
    ),
    Engine(
        "tgi",
        ("tgi_",),
        {
            "waiting": _one("tgi_queue_size"),
            "running": _one("tgi_batch_current_size"),
            # A histogram of tokens per request: its _sum is all tokens generated.
            "generation_tokens_total": _one("tgi_request_generated_tokens_sum"),
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
    ),
    Engine(
        "trtllm",
        ("trtllm_",),
        {
            "waiting": _one("trtllm_num_requests_waiting"),
            "running": _one("trtllm_num_requests_running"),
            "kv_cache_usage": _one("trtllm_kv_cache_utilization", how="mean"),
            "generation_tokens_total": _one("trtllm_generation_tokens_total"),
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
