"""Named settings (`--profile NAME`) modelled on real deployments; every flag still overrides.

Each profile is a set of SimConfig fields. The figures are derived from
published numbers, not measured here; where a number is an estimate, the
comment says how it was reached. Common sources:

* Llama 3.1 architecture (Hugging Face `config.json`): 8B = 32 layers, 8 KV
  heads × 128 dims, 8.03 B parameters; 70B = 80 layers, 8 KV heads × 128
  dims, 70.6 B parameters. KV bytes per token (BF16) = 2 (K, V) × layers ×
  KV heads × head dim × 2 bytes: 8B → 131 072 (128 KiB), 70B → 327 680 (320 KiB).
* NVIDIA datasheets: H100 SXM5 80 GB HBM3, 3.35 TB/s, 989 TFLOPS dense BF16,
  700 W TDP; H200 SXM 141 GB HBM3e, 4.8 TB/s, same compute, 700 W.
* vLLM defaults: `gpu_memory_utilization` 0.9, `max_num_seqs` 256, chunked
  prefill with `max_num_batched_tokens` 8192 (the V1 OpenAI server on GPUs of
  70 GiB or more).
* Decode is memory-bound: one step reads every weight once, so the fixed step
  cost ≈ weight bytes per GPU / HBM bandwidth (+ launch and, under tensor
  parallelism, all-reduce overhead); each extra sequence adds its KV reads and
  sampling. Prefill is compute-bound: ≈ 2 × parameters FLOP per prompt token
  at ~50 % of dense peak.
* Sanity check against published serving figures: Llama 3 8B on one H100 in
  vLLM ≈ 6–7 ms ITL single-stream and several thousand output tok/s at full
  batch (vLLM v0.6.0 release blog, Sep 2024, and NVIDIA NIM benchmarks);
  Llama 3 70B TP4 on H100 ≈ 12–15 ms ITL single-stream (same sources).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadgen.sim.model import SimConfig

GB = 1000**3
GIB = 1024**3

PROFILES: dict[str, dict[str, Any]] = {
    # Llama 3.1 8B BF16, vLLM, one H100 SXM5 80 GB.
    "llama3-8b-h100": {
        "slots": 256,  # vLLM max_num_seqs
        # 0.9 × 80 GiB − 16 GB weights − ~4 GiB activations/graphs ≈ 52 GiB of KV
        # ÷ 128 KiB per token ≈ 430k tokens (vLLM logs report ~430–450k for this setup)
        "kv_tokens": 430_000,
        "step_overhead_ms": 6.0,  # 16 GB ÷ 3.35 TB/s = 4.8 ms + launch overhead
        "decode_ms_per_seq": 0.1,  # ~30 ms ITL at a full batch of 256
        "prefill_ms_per_token": 0.03,  # 16 GFLOP/token ÷ ~500 TFLOP/s effective
        "prefill_chunk_tokens": 8192,
        "gpu_name": "Simulated H100 80GB HBM3",
        "gpu_count": 1,
        "gpu_memory_bytes": 80 * GIB,
        "weights_bytes": 16 * GB,
        "kv_bytes_per_token": 131_072,
        "idle_power_w": 70.0,
        "power_limit_w": 700.0,
    },
    # Llama 3.1 8B BF16, vLLM, one H200 SXM 141 GB.
    "llama3-8b-h200": {
        "slots": 256,
        # 0.9 × 141 GB − 16 GB − ~4 GiB ≈ 107 GB ÷ 128 KiB ≈ 810k tokens
        "kv_tokens": 810_000,
        "step_overhead_ms": 4.5,  # 16 GB ÷ 4.8 TB/s = 3.3 ms + launch overhead
        "decode_ms_per_seq": 0.075,  # KV reads scale with bandwidth too
        "prefill_ms_per_token": 0.03,  # same compute as the H100
        "prefill_chunk_tokens": 8192,
        "gpu_name": "Simulated H200 141GB HBM3e",
        "gpu_count": 1,
        "gpu_memory_bytes": 141 * GB,
        "weights_bytes": 16 * GB,
        "kv_bytes_per_token": 131_072,
        "idle_power_w": 75.0,
        "power_limit_w": 700.0,
    },
    # Llama 3.1 70B BF16, vLLM, tensor parallel over 4 × H100 SXM5 80 GB.
    "llama3-70b-4xh100": {
        "slots": 256,
        # per GPU: 0.9 × 80 GiB − 35 GB weight shard − ~4 GiB ≈ 31 GiB; × 4 GPUs
        # = 124 GiB ÷ 320 KiB per token ≈ 400k tokens
        "kv_tokens": 400_000,
        "step_overhead_ms": 13.0,  # 35 GB per GPU ÷ 3.35 TB/s = 10.5 ms + all-reduces
        "decode_ms_per_seq": 0.2,  # ~65 ms ITL at a full batch
        "prefill_ms_per_token": 0.07,  # 141 GFLOP/token ÷ (4 × ~500 TFLOP/s)
        "prefill_chunk_tokens": 8192,
        "gpu_name": "Simulated H100 80GB HBM3",
        "gpu_count": 4,
        "gpu_memory_bytes": 80 * GIB,  # per GPU
        "weights_bytes": 141 * GB,  # the whole model, split over the GPUs
        "kv_bytes_per_token": 327_680,
        "idle_power_w": 70.0,
        "power_limit_w": 700.0,
    },
    # Exact-timing mode: every request 100 ms to the first token, then 10 ms per token.
    "exact": {
        "exact_ttft_ms": 100.0,
        "exact_itl_ms": 10.0,
    },
    # Small and quick: the shapes of the real profiles at a scale that a test can sweep
    # in a second (8 slots, a KV budget that 2 × 8 mid-size requests overflow).
    "tiny": {
        "slots": 8,
        "kv_tokens": 4096,
        "step_overhead_ms": 4.0,
        "decode_ms_per_seq": 0.5,
        "prefill_ms_per_token": 0.01,
        "prefill_chunk_tokens": 1024,
    },
}


def profile(name: str) -> dict[str, Any]:
    """A copy of one profile's settings; KeyError names the known ones."""
    try:
        return dict(PROFILES[name])
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown profile {name!r} (known: {known})") from None


def describe(cfg: SimConfig, profile: str | None) -> str:
    """The simulator in words, for a person: `PROFILE profile: N slots, KV N tokens,
    faults name=value, …` (`default profile` without one; `no faults`). `profile`: the
    --profile it was started from, which cfg cannot say (a flag may have overridden any
    of its settings)."""
    faults = cfg.faults.active()
    return (f"{profile or 'default'} profile: {cfg.slots} slots, KV {cfg.kv_tokens:,} tokens, "
            f"{'faults ' + ', '.join(faults) if faults else 'no faults'}")
