"""The merged fleet view: exact percentiles, totals that never go backwards, read-only."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest
from scripted_source import make_snapshot

from loadgen.fleet.link import parse_broker_url
from loadgen.fleet.merged import FleetMergedSource
from loadgen.fleet.monitor import FleetMonitor
from loadgen.model import hdr
from loadgen.model.snapshot import Control, Counters
from loadgen.model.source import SourceError


def snap(run_id: str, i: int, values_us: list[float], later: float = 0.0):
    s = make_snapshot(i)
    dense = hdr.dense_from_sparse([hdr.sparse_counts(np.array(values_us))])
    return msgspec.structs.replace(s, run_id=run_id, seq=i, t=s.t + later,
                                   hist={"ttft": hdr.encode(dense)}, events=[])


async def test_merged_snapshots_add_histograms_and_keep_totals_across_a_restart():
    # no broker needed: the monitor is fed directly, as its MQTT session would feed it
    monitor = FleetMonitor(parse_broker_url("mqtt://127.0.0.1:1"), "lab")
    src = FleetMergedSource(monitor)
    monitor.take_snapshot("a", snap("ra", 0, [1000.0]))
    monitor.take_snapshot("b", snap("rb", 0, [50_000.0]))
    src._listen()  # what start() does once connected
    a_vals, b_vals = [1000.0, 2000.0, 3000.0], [40_000.0, 90_000.0]
    monitor.take_snapshot("a", snap("ra", 1, a_vals))
    monitor.take_snapshot("b", snap("rb", 1, b_vals))
    merged = src.merge()
    union = hdr.dense_from_sparse([hdr.sparse_counts(np.array(a_vals + b_vals))])
    assert np.array_equal(hdr.decode(merged.hist["ttft"]), union)  # exact, not averaged
    assert hdr.summarize(hdr.decode(merged.hist["ttft"]))["p99"] == hdr.summarize(union)["p99"]
    # counted from first sight: one tick of each agent (10 requests each)
    assert merged.counters.requests_ok == 20
    assert merged.load.target_concurrency == 128
    assert [g.name.split("/")[0] for g in merged.gpu.gpus] == ["a", "b"]
    # agent b restarts: its new run counts on top of what its first run added, from its
    # first tick on, in the counters as in the histograms (one request, one TTFT)
    first = msgspec.structs.replace(snap("rb2", 0, [10_000.0], later=60.0),
                                    counters=Counters(requests_ok=1))
    monitor.take_snapshot("b", first)
    later = src.merge()
    assert later.counters.requests_ok == 20 + 1
    assert int(hdr.decode(later.hist["ttft"]).sum()) == 1
    monitor.take_snapshot("b", snap("rb2", 1, [10_000.0], later=60.0))
    monitor.take_snapshot("a", snap("ra", 2, [1000.0]))
    last = src.merge()
    # a: 10 more; rb: the 10 it added before it restarted; rb2: all of its own 20
    assert last.counters.requests_ok == (10 + 10) + 10 + 20
    assert last.seq > later.seq > merged.seq
    with pytest.raises(SourceError, match="read-only"):
        await src.control(Control(op="add_concurrency", value=1))
    await src.close()
    await asyncio.sleep(0)
