"""A stall's length counts from the streams' last byte, not from when the workers could
first call them stalled (STALL_AFTER_S later): a 10 s freeze is a 10 s stall."""

from __future__ import annotations

from loadgen.model.outage import STALL_AFTER_S, OutageTracker, Tick

T0 = 1_700_000_000.0
DT = 0.5


def _tick(i: int, *, tokens: int = 0, stalled: int = 0) -> Tick:
    """The i-th tick (ending at T0 + (i + 1)·DT), 4 streams in flight."""
    return Tick(t=T0 + (i + 1) * DT, interval=DT, ok=0, tokens=tokens, errors={},
                in_flight=4, stalled=stalled, metrics_ok=True)


def test_a_stall_lasts_from_the_last_byte_to_the_first_again():
    frozen, thawed = 20, 34  # tokens stop at the start of tick 20 and come again in tick 34
    ticks = [_tick(i, tokens=40) for i in range(frozen)]
    # the workers call the 4 streams stalled once STALL_AFTER_S passed without a byte
    seen = frozen + int(STALL_AFTER_S / DT)
    ticks += [_tick(i, stalled=4 if i >= seen else 0) for i in range(frozen, thawed)]
    ticks += [_tick(i, tokens=40) for i in range(thawed, thawed + 4)]
    tracker = OutageTracker()
    stalls = [c for t in ticks for c in tracker.observe(t) if c.kind == "stall"]
    began, over = stalls
    freeze_s = (thawed - frozen) * DT  # 7 s, the ticks' own truth
    assert abs(over.seconds - freeze_s) <= DT, over
    assert abs(began.since - (T0 + frozen * DT)) <= DT, began
    assert over.since == began.since
    assert over.message.startswith(f"stall over after {over.seconds:.1f} s without data"), \
        over.message
