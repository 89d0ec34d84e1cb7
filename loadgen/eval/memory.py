"""Memory efficiency (the eval's `memory` phase): GPU memory per billion parameters, the KV
cache's capacity in tokens and its bytes per token, from what the server states and the
baseline's GPU samples; where the server does not say, the row says why.

What each engine states (and so where each figure comes from):
* the parameters: llama.cpp's /v1/models `meta.n_params`; vLLM's and SGLang's /v1/models
  state only the context (max_model_len) and the weights' path, so there --model-params
  fills in. The server's figure wins where it states one: it is the model actually loaded;
  the flag's is kept beside it, and the row says both when they differ by more than 5 %.
* GPU memory used: the probes' GPU samples of the baseline's recording (NVML, or the
  embedded simulator's pretend GPU at /sim/gpu), summed over the GPUs.
* the KV pool: /metrics as probes/server_metrics reads it (the console's and the efficiency
  phase's one definition: vLLM's cache_config_info, SGLang's max_total_num_tokens,
  Triton's blocks); llama.cpp exports none there, so its /props `n_ctx`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from loadgen.analysis.report import soak_report
from loadgen.eval.efficiency import in_measured_window
from loadgen.eval.phase_run import Eval
from loadgen.eval.results import MemoryFigures, PhaseResult, done, skipped
from loadgen.record.rundir import iter_snapshots
from probes.server_metrics import (
    HttpStatus,
    describe_error,
    fetch_page,
    metrics_url_for,
    parse_metrics,
    server_root,
)

GET_TIMEOUT_S = 10.0
DIFFER = 0.05  # the server's and the flag's parameters differ beyond this share: both shown
GB = 1e9  # decimal, as model sizes are written (an 8B model in bf16: 16 GB)


async def run(ev: Eval) -> PhaseResult:
    """The memory phase's result: a few GETs to the target, and the baseline's recording."""
    if not ev.phases.memory.enabled:
        return skipped("disabled in the plan")
    headers = ev.secrets.request_headers()
    timeout = aiohttp.ClientTimeout(total=GET_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        stated, params_why = await _stated_params(session, ev)
        gpu = _gpu_memory(ev)
        pool = await _kv_pool(session, ev, gpu["gpu_count"] or None)
    figures = MemoryFigures(**_params(stated, params_why, ev.model_params), **gpu, **pool,
                            gb_per_b_params=None, gb_per_b_why=None)
    figures.gb_per_b_params, figures.gb_per_b_why = _per_b(figures)
    return done(figures)


# ---- the parameters ----------------------------------------------------------------------------


async def _get_json(session: aiohttp.ClientSession, url: str) -> tuple[Any, str | None]:
    """(the body, None), or (None, why not) in words of ours (the server's text is not
    quoted: it is untrusted)."""
    try:
        async with session.get(url) as r:
            if r.status != 200:
                return None, f"HTTP {r.status} from {url}"
            return await r.json(content_type=None), None
    except ValueError:
        return None, f"{url} did not answer JSON"
    except (aiohttp.ClientError, TimeoutError) as e:
        return None, f"{url}: {describe_error(e)}"


async def _stated_params(session: aiohttp.ClientSession, ev: Eval) -> tuple[float | None, str]:
    """The parameters /v1/models states (llama.cpp's meta.n_params), in billions; else None
    and why."""
    url = ev.url.rstrip("/") + "/models"
    body, why = await _get_json(session, url)
    if why is not None:
        return None, why
    entries = body.get("data") if isinstance(body, dict) else None
    if not isinstance(entries, list) or not entries:
        return None, "/v1/models lists no model"
    # the eval's model where it is listed, else the first (what a request without one gets)
    entry = next((m for m in entries if isinstance(m, dict) and m.get("id") == ev.cfg.model),
                 entries[0])
    meta = entry.get("meta") if isinstance(entry, dict) else None
    n = meta.get("n_params") if isinstance(meta, dict) else None
    if n is None:
        return None, "/v1/models states no parameter count (vLLM and SGLang state only the " \
                     "context and the weights' path; llama.cpp states meta.n_params)"
    if isinstance(n, bool) or not isinstance(n, int | float) or not math.isfinite(n) or n <= 0:
        return None, "/v1/models' meta.n_params is not a positive number"
    return float(n) / 1e9, ""


def _params(stated: float | None, why: str, flag: float | None) -> dict[str, Any]:
    """The parameters used: the server's where it states them, else the flag's."""
    if stated is not None:
        source = "the server's /v1/models (meta.n_params)"
        if flag is not None and abs(flag - stated) > DIFFER * stated:
            source += f"; --model-params said {flag:g}B"
        return {"params_b": stated, "params_source": source, "params_flag_b": flag,
                "params_why": None}
    if flag is not None:
        return {"params_b": flag, "params_source": "--model-params", "params_flag_b": flag,
                "params_why": None}
    return {"params_b": None, "params_source": "none", "params_flag_b": None,
            "params_why": f"{why}: give --model-params (e.g. 8B)"}


# ---- GPU memory --------------------------------------------------------------------------------


def _gpu_memory(ev: Eval) -> dict[str, Any]:
    """GPU memory used, summed over the GPUs, the mean over the baseline's measured ticks
    that have GPU readings."""
    base = ev.results.baseline
    if base is None or base.status != "done" or not base.run_dir:
        said = f"{base.status}: {base.why}" if base is not None else "did not run"
        return _no_gpu(f"the baseline {said}: its GPU samples are the figure's")
    r, _ = soak_report(Path(base.run_dir), warnings=[])
    sums: list[float] = []
    count, source = 0, "none"
    for snap in iter_snapshots(Path(base.run_dir)):
        gpus = snap.gpu.gpus
        used = [g.memory_used_bytes for g in gpus if g.memory_used_bytes is not None]
        if not in_measured_window(r, snap.t) or not used:
            continue
        sums.append(float(sum(used)))
        count, source = max(count, len(gpus)), snap.gpu.source or source
    if not sums:
        return _no_gpu("no GPU memory reading in the baseline's window (no GPU seen: NVML "
                       "found none, and the target is not the simulator)")
    return {"gpu_memory_gb": float(np.mean(sums)) / GB, "gpu_count": count,
            "gpu_samples": len(sums), "gpu_source": source, "gpu_why": None}


def _no_gpu(why: str) -> dict[str, Any]:
    return {"gpu_memory_gb": None, "gpu_count": 0, "gpu_samples": 0, "gpu_source": "none",
            "gpu_why": why}


def _per_b(f: MemoryFigures) -> tuple[float | None, str | None]:
    if f.gpu_memory_gb is None:
        return None, f.gpu_why
    if f.params_b is None:
        return None, f.params_why
    return f.gpu_memory_gb / f.params_b, None


# ---- the KV pool -------------------------------------------------------------------------------


async def _kv_pool(session: aiohttp.ClientSession, ev: Eval,
                   gpus: int | None) -> dict[str, Any]:
    """The KV pool's tokens and bytes: /metrics as the probes read it, else llama.cpp's
    /props n_ctx."""
    url = ev.cfg.metrics_url or metrics_url_for(ev.url)
    try:
        m = parse_metrics(await fetch_page(session, url), url)
    except HttpStatus as e:
        m, said = None, str(e)
    except (aiohttp.ClientError, TimeoutError) as e:
        m, said = None, f"{url}: {describe_error(e)}"
    if m is not None and m.kv_pool_tokens:
        return _from_metrics(m.engine or "unknown", m.kv_pool_tokens, m.kv_pool_bytes,
                             gpus)
    said = said if m is None else (f"{m.engine} /metrics states no KV pool"
                                   if m.engine else f"{url} is no engine's /metrics page")
    n_ctx, props_why = await _props_n_ctx(session, ev)
    if n_ctx is None:
        return _no_kv(f"{said}; {props_why}")
    return {"kv_tokens": n_ctx, "kv_bytes": None, "kv_bytes_per_token": None,
            "kv_source": "llama.cpp /props default_generation_settings.n_ctx (one slot's "
                         "context: × total_slots when its KV cache is not unified)",
            "kv_why": None, "kv_bytes_why": "llama.cpp states no bytes for its KV cache"}


def _from_metrics(engine: str, tokens: int, per_gpu: int | None,
                  gpus: int | None) -> dict[str, Any]:
    """The pool /metrics states. Its bytes are per GPU (vLLM's kv_cache_memory_bytes is):
    × the GPUs the probes saw, the model split over them (tensor parallel)."""
    out = {"kv_tokens": tokens, "kv_bytes": None, "kv_bytes_per_token": None,
           "kv_source": f"{engine} /metrics", "kv_why": None, "kv_bytes_why": None}
    if per_gpu is None:
        out["kv_bytes_why"] = (f"{engine} states its pool in tokens only (vLLM's "
                               "kv_cache_memory_bytes is None unless the operator set it)")
    elif gpus is None:
        out["kv_bytes_why"] = "the pool's bytes are per GPU, and no GPU was seen to count"
    else:
        out["kv_bytes"] = per_gpu * gpus
        out["kv_bytes_per_token"] = per_gpu * gpus / tokens
        out["kv_source"] += f" (its bytes per GPU × {gpus} GPU{'s' if gpus > 1 else ''})"
    return out


async def _props_n_ctx(session: aiohttp.ClientSession, ev: Eval) -> tuple[int | None, str]:
    """llama.cpp's /props default_generation_settings.n_ctx (None and why without one)."""
    url = server_root(ev.url) + "/props"
    body, why = await _get_json(session, url)
    if why is not None:
        return None, f"no llama.cpp /props ({why})"
    settings = body.get("default_generation_settings") if isinstance(body, dict) else None
    n = settings.get("n_ctx") if isinstance(settings, dict) else None
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return None, "/props states no n_ctx"
    return n, ""


def _no_kv(why: str) -> dict[str, Any]:
    return {"kv_tokens": None, "kv_bytes": None, "kv_bytes_per_token": None,
            "kv_source": "none", "kv_why": why, "kv_bytes_why": why}
