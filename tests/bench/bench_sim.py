"""How many SSE chunks one simulator process sustains on one core.

Not a test: it prints figures and asserts nothing about speed. Run it as

    python tests/bench/bench_sim.py [--streams 256] [--seconds 5] [--tokens-per-chunk 1 4]

The simulator runs as a subprocess (`tokentop sim`) pinned to one CPU;
this process pins itself to another and drives it with a deliberately cheap
client: raw asyncio sockets (uvloop where installed), HTTP/1.1 keep-alive, and
a byte count of `data: ` per read, no HTTP or JSON parsing. The engine is set
up so that the model itself is never the limit (a 0.5 ms step, free decode and
prefill, more slots than streams), so what is measured is the server's cost of
producing and writing chunks. CPU per chunk comes from the simulator's own
`cpu_times` (psutil) over the measured window.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time

import psutil

ANNOUNCE = b"TOKENTOP_SIM_LISTENING "
MAX_TOKENS = 4000


class StreamCounter(asyncio.Protocol):
    """One keep-alive connection sending streamed completions back to back."""

    def __init__(self, request: bytes, totals: list[int]) -> None:
        self.request = request
        self.totals = totals  # [chunks, requests]
        self.transport: asyncio.Transport | None = None
        self.tail = b""
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        # A chunk boundary may split "data: " or the end marker: keep a short tail.
        buf = self.tail + data
        self.totals[0] += buf.count(b"data: {") - self.tail.count(b"data: {")
        if b"\r\n0\r\n\r\n" in buf:  # the chunked body's terminator: the stream is over
            self.totals[1] += 1
            self.tail = b""
            assert self.transport is not None
            self.transport.write(self.request)
            return
        self.tail = buf[-16:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def request_bytes(port: int) -> bytes:
    body = (
        b'{"model":"tokentop-sim","prompt":"bench","max_tokens":%d,"ignore_eos":true,'
        b'"stream":true}' % MAX_TOKENS
    )
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def start_sim(streams: int, tokens_per_chunk: int) -> tuple[asyncio.subprocess.Process, int]:
    args = [
        sys.executable, "-m", "tui.cli", "sim", "--port", "0", "--announce", "--exit-with-parent",
        "--slots", str(streams * 2), "--kv-tokens", str(streams * 2 * (MAX_TOKENS + 16)),
        "--step-overhead-ms", "0.5", "--decode-ms-per-seq", "0", "--prefill-ms-per-token", "0",
    ]  # fmt: skip
    if tokens_per_chunk != 1:
        args += ["--tokens-per-chunk", str(tokens_per_chunk)]
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 20)
    if not line.startswith(ANNOUNCE):
        raise SystemExit(f"simulator did not start: {line!r}")
    return proc, int(line[len(ANNOUNCE) :])


async def run_one(streams: int, seconds: float, tokens_per_chunk: int) -> dict[str, float]:
    proc, port = await start_sim(streams, tokens_per_chunk)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(proc.pid, {cpus[0]})
        os.sched_setaffinity(0, {cpus[1]})
    sim = psutil.Process(proc.pid)
    loop = asyncio.get_running_loop()
    totals = [0, 0]
    request = request_bytes(port)
    conns = []
    try:
        for _ in range(streams):
            _, proto = await loop.create_connection(
                lambda: StreamCounter(request, totals), "127.0.0.1", port
            )
            conns.append(proto)
        await asyncio.sleep(1.0)  # warm up: every stream admitted and flowing
        c0, t0, cpu0 = totals[0], time.perf_counter(), sum(sim.cpu_times()[:2])
        await asyncio.sleep(seconds)
        c1, t1, cpu1 = totals[0], time.perf_counter(), sum(sim.cpu_times()[:2])
    finally:
        for proto in conns:
            if proto.transport is not None:
                proto.transport.close()
        assert proc.stdin is not None
        proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    chunks = c1 - c0
    wall = t1 - t0
    cpu = cpu1 - cpu0
    return {
        "chunks_s": chunks / wall,
        "tokens_s": chunks * tokens_per_chunk / wall,
        "cpu_us_per_chunk": cpu / chunks * 1e6 if chunks else float("nan"),
        "sim_cpu_pct": cpu / wall * 100.0,
    }


async def main_async(args: argparse.Namespace) -> None:
    print(f"simulator on one core, {args.streams} streams, {args.seconds:g} s per run")
    print(f"{'tokens/chunk':>12} {'chunks/s':>10} {'tokens/s':>10} {'µs/chunk':>9} {'sim CPU':>8}")
    for k in args.tokens_per_chunk:
        r = await run_one(args.streams, args.seconds, k)
        print(
            f"{k:>12} {r['chunks_s']:>10,.0f} {r['tokens_s']:>10,.0f} "
            f"{r['cpu_us_per_chunk']:>9.1f} {r['sim_cpu_pct']:>7.0f}%"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--tokens-per-chunk", type=int, nargs="+", default=[1, 4])
    args = p.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(main_async(args))


if __name__ == "__main__":
    main()
