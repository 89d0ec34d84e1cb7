"""The baseline's GPU figures over its measured window: energy per token and per request,
utilisation, GPU memory per request in flight; and the engine's own memory figures: the KV
cache in use per request in flight (kv_per_request) and its slope over a soak at a steady
load (engine_memory_slope), the GPU-side leak signal.

Why the engine's figures: real engines preallocate. vLLM takes gpu_memory_utilization (0.9
by default) of each GPU at start, for the weights, the activations and a KV pool that fills
the rest; SGLang, TensorRT-LLM and llama.cpp size their KV cache at start too. So the GPU's
memory used is flat whatever the load, GPU memory ÷ requests in flight is the preallocation
÷ N, and KV blocks leaking inside the pool never move it. What moves is the engine's KV in
use: its usage (vLLM's kv_cache_usage_perc, SGLang's token_usage, Triton's block fraction)
× the pool it states (ServerMetrics.kv_pool_tokens). In MB only where the engine states the
pool's bytes (vLLM's kv_cache_memory_bytes, when the operator set it): vLLM does not export
the model's bytes per token, and the preallocation less the weights is not knowable from
outside, so otherwise the figure stays in tokens and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec
import numpy as np

from loadgen.analysis.report import Report
from loadgen.model import units
from loadgen.model.energy import EnergyReadings, Reading, per_joule
from loadgen.model.snapshot import ServerMetrics, Snapshot
from loadgen.model.trend import MIN_SLOPE_SPAN_S
from loadgen.record.rundir import iter_snapshots


class GpuUse(msgspec.Struct, kw_only=True):
    """Energy and GPU use over a measured run (gpu_use)."""

    tokens_per_joule: float | None
    req_s_per_w: float | None
    gpu_util_pct: float | None
    gpu_memory_mb_per_in_flight: float | None
    gpu_source: str  # nvml | simulated | none …
    energy_why: str | None  # why there is no energy figure


def gpu_use(run_dir: Path, r: Report) -> GpuUse:
    """Output tokens per joule and requests/s per watt (requests per joule) over the
    measured window, the report's rates' own (after warm-up, before the drain): the GPUs'
    energy between the first and last fresh readings inside it, and the tokens and
    requests counted between those same times (loadgen.model.energy); mean GPU
    utilisation and GPU memory per request in flight over its ticks; `energy_why` when the
    GPUs give no energy figure."""
    first = last = None  # the energy readings
    source, util, mem_per = None, [], []
    readings = EnergyReadings()
    for snap in iter_snapshots(run_dir):
        reading = readings.see(snap)
        if not in_measured_window(r, snap.t) or not snap.gpu.gpus:
            continue
        source = source or snap.gpu.source
        if reading is not None and in_measured_window(r, reading.t):
            first, last = first or reading, reading
        gpus = snap.gpu.gpus
        util += [g.utilization_pct for g in gpus if g.utilization_pct is not None]
        mem = sum(g.memory_used_bytes or 0 for g in gpus)
        if snap.load.in_flight and mem:
            mem_per.append(mem / snap.load.in_flight / 1e6)
    energy = _energy_j(first, last)
    return GpuUse(tokens_per_joule=per_joule(first, last) if energy else None,
                  req_s_per_w=per_joule(first, last, "requests_ok") if energy else None,
                  gpu_util_pct=sum(util) / len(util) if util else None,
                  gpu_memory_mb_per_in_flight=sum(mem_per) / len(mem_per) if mem_per else None,
                  gpu_source=source or "none",
                  energy_why=None if energy else "no GPU energy counter (no NVIDIA GPU seen)")


def in_measured_window(r: Report, t: float) -> bool:
    """Within the report's measured window (after warm-up, before the drain)."""
    return r.measured_from is not None and r.measured_to is not None \
        and r.measured_from <= t <= r.measured_to


def _energy_j(a: Reading | None, b: Reading | None) -> float | None:
    """Joules between two readings of the same GPUs; None without two, or when the counter
    went down (a driver reload)."""
    if a is None or b is None or a is b or a.gpus != b.gpus:
        return None
    used = b.energy_j - a.energy_j
    return used if used > 0 else None


# ---- the engine's own memory figures -----------------------------------------------------------

KvUnit = Literal["MB", "tokens"]
SlopeUnit = Literal["MB/h", "tokens/h"]
SLOPE_UNIT: dict[KvUnit, SlopeUnit] = {"MB": "MB/h", "tokens": "tokens/h"}
MIN_SLOPE_SAMPLES = 3


class KvPerRequest(msgspec.Struct, kw_only=True):
    """The KV cache in use per request in flight, the mean over the measured window's ticks:
    the engine's usage × its pool ÷ the requests in flight (loadgen.eval.efficiency)."""

    value: float | None  # in `unit`; None: no figure (`why` says why)
    unit: KvUnit | None
    tokens: float | None  # the same figure in tokens, whatever `unit`
    samples: int  # the ticks averaged
    source: str  # where the figure comes from, in words
    why: str | None  # why it is in tokens rather than MB, or why there is none


class EngineSlope(msgspec.Struct, kw_only=True):
    """The KV cache in use over a soak at a steady load, its least-squares slope: a GPU-side
    leak on the engine's own figures (loadgen.eval.efficiency.engine_memory_slope)."""

    slope: float | None  # per hour, in `unit`; None: withheld (`why` says why)
    unit: SlopeUnit | None
    samples: int
    span_s: float
    first: float | None  # KV in use at the first and last ticks, in `unit` less "/h"
    last: float | None
    source: str
    why: str | None
    gpu_memory_why: str  # why the GPU's memory used is no leak signal (it is preallocated)


@dataclass(frozen=True)
class _KvTick:
    """One tick's KV cache in use, from the engine's figures."""

    t: float
    tokens: float
    mb_per_token: float | None  # None: the engine states no bytes for its pool
    in_flight: int


def _kv_tick(snap: Snapshot) -> _KvTick | None:
    """The tick's KV in use: usage × pool (None without both)."""
    m = snap.server
    if m is None or not _has_kv(m) or m.kv_cache_usage is None or m.kv_pool_tokens is None:
        return None  # (the last two for the type checker: _has_kv said so)
    per_token = m.kv_pool_bytes / m.kv_pool_tokens / 1e6 if m.kv_pool_bytes else None
    # the requests the KV is held for: the engine's running count from the same scrape
    # (the client's in flight is a scrape's age apart, and counts requests on the wire)
    requests = round(m.running) if m.running is not None else snap.load.in_flight
    return _KvTick(t=snap.t, tokens=m.kv_cache_usage * m.kv_pool_tokens,
                   mb_per_token=per_token, in_flight=requests)


def _source(m: ServerMetrics | None) -> str:
    """Where the figure comes from, in words (the engine's name is ours, never the page's)."""
    if m is None or m.engine is None:
        return "no server /metrics"
    return (f"{m.engine} /metrics: KV cache usage × the pool it states"
            + (" (and its bytes per GPU)" if m.kv_pool_bytes else ""))


def _why_none(last: ServerMetrics | None) -> str:
    """Why the engine's figures give no KV in use: what the last page had or lacked."""
    if last is None:
        return "no server /metrics in the window (--metrics-url, or a server without one)"
    if not last.ok:
        return f"the server's /metrics did not answer ({last.error or 'no page'})"
    if last.kv_cache_usage is None:
        return f"{last.engine} exports no KV cache usage on /metrics"
    return (f"{last.engine} exports its KV cache usage but not the pool's size "
            "(vLLM states it in cache_config_info, SGLang in max_total_num_tokens)")


WHY_TOKENS = ("the engine states no bytes for its KV pool (vLLM's kv_cache_memory_bytes is "
              "None unless set; /metrics gives no bytes per token, and what the engine "
              "preallocated less the weights cannot be known from outside)")


@dataclass
class _Window:
    """What the measured window's ticks say about the KV cache, kept small: a day's soak is
    86 400 ticks, and only these few facts of each are needed (never the Snapshots)."""

    kv: list[_KvTick] = field(default_factory=list)  # the ticks with a KV figure
    last: ServerMetrics | None = None  # the last page of the server's metrics
    settings: set[tuple] = field(default_factory=set)  # the load settings seen
    trace: bool = False  # the load followed a trace
    paused: bool = False
    share: float | None = None  # the engine's gpu_memory_utilization, last stated


def _window(run_dir: Path, r: Report) -> _Window:
    w = _Window()
    for snap in iter_snapshots(run_dir):
        if not in_measured_window(r, snap.t):
            continue
        if (tick := _kv_tick(snap)) is not None:
            w.kv.append(tick)
        w.last = snap.server if snap.server is not None else w.last
        w.settings.add((snap.load.mode, snap.load.target_concurrency, snap.load.target_rate))
        w.trace = w.trace or snap.load.trace_total is not None
        w.paused = w.paused or snap.load.state == "paused"
        if snap.server is not None and snap.server.gpu_memory_utilization is not None:
            w.share = snap.server.gpu_memory_utilization
    return w


def kv_per_request(run_dir: Path, r: Report) -> KvPerRequest:
    """KV in use ÷ requests in flight, the mean over the measured window's ticks that have
    both (a tick with nothing in flight has no per-request figure); in MB when every such
    tick's engine stated its pool's bytes, else in tokens (with why)."""
    w = _window(run_dir, r)
    ticks, last = [k for k in w.kv if k.in_flight > 0], w.last
    if not ticks:
        why = ("no tick of the measured window had requests in flight"
               if last is not None and _has_kv(last) else _why_none(last))
        return KvPerRequest(value=None, unit=None, tokens=None, samples=0,
                            source=_source(last), why=why)
    tokens = float(np.mean([k.tokens / k.in_flight for k in ticks]))
    if all(k.mb_per_token is not None for k in ticks):
        mb = float(np.mean([k.tokens * (k.mb_per_token or 0.0) / k.in_flight for k in ticks]))
        return KvPerRequest(value=mb, unit="MB", tokens=tokens, samples=len(ticks),
                            source=_source(last), why=None)
    return KvPerRequest(value=tokens, unit="tokens", tokens=tokens, samples=len(ticks),
                        source=_source(last), why=WHY_TOKENS)


def _has_kv(m: ServerMetrics) -> bool:
    """A page has what a KV figure needs: usage and the pool."""
    return m.ok and m.kv_cache_usage is not None and bool(m.kv_pool_tokens)


def engine_memory_slope(run_dir: Path, r: Report, *,
                        min_span_s: float = MIN_SLOPE_SPAN_S) -> EngineSlope:
    """The slope of the KV cache in use over the measured window (the long tail's soak):
    MB/h where the engine states its pool's bytes, else tokens/h. Withheld (None, with why)
    when the engine exports no usage or pool, when the load was not steady (a ramp, a
    trace, a pause: KV in use follows the load), or when the ticks span less than
    `min_span_s` (start-up filling is no leak: loadgen.model.trend)."""
    w = _window(run_dir, r)
    ticks, last = w.kv, w.last

    def withheld(why: str, unit: SlopeUnit | None = None) -> EngineSlope:
        span = ticks[-1].t - ticks[0].t if len(ticks) > 1 else 0.0
        return EngineSlope(slope=None, unit=unit, samples=len(ticks), span_s=span, first=None,
                           last=None, source=_source(last), why=why,
                           gpu_memory_why=gpu_memory_why(w.share))

    if not ticks:
        return withheld(_why_none(last))
    if (unsteady := _unsteady(w)) is not None:
        return withheld(unsteady)
    unit: KvUnit = "MB" if all(k.mb_per_token is not None for k in ticks) else "tokens"
    span = ticks[-1].t - ticks[0].t
    if len(ticks) < MIN_SLOPE_SAMPLES or span < min_span_s - 1e-9:
        return withheld(f"soak too short for a slope ({units.duration(span)}; needs ≥ "
                        f"{units.duration(min_span_s)})", SLOPE_UNIT[unit])
    t = np.array([k.t - ticks[0].t for k in ticks]) / 3600.0
    y = np.array([k.tokens * (k.mb_per_token or 0.0) if unit == "MB" else k.tokens
                  for k in ticks])
    slope = float(np.polyfit(t, y, 1)[0])
    return EngineSlope(slope=slope, unit=SLOPE_UNIT[unit], samples=len(ticks), span_s=span,
                       first=float(y[0]), last=float(y[-1]), source=_source(last),
                       why=None if unit == "MB" else WHY_TOKENS,
                       gpu_memory_why=gpu_memory_why(w.share))


def _unsteady(w: _Window) -> str | None:
    """Why the window's load was not steady (None: one setting throughout, not a trace)."""
    if w.trace:
        return "the load followed a trace, which varies by design: KV in use follows it"
    if len(w.settings) > 1:
        return "the load changed inside the window (a ramp or a step): KV in use follows it"
    if w.paused:  # (the window's last tick may be the drain's first)
        return "the load paused inside the window: KV in use follows it"
    return None


def gpu_memory_why(share: float | None) -> str:
    """Why the GPU's memory used is no leak signal, in words: with the engine's own share
    where it states one (vLLM's gpu_memory_utilization)."""
    if share is not None:
        return (f"the engine preallocated {units.pct(share)} of GPU memory at start "
                "(gpu_memory_utilization): GPU memory used stays flat whatever leaks inside "
                "its KV pool, so a GPU-side leak is judged on its KV cache in use")
    return ("inference engines size their KV pool at start (vLLM, SGLang, TensorRT-LLM, "
            "llama.cpp), so GPU memory used stays flat whatever leaks inside it; a GPU-side "
            "leak is judged on the engine's KV cache in use where it exports one")
