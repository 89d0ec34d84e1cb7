"""Multi-turn conversations (--turns, --think-time) through the command line, against the
simulator: each turn's prompt is the whole history (its size by the server's own count),
prefix-cache hits are counted as the server counts them, the think time is spent between a
conversation's turns and not before a new one."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from support import running_sim, scrape, server_arrivals, tokentop

IN, OUT, TURNS, BLOCK = 32, 8, 3, 16


async def _conversations(sim, tmp_path, *flags: str) -> tuple[dict, str]:
    out = tmp_path / "summary.json"
    done = await asyncio.to_thread(
        tokentop, "run", "--headless", f"--url={sim.url}", "--workers=1", "--tick=0.25",
        f"--input-tokens={IN}", f"--output-tokens={OUT}", f"--turns={TURNS}",
        "--tokenizer=none", "--json", str(out), "--no-record", *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text()), done.stderr


def _units(turn: int) -> int:
    """The simulator's prefix-cache units of turn `turn`'s prompt: a role marker a message,
    the words of each (IN a user message, OUT a reply)."""
    return turn * (1 + IN) + (turn - 1) * (1 + OUT)


async def test_prompts_grow_turn_by_turn_and_cache_hits_are_counted(tmp_path):
    async with running_sim() as sim:
        summary, _ = await _conversations(sim, tmp_path, "--concurrency=2",
                                          f"--requests={4 * TURNS}")
        metrics = await scrape(sim.url.removesuffix("/v1") + "/metrics")
    rows = {r["turn"]: r for r in summary["turns"]}
    assert sorted(rows) == [1, 2, 3]
    for n, row in rows.items():
        # the server counts words of every message: n user turns and the n − 1 replies
        assert row["input_per_request"] == n * IN + (n - 1) * OUT
        # cached: the previous turn's prompt, in whole blocks (the replies are not cached
        # as they are generated, so the last reply's block is new)
        assert row["cached_per_request"] == (_units(n - 1) // BLOCK * BLOCK if n > 1 else 0)
    # the truth for the totals: the server's own counter of the tokens it served cached
    cache = summary["prefix_cache"]
    assert cache["cached_tokens"] == metrics["vllm:prefix_cache_hits_total"]
    assert cache["cached_tokens"] > 0
    assert cache["hit_rate"] == pytest.approx(
        metrics["vllm:prefix_cache_hits_total"] / metrics["vllm:prompt_tokens_total"], rel=1e-3)
    assert summary["requests"]["ok"] == 4 * TURNS


async def test_think_time_between_turns_only(tmp_path):
    think = 0.4
    async with running_sim() as sim:
        await _conversations(sim, tmp_path, "--concurrency=1", f"--requests={2 * TURNS}",
                             f"--think-time={think}")
        arrivals = await server_arrivals(sim)
    assert len(arrivals) == 2 * TURNS
    gaps = np.diff(arrivals)
    within = np.delete(gaps, TURNS - 1)  # every gap but the one to the second conversation
    assert within.min() >= think
    # a new conversation starts at once: the gap is the last turn's own time (well under)
    assert gaps[TURNS - 1] < think


def test_turns_refused_where_a_conversation_cannot_be():
    for flags, words in ((["--mode=open"], "closed loop"), (["--api=completions"], "chat API"),
                         (["--think-time=2"], "give --turns too")):
        turns = [] if words == "give --turns too" else ["--turns=2"]
        done = tokentop("run", "--headless", "--duration=1", *turns, *flags)
        assert done.returncode == 2
        assert words in done.stderr and "Traceback" not in done.stderr


def _sharegpt(path, humans: list[int], replies: list[int]) -> None:
    turns = []
    for i, (h, r) in enumerate(zip(humans, replies, strict=True)):
        turns.append({"from": "human", "value": " ".join(f"h{i}w{k}" for k in range(h))})
        turns.append({"from": "gpt", "value": " ".join(f"g{i}w{k}" for k in range(r))})
    path.write_text(json.dumps([{"conversations": turns}]))


async def test_sharegpt_conversations_with_their_own_turns_and_reply_lengths(tmp_path):
    humans, replies = [10, 20, 30], [5, 7, 9]
    path = tmp_path / "share.json"
    _sharegpt(path, humans, replies)
    async with running_sim() as sim:
        summary, _ = await _conversations(
            sim, tmp_path, "--concurrency=1", "--requests=6", f"--dataset=sharegpt:{path}",
            "--output-tokens=dataset", "--turns=5")  # more than the conversation has: 3
        metrics = await scrape(sim.url.removesuffix("/v1") + "/metrics")
    rows = {r["turn"]: r for r in summary["turns"]}
    assert sorted(rows) == [1, 2, 3]
    for n in rows:
        # the human turns so far and the replies to the earlier ones (the server generated
        # exactly the file's reply lengths, and its text is what goes back)
        assert rows[n]["input_per_request"] == sum(humans[:n]) + sum(replies[:n - 1])
    assert metrics["vllm:generation_tokens_total"] == 2 * sum(replies)


@pytest.mark.parametrize("warmup", ["0", "1"])
async def test_per_turn_rows_cover_the_runs_window_as_every_other_count(tmp_path, warmup):
    """Each Snapshot's per-turn rows are its own (a Snapshot is a value): the summary's rows
    add up to the requests the summary counts, without the warm-up and without the drain."""
    async with running_sim() as sim:
        summary, _ = await _conversations(sim, tmp_path, "--concurrency=2", "--duration=3",
                                          f"--warmup={warmup}")
    rows = summary.get("turns")
    assert rows, "the turns section is missing"
    ok = summary["requests"]["ok"]
    assert ok > 0 and sum(r["requests"] for r in rows) == ok, (rows, ok)


@pytest.mark.parametrize("reasoning", [0, 4])
async def test_a_turns_asked_length_is_the_servers_count_of_what_was_sent(tmp_path, reasoning):
    """The asked prompt length of a turn is its history's: the user messages and the replies'
    answers, and never a reasoning model's reasoning, which is not sent back. The truth: the
    server's usage.prompt_tokens of every turn (the simulator counts the words of every
    message, and a reply's words are its answer tokens)."""
    async with running_sim(reasoning_tokens=reasoning) as sim:
        summary, _ = await _conversations(sim, tmp_path, "--concurrency=2",
                                          f"--requests={4 * TURNS}")
    assert summary["requests"]["ok"] == 4 * TURNS
    rows = {r["turn"]: r for r in summary["turns"]}
    for n, row in rows.items():
        assert row["input_per_request"] == n * IN + (n - 1) * (OUT - reasoning)
    prompt = summary["tokens"]["input_per_request"]
    assert prompt["asked"] == prompt["server"] and not prompt["differs"], prompt
