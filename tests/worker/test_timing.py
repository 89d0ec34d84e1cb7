"""tokentop's own timing accuracy, against the simulator's exact-timing mode."""

from __future__ import annotations

import numpy as np
from support import tokentop

from loadgen.model import hdr
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.sim import SimConfig, start_sim


async def measure(cfg: RunConfig, seconds: float) -> dict[str, np.ndarray]:
    coord = Coordinator(cfg)
    await coord.start()
    dense: dict[str, np.ndarray] = {}
    try:
        async for snap in coord.snapshots():
            if snap.elapsed > 1.0:  # the first second: connections and processes warm up
                for m, blob in snap.hist.items():
                    d = hdr.decode(blob)
                    dense[m] = dense[m] + d if m in dense else d
            if snap.elapsed >= seconds and coord.state == "running":
                coord.request_stop("measured")
    finally:
        await coord.close()
    return dense


async def test_ttft_and_itl_track_the_servers_send_stamps_at_modest_load():
    # every request: first token 40 ms after it arrives, then one every 10 ms; each chunk
    # carries the time the server wrote it, so the client's error is measurable. The
    # simulator runs in its own process, as `tokentop calibrate` runs it.
    cfg = RunConfig(concurrency=8, output_tokens="20", input_tokens="8", workers=1, tick=0.5,
                    calibrate=True, drain_grace=2.0,
                    sim=SimConfig(exact_ttft_ms=40.0, exact_itl_ms=10.0))
    dense = await measure(cfg, 6.0)
    ttft_err, itl_err = hdr.summarize(dense["ttft_err"]), hdr.summarize(dense["itl_err"])
    assert ttft_err["count"] > 50 and itl_err["count"] > 1000, (ttft_err, itl_err)
    # Nearly every chunk is stamped within a millisecond of the server's write. The tail is
    # the machine's: on a 2-vCPU VM where the simulator, the coordinator and the worker
    # share the cores, scheduling hiccups of 1-4 ms hit about 1 % of chunks (measured p99
    # 0.2-2 ms from run to run), so the p99 ≤ 1 ms promise is what `tokentop calibrate`
    # checks and reports on the machine at hand, and this test holds the line a shared CI
    # machine can keep: p90 within 1 ms, p99 within 5 ms.
    for err in (ttft_err, itl_err):
        assert err["p90"] <= 1000, err  # µs
        assert err["p99"] <= 5000, err
    # and the measured values themselves sit on the truth
    assert 39_000 <= hdr.summarize(dense["ttft"])["p50"] <= 42_000
    assert 9_500 <= hdr.summarize(dense["itl"])["p50"] <= 10_500


async def test_multi_token_chunks_give_the_true_per_token_itl():
    """4 tokens per chunk: the chunk gap (ICL) is 4 steps, the per-token ITL is one step."""
    results = {}
    for k in (1, 4):
        sim = await start_sim(SimConfig(slots=4, tokens_per_chunk=k), port=0)
        try:
            cfg = RunConfig(url=sim.url, concurrency=1, output_tokens="64", input_tokens="8",
                            workers=1, tick=0.5, drain_grace=2.0)
            dense = await measure(cfg, 3.0)
        finally:
            await sim.close()
        results[k] = {m: hdr.summarize(dense[m])["p50"] for m in ("itl", "icl")}
    one, four = results[1], results[4]
    assert abs(four["itl"] - one["itl"]) <= 0.15 * one["itl"], results
    assert 3.4 * one["icl"] <= four["icl"] <= 4.6 * one["icl"], results


def test_calibrate_prints_its_table_and_verdict():
    proc = tokentop("calibrate", "--steps", "1,4", "--step-seconds", "1.5", "--warmup", "0.5",
                    "--ttft-ms", "20", "--itl-ms", "10", timeout=60)
    # 0: some step kept the error within 1 ms; 3: none did (a shared, busy machine)
    assert proc.returncode in (0, 3), proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("highest load") is (proc.returncode == 0), lines[-1]
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("streams"))
    rows = lines[header + 1 : header + 3]
    assert [r.split()[0] for r in rows] == ["1", "4"]
    assert "µs/chunk" in lines[header] and "ITL err" in lines[header]
    assert lines[-1].startswith(("highest load with timing error", "no step kept"))
