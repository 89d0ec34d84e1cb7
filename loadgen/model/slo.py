"""SLOs: per-request limits (goodput), whole-run thresholds, and judging them, once.

`--slo` mixes two kinds of limits. Per request (`ttft<500ms,tpot<50ms`): a request
inside all of them is "good", and goodput is good requests per second; the worker
judges each request with `Slo.met`. Whole run (`ttft_p99<1s`, `error_rate<0.1%`,
`output_tok_s>1000`, and the stability of the whole run: `availability>99.9%`,
`outages<1`): each threshold passes or fails on a window's statistics; the
run's summary, the live watch (breach/recovery events), the auto-ramp, the soak
report and the console's colours all judge with `Threshold.passes` / `holds`.
Latencies are in µs everywhere here.
"""

from __future__ import annotations

import re

import msgspec

from loadgen.model import units


class SloError(ValueError):
    """A `--slo` text that cannot be read; str(e) is the message for the user."""


def holds(measured: float, op: str, limit: float) -> bool:
    """`measured op limit`, for the four comparisons an SLO can make."""
    return {"<": measured < limit, "<=": measured <= limit, ">": measured > limit,
            ">=": measured >= limit}[op]


class Slo(msgspec.Struct, kw_only=True, frozen=True):
    """Per-request limits for goodput, in µs; None = not set."""

    ttft_us: float | None = None
    tpot_us: float | None = None
    e2e_us: float | None = None

    def met(self, ttft: float, tpot: float | None, e2e: float) -> bool:
        if self.ttft_us is not None and ttft > self.ttft_us:
            return False
        if self.tpot_us is not None and tpot is not None and tpot > self.tpot_us:
            return False
        return not (self.e2e_us is not None and e2e > self.e2e_us)

    @property
    def text(self) -> str:
        """The limits in --slo's words ("ttft<2.00 s, tpot<100 ms"), for the rows that use
        them."""
        return ", ".join(f"{name}<{units.ms(us)}" for name, us in (
            ("ttft", self.ttft_us), ("tpot", self.tpot_us), ("e2e", self.e2e_us))
            if us is not None)


def parse_us(text: str) -> float:
    """A time with its unit, in µs (units.parse_latency_us, as every flag taking a time
    reads it). A bare number is refused: `ttft<20` could be 20 ms or 20 s, and guessing
    silently judges a run against a limit 1000× off."""
    return _read(units.parse_latency_us, text)


def _read(parse, text: str) -> float:
    try:
        return parse(text.strip())
    except units.UnitError as e:
        raise SloError(str(e)) from None


class Threshold(msgspec.Struct, frozen=True):
    """A whole-run pass/fail limit, k6 style: `ttft_p99<500ms`, `error_rate<0.1%`."""

    metric: str  # ttft | itl | tpot | e2e | error_rate | req_s | output_tok_s
    stat: str | None  # p50 | p90 | p99 | p99.9 | max | mean (latencies only)
    op: str  # < | <= | > | >=
    value: float  # µs for latencies, a fraction for error_rate, per second for rates
    text: str  # as the user wrote it, for reports

    def passes(self, measured: float | None) -> bool:
        if measured is None:
            return False
        return holds(measured, self.op, self.value)


class Slos(msgspec.Struct, frozen=True):
    per_request: Slo | None  # goodput: each request within these
    thresholds: list[Threshold]  # the run passes when all hold


_LATENCIES = ("ttft", "itl", "tpot", "e2e")
# the whole-run rates an SLO may name, and the unit each is shown in
_RATES = {"req_s": "req/s", "output_tok_s": "tok/s", "goodput_req_s": "req/s"}
# the whole run's stability (loadgen.model.outage): a share of the time, and a count
_FRACTIONS = ("error_rate", "availability")
_COUNTS = ("outages",)
_STATS = ("p50", "p90", "p99", "p99.9", "max", "mean")
_SLO_PART = re.compile(
    r"^\s*([a-z0-9_]+?)(?:_(" + "|".join(re.escape(s) for s in _STATS) + r"))?"
    r"\s*(<=|<|>=|>|=)\s*(.+)$"
)


def parse_slos(text: str | None) -> Slos:
    """`--slo` parts, comma-separated:

    ttft<500ms, tpot<50ms, e2e<10s   per request: a request inside all of them is "good"
                                     (goodput = good requests per second)
    ttft_p99<500ms, itl_p99.9<80ms   whole run: pass/fail thresholds (exit code 3 on fail)
    error_rate<0.1%, output_tok_s>1000, req_s>=5
    """
    if not text:
        return Slos(None, [])
    per_request: dict[str, float] = {}
    thresholds: list[Threshold] = []
    for part in text.split(","):
        m = _SLO_PART.match(part.strip().lower())
        if not m:
            raise SloError(f"bad --slo part {part.strip()!r}: use e.g. ttft<500ms, "
                              "ttft_p99<500ms or error_rate<1%")
        metric, stat, op, value = m.groups()
        op = "<=" if op == "=" else op
        if metric in _LATENCIES and stat is None:
            if op not in ("<", "<="):
                raise SloError(f"per-request limit {part.strip()!r} must be an upper bound")
            per_request[f"{metric}_us"] = parse_us(value)
        elif metric in _LATENCIES:
            thresholds.append(Threshold(metric, stat, op, parse_us(value), part.strip()))
        elif metric in _FRACTIONS and stat is None:
            thresholds.append(Threshold(metric, None, op, _read(units.parse_fraction, value),
                                        part.strip()))
        elif metric in _COUNTS and stat is None:
            thresholds.append(Threshold(metric, None, op, _read(units.parse_whole, value),
                                        part.strip()))
        elif metric in _RATES and stat is None:
            thresholds.append(Threshold(metric, None, op, _read(units.parse_rate, value),
                                        part.strip()))
        else:
            raise SloError(f"unknown --slo metric in {part.strip()!r}: latencies "
                              f"{', '.join(_LATENCIES)} (optionally _p99 etc.), error_rate, "
                              "req_s, output_tok_s, goodput_req_s, availability, outages")
    return Slos(Slo(**per_request) if per_request else None, thresholds)


def measured_value(th: Threshold, latency: dict[str, dict], rates: dict) -> float | None:
    """What a threshold compares: a latency statistic (µs) or a whole-run rate."""
    if th.stat is not None:
        return (latency.get(th.metric) or {}).get(th.stat)
    return rates.get(th.metric)


def evaluate_thresholds(thresholds: list[Threshold], latency: dict[str, dict],
                        rates: dict) -> list[dict]:
    """Per threshold: text, measured (in the threshold's unit), pass/fail."""
    out = []
    for th in thresholds:
        measured = measured_value(th, latency, rates)
        out.append({
            "text": th.text, "metric": th.metric, "stat": th.stat, "op": th.op,
            "limit": th.value, "measured": measured,
            "unit": _unit(th),
            "passed": th.passes(measured),
            "shown": _shown(th, measured),
        })
    return out


def _unit(th: Threshold) -> str:
    if th.stat is not None:
        return "us"
    if th.metric in _FRACTIONS:
        return "fraction"
    return "count" if th.metric in _COUNTS else "per_s"


def _shown(th: Threshold, measured: float | None) -> str:
    if measured is None:
        return f"{th.text}: no data (fails)"
    if th.stat is not None:
        m = units.ms(measured)
    elif th.metric in _FRACTIONS:
        m = units.pct(measured)
    elif th.metric in _COUNTS:
        m = units.count(measured)
    else:
        m = units.rate(measured, _RATES.get(th.metric, "/s"))
    return f"{th.text}: measured {m}"


def rates_from(ok: int, failed: int, good: int, out_tok: int, seconds: float) -> dict:
    n = ok + failed
    return {
        "error_rate": failed / n if n else None,
        "req_s": ok / seconds if seconds > 0 else None,
        "output_tok_s": out_tok / seconds if seconds > 0 else None,
        "goodput_req_s": good / seconds if seconds > 0 else None,
    }


