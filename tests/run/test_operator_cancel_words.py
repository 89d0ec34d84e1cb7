"""Requests the operator cancelled are no errors: after a second Ctrl-C the recording says
how many were cut, by the operator, and no error event counts them ("error: 3× cancelled"
it said). A real `tokentop run --headless` on the real simulator, long streams in flight."""

from __future__ import annotations

import asyncio
import json
import signal
import time

from support import headless_argv, root, running_sim, scrape

from loadgen.record.rundir import read_events

STREAMS = 3


async def _stderr_until(stream: asyncio.StreamReader, wanted, seen: list[str],
                        within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        try:
            raw = await asyncio.wait_for(stream.readline(), left)
        except TimeoutError:
            break
        if not raw:
            break
        seen.append(raw.decode().rstrip("\n"))
        if wanted(seen[-1]):
            return
    raise AssertionError("never came; stderr so far:\n" + "\n".join(seen))


async def test_the_second_ctrl_c_cancels_are_the_operators_not_errors(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "r.json"
    # 20 ms a decode step: a 1000-token answer streams for about 20 s
    async with running_sim(slots=8, step_overhead_ms=20.0) as sim:
        proc = await asyncio.create_subprocess_exec(
            *headless_argv("--json", str(out), url=sim.url, concurrency=STREAMS,
                           output_tokens=1000, drain_grace=120, out=run_dir, stagger=0),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        seen: list[str] = []
        try:
            await _stderr_until(proc.stderr, lambda s: s.startswith("[")
                                and f"inflight={STREAMS}" in s, seen)
            proc.send_signal(signal.SIGINT)
            await _stderr_until(proc.stderr, lambda s: " draining " in s, seen)
            # the simulator's own gauge: every stream is still running when it is cut
            running = (await scrape(root(sim) + "/metrics"))["vllm:num_requests_running"]
            proc.send_signal(signal.SIGINT)
            rest = await asyncio.wait_for(proc.stderr.read(), 30)
            seen += rest.decode().splitlines()
            await asyncio.wait_for(proc.wait(), 10)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert running == STREAMS
    events = list(read_events(run_dir))
    cancelled = [e for e in events if e.get("error") == "cancelled"]
    assert cancelled and all(e["kind"] != "error" for e in cancelled), cancelled
    (cut,) = cancelled
    assert cut["kind"] == "operator" and cut["count"] == STREAMS, cut
    assert cut["message"] == (f"{STREAMS} requests in flight cancelled by the operator (the "
                              "stop was made immediate): not failures"), cut
    assert not any("× cancelled" in line for line in seen), seen
    summary = json.loads(out.read_text())
    assert summary["drain"]["requests_cancelled"] == STREAMS
