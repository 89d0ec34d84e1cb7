"""Faults on demand: what the simulator does wrong, when asked, and how often it did.

Settings come from `--fault-*` flags at start and from `POST /sim/faults`
(loopback only) mid-run; `GET /sim/faults` returns the settings and the
counters of what was actually injected, so a test can check that a client saw
exactly that.

Per-request faults are exclusive: each request draws one number from a seeded
RNG (only while some rate is non-zero) and gets at most one of them, in this
order of the cumulative rates:

| fault            | what the client gets                                   | client kind      |
| ---------------- | ------------------------------------------------------ | ---------------- |
| `error_rate`     | HTTP 500 with an OpenAI-style error body               | http_5xx         |
| `rate_limit_rate`| HTTP 429 with `Retry-After: retry_after_s`             | http_429         |
| `drop_rate`      | the connection closes mid-stream, no terminating chunk | stream_broken    |
| `malformed_rate` | one malformed chunk mid-stream (`malformed_kind`)      | malformed_chunk  |
| `empty_choices_rate` | every chunk has `"choices": []`, then [DONE]       | empty_response   |
| `stall_rate`     | the stream pauses `stall_s` mid-way, then goes on      | (none: long ITL) |

500 and 429 apply to every request; the stream faults apply to streamed
requests only (a whole response draws them too, so the RNG sequence does not
depend on the mix, but nothing is injected and nothing counted).

Global faults:

* `slow_first_byte_ms`: every request waits this long before anything is sent;
* `spike_every_s` / `spike_ms`: every so often one engine step takes `spike_ms`
  longer (a stop-the-world GC pause: every running stream sees it at once);
* `outage_s` (with `outage_after_s`): a restart. The listening socket is really
  closed for `outage_s` seconds (new connections are refused by the kernel),
  every open connection is dropped, the engine's /metrics counters start again
  from zero, and the same port is listened on again afterwards. Refused
  connects never reach the simulator, so they cannot be counted here: the
  counters say how many outages began (`outage`) and how many in-flight
  requests they cut (`outage_dropped`).

`malformed_kind`: `bad_json` (a chunk whose JSON is cut short), `missing_data`
(a chunk's JSON on a line without the `data:` field name), `split_utf8` (a
two-byte character split across two SSE events, so each event is invalid UTF-8).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields
from typing import Any

MALFORMED_KINDS = ("bad_json", "missing_data", "split_utf8")

# The exclusive per-request faults, in draw order: (rate field, counter name)
REQUEST_FAULTS = (
    ("error_rate", "http_500"),
    ("rate_limit_rate", "http_429"),
    ("drop_rate", "drop"),
    ("malformed_rate", "malformed"),
    ("empty_choices_rate", "empty_choices"),
    ("stall_rate", "stall"),
)
STREAM_ONLY = frozenset({"drop", "malformed", "empty_choices", "stall"})

COUNTERS = (
    "http_500",
    "http_429",
    "drop",
    "malformed",
    "empty_choices",
    "stall",
    "slow_first_byte",
    "spike",
    "outage",
    "outage_dropped",
)


@dataclass
class FaultConfig:
    """Fault settings; the names are those of the JSON body and of `--fault-<name>`."""

    error_rate: float = 0.0
    rate_limit_rate: float = 0.0
    retry_after_s: float = 1.0
    slow_first_byte_ms: float = 0.0
    stall_rate: float = 0.0
    stall_s: float = 3.0
    drop_rate: float = 0.0
    malformed_rate: float = 0.0
    malformed_kind: str = "bad_json"
    empty_choices_rate: float = 0.0
    outage_s: float = 0.0  # > 0: one outage of this length, `outage_after_s` from now
    outage_after_s: float = 0.0
    spike_every_s: float = 0.0
    spike_ms: float = 0.0
    seed: int = 1

    def __post_init__(self) -> None:
        total = 0.0
        for name, _ in REQUEST_FAULTS:
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {rate}")
            total += rate
        if total > 1.0 + 1e-9:
            raise ValueError(f"the per-request fault rates add up to {total:g}, more than 1")
        for name in ("retry_after_s", "slow_first_byte_ms", "stall_s", "outage_s",
                     "outage_after_s", "spike_every_s", "spike_ms"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.malformed_kind not in MALFORMED_KINDS:
            raise ValueError(f"malformed_kind must be one of {', '.join(MALFORMED_KINDS)}")

    def updated(self, changes: dict[str, Any]) -> FaultConfig:
        """A copy with `changes` applied; raises ValueError on unknown names or bad values."""
        known = {f.name: f.type for f in fields(self)}
        values = asdict(self)
        for name, value in changes.items():
            if name not in known:
                raise ValueError(f"unknown fault setting {name!r}")
            if name == "malformed_kind":
                if not isinstance(value, str):
                    raise ValueError("malformed_kind must be a string")
            elif name == "seed":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError("seed must be an integer")
            elif not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"{name} must be a number")
            values[name] = value
        return FaultConfig(**values)

    def active(self) -> list[str]:
        """`name=value` for each setting that differs from no faults at all, in field order.

        The seed is left out: it picks which requests a fault hits, not what the faults are.
        A setting that only shapes a fault (stall_s, retry_after_s …) shows once changed,
        even while that fault is off: what is printed is what was asked for.
        """
        plain = FaultConfig()
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "seed" and value != getattr(plain, f.name):
                out.append(f"{f.name}={value}" if isinstance(value, str) else
                           f"{f.name}={value:g}")
        return out


class Faults:
    """The live settings, the seeded draw, and the injected counters."""

    def __init__(self, cfg: FaultConfig | None = None) -> None:
        self.injected = dict.fromkeys(COUNTERS, 0)
        self.cfg = FaultConfig()
        self._thresholds: tuple[tuple[float, str], ...] = ()
        self._rng = random.Random()
        self.apply(cfg or FaultConfig())

    def apply(self, cfg: FaultConfig) -> None:
        """New settings; the RNG is reseeded whenever the seed is given anew."""
        self.cfg = cfg
        self._rng = random.Random(cfg.seed)
        acc = 0.0
        thresholds = []
        for name, counter in REQUEST_FAULTS:
            rate = getattr(cfg, name)
            if rate > 0:
                acc += rate
                thresholds.append((acc, counter))
        self._thresholds = tuple(thresholds)

    def draw(self, *, stream: bool) -> str | None:
        """The fault for the next request (a counter name), or None."""
        if not self._thresholds:
            return None
        u = self._rng.random()
        for limit, counter in self._thresholds:
            if u < limit:
                if not stream and counter in STREAM_ONLY:
                    return None
                return counter
        return None

    def count(self, counter: str, n: int = 1) -> None:
        self.injected[counter] += n

    def snapshot(self, *, outage_active: bool) -> dict[str, Any]:
        return {
            "settings": asdict(self.cfg),
            "injected": dict(self.injected),
            "outage_active": outage_active,
        }
