"""Priority classes (`--mix`): a workload of named classes, each its share of the requests,
its lengths, its SLO and the priority it is sent with.

One `--mix` is one class, its words apart:

    --mix "interactive 20% in=128 out=64 priority=0 slo=ttft<200ms"
    --mix "batch 80% in=1024 out=512 priority=10 slo=ttft_p99<30s"

The name comes first, then its share (`20%` or `0.2`; the shares add up to 100 %), then
any of `in=` and `out=` (a length as --input-tokens takes it; the run's where not given),
`priority=` (an integer sent as the body's `priority`, as vLLM reads it with
`--scheduling-policy priority`: lower is served first; not sent where not given) and
`slo=` (limits as --slo takes them: per-request ones judge the class's goodput,
percentile ones pass or fail the class). A request's class is drawn by the shares from
the worker's seeded draws, so a run is the same mix every time.

Every request of a mix is measured in its class's own recorder (loadgen.worker.main), so
each class has its percentiles and counts beside the run's, which are their sum.
"""

from __future__ import annotations

import bisect
import random
import re

import msgspec

from loadgen.model.slo import Slo, SloError, Slos, parse_slos
from loadgen.worker.distributions import LengthDist, WorkloadError

MAX_CLASSES = 8  # a Snapshot carries every class each tick: kept to what a person reads
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,23}$")
_KEYS = ("in", "out", "priority", "slo")


class TrafficClass(msgspec.Struct, frozen=True, kw_only=True):
    """One class of a mix, as the workers draw and send it."""

    name: str
    share: float  # of all requests, 0 < share ≤ 1; a mix's add up to 1
    input_tokens: LengthDist | None = None  # None: the run's --input-tokens
    output_tokens: LengthDist | None = None  # None: the run's --output-tokens
    priority: int | None = None  # the body's "priority"; None: not sent
    slo: str | None = None  # as --slo takes it, checked when parsed

    def slos(self) -> Slos:
        return parse_slos(self.slo)

    @property
    def per_request(self) -> Slo | None:
        """The limits a request of this class must meet to be good (its goodput)."""
        return self.slos().per_request

    def describe(self) -> str:
        parts = [self.name, f"{self.share:.0%}"]
        if self.input_tokens is not None:
            parts.append(f"in {self.input_tokens}")
        if self.output_tokens is not None:
            parts.append(f"out {self.output_tokens}")
        if self.priority is not None:
            parts.append(f"priority {self.priority}")
        if self.slo:
            parts.append(f"SLO {self.slo}")
        return " ".join(parts)


def parse_mix(texts: list[str]) -> tuple[TrafficClass, ...]:
    """The classes of `--mix` texts (none: an empty mix, the run as ever); raises
    WorkloadError with the sentence for the user."""
    classes = tuple(parse_class(t) for t in texts)
    if not classes:
        return ()
    if len(classes) > MAX_CLASSES:
        raise WorkloadError(f"--mix takes at most {MAX_CLASSES} classes, not {len(classes)}")
    names = [c.name for c in classes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise WorkloadError(f"--mix names the class {twice[0]!r} twice: give each class once")
    total = sum(c.share for c in classes)
    if abs(total - 1.0) > 0.005:
        shares = " + ".join(f"{c.share:.1%}" for c in classes)
        raise WorkloadError(f"--mix shares must add up to 100 %: {shares} = {total:.1%}")
    return classes


def parse_class(text: str) -> TrafficClass:
    """One class of `--mix` text alone (its share not yet held against the others')."""
    words = text.split()
    if len(words) < 2:
        raise WorkloadError(f"bad --mix {text!r}: give a name and a share, e.g. "
                            "'interactive 20% in=128 out=64 priority=0 slo=ttft<200ms'")
    name, share, *rest = words
    if not _NAME.match(name):
        raise WorkloadError(f"bad --mix class name {name!r}: lower-case letters, digits, "
                            "- and _, starting with a letter, at most 24")
    fields: dict = {"name": name, "share": _share(share, name)}
    for word in rest:
        key, eq, value = word.partition("=")
        if not eq or key not in _KEYS or not value:
            raise WorkloadError(f"bad --mix part {word!r} of class {name}: use "
                                f"{', '.join(k + '=' for k in _KEYS)}")
        fields.update(_field(key, value, name))
    return TrafficClass(**fields)


def _share(text: str, name: str) -> float:
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise WorkloadError(f"bad --mix share {text!r} of class {name}: "
                            "a percentage (20%) or a fraction (0.2)") from None
    if not 0 < share <= 1:
        raise WorkloadError(f"--mix share of class {name} must be above 0 and at most 100 %")
    return share


def _field(key: str, value: str, name: str) -> dict:
    if key == "in":
        return {"input_tokens": LengthDist.parse(value)}
    if key == "out":
        return {"output_tokens": LengthDist.parse(value)}
    if key == "priority":
        try:
            return {"priority": int(value)}
        except ValueError:
            raise WorkloadError(f"bad --mix priority {value!r} of class {name}: "
                                "an integer (lower is served first)") from None
    try:
        parse_slos(value)
    except SloError as e:
        raise WorkloadError(f"--mix class {name}: {e}") from None
    return {"slo": value}


def class_limits(classes: tuple[TrafficClass, ...], run: Slo | None) -> list[Slo | None]:
    """Each class's per-request limits, as its requests are judged for goodput: its own,
    else the run's --slo. Where some class has limits, one with none has nothing to miss
    (Slo(): each of its completed requests is good), so the run's goodput is the sum of
    its classes'; where none has any, there is no goodput, as without a mix."""
    own = [c.per_request or run for c in classes]
    if all(s is None for s in own):
        return own
    return [s or Slo() for s in own]


def judges_goodput(run_slo: str | None, classes: tuple[TrafficClass, ...]) -> bool:
    """Whether a run's requests are judged for goodput: by the run's --slo or a class's."""
    return (parse_slos(run_slo).per_request is not None
            or any(c.per_request is not None for c in classes))


class ClassDraw:
    """Which class each request is, drawn by the shares."""

    def __init__(self, classes: tuple[TrafficClass, ...]) -> None:
        edges, acc = [], 0.0
        for c in classes:
            acc += c.share
            edges.append(acc)
        self._edges = edges
        self._last = len(classes) - 1

    def draw(self, rng: random.Random) -> int:
        return min(bisect.bisect_right(self._edges, rng.random() * self._edges[-1]), self._last)
