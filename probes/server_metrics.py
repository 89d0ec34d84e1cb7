"""Scrape an inference server's Prometheus /metrics and map it to `ServerMetrics`.

One page gives the gauges and totals (`parse_metrics`). Two pages give rates
and the server's own latency quantiles over the interval between them
(`MetricsTracker`, which `ServerMetricsProbe` keeps): token rates from the
counters' differences, quantiles from the differences of histogram buckets,
interpolated inside a bucket as Prometheus' `histogram_quantile` does. A
counter that goes down means the server restarted: it is counted in
`restarts`, and that interval has no rates and no quantiles (never negative).
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections import deque
from dataclasses import dataclass, field

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from loadgen.model.snapshot import ServerMetrics
from loadgen.model.text import plain
from probes.engines import collect_histograms, detect_engine, map_fields

TIMEOUT_S = 2.0
ERROR_LIMIT = 200  # characters of a failed scrape's words (they may quote the server)
LABEL_LIMIT = 60  # characters of a label value in an unknown engine's gauge names

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
GENERIC_MAX = 20  # gauges shown for an engine we do not know
# Standard client-library gauges: shown for an unknown engine only if room is left.
_BORING = ("python_", "process_", "go_", "promhttp_")


def server_root(url: str) -> str:
    """The server's root URL from an OpenAI base URL: drop trailing slashes and a /v1."""
    root = url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root.rstrip("/")


def metrics_url_for(base_url: str) -> str:
    """http://host:8000/v1 -> http://host:8000/metrics (engines serve /metrics at the root)."""
    return server_root(base_url) + "/metrics"


Buckets = list[tuple[float, float]]  # cumulative (upper bound in ms, count), ends with +Inf


@dataclass
class Page:
    """One parsed /metrics page: the mapped view and the raw latency histograms."""

    metrics: ServerMetrics
    histograms: dict[str, Buckets] = field(default_factory=dict)


def parse_page(text: str, url: str) -> Page:
    """Map one /metrics page; text that is not Prometheus gives metrics.ok=False."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError and friends on non-metrics text
        return Page(
            ServerMetrics(url=url, ok=False,
                          error=f"not Prometheus text: {plain(_first_line(exc), ERROR_LIMIT)}")
        )
    samples = [s for family in families for s in family.samples]
    engine = detect_engine(s.name for s in samples)
    if engine is None:
        return Page(ServerMetrics(url=url, ok=True, engine="unknown", generic=_generic(families)))
    metrics = ServerMetrics(url=url, ok=True, engine=engine.name, **map_fields(engine, samples),
                            **msgspec.structs.asdict(kv_pool(engine.name, samples)))
    return Page(metrics, collect_histograms(engine, samples))


class KvPool(msgspec.Struct, kw_only=True):
    """The KV cache's pool as one page states it (ServerMetrics' kv_pool_* fields)."""

    kv_pool_tokens: int | None = None
    kv_pool_bytes: int | None = None  # per GPU (vLLM's kv_cache_memory_bytes is)
    gpu_memory_utilization: float | None = None


def kv_pool(engine: str, samples: list[Sample]) -> KvPool:
    """The pool's size, from what each engine exports; an engine that states none (TGI,
    trtllm-serve, llama.cpp, whose KV gauges were removed upstream and whose n_ctx is only
    in /props) gives all None. Label sets (data-parallel engines) add up."""
    if engine == "vllm":
        return _vllm_pool([s for s in samples if s.name == "vllm:cache_config_info"])
    if engine == "sglang":
        tokens = [s.value for s in samples if s.name == "sglang:max_total_num_tokens"]
        return KvPool(kv_pool_tokens=_whole_sum(tokens))
    if engine == "triton":
        return _triton_pool([s for s in samples if s.name == "nv_trt_llm_kv_cache_block_metrics"])
    return KvPool()


def _vllm_pool(infos: list[Sample]) -> KvPool:
    """vLLM's cache_config_info, one series per engine, its figures in labels: the pool is
    kv_cache_size_tokens where given (newer vLLM), else num_gpu_blocks × block_size; its
    bytes kv_cache_memory_bytes, which reads "None" unless the operator set it (vLLM does
    not export the model's bytes per token, and its preallocation less the weights cannot be
    known from outside)."""
    tokens: list[float] = []
    size: list[float] = []
    fractions: list[float] = []
    for s in infos:
        labels = s.labels
        given = _label_number(labels, "kv_cache_size_tokens")
        blocks = _label_number(labels, "num_gpu_blocks")
        block = _label_number(labels, "block_size")
        if given is None and blocks is not None and block is not None:
            given = blocks * block
        if given is not None:
            tokens.append(given)
        if (memory := _label_number(labels, "kv_cache_memory_bytes")) is not None:
            size.append(memory)
        if (fraction := _label_number(labels, "gpu_memory_utilization")) is not None:
            fractions.append(fraction)
    complete = len(size) == len(infos)  # bytes only when every engine states them
    return KvPool(kv_pool_tokens=_whole_sum(tokens),
                  kv_pool_bytes=_whole_sum(size) if complete else None,
                  gpu_memory_utilization=sum(fractions) / len(fractions) if fractions else None)


def _triton_pool(rows: list[Sample]) -> KvPool:
    """Triton's TensorRT-LLM backend: max blocks × tokens per block, per model."""
    by_model: dict[tuple, dict[str, float]] = {}
    for s in rows:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "kv_cache_block_type"))
        by_model.setdefault(key, {})[s.labels.get("kv_cache_block_type", "")] = s.value
    pools = [m["max"] * m["tokens_per"] for m in by_model.values()
             if "max" in m and "tokens_per" in m]
    return KvPool(kv_pool_tokens=_whole_sum(pools))


def _label_number(labels: dict[str, str], key: str) -> float | None:
    """A label's value as a finite, non-negative number; None for "None", absent or junk."""
    try:
        value = float(labels[key])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _whole_sum(values: list[float]) -> int | None:
    """The sum as a whole count; None when there is nothing, or a zero pool (no figure)."""
    values = [v for v in values if math.isfinite(v) and v >= 0]
    total = round(sum(values)) if values else 0
    return total or None


def parse_metrics(text: str, url: str) -> ServerMetrics:
    """Map one /metrics page to ServerMetrics (no rates: those need two pages)."""
    return parse_page(text, url).metrics


def _generic(families: list) -> dict[str, float]:
    """Up to GENERIC_MAX gauges by name (labels shown when there are several series)."""
    picked: list[tuple[bool, str, float]] = []
    for family in families:
        if family.type not in ("gauge", "unknown"):
            continue
        several = len(family.samples) > 1
        for s in family.samples:
            key = s.name
            if several and s.labels:  # the server's label values: plain, short
                key += "{" + ",".join(f'{k}="{plain(v, LABEL_LIMIT)}"'
                                      for k, v in sorted(s.labels.items())) + "}"
            if math.isfinite(s.value):
                picked.append((s.name.startswith(_BORING), plain(key), float(s.value)))
    picked.sort(key=lambda p: p[0])  # stable: page order within each group
    return {key: value for _, key, value in picked[:GENERIC_MAX]}


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile of cumulative buckets, as Prometheus' histogram_quantile computes it.

    Linear interpolation inside the bucket that holds the rank; the lowest bucket
    starts at 0; a rank in the +Inf bucket gives the highest finite bound.
    None when there are no observations.
    """
    if len(buckets) < 1 or buckets[-1][0] != math.inf:
        return None
    # Counts must not decrease with the bound (float sums can wobble): as Prometheus does.
    fixed: Buckets = []
    top = 0.0
    for le, n in buckets:
        top = max(top, n)
        fixed.append((le, top))
    total = fixed[-1][1]
    if total <= 0:
        return None
    rank = q * total
    # the first bucket that holds the rank (the +Inf one holds every rank)
    i = next(i for i, (_, n) in enumerate(fixed) if n >= rank)
    le, n = fixed[i]
    if le == math.inf:
        return fixed[-2][0] if len(fixed) >= 2 else None
    if i == 0:
        if le <= 0:
            return le
        lower, below = 0.0, 0.0
    else:
        lower, below = fixed[i - 1]
    return lower + (le - lower) * (rank - below) / (n - below)


def bucket_delta(before: Buckets, after: Buckets) -> Buckets | None:
    """after - before bucket by bucket; None when the layouts differ or a count went down."""
    if [le for le, _ in before] != [le for le, _ in after]:
        return None
    out: Buckets = []
    for (le, a), (_, b) in zip(before, after, strict=True):
        if b < a:
            return None
        out.append((le, b - a))
    return out


QUANTILE_WINDOW_S = 10.0  # server-side quantiles cover about this much recent time
MAX_PAGES = 32


class MetricsTracker:
    """Keeps recent pages: counters between the last two give rates, histogram buckets over
    the last ~10 s give the server's own quantiles (one 1 s scrape interval often holds no
    finished request, and a quantile of nothing would read "n/a" half the time)."""

    def __init__(self, window_s: float = QUANTILE_WINDOW_S) -> None:
        self.restarts = 0
        self.window_s = window_s
        # by time, and by count too: whoever scrapes fast must not pile pages up
        self._pages: deque[tuple[float, Page]] = deque(maxlen=MAX_PAGES)

    def feed(self, text: str, url: str, t: float) -> ServerMetrics:
        """Parse a page scraped at monotonic time `t` and fill its rates and quantiles."""
        return self.update(parse_page(text, url), t)

    def update(self, page: Page, t: float) -> ServerMetrics:
        m = page.metrics
        if not m.ok:
            m.restarts = self.restarts
            return m  # keep the last good pages: the next good one is compared with them
        while len(self._pages) > 1 and self._pages[0][0] < t - self.window_s:
            self._pages.popleft()
        if self._pages:
            t_prev, prev = self._pages[-1]
            if prev.metrics.engine != m.engine or _was_reset(prev, page):
                if prev.metrics.engine == m.engine:
                    self.restarts += 1  # this interval straddles a restart: no rates, no quantiles
                self._pages.clear()
            elif t > t_prev:
                self._rates(prev, page, t - t_prev)
                self._quantiles(page, t)
        self._pages.append((t, page))
        m.restarts = self.restarts
        return m

    @staticmethod
    def _rates(before: Page, after: Page, dt: float) -> None:
        a, b = before.metrics, after.metrics
        b.prompt_tok_s = _rate(a.prompt_tokens_total, b.prompt_tokens_total, dt)
        b.generation_tok_s = _rate(a.generation_tokens_total, b.generation_tokens_total, dt)
        queries = _rate(a.prefix_cache_queries_total, b.prefix_cache_queries_total, dt)
        hits = _rate(a.prefix_cache_hits_total, b.prefix_cache_hits_total, dt)
        if queries and hits is not None:  # no queries in between: the gauge (if any) stands
            b.prefix_cache_hit_rate = hits / queries

    def _quantiles(self, after: Page, t: float) -> None:
        # the oldest page still inside the window (the deque holds nothing older)
        _, before = self._pages[0]
        for key, buckets in after.histograms.items():
            old = before.histograms.get(key)
            delta = None if old is None else bucket_delta(old, buckets)
            if delta is None:
                continue
            quantiles = {name: histogram_quantile(q, delta) for name, q in QUANTILES.items()}
            if all(v is not None for v in quantiles.values()):
                after.metrics.latency_ms[key] = {
                    k: round(v, 3) for k, v in quantiles.items() if v is not None
                }


def _was_reset(before: Page, after: Page) -> bool:
    """A counter or a histogram went down: the server restarted between the two pages."""
    a, b = before.metrics, after.metrics
    counters = ("prompt_tokens_total", "generation_tokens_total", "preemptions_total")
    if any(_went_down(getattr(a, c), getattr(b, c)) for c in counters):
        return True
    for key, buckets in after.histograms.items():
        old = before.histograms.get(key)
        if old is not None and old[-1][1] > buckets[-1][1]:
            return True  # fewer observations than before
    return False


def _went_down(before: float | None, after: float | None) -> bool:
    return before is not None and after is not None and after < before


def _rate(before: float | None, after: float | None, dt: float) -> float | None:
    if before is None or after is None or after < before or dt <= 0:
        return None
    return (after - before) / dt


class ServerMetricsProbe:
    def __init__(
        self, metrics_url: str, session: aiohttp.ClientSession, authorization: str | None = None
    ) -> None:
        self.url = metrics_url
        self._session = session
        self.tracker = MetricsTracker()
        # Kept only in the header: never in errors, logs or the ServerMetrics.
        self._headers = {"Authorization": authorization} if authorization else {}

    async def sample(self) -> ServerMetrics:
        start = time.perf_counter()
        try:
            text = await fetch_page(self._session, self.url, self._headers)
        except HttpStatus as exc:
            page = Page(ServerMetrics(url=self.url, ok=False, error=str(exc)))
        except Exception as exc:  # the words may quote the server (a reason, a header)
            page = Page(ServerMetrics(url=self.url, ok=False,
                                      error=plain(describe_error(exc), ERROR_LIMIT)))
        else:
            # Parsing a large page costs a few ms; still cheap enough per tick.
            page = parse_page(text, self.url)
        result = self.tracker.update(page, time.monotonic())
        result.scrape_ms = (time.perf_counter() - start) * 1000.0
        return result



async def fetch_page(session: aiohttp.ClientSession, url: str,
                     headers: dict[str, str] | None = None) -> str:
    """A Prometheus page's text (any exporter's); HttpStatus when it answers other than 200."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with session.get(url, headers=headers or {}, timeout=timeout) as resp:
        if resp.status != 200:
            raise HttpStatus(f"HTTP {resp.status} from {url}")
        return await resp.text(errors="replace")


class HttpStatus(Exception):
    """A scrape answered with another status than 200; str(e) says which, and from where."""


def describe_error(exc: BaseException) -> str:
    """A failed scrape in words."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return f"timed out after {TIMEOUT_S} s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionRefusedError):
            return "connection refused"
        if isinstance(os_error, socket.gaierror):
            return f"cannot resolve host {exc.host}"
        return f"cannot connect: {os_error.strerror or os_error}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server closed the connection"
    if isinstance(exc, aiohttp.ClientError):
        return f"request failed: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line[:200]
