"""Auto-ramp against the simulator: it climbs, then settles at the SLO boundary."""

from __future__ import annotations

from loadgen.model.snapshot import Control
from loadgen.run.config import RunConfig
from loadgen.run.coordinator import Coordinator
from loadgen.sim import SimConfig, start_sim


async def test_auto_ramp_settles_at_the_slot_limit():
    # 4 slots: past 4 streams a request waits a whole request (~30 steps ≈ 200 ms) for its
    # first token, so ttft_p99<60ms holds at 4 and fails at 8
    sim = await start_sim(SimConfig(slots=4), host="127.0.0.1", port=0)
    cfg = RunConfig(url=sim.url, concurrency=0, output_tokens="32", slo="ttft_p99<60ms",
                    workers=1, tick=0.25, drain_grace=1.0, auto_ramp_hold=1.5,
                    auto_ramp_warmup=1.0)
    coord = Coordinator(cfg)
    await coord.start()
    try:
        snaps = coord.snapshots()
        await coord.control(Control(op="auto_ramp", source="key"))
        loads = []
        async for snap in snaps:
            loads.append(snap.load.target_concurrency)
            if coord.auto is not None and coord.auto.settled:
                break
            assert snap.elapsed < 40, "auto-ramp did not settle in time"
        assert coord.auto.load == 4
        assert snap.load.note.startswith("auto-ramp settled at 4 streams")
        assert max(loads) >= 5  # it went past the boundary before settling back
        assert any(e.message.startswith("auto-ramp") for e in snap.events)
        # a manual key takes control back
        await coord.control(Control(op="add_concurrency", value=1, source="key"))
        assert coord.auto is None and coord.spec.concurrency == 5
        coord.request_stop("test over")
        async for _ in snaps:
            pass
    finally:
        await coord.close()
        await sim.close()
