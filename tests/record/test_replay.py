"""ReplaySource: pacing by speed, pause, seek, and following a run that is still written."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from msgspec import to_builtins

from loadgen.model import hdr
from loadgen.model.snapshot import Control, Counters, LoadState, Snapshot, Target
from loadgen.model.source import SourceError
from loadgen.record.recorder import Recorder
from loadgen.record.replay import ReplaySource
from loadgen.run.config import RunConfig

T0 = 1_700_000_000.0


def snap(seq: int, tick: float = 1.0) -> Snapshot:
    idx, cnt = hdr.sparse_counts(np.array([1000.0, 2000.0]))
    return Snapshot(
        run_id="r", seq=seq, t=T0 + (seq + 1) * tick, elapsed=(seq + 1) * tick, interval=tick,
        target=Target(url="http://x/v1", model="m"), load=LoadState(state="running"),
        counters=Counters(requests_ok=seq), hist={"ttft": hdr.encode(hdr.dense_from_sparse(
            [(idx, cnt)]))},
    )


def recorded(tmp_path, n: int, *, finish: bool = True) -> Recorder:
    rec = Recorder.create(tmp_path / "run", to_builtins(RunConfig()), run_id="r")
    for i in range(n):
        rec.write(snap(i))
    if finish:
        rec.close()
    return rec


async def test_speed_paces_by_snapshot_time(tmp_path):
    recorded(tmp_path, 6)
    src = ReplaySource(tmp_path / "run", speed=20.0)  # 1 s ticks → 50 ms apart
    await src.start()
    assert "replay" in src.description
    t0 = time.monotonic()
    seqs = [s.seq async for s in src.snapshots()]
    took = time.monotonic() - t0
    assert seqs == list(range(6))
    assert 0.2 <= took < 1.5


async def test_pause_speed_and_seek_controls(tmp_path):
    recorded(tmp_path, 400)
    src = ReplaySource(tmp_path / "run", speed=1.0)
    await src.start()
    got: list[Snapshot] = []

    async def consume() -> None:
        async for s in src.snapshots():
            got.append(s)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    assert [s.seq for s in got] == [0]  # ×1: the next one is a second away
    await src.control(Control(op="replay_speed", value=100.0))
    await asyncio.sleep(0.3)
    assert 10 <= len(got) <= 60
    await src.control(Control(op="pause"))
    await asyncio.sleep(0.05)
    n = len(got)
    await asyncio.sleep(0.3)
    assert len(got) == n  # paused
    await src.control(Control(op="seek", value=300.0))
    await src.control(Control(op="resume"))
    await asyncio.sleep(0.3)
    after = got[n:]
    assert after and after[0].elapsed >= 300.0 - 60.0  # preroll: the minute before
    assert any(e.kind == "replay" and "seek to 300" in e.message
               for s in after for e in s.events)
    await src.control(Control(op="seek_by", value=-250.0))  # backwards: seq goes down
    await asyncio.sleep(0.3)
    assert min(s.seq for s in got[n + len(after):]) < 100
    await src.control(Control(op="stop"))
    await asyncio.wait_for(task, 2)


async def test_follow_a_run_that_is_still_written(tmp_path):
    rec = recorded(tmp_path, 3, finish=False)
    src = ReplaySource(tmp_path / "run", speed=0)  # as fast as possible
    await src.start()
    assert "following" in src.description
    got: list[int] = []

    async def consume() -> None:
        async for s in src.snapshots():
            got.append(s.seq)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.4)
    assert got == [0, 1, 2]
    for i in range(3, 6):
        rec.write(snap(i))
    await asyncio.sleep(0.6)
    assert got == list(range(6))
    rec.close()
    await asyncio.wait_for(task, 3)  # the manifest says finished: the replay ends


async def test_not_a_run_directory(tmp_path):
    with pytest.raises(SourceError, match="not a tokentop run directory"):
        await ReplaySource(tmp_path).start()
