"""ReplaySource: pacing by speed, pause, seek (fast seeks add up, held within the
recording), holding at the end, and following a run that is still written."""

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


async def until(cond, what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.01)


async def playing(src: ReplaySource, got: list[Snapshot]) -> asyncio.Task:
    await src.start()

    async def consume() -> None:
        async for s in src.snapshots():
            got.append(s)

    return asyncio.create_task(consume())


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
    await until(lambda: got, "the first Snapshot")
    await asyncio.sleep(0.2)  # nothing more may come: a fixed wait is the only way to see it
    assert [s.seq for s in got] == [0]  # ×1: the next one is a second away
    t0 = time.monotonic()
    await src.control(Control(op="replay_speed", value=100.0))
    await until(lambda: len(got) >= 11, "ten more Snapshots at ×100")
    assert time.monotonic() - t0 < 1.5  # ten seconds of recording, at ×1 ten seconds
    await src.control(Control(op="pause"))
    await asyncio.sleep(0.05)
    n = len(got)
    await asyncio.sleep(0.3)
    assert len(got) == n  # paused
    await src.control(Control(op="seek", value=300.0))
    await src.control(Control(op="resume"))
    await until(lambda: any(e.kind == "replay" and "seek to 300" in e.message
                            for s in got[n:] for e in s.events), "the seek to 300 s")
    after = got[n:]
    assert after[0].elapsed >= 300.0 - 60.0  # preroll: the minute before
    await src.control(Control(op="seek_by", value=-250.0))  # backwards: seq goes down
    await until(lambda: min((s.seq for s in got[n + len(after):]), default=400) < 100,
                "Snapshots from before 100 s again")
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
    await until(lambda: got == [0, 1, 2], "what is written so far")
    for i in range(3, 6):
        rec.write(snap(i))
    await until(lambda: got == list(range(6)), "what is written next")
    rec.close()
    await asyncio.wait_for(task, 3)  # the manifest says finished: the replay ends


async def test_not_a_run_directory(tmp_path):
    with pytest.raises(SourceError, match="not a tokentop run directory"):
        await ReplaySource(tmp_path).start()


async def test_seeks_add_up_while_one_is_under_way(tmp_path):
    recorded(tmp_path, 400)
    src = ReplaySource(tmp_path / "run", speed=1.0)
    got: list[Snapshot] = []
    task = await playing(src, got)
    await until(lambda: got, "the first Snapshot")
    await src.control(Control(op="pause"))
    for _ in range(3):  # three presses before the replay has moved at all
        await src.control(Control(op="seek_by", value=30.0))
    # paused, the seek still shows where it went: the first Snapshot at 1 + 90 s
    await until(lambda: src.position == 91.0, "three seeks of 30 s from 1 s")
    assert got[-1].elapsed == 91.0 and not src.status().replay.at_end
    await src.control(Control(op="seek_by", value=-30.0))
    await src.control(Control(op="seek_by", value=-1000.0))  # held at the start
    await until(lambda: src.position == 1.0, "back to the start")
    await src.control(Control(op="stop"))
    await asyncio.wait_for(task, 2)


async def test_held_at_the_end_a_seek_goes_back(tmp_path):
    recorded(tmp_path, 20)
    src = ReplaySource(tmp_path / "run", speed=0, hold=True)
    got: list[Snapshot] = []
    task = await playing(src, got)
    await until(lambda: src.status().replay.at_end, "the end of the recording")
    assert src.status().replay.length == 20.0 and len(got) == 20
    assert any("end of the recording" in e.message for e in got[-1].events)
    assert not task.done()  # held: still there for a seek
    await src.control(Control(op="pause"))
    await src.control(Control(op="seek_by", value=-5.0))
    await until(lambda: src.position == 15.0, "5 s back from the end")
    await src.control(Control(op="seek_by", value=100.0))  # held at the end
    await until(lambda: src.status().replay.at_end, "the end again")
    assert src.position == 20.0
    await src.control(Control(op="stop"))
    await asyncio.wait_for(task, 2)
