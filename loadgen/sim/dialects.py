"""/metrics in the words of each engine (`--metrics-dialect`), from one engine model.

The model is the same whatever the dialect; only the names, labels and
shapes change, so that each of tokentop's scrapers (probes/engines.py) can be
exercised against a live endpoint. The output is the Prometheus text format, which
prometheus_client's parser reads. Names follow what each engine exports:

* vllm: `vllm:*` with `model_name`, bucket edges as vLLM declares them (metrics.py),
  vLLM v1's `vllm:prefix_cache_{queries,hits}_total` when there is a prefix cache, and
  `vllm:cache_config_info`, whose labels state the KV pool (num_gpu_blocks of block_size
  16, kv_cache_size_tokens, gpu_memory_utilization, kv_cache_memory_bytes) as in
  ../shared/captures/vllm-cpu/metrics.txt;
* sglang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`,
  `sglang:num_used_tokens`, `sglang:max_total_num_tokens`, `sglang:prompt_tokens_total`,
  `sglang:generation_tokens_total`, `sglang:num_requests_total`, latency histograms;
* tgi: `tgi_queue_size`, `tgi_batch_current_size`, `tgi_request_count`,
  `tgi_request_success`, and histograms `tgi_request_input_length`,
  `tgi_request_generated_tokens` (its _sum is every token of finished
  requests, as TGI observes at the end), `tgi_request_duration`,
  `tgi_request_queue_duration`; no labels;
* llamacpp: `llamacpp:*` without labels, as in ../shared/captures/llamacpp/metrics.txt;
  the `*_seconds` gauges are averages since the previous scrape, as llama.cpp's are;
* trtllm (trtllm-serve): `trtllm_num_requests_waiting`, `trtllm_num_requests_running`,
  `trtllm_kv_cache_utilization`, `trtllm_prompt_tokens_total`, `trtllm_generation_tokens_total`,
  `trtllm_request_success_total`, latency histograms;
* triton (TensorRT-LLM backend): `nv_trt_llm_request_metrics{request_type}` and
  `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from loadgen.sim.metrics import Histogram
    from loadgen.sim.model import BatchModel, SimConfig
    from loadgen.sim.prefix_cache import PrefixCache

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

KV_BLOCK_TOKENS = 16  # a paged KV block, for the dialects that count blocks


class Scrape(NamedTuple):
    """What one rendering reads besides the engine."""

    prefix_cache: PrefixCache | None  # its counters, for the dialects that show them
    # what the previous scrape saw, per dialect, for gauges that cover the time since it
    previous: dict[str, Any]


def render(dialect: str, engine: BatchModel, *, prefix_cache: PrefixCache | None = None,
           scrapes: dict[str, Any] | None = None) -> str:
    """The engine's /metrics page in `dialect`'s names. `prefix_cache`: the server's, whose
    counters vLLM shows; `scrapes`: a dict the caller keeps between scrapes, for llama.cpp's
    per-scrape averages (None: each scrape averages since the start)."""
    try:
        fn = _RENDERERS[dialect]
    except KeyError:
        raise ValueError(f"unknown metrics dialect {dialect!r}") from None
    return fn(engine, Scrape(prefix_cache, {} if scrapes is None else scrapes))


# ---- the text format


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


class _Out:
    """Lines of one exposition, with a fixed label set."""

    def __init__(self, label: str = "") -> None:
        self.label = label
        self.lines: list[str] = []

    def scalar(self, name: str, kind: str, doc: str, value: float, extra: str = "") -> None:
        _header(self.lines, name, kind, doc)
        self.sample(name, value, extra)

    def sample(self, name: str, value: float, extra: str = "") -> None:
        labels = ",".join(x for x in (self.label, extra) if x)
        self.lines.append(f"{name}{{{labels}}} {float(value)!r}" if labels else
                          f"{name} {float(value)!r}")  # fmt: skip

    def histogram(self, name: str, doc: str, hist: Histogram) -> None:
        _header(self.lines, name, "histogram", doc)
        _histogram(self.lines, name, self.label, hist)

    def text(self) -> str:
        self.lines.append("")
        return "\n".join(self.lines)


def _model_label(engine: BatchModel) -> str:
    return f'model_name="{_escape(engine.cfg.model_name)}"'


# ---- the dialects


def _vllm(engine: BatchModel, scrape: Scrape) -> str:
    m = engine.metrics
    out = _Out(_model_label(engine))
    out.scalar("vllm:num_requests_running", "gauge",
               "Number of requests in model execution batches.", engine.num_running)
    out.scalar("vllm:num_requests_waiting", "gauge",
               "Number of requests waiting to be processed.", engine.num_waiting)
    out.scalar("vllm:kv_cache_usage_perc", "gauge",
               "KV-cache usage. 1 means 100 percent usage.", engine.kv_usage)
    out.scalar("vllm:num_preemptions_total", "counter",
               "Cumulative number of preemption from the engine.", m.preemptions)
    out.scalar("vllm:prompt_tokens_total", "counter",
               "Number of prefill tokens processed.", m.prompt_tokens)
    out.scalar("vllm:generation_tokens_total", "counter",
               "Number of generation tokens processed.", m.generation_tokens)
    cache = scrape.prefix_cache
    if cache is not None:  # counted in tokens, as vLLM v1's are
        out.scalar("vllm:prefix_cache_queries_total", "counter",
                   "Prefix cache queries, in terms of number of queried tokens.", cache.queries)
        out.scalar("vllm:prefix_cache_hits_total", "counter",
                   "Prefix cache hits, in terms of number of cached tokens.", cache.hits)
    _cache_config_info(out, engine)
    name = "vllm:request_success_total"
    _header(out.lines, name, "counter", "Count of successfully processed requests.")
    for reason, n in m.success.items():
        out.sample(name, n, f'finished_reason="{reason}"')
    out.histogram("vllm:time_to_first_token_seconds",
                  "Histogram of time to first token in seconds.", m.ttft)
    out.histogram("vllm:inter_token_latency_seconds",
                  "Histogram of inter-token latency in seconds.", m.itl)
    out.histogram("vllm:e2e_request_latency_seconds",
                  "Histogram of e2e request latency in seconds.", m.e2e)
    out.histogram("vllm:request_queue_time_seconds",
                  "Histogram of time spent in WAITING phase for request.", m.queue)
    return out.text()  # fmt: skip


def _cache_config_info(out: _Out, engine: BatchModel) -> None:
    """vLLM's CacheConfig as labels of a gauge that reads 1 (its labels are the figures): a
    pool of exactly the engine's KV budget, whose usage kv_cache_usage_perc is. Without the
    model_name label, as vLLM writes it."""
    cfg = engine.cfg
    state = cfg.kv_tokens * cfg.kv_bytes_per_token // cfg.gpu_count if cfg.state_kv_bytes else None
    labels = {
        "block_size": KV_BLOCK_TOKENS, "cache_dtype": "auto",
        "enable_prefix_caching": cfg.prefix_cache_tokens != 0,
        "engine": 0, "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "kv_cache_memory_bytes": state, "kv_cache_size_tokens": cfg.kv_tokens,
        "num_cpu_blocks": None, "num_gpu_blocks": cfg.kv_tokens // KV_BLOCK_TOKENS,
    }
    name = "vllm:cache_config_info"
    _header(out.lines, name, "gauge", "Information of the LLMEngine CacheConfig")
    text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    out.lines.append(f"{name}{{{text}}} 1.0")


def _sglang(engine: BatchModel, _scrape: Scrape) -> str:
    m = engine.metrics
    out = _Out(_model_label(engine))
    out.scalar(
        "sglang:num_running_reqs", "gauge", "The number of running requests.", engine.num_running
    )
    out.scalar("sglang:num_used_tokens", "gauge", "The number of used tokens.", engine.kv_used)
    out.scalar("sglang:token_usage", "gauge", "The token usage.", engine.kv_usage)
    out.scalar("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens",
               engine.cfg.kv_tokens)
    out.scalar(
        "sglang:num_queue_reqs",
        "gauge",
        "The number of requests in the waiting queue.",
        engine.num_waiting,
    )
    out.scalar(
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        m.prompt_tokens,
    )
    out.scalar(
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        m.generation_tokens,
    )
    out.scalar(
        "sglang:num_requests_total",
        "counter",
        "Number of requests processed.",
        sum(m.success.values()),
    )
    out.histogram(
        "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", m.ttft
    )
    out.histogram(
        "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", m.itl
    )
    out.histogram(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        m.e2e,
    )
    return out.text()  # fmt: skip


def _tgi(engine: BatchModel, _scrape: Scrape) -> str:
    m = engine.metrics
    out = _Out()
    out.scalar("tgi_queue_size", "gauge", "", engine.num_waiting)
    out.scalar("tgi_batch_current_size", "gauge", "", engine.num_running)
    out.scalar("tgi_batch_current_max_tokens", "gauge", "", engine.kv_used)
    out.scalar("tgi_request_count", "counter", "", m.arrived)
    out.scalar("tgi_request_success", "counter", "", sum(m.success.values()))
    out.histogram("tgi_request_input_length", "", m.input_length)
    out.histogram("tgi_request_generated_tokens", "", m.generated_per_request)
    out.histogram("tgi_request_duration", "", m.e2e)
    out.histogram("tgi_request_queue_duration", "", m.queue)
    return out.text()


def _llamacpp(engine: BatchModel, scrape: Scrape) -> str:
    m = engine.metrics
    now = engine.now()
    busy = engine.busy_seconds(now)
    # llama.cpp's rate gauges cover the time since the previous scrape; that scrape's
    # metrics object is kept too, as a restart (an outage) makes a new one from zero
    last = scrape.previous.get("llamacpp")
    scrape.previous["llamacpp"] = (m, m.prompt_tokens, m.generation_tokens, busy, engine.steps,
                                   m.busy_slot_steps)  # fmt: skip
    if last is None or last[0] is not m:
        last = (m, 0, 0, 0.0, 0, 0)
    d_prompt = m.prompt_tokens - last[1]
    d_gen = m.generation_tokens - last[2]
    d_busy = busy - last[3]
    d_steps = engine.steps - last[4]
    d_slots = m.busy_slot_steps - last[5]
    out = _Out()
    out.scalar(
        "llamacpp:prompt_tokens_total",
        "counter",
        "Number of prompt tokens processed, excluding cached tokens",
        m.prompt_tokens,
    )
    out.scalar(
        "llamacpp:prompt_seconds_total",
        "counter",
        "Total time spent processing prompts",
        m.prefill_seconds,
    )
    out.scalar(
        "llamacpp:tokens_predicted_total",
        "counter",
        "Number of generation tokens processed",
        m.generation_tokens,
    )
    out.scalar(
        "llamacpp:tokens_predicted_seconds_total",
        "counter",
        "Total time spent generating tokens",
        busy,
    )
    out.scalar(
        "llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", engine.steps
    )
    out.scalar(
        "llamacpp:prompt_tokens_seconds",
        "gauge",
        "Average prompt throughput in tokens/s",
        d_prompt / d_busy if d_busy > 0 else 0.0,
    )
    out.scalar(
        "llamacpp:predicted_tokens_seconds",
        "gauge",
        "Average generation throughput in tokens/s",
        d_gen / d_busy if d_busy > 0 else 0.0,
    )
    out.scalar(
        "llamacpp:requests_processing", "gauge", "Number of requests processing", engine.num_running
    )
    out.scalar(
        "llamacpp:requests_deferred", "gauge", "Number of requests deferred", engine.num_waiting
    )
    out.scalar(
        "llamacpp:n_busy_slots_per_decode",
        "gauge",
        "Average number of busy slots per llama_decode() call",
        d_slots / d_steps if d_steps > 0 else 0.0,
    )
    return out.text()  # fmt: skip


def _trtllm(engine: BatchModel, _scrape: Scrape) -> str:
    m = engine.metrics
    out = _Out(_model_label(engine) + ',engine_type="trtllm"')
    out.scalar(
        "trtllm_num_requests_running", "gauge", "Number of requests running.", engine.num_running
    )
    out.scalar(
        "trtllm_num_requests_waiting", "gauge", "Number of requests waiting.", engine.num_waiting
    )
    out.scalar("trtllm_kv_cache_utilization", "gauge", "KV cache utilization.", engine.kv_usage)
    out.scalar("trtllm_prompt_tokens_total", "counter", "Number of prompt tokens.", m.prompt_tokens)
    out.scalar(
        "trtllm_generation_tokens_total",
        "counter",
        "Number of generation tokens.",
        m.generation_tokens,
    )
    name = "trtllm_request_success_total"
    _header(out.lines, name, "counter", "Count of successfully processed requests.")
    for reason, n in m.success.items():
        out.sample(name, n, f'finished_reason="{reason}"')
    out.histogram(
        "trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", m.ttft
    )
    out.histogram(
        "trtllm_time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        m.itl,
    )
    out.histogram(
        "trtllm_e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        m.e2e,
    )
    out.histogram(
        "trtllm_request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        m.queue,
    )
    return out.text()  # fmt: skip


def _triton(engine: BatchModel, _scrape: Scrape) -> str:
    cfg = engine.cfg
    out = _Out('model="tensorrt_llm",version="1"')
    name = "nv_trt_llm_request_metrics"
    _header(out.lines, name, "gauge", "TRT LLM request metrics")
    for kind, value in (("active", engine.num_running), ("waiting", engine.num_waiting),
                        ("max", cfg.slots), ("scheduled", engine.num_running),
                        ("context", 0)):  # fmt: skip
        out.sample(name, value, f'request_type="{kind}"')
    name = "nv_trt_llm_kv_cache_block_metrics"
    _header(out.lines, name, "gauge", "TRT LLM KV cache block metrics")
    max_blocks = -(-cfg.kv_tokens // KV_BLOCK_TOKENS)
    used = -(-engine.kv_used // KV_BLOCK_TOKENS)
    for kind, value in (("fraction", engine.kv_usage), ("max", max_blocks), ("used", used),
                        ("free", max_blocks - used), ("tokens_per", KV_BLOCK_TOKENS)):  # fmt: skip
        out.sample(name, value, f'kv_cache_block_type="{kind}"')
    return out.text()


# one renderer for each dialect SimConfig accepts (loadgen.sim.model.DIALECTS)
_RENDERERS = {
    "vllm": _vllm,
    "sglang": _sglang,
    "tgi": _tgi,
    "llamacpp": _llamacpp,
    "trtllm": _trtllm,
    "triton": _triton,
}


def version_answer(dialect: str, version: str, model: str, *, n_ctx: int = 4096,
                   slots: int = 1) -> tuple[str, dict] | None:
    """Where the engine `dialect` speaks says its version, and what it says there (the
    simulator's version in the engine's own shape), so a client that asks a real engine
    asks the simulator the same way; None for an engine without such a route."""
    said = f"tokentop-sim {version}"
    return {
        "vllm": ("/version", {"version": said}),
        "trtllm": ("/version", {"version": said}),
        "sglang": ("/get_server_info", {"version": said, "tp_size": 1, "model_path": model}),
        "tgi": ("/info", {"version": said, "model_id": model, "max_total_tokens": 4096}),
        # llama.cpp's n_ctx is a slot's context; the simulator's KV budget is shared by its
        # slots, as llama.cpp's unified KV cache is, so each slot's context is all of it
        "llamacpp": ("/props", {"build_info": said, "total_slots": slots,
                                "default_generation_settings": {"n_ctx": n_ctx}}),
        "triton": ("/v2", {"name": "triton", "version": said, "extensions": []}),
    }.get(dialect)


def model_entry(cfg: SimConfig, entry: dict) -> dict:
    """/v1/models' entry for the model in the engine's shape: vLLM's (`entry`: its id, root
    and max_model_len; SGLang's is the same), or llama.cpp's, which states the model's own
    figures in `meta` (its parameters, its file's bytes, its training context)."""
    if cfg.metrics_dialect != "llamacpp":
        return entry
    return {"id": entry["id"], "object": "model", "created": entry["created"],
            "owned_by": "llamacpp",
            "meta": {"vocab_type": 2, "n_vocab": 128256, "n_ctx_train": cfg.kv_tokens,
                     "n_embd": 4096, "n_params": cfg.model_params, "size": cfg.weights_bytes}}
