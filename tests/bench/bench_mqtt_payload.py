"""Bytes per second one agent puts on the broker at 2 Hz under load against the simulator.

    python tests/bench/bench_mqtt_payload.py [--seconds 10] [--concurrency 32]

Starts the simulator and a mosquitto on loopback, runs one agent (tick 0.5 s),
and counts every payload byte a subscriber receives per topic; also prints
what the same Snapshots would cost as plain JSON. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mosquitto import Mosquitto, Recorder, settings, small_run, start_agent

from loadgen.sim import SimConfig, start_sim


async def main(seconds: float, concurrency: int) -> None:
    sim = await start_sim(SimConfig(slots=64), host="127.0.0.1", port=0)
    with tempfile.TemporaryDirectory() as tmp:
        async with Mosquitto(Path(tmp)) as broker:
            b = settings(broker.url)
            async with Recorder(b, "tokentop/bench/#") as raw:
                cfg = small_run(sim.url, duration=seconds, concurrency=concurrency,
                                input_tokens="uniform:64:512", output_tokens="uniform:32:256")
                code = await start_agent(cfg, b, "bench", fleet="bench")
                await asyncio.sleep(0.5)
    await sim.close()
    snaps = raw.payloads("/snapshot")
    plain = sum(len(zlib.decompress(p)) for _t, p in snaps)
    covered = len(snaps) * 0.5  # seconds of run the Snapshots cover (warm-up and drain too)
    print(f"agent exit {code}; {len(snaps)} snapshots = {covered:g} s of run "
          f"(tick 0.5 s, concurrency {concurrency})")
    seconds = covered or seconds
    total = 0
    for kind in ("/snapshot", "/events", "/status"):
        n = sum(len(p) for _t, p in raw.payloads(kind))
        total += n
        print(f"  {kind[1:]:<9} {n / seconds:8.0f} B/s  ({len(raw.payloads(kind))} messages)")
    print(f"  total     {total / seconds:8.0f} B/s per agent  (budget 4096 B/s)")
    if snaps:
        print(f"  snapshot payload mean {sum(len(p) for _t, p in snaps) / len(snaps):.0f} B "
              f"zlib, {plain / len(snaps):.0f} B as plain JSON "
              f"({plain / seconds:.0f} B/s uncompressed)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=32)
    a = p.parse_args()
    asyncio.run(main(a.seconds, a.concurrency))
