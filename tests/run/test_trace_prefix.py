"""A trace's prefix block ids (Mooncake's hash_ids) reproduce its prefix sharing at the
server: judged by the simulator's own prefix-cache counters, and by the prompts' words."""

from __future__ import annotations

import asyncio
import json

import numpy as np
from support import running_sim, scrape, tokentop

from loadgen.worker.trace import read_trace
from loadgen.worker.workload import RequestFactory, Workload

N, BLOCK = 20, 16


def _trace(path, shared: int) -> None:
    """N requests 50 ms apart, 3 blocks each: the first `shared` ids common to all, the
    rest their own."""
    rows = []
    for i in range(N):
        ids = list(range(shared)) + [1000 + 10 * i + k for k in range(3 - shared)]
        rows.append({"timestamp": 50 * i, "input_length": 3 * BLOCK, "output_length": 2,
                     "hash_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


async def _hits(tmp_path, shared: int) -> tuple[float, float]:
    path = tmp_path / f"trace{shared}.jsonl"
    _trace(path, shared)
    async with running_sim() as sim:
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", f"--trace={path}",
            f"--trace-block-tokens={BLOCK}", "--tokenizer=none", "--workers=2", "--no-record")
        assert done.returncode == 0, done.stderr
        metrics = await scrape(sim.url.removesuffix("/v1") + "/metrics")
    return metrics["vllm:prefix_cache_hits_total"], metrics["vllm:request_success_total"]


async def test_shared_block_ids_are_cache_hits_at_the_server(tmp_path):
    hits, ok = await _hits(tmp_path, shared=2)
    assert ok == N
    # the simulator's units are the role marker and the words: its blocks 0 and 1 (the
    # marker and words 0..30) lie inside the two shared trace blocks (words 0..31), block 2
    # does not; every request after the first finds those two
    assert hits == 2 * BLOCK * (N - 1)
    none, _ = await _hits(tmp_path, shared=0)
    assert none == 0


def test_blocks_are_the_same_words_in_every_worker(tmp_path):
    path = tmp_path / "t.jsonl"
    _trace(path, shared=2)
    trace = read_trace(path)
    assert trace.blocks(3).tolist() == [0, 1, 1030]
    w = Workload(model="m", trace_block_tokens=BLOCK)
    a = RequestFactory(w, worker_index=0).sized(48, 2, trace.blocks(0))
    b = RequestFactory(w, worker_index=1).sized(48, 2, trace.blocks(5))
    words = [json.loads(p.body)["messages"][0]["content"].split() for p in (a, b)]
    assert len(words[0]) == len(words[1]) == 48 == a.asked
    assert words[0][:2 * BLOCK] == words[1][:2 * BLOCK]
    assert words[0][2 * BLOCK:] != words[1][2 * BLOCK:]


def test_time_order_keeps_each_requests_blocks(tmp_path):
    path = tmp_path / "shuffled.jsonl"
    rows = [{"timestamp": t, "input_length": 4, "output_length": 1, "hash_ids": ids}
            for t, ids in ((30, [3]), (10, [1, 11]), (20, []), (0, [0, 5, 6]))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = read_trace(path)
    assert np.array_equal(trace.offsets, [0, 0.01, 0.02, 0.03])
    assert [trace.blocks(i).tolist() for i in range(4)] == [[0, 5, 6], [1, 11], [], [3]]
