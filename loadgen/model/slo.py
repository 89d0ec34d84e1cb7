"""SLOs: per-request limits (goodput), whole-run thresholds, and judging them, once.

`--slo` mixes two kinds of limits. Per request (`ttft<500ms,tpot<50ms`): a request
inside all of them is "good", and goodput is good requests per second; the worker
judges each request with `Slo.met`. Whole run (`ttft_p99<1s`, `error_rate<0.1%`,
`output_tok_s>1000`): each threshold passes or fails on a window's statistics; the
run's summary, the live watch (breach/recovery events), the auto-ramp, the soak
report and the console's colours all judge with `Threshold.passes` / `holds`.
Latencies are in µs everywhere here.
"""

from __future__ import annotations

import re

import msgspec


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


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|µs|ms|s)?\s*$")
_UNIT_US = {"us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}


def parse_us(text: str) -> float:
    """A time with its unit, in µs. A bare number is refused: `ttft<20` could be 20 ms or
    20 s, and guessing silently judges a run against a limit 1000× off."""
    m = _DURATION.match(text)
    if not m:
        raise SloError(f"bad time {text!r}: use e.g. 500ms, 2s or 800us")
    if m.group(2) is None:
        raise SloError(f"time {text.strip()!r} has no unit: write {m.group(1)}ms or "
                       f"{m.group(1)}s (units: ms, s, us)")
    return float(m.group(1)) * _UNIT_US[m.group(2)]


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
        elif metric == "error_rate" and stat is None:
            thresholds.append(Threshold(metric, None, op, _fraction(value), part.strip()))
        elif metric in ("req_s", "output_tok_s", "goodput_req_s") and stat is None:
            thresholds.append(Threshold(metric, None, op, _number(value), part.strip()))
        else:
            raise SloError(f"unknown --slo metric in {part.strip()!r}: latencies "
                              f"{', '.join(_LATENCIES)} (optionally _p99 etc.), error_rate, "
                              "req_s, output_tok_s, goodput_req_s")
    return Slos(Slo(**per_request) if per_request else None, thresholds)


def _fraction(text: str) -> float:
    t = text.strip()
    try:
        return float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise SloError(f"bad fraction {text!r}: use 0.001 or 0.1%") from None


def _number(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise SloError(f"bad number {text!r}") from None


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
            "unit": "us" if th.stat is not None else ("fraction" if th.metric == "error_rate"
                                                      else "per_s"),
            "passed": th.passes(measured),
            "shown": _shown(th, measured),
        })
    return out


def _shown(th: Threshold, measured: float | None) -> str:
    if measured is None:
        return f"{th.text}: no data (fails)"
    if th.stat is not None:
        m = f"{measured / 1e3:.1f}ms"
    elif th.metric == "error_rate":
        m = f"{measured * 100:.3g}%"
    else:
        m = f"{measured:.3g}/s"
    return f"{th.text}: measured {m}"


def rates_from(ok: int, failed: int, good: int, out_tok: int, seconds: float) -> dict:
    n = ok + failed
    return {
        "error_rate": failed / n if n else None,
        "req_s": ok / seconds if seconds > 0 else None,
        "output_tok_s": out_tok / seconds if seconds > 0 else None,
        "goodput_req_s": good / seconds if seconds > 0 else None,
    }


