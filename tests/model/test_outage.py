"""The one definition of an outage (loadgen.model.outage) over synthetic tick sequences:
isolated errors among long streams are errors; a span of connect errors is one outage,
dated from its start, with an exact MTTR; a recording gap neither ends an outage nor
counts in it; every stream stalled with no token is a frozen server, a stall with tokens
arriving elsewhere is not."""

from __future__ import annotations

from loadgen.model.outage import STALL_AFTER_S, Change, OutageTracker, Tick

T0 = 1_700_000_000.0


def tick(i: int, dt: float, *, ok: int = 0, tokens: int = 0, errors: dict | None = None,
         in_flight: int = 0, stalled: int = 0, metrics_ok: bool | None = True,
         shift: float = 0.0, stalled_first: int = 0) -> Tick:
    """The i-th tick of `dt` seconds (ending at T0 + shift + (i + 1)·dt)."""
    return Tick(t=T0 + shift + (i + 1) * dt, interval=dt, ok=ok, tokens=tokens,
                errors=errors or {}, in_flight=in_flight, stalled=stalled,
                metrics_ok=metrics_ok, stalled_first=stalled_first)


def feed(ticks: list[Tick]) -> tuple[OutageTracker, list[Change], list[str]]:
    """Every change, and the health after each tick."""
    tracker = OutageTracker()
    changes: list[Change] = []
    health = []
    for t in ticks:
        changes += tracker.observe(t)
        health.append(tracker.health)
    return tracker, changes, health


def kinds(changes: list[Change]) -> list[str]:
    return [c.kind for c in changes]


def test_isolated_errors_among_long_streams_are_not_an_outage():
    """4 streams of 3 s, tokens counted only when a stream completes (the worst case: one
    completion a second, quiet ticks between), 500s and broken streams in quiet ticks, and
    one 2.5 s stretch with nothing but a 500: errors, never an outage."""
    dt = 0.25
    ticks = []
    for i in range(120):
        done = i % 4 == 3 and not 40 <= i < 50  # 40..49: 2.5 s without any completion
        errors = {"http_5xx": 1} if i in (5, 21, 45, 90) else \
            {"stream_broken": 1} if i in (13, 66) else {}
        ticks.append(tick(i, dt, ok=int(done), tokens=300 * done, errors=errors, in_flight=4))
    tracker, changes, health = feed(ticks)
    assert "outage" not in kinds(changes) and "outage" not in health
    assert tracker.outage_s == 0.0 and tracker.outage_since is None
    assert "degraded" in health  # 6 of ~35 finished requests failed: more than 5 %


def test_not_outage_evidence_is_not_an_outage():
    """10 s in which nothing succeeds but only 429s, 4xx and the client's own limits fail:
    the server said no (or the client could not ask), it is not out."""
    dt = 0.5
    ticks = [tick(i, dt, ok=2, tokens=20) for i in range(10)]
    ticks += [tick(i, dt, errors={"http_429": 2, "http_4xx": 1, "client_fd_limit": 1,
                                  "cancelled": 1}, in_flight=2) for i in range(10, 30)]
    _, changes, health = feed(ticks)
    assert "outage" not in kinds(changes) and set(health) == {"up"}


def test_idle_time_before_any_evidence_does_not_date_an_outage():
    """A stream waits 1 s for its first token, the load is paused for a minute (nothing in
    flight), then connects are refused: the outage starts with the refusals."""
    dt = 0.5
    ticks = [tick(i, dt, ok=1, tokens=9, in_flight=1) for i in range(4)]
    ticks += [tick(i, dt, in_flight=1) for i in range(4, 6)]
    ticks += [tick(i, dt) for i in range(6, 126)]
    ticks += [tick(i, dt, errors={"connect": 1}) for i in range(126, 134)]
    _, changes, _ = feed(ticks)
    assert kinds(changes) == ["outage"] and changes[0].outage.start == T0 + 63.0


def test_ten_seconds_of_connect_errors_is_one_backdated_outage_with_exact_mttr():
    """Refused connects, with the client backing off between them: the idle ticks between
    two refusals are inside the outage, which ends when a success comes."""
    dt = 0.5
    ticks = [tick(i, dt, ok=3, tokens=30, in_flight=3) for i in range(20)]  # up to T0+10
    for i in range(20, 40):  # T0+10 .. T0+20: refused, with a client backing off
        ticks.append(tick(i, dt, errors={"connect": 3} if i % 3 != 1 else {}, in_flight=0))
    ticks += [tick(i, dt, ok=3, tokens=30, in_flight=3) for i in range(40, 50)]
    tracker = OutageTracker()
    seen = []
    for t in ticks:
        for c in tracker.observe(t):
            seen.append((t.t - T0, c, tracker.outage_since, tracker.health))
    assert [c.kind for _, c, _, _ in seen] == ["outage", "recovery"]
    (t_out, began, since, health), (t_rec, ended, since_after, health_after) = seen
    # announced at the first refusal once held OUTAGE_MIN_S (13.0 is a backing-off tick),
    # dated from the start of the span
    assert t_out == 13.5 and since == T0 + 10.0 and health == "outage"
    assert began.level == "error" and "cannot reach the server" in began.message
    assert began.message.startswith("outage started 3.5 s ago")
    # ends at the start of the first tick with a success: exactly 10 s
    assert t_rec == 20.5 and ended.outage is began.outage
    assert ended.outage.end == T0 + 20.0 and ended.outage.duration_s == 10.0
    assert ended.message.startswith("recovered after 10.0 s")
    assert since_after is None and health_after == "up"
    assert ended.outage.failed == 3 * 14 and ended.outage.errors == {"connect": 42}
    assert tracker.outage_s == 10.0


def test_idle_ticks_just_before_the_recovery_do_not_lengthen_the_outage():
    """The last refusal at T0+18, then nothing tried until a success at T0+20: nothing says
    the server was still out after 18, so the outage ends there."""
    dt = 0.5
    ticks = [tick(i, dt, ok=3, tokens=30, in_flight=3) for i in range(20)]
    ticks += [tick(i, dt, errors={"connect": 3}) for i in range(20, 36)]  # T0+10 .. T0+18
    ticks += [tick(i, dt) for i in range(36, 40)]  # idle: nothing in flight, nothing sent
    ticks += [tick(i, dt, ok=3, tokens=30, in_flight=3) for i in range(40, 44)]
    tracker, changes, _ = feed(ticks)
    assert kinds(changes) == ["outage", "recovery"]
    o = changes[1].outage
    assert o.start == T0 + 10.0 and o.end == T0 + 18.0 and o.duration_s == 8.0
    assert tracker.outage_s == 8.0


def test_one_error_then_idle_time_is_an_error_not_an_outage():
    """Open loop at 0.2 req/s: one request gets a 500, nothing is in flight for 5 s, the
    next request succeeds. The failure did not persist: no outage, full availability."""
    dt = 0.5
    ticks = []
    for i in range(60):  # a request every 10 ticks: in flight for a tick, done in the next
        if i == 20:
            ticks.append(tick(i, dt, errors={"http_5xx": 1}))
        elif i % 10 == 0:
            ticks.append(tick(i, dt, in_flight=1))
        else:
            done = i % 10 == 1 and i != 21
            ticks.append(tick(i, dt, ok=int(done), tokens=10 * done))
    tracker, changes, health = feed(ticks)
    assert "outage" not in kinds(changes) and "outage" not in health
    assert tracker.outage_s == 0.0


def test_every_request_failing_at_a_low_rate_is_an_outage():
    """The same 0.2 req/s, every request failing from T0+10 on: the failure persists across
    the idle time between the requests, so it is one outage from the first failure."""
    dt = 0.5
    ticks = [tick(i, dt, ok=int(i % 10 == 0), tokens=10 * (i % 10 == 0)) for i in range(20)]
    ticks += [tick(i, dt, errors={"http_5xx": 1} if i % 10 == 0 else None)
              for i in range(20, 60)]
    _, changes, health = feed(ticks)
    assert kinds(changes) == ["outage"] and changes[0].outage.start == T0 + 10.0
    assert changes[0].t == T0 + 15.5  # at the second failure: it persisted ≥ OUTAGE_MIN_S
    assert health[-1] == "outage"


def test_a_long_wait_for_the_first_token_is_a_busy_server_not_a_frozen_one():
    """2 streams wait 7 s for their first token (a long prefill): the workers count them
    as first-token waits, /metrics answers: no outage. The same waits while /metrics has
    stopped answering are a frozen server."""
    dt = 0.5

    def rounds(metrics_ok: bool) -> list[Tick]:
        ticks = []
        for i in range(60):
            phase = i % 16  # 7 s waiting, then 1 s streaming, then the next request
            waiting = phase < 14
            ticks.append(tick(i, dt, in_flight=2, tokens=0 if waiting else 64,
                              ok=2 if phase == 15 else 0,
                              stalled=2 if waiting and phase >= 10 else 0,
                              stalled_first=2 if waiting and phase >= 10 else 0,
                              metrics_ok=True if i < 10 else metrics_ok))
        return ticks

    tracker, changes, health = feed(rounds(metrics_ok=True))
    assert "outage" not in kinds(changes) and "outage" not in health
    assert tracker.outage_s == 0.0
    _, changes, _ = feed(rounds(metrics_ok=False))
    assert "outage" in kinds(changes)
    assert next(c for c in changes if c.kind == "outage").outage.reason == "frozen"


def test_a_recording_gap_inside_an_outage_does_not_close_it_nor_count_in_it():
    dt = 0.5
    ticks = [tick(i, dt, ok=3, tokens=30, in_flight=3) for i in range(20)]
    ticks += [tick(i, dt, errors={"timeout": 1}, in_flight=3) for i in range(20, 30)]  # 5 s
    # 100 s nobody recorded (a resume), still timing out afterwards for 5 s, then up
    ticks += [tick(i, dt, errors={"timeout": 1}, in_flight=3, shift=100.0)
              for i in range(30, 40)]
    ticks += [tick(i, dt, ok=3, tokens=30, in_flight=3, shift=100.0) for i in range(40, 45)]
    _, changes, _ = feed(ticks)
    assert kinds(changes) == ["outage", "recovery"]
    o = changes[1].outage
    assert o is not None and o.start == T0 + 10.0 and o.end == T0 + 120.0
    assert o.gap_s == 100.0 and o.duration_s == 10.0


def test_a_gap_before_the_outage_is_held_does_not_reset_the_hold():
    """2 s of connect errors, a gap, 2 s more: held 4 s of recorded time, one outage."""
    dt = 0.5
    ticks = [tick(i, dt, ok=1, tokens=9, in_flight=1) for i in range(4)]
    ticks += [tick(i, dt, errors={"connect": 1}) for i in range(4, 8)]
    ticks += [tick(i, dt, errors={"connect": 1}, shift=30.0) for i in range(8, 12)]
    ticks += [tick(i, dt, ok=1, tokens=9, in_flight=1, shift=30.0) for i in range(12, 14)]
    _, changes, _ = feed(ticks)
    assert kinds(changes) == ["outage", "recovery"]
    assert changes[1].outage.duration_s == 4.0 and changes[1].outage.gap_s == 30.0


def test_every_stream_stalled_and_no_token_is_a_frozen_server():
    dt = 0.5
    ticks = [tick(i, dt, tokens=40, in_flight=4) for i in range(20)]  # streaming to T0+10
    # frozen at T0+10: nothing arrives; the workers call the streams stalled 5 s later
    n_quiet = int(STALL_AFTER_S / dt)
    ticks += [tick(i, dt, in_flight=4, stalled=4 if i >= 20 + n_quiet else 0)
              for i in range(20, 40)]
    ticks += [tick(i, dt, tokens=40, in_flight=4) for i in range(40, 44)]  # thawed at +20
    _, changes, _ = feed(ticks)
    assert kinds(changes) == ["stall", "outage", "recovery", "stall"]
    stall, began, ended, over = changes
    assert stall.level == "warn" and stall.message == (
        f"4 of 4 streams in flight have received nothing for ≥{STALL_AFTER_S:g} s "
        "(server frozen?)")
    assert stall.t == began.t == T0 + 10.0 + STALL_AFTER_S + dt
    assert began.outage.reason == "frozen" and "the server is frozen" in began.message
    assert began.outage.start == T0 + 10.0  # from when the tokens stopped
    assert ended.outage.duration_s == 10.0 and ended.message.endswith("tokens arrive again")
    assert over.level == "info" and over.message.startswith("stall over")


def test_a_stall_with_tokens_arriving_elsewhere_is_not_an_outage():
    """2 of 4 streams stalled for 15 s while the other 2 stream on (tokens, no completion
    yet) and one request fails with a 500: the tokens say the server is there."""
    dt = 0.5
    ticks = [tick(i, dt, tokens=40, in_flight=4) for i in range(10)]
    ticks += [tick(i, dt, tokens=20, in_flight=4, stalled=2,
                   errors={"http_5xx": 1} if i == 20 else None) for i in range(10, 40)]
    ticks += [tick(i, dt, tokens=40, in_flight=4) for i in range(40, 42)]
    _, changes, health = feed(ticks)
    assert kinds(changes) == ["stall", "stall"]  # once per episode, and its end
    assert changes[0].message.startswith("2 of 4 streams in flight")
    assert "outage" not in health and health[10:40] == ["degraded"] * 30
    assert health[-1] == "up"


def test_metrics_down_with_requests_failing_is_outage_evidence():
    """/metrics answered, then stops while requests fail with 401s and nothing succeeds:
    an outage (a proxy in front says no for a server that is gone); a /metrics that never
    answered is no evidence."""
    dt = 0.5
    up = [tick(i, dt, ok=2, tokens=20, in_flight=2) for i in range(10)]
    down = [tick(i, dt, errors={"http_4xx": 2}, in_flight=2, metrics_ok=False)
            for i in range(10, 20)]
    _, changes, _ = feed(up + down)
    assert kinds(changes) == ["outage"] and changes[0].outage.reason == "metrics"
    never = [tick(i, dt, ok=2, tokens=20, in_flight=2, metrics_ok=False) for i in range(10)]
    _, changes, _ = feed(never + down)
    assert changes == []
