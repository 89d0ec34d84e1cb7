"""Auto-ramp against the simulator: it climbs, then settles at the SLO boundary."""

from __future__ import annotations

from loadgen.model.slo import parse_slos
from loadgen.model.snapshot import Control, Counters
from loadgen.run.auto_ramp import AutoRamp
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


def _ramp_on(tok_s, slos: str | None = None) -> AutoRamp:
    """An AutoRamp fed ticks of a made-up server whose output tok/s at n streams is
    tok_s(n) (a request completing every tick), until it settles; bounded."""
    ramp = AutoRamp(parse_slos(slos), hold_s=2.0, warmup_s=0.5)
    counters, t, tick = Counters(), 0.0, 0.25
    for _ in range(2000):
        t += tick
        counters.requests_ok += 1
        counters.requests_good += 1
        counters.output_tokens += round(tok_s(ramp.load) * tick)
        ramp.observe(t, {}, counters)
        if ramp.settled:
            return ramp
    raise AssertionError("the auto-ramp did not settle")


def _engine(slots: int, refill_gain: float = 0.0):
    """A batch engine by hand (the simulator's default step costs), flat past its slots;
    `refill_gain`: the few % one more stream than slots buys (a slot no longer waits for
    the client's next request), which is not more capacity."""
    def tok_s(n: int) -> float:
        running = min(n, slots)
        extra = 1.0 + (refill_gain if n > slots else 0.0)
        return extra * 1000.0 * running / (6.0 + 0.35 * running)
    return tok_s


def test_without_slo_the_knee_rule_settles_at_the_slot_count():
    ramp = _ramp_on(_engine(8))
    assert ramp.by_knee and ramp.load == 8
    # doubling to 16 fails, then 12 and 10; 8 → 10 is 1.25×, where it stops narrowing
    assert [load for load, _, _ in ramp.history] == [1, 2, 4, 8, 16, 12, 10]
    assert ramp.why[10].startswith("+0.0% tok/s") and "under 0.2" in ramp.why[10]
    assert ramp.describe(0.0).startswith("auto-ramp settled at 8 streams (the highest step "
                                         "before throughput stopped rising; 10 failed: ")


def test_a_refilled_slot_is_not_read_as_capacity():
    # +3 % at 9 streams over 8 is scaling 0.25 over 1.125×: read that fine, the ramp would
    # pass 9; it never judges a step that close, so it settles at the slots
    assert _ramp_on(_engine(8, refill_gain=0.03)).load == 8
    assert _ramp_on(_engine(16, refill_gain=0.03)).load == 16

