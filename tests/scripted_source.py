"""A deterministic SnapshotSource for console tests: plays a fixed list, records controls.

`make_snapshots()` builds realistic Snapshots without a clock or an unseeded
random generator, so the same call always gives the same bytes (and the same
screen in snapshot tests).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from loadgen.model import hdr
from loadgen.model.snapshot import (
    ClientSample,
    Control,
    Counters,
    Event,
    GpuSample,
    GpuStatus,
    HostSample,
    LoadState,
    ProcessSample,
    ServerMetrics,
    Snapshot,
    Target,
)
from loadgen.model.source import RunOutcome, SourceError, SourceStatus

RUN_ID = "20250101T000000-test"
T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z, fixed so nothing depends on today
URL = "http://127.0.0.1:8000/v1"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GIB = 1024**3

# The µs values every tick records (100 of each, spread deterministically):
# TTFT 40..400 ms, ITL 8..30 ms, TPOT 9..20 ms, E2E 1.2..3.6 s, ICL as ITL.
_SPREAD = np.linspace(0.0, 1.0, 100) ** 3  # a long right tail, as real latencies have
LATENCY_US = {
    "ttft": 40_000 + 360_000 * _SPREAD,
    "itl": 8_000 + 22_000 * _SPREAD,
    "tpot": 9_000 + 11_000 * _SPREAD,
    "e2e": 1_200_000 + 2_400_000 * _SPREAD,
    "icl": 8_000 + 22_000 * _SPREAD,
}


def encode_values(values_us: np.ndarray) -> str:
    """One interval histogram, encoded the way Snapshots carry it."""
    return hdr.encode(hdr.dense_from_sparse([hdr.sparse_counts(values_us)]))


# Encoding is the slow part, and every tick records the same values: do it once.
_HIST = {metric: encode_values(values) for metric, values in LATENCY_US.items()}


def make_gpu(index: int, tick: int, *, simulated: bool = True) -> GpuSample:
    return GpuSample(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        simulated=simulated,
        memory_used_bytes=int((60 + index + tick * 0.1) * GIB),
        memory_total_bytes=80 * GIB,
        utilization_pct=90.0 + index,
        power_w=550.0 + 5 * index,
        power_limit_w=700.0,
        temperature_c=66.0 + index,
        energy_j=1000.0 * (tick + 1),
        sm_clock_mhz=1980.0 - 15 * index,
        mem_clock_mhz=2619.0,
        # the last GPU of a multi-GPU box is held back by its power cap
        throttle_reasons=["power cap"] if index == 3 else [],
        pcie_tx_kbs=20_480.0,
        pcie_rx_kbs=40_960.0,
        ecc_corrected=0,
        ecc_uncorrected=0,
    )


# events the engine raised at some ticks (only during that tick, as a live run does)
EVENTS: dict[int, list[Event]] = {
    0: [Event(t=T0 + 1, kind="run", message="run started: closed loop, 64 streams")],
    3: [Event(t=T0 + 4, kind="operator", message="concurrency 54 → 64 (key)")],
    6: [Event(t=T0 + 7, kind="error", level="error",
              message="3× timeout: no token for 30 s")],
    9: [Event(t=T0 + 10, kind="probe", level="warn",
              message="server /metrics: connection refused")],
    10: [Event(t=T0 + 11, kind="probe", message="server /metrics answering again")],
}


def make_snapshot(
    i: int,
    *,
    gpus: int = 1,
    gpu_source: str = "simulated",
    gpu_message: str | None = None,
    server: bool = True,
    server_ok: bool = True,
    concurrency: int = 64,
    state: str = "running",
) -> Snapshot:
    """Tick `i` of a steady run: 10 req/s, 2,000 out tok/s, 8,000 in tok/s, rising errors."""
    tick = i + 1
    counters = Counters(
        requests_ok=10 * tick,
        requests_failed=tick // 2,
        requests_good=9 * tick,
        output_tokens=2_000 * tick,
        input_tokens=8_000 * tick,
        chunks=2_000 * tick,
        errors={"timeout": tick // 2, "http_5xx": tick // 4} if tick >= 2 else {},
    )
    metrics = None
    if server:
        metrics = ServerMetrics(
            url="http://127.0.0.1:8000/metrics",
            ok=server_ok,
            error=None if server_ok else "connection refused",
            engine="vllm" if server_ok else None,
            waiting=7.0 if server_ok else None,
            running=57.0 if server_ok else None,
            kv_cache_usage=0.625 if server_ok else None,
            preemptions_total=3.0 if server_ok else None,
            latency_ms={"ttft": {"p50": 80.0, "p99": 370.0}} if server_ok else {},
            scrape_ms=3.0,
        )
    gpu = GpuStatus(
        source=gpu_source,
        message=gpu_message,
        gpus=[] if gpu_source == "none" else [
            make_gpu(g, i, simulated=gpu_source == "simulated") for g in range(gpus)
        ],
        poll_ms=1.0,
    )
    return Snapshot(
        run_id=RUN_ID,
        seq=i,
        t=T0 + tick,
        elapsed=float(tick),
        interval=1.0,
        target=Target(url=URL, model=MODEL, simulated=gpu_source == "simulated"),
        load=LoadState(
            mode="closed",
            state=state,
            target_concurrency=concurrency,
            in_flight=concurrency - 1,
            backlog=0,
        ),
        counters=counters,
        hist=dict(_HIST),
        server=metrics,
        gpu=gpu,
        host=HostSample(
            cpu_pct=23.5,
            cpu_count=16,
            mem_used_bytes=21 * GIB,
            mem_total_bytes=64 * GIB,
            load1=3.25,
        ),
        process=ProcessSample(pid=4242, name="vllm", found_by="port", rss_bytes=9 * GIB,
                              cpu_pct=97.0, rss_slope_mb_h=12.0),
        client=ClientSample(workers=2, cpu_pct=84.0, loop_lag_ms=1.5),
        events=list(EVENTS.get(i, [])),
    )


def make_snapshots(n: int, **kwargs: object) -> list[Snapshot]:
    """`n` consecutive ticks of one run; keyword arguments go to `make_snapshot`."""
    return [make_snapshot(i, **kwargs) for i in range(n)]  # type: ignore[arg-type]


class ScriptedSource:
    """Plays `snapshots` in order, `delay` seconds apart, then ends (or holds, see `hold`).

    `hold=True` keeps the iterator open after the last Snapshot until close(),
    as a live run does, so the header keeps the run's own state.
    """

    def __init__(
        self,
        snapshots: list[Snapshot],
        delay: float = 0.0,
        *,
        hold: bool = False,
        start_error: str | None = None,
        description: str = f"scripted: {URL}",
    ) -> None:
        self.kind = "live"  # a SnapshotSource says what it is (live, replay, fleet)
        self.snapshots_list = snapshots
        self.delay = delay
        self.hold = hold
        self.start_error = start_error
        self.description = description
        self.run_dir: str | None = None  # what status() says (a test may set them)
        self.outcome: RunOutcome | None = None
        self.controls: list[Control] = []
        self.started = False
        self.closed = False
        self._closed_event = asyncio.Event()

    def status(self) -> SourceStatus:
        return SourceStatus(kind=self.kind, description=self.description,
                            run_dir=self.run_dir, outcome=self.outcome)

    async def start(self) -> None:
        if self.start_error is not None:
            raise SourceError(self.start_error)
        self.started = True

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        for snap in self.snapshots_list:
            if self.closed:
                return
            # sleep(0) still yields, so the app's event loop runs between ticks
            await asyncio.sleep(self.delay)
            yield snap
        if self.hold:
            await self._closed_event.wait()

    async def control(self, msg: Control) -> None:
        self.controls.append(msg)

    async def close(self) -> None:
        self.closed = True
        self._closed_event.set()


class ScriptedEvalSource(ScriptedSource):
    """A ScriptedSource that is an eval's (loadgen.eval.eval_process.WatchesEval): where the
    eval stands is `progress`, fixed, so the phase strip's picture is the same every time."""

    def __init__(self, snapshots: list[Snapshot], progress, **kw) -> None:
        super().__init__(snapshots, description=f"eval: {URL} → /evals/vllm-0.11", **kw)
        self.kind = "eval"
        self.progress = progress

    def eval_progress(self):
        return self.progress


def eval_progress(**changes):
    """Phase 3 of 7, the long tail, 12:04 left in it and 3:10:00 in the eval, 17/52 rows."""
    from loadgen.eval.eval_process import EvalProgress
    from loadgen.eval.phases import ABOUT

    fields = {"index": 3, "count": 7, "name": "long_tail", "about": ABOUT["long_tail"].what,
              "phase_left_s": 724.0, "eval_left_s": 11_400.0, "rows_filled": 17,
              "rows_total": 52, "at": T0}
    return EvalProgress(**{**fields, **changes})
