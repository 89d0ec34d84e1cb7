"""A frozen server (SIGSTOP) keeps its sockets open and sends nothing: no error shows it,
so both clients count the streams in flight that have received no byte for STALL_AFTER_S.

The simulator runs as its own process (`tokentop sim`), so that it can be stopped whole
while the clients, in this process, keep their streams open."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from time import perf_counter

from loadgen.model.outage import STALL_AFTER_S
from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.openai_client import OpenAIClient

# 1000 tokens at a 20 ms step: each stream lasts ~20 s, far past the freeze
BODY = json.dumps({
    "model": "tokentop-sim", "messages": [{"role": "user", "content": "hi there"}],
    "max_tokens": 1000, "stream": True, "ignore_eos": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}).encode()  # fmt: skip


@contextlib.asynccontextmanager
async def sim_process() -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`tokentop sim` on a free 127.0.0.1 port: (the process, its chat URL)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tui.cli", "sim", "--port", "0", "--announce",
        "--exit-with-parent", "--step-overhead-ms", "20",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        assert line.startswith("TOKENTOP_SIM_LISTENING"), line
        yield proc, f"http://127.0.0.1:{int(line.split()[1])}/v1/chat/completions"
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot act on a kill
            proc.kill()
        await proc.wait()


async def until(check, timeout: float) -> float:
    """Wait for check() with a deadline; the perf_counter time it first held."""
    deadline = perf_counter() + timeout
    while not check():
        assert perf_counter() < deadline, "timed out"
        await asyncio.sleep(0.05)
    return perf_counter()


async def test_a_frozen_server_shows_as_stalled_streams_and_thaws() -> None:
    raw_rec, sdk_rec = IntervalRecorder(), IntervalRecorder()
    async with sim_process() as (proc, url):
        raw, sdk = StreamingClient(url, raw_rec), OpenAIClient(url, sdk_rec)
        clients = (raw, sdk)
        tasks = [asyncio.create_task(c.request(BODY, 2)) for c in (raw, raw, sdk, sdk)]
        try:
            await until(lambda: len(raw_rec.ttft) == 2 and len(sdk_rec.ttft) == 2, 10)
            assert [c.stalled(perf_counter()).stalled for c in clients] == [0, 0]  # bytes flowing
            os.kill(proc.pid, signal.SIGSTOP)
            stopped = perf_counter()
            try:
                # one more stream that starts while the server is frozen: the kernel still
                # accepts its connection, and it is counted from its start
                tasks.append(asyncio.create_task(raw.request(BODY, 2)))
                assert [c.stalled(perf_counter()).stalled for c in clients] == [0, 0]
                at = await until(lambda: raw.stalled(perf_counter()).stalled == 3
                                 and sdk.stalled(perf_counter()).stalled == 2, STALL_AFTER_S + 4)
                # no stream had gone quiet for STALL_AFTER_S before the freeze
                assert at - stopped >= STALL_AFTER_S
                assert (raw.in_flight, sdk.in_flight) == (3, 2)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            await until(lambda: raw.stalled(perf_counter()).stalled == 0
                        and sdk.stalled(perf_counter()).stalled == 0, 5)
            assert len(raw_rec.ttft) == 3  # the late stream got its first token after all
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raw.close()
    # none left in flight
    assert [c.stalled(perf_counter() + 60).stalled for c in clients] == [0, 0]
    assert raw_rec.counters.errors == {"cancelled": 3}
    assert sdk_rec.counters.errors == {"cancelled": 2}
