"""How every PNG tokentop writes reads (the report's plots, sweep.png, compare's, the eval's
faults.png): postmortems paste them, so each says what it is of and its axes do not lie.

* the target is named the way the run names it: "embedded simulator", or the server's model
  and engine and the public URL's host (target_name); a throw-away 127.0.0.1 port the eval's
  own simulator listened on is never a legend;
* the load in words (load_words): "8 streams", "2 req/s poisson";
* latency on a log scale only when it spans decades, its ticks plain numbers (20, 50, 100;
  never 2×10^1): latency_y;
* counts and rates start at 0 (counts_from_zero): a 4 % dip is not drawn as a collapse;
* memory is given a span of at least MEMORY_SPAN_FRACTION of its level, or MEMORY_SPAN_MB
  (memory_span): a 0.3 MB step of a 43 MB process is noise, and looks it;
* event labels are thinned (thin_labels): those closer than LABEL_GAP of the axis are merged
  into one, and past LABELS_AT_MOST the rest are counted ("+k more"), never overprinted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

from loadgen.model.text import plain
from loadgen.model.urls import public_url

EMBEDDED_SIM = "embedded simulator"  # as the run, the sweep and the eval name it
LOG_WHEN_SPAN = 30.0  # latency: a log scale when its largest value is this many times its least
MEMORY_SPAN_FRACTION = 0.10
MEMORY_SPAN_MB = 4.0
LABEL_GAP = 0.03  # event labels closer than this fraction of the x axis are merged
LABELS_AT_MOST = 12  # event labels drawn on a plot at most (every event still gets its line)
LABEL_CHARS = 32  # an event label is cut to this
MODEL_CHARS = 48  # a model's name in a title or legend (a path can be long)


# ---- words -----------------------------------------------------------------------------------


def target_name(url: str | None, model: str | None = None, engine: str | None = None,
                simulated: bool = False) -> str:
    """The target as the run names it: the embedded simulator, else "MODEL on ENGINE at HOST"
    (what is known of it; the host from the public URL, never its credentials)."""
    if simulated or not url:
        return EMBEDDED_SIM
    host = urlsplit(public_url(url)).netloc or plain(url, 60)
    parts = [plain(model, MODEL_CHARS)] if model else []
    if engine and engine != "unknown":
        parts.append(f"on {plain(engine, 24)}")
    return " ".join([*parts, f"at {host}"]) if parts else host


def against(name: str) -> str:
    """"against the embedded simulator", "against m on vllm at gpu1:8000"."""
    return f"against {'the ' if name == EMBEDDED_SIM else ''}{name}"


def load_words(config: dict) -> str:
    """A run's load as its config (RunConfig's, as recorded) set it, in words."""
    if config.get("trace"):
        return "trace replay"
    if config.get("auto_ramp"):
        return "auto-ramp"
    if config.get("ramp"):
        return f"ramp {plain(str(config['ramp']), 40)}"
    if config.get("mode") == "open":
        rate = config.get("rate") or 0
        return "steered load (open loop)" if not rate else \
            f"{rate:g} req/s {config.get('arrival') or ''}".rstrip()
    n = config.get("concurrency") or 0
    return "steered load (closed loop)" if not n else f"{n} stream{'s' * (n != 1)}"


PHASE_DIR = re.compile(r"\.(try|r)\d+$")  # an eval's second try of a phase, its repeats


def phase_of(run_dir_name: str) -> str:
    """The eval's phase a run directory under OUT/runs/ is of: `long_tail.try2` → long tail."""
    return PHASE_DIR.sub("", run_dir_name).replace("_", " ")


# ---- axes ------------------------------------------------------------------------------------


def finite(values: Sequence[float | None] | np.ndarray) -> np.ndarray:
    a = np.asarray([np.nan if v is None else v for v in values], float)
    return a[np.isfinite(a)]


def latency_y(ax, values: Sequence[float | None] | np.ndarray, unit: str = "ms") -> None:
    """Log scale when the latencies span decades (LOG_WHEN_SPAN), with plain tick labels
    (1, 2, 5 a decade: 20, 50, 100), else linear; the unit on the axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    v = finite(values)
    v = v[v > 0]
    if len(v) and v.max() / v.min() > LOG_WHEN_SPAN:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel(f"{unit} (log scale)")
    else:
        ax.set_yscale("linear")
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        ax.set_ylabel(unit)


def bridged(x: np.ndarray, y: np.ndarray, max_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the finite points, joined into a line across gaps up to `max_gap` (a tick
    that saw no first token is no event) and broken across longer ones (the server said
    nothing for a while: the line must not pretend it did)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(y)
    if len(keep):  # the first and last times stay (no value there): the line's time span
        keep[0] = keep[-1] = True
    xs, ys = x[keep], y[keep]
    finite = np.flatnonzero(np.isfinite(ys))
    if len(finite) < 2:
        return xs, ys
    # a break is a NaN value at the gap's middle: the times stay finite (and in order)
    gaps = finite[1:][np.diff(xs[finite]) > max_gap]
    middle = (xs[gaps - 1] + xs[gaps]) / 2
    return np.insert(xs, gaps, middle), np.insert(ys, gaps, np.nan)


def counts_from_zero(ax) -> None:
    """A count or a rate: the axis starts at 0 (and has some height when all are 0)."""
    ax.set_ylim(bottom=0)
    if ax.get_ylim()[1] <= 0:
        ax.set_ylim(0, 1)


def memory_span(ax, values: Sequence[float | None] | np.ndarray) -> None:
    """At least MEMORY_SPAN_FRACTION of the level (or MEMORY_SPAN_MB) of height, centred on
    the values: a small step drawn full height reads as a leak."""
    v = finite(values)
    if not len(v):
        return
    lo, hi = float(v.min()), float(v.max())
    need = max(MEMORY_SPAN_FRACTION * abs(hi), MEMORY_SPAN_MB)
    if hi - lo >= need:
        return
    mid = (lo + hi) / 2
    bottom = max(0.0, mid - need / 2)
    ax.set_ylim(bottom, bottom + need)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)


# ---- event labels ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Label:
    at: float  # where it is drawn, in the axis' x units
    text: str


def cut(text: str, chars: int = LABEL_CHARS) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"


def thin_labels(marks: Sequence[tuple[float, str]], span: float, *, gap: float = LABEL_GAP,
                at_most: int = LABELS_AT_MOST) -> tuple[list[Label], int]:
    """(the labels to draw, how many events are left unlabelled). Events closer than `gap`
    of the axis' `span` to the first of a group share its label ("note (+3)"); past
    `at_most` labels the rest are only counted, for the legend's "+k more"."""
    groups: list[list[tuple[float, str]]] = []
    for at, text in sorted(marks, key=lambda m: m[0]):
        if groups and at - groups[-1][0][0] < gap * span:
            groups[-1].append((at, text))
        else:
            groups.append([(at, text)])
    labels = [Label(g[0][0], cut(g[0][1]) + (f" (+{len(g) - 1})" if len(g) > 1 else ""))
              for g in groups[:at_most]]
    return labels, sum(len(g) for g in groups[at_most:])
