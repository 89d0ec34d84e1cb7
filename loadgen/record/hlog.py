"""The HdrHistogram interval log format (latency.hlog), written line by line.

The lines are the standard ones (as HdrHistogram's Java HistogramLogWriter writes
them, log format version 1.2), so HistogramLogProcessor, HdrHistogram's plotters
and `hdrh.log.HistogramLogReader` read the file:

    #[Histogram log format version 1.2]
    #[StartTime: 1718000000.000 (seconds since epoch), 2024-06-10 06:13:20]
    #[BaseTime: 1718000000.000 (seconds since epoch)]
    "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
    Tag=ttft,0.000,0.500,12.345,HISTFAAAA…

Timestamps are seconds relative to BaseTime (= StartTime, the run's start); the max
is in milliseconds (the histograms hold µs, so the max-value unit ratio is 1000).
We do not use `hdrh.log.HistogramLogWriter`: in hdrhistogram 0.10.8 it writes a
broken StartTime line (`datetime.iso_format`), no tags, and never flushes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from hdrh.histogram import HdrHistogram

LOG_FORMAT_VERSION = "1.2"
LEGEND = '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'
MAX_VALUE_UNIT_RATIO = 1000.0  # µs → ms in the Interval_Max column


def header(start_time: float, comment: str | None = None) -> bytes:
    """The header lines of one log file (each rotated part gets its own)."""
    when = time.strftime("%a %b %d %H:%M:%S %Z %Y", time.localtime(start_time))
    lines = []
    if comment:
        lines.append(f"#[{comment}]")
    lines += [
        f"#[Histogram log format version {LOG_FORMAT_VERSION}]",
        f"#[StartTime: {start_time:.3f} (seconds since epoch), {when}]",
        f"#[BaseTime: {start_time:.3f} (seconds since epoch)]",
        LEGEND,
    ]
    return ("\n".join(lines) + "\n").encode()


def max_value_us(blob: str) -> int:
    """The highest recorded value of an encoded histogram (µs, highest equivalent value)."""
    h = HdrHistogram.decode(blob.encode("ascii"))
    try:
        return int(h.get_max_value())
    finally:
        # hdrh's histogram and its encoder point at each other: without this, every
        # decoded 184 KB counts array waits for the cyclic GC (RSS creeps up meanwhile)
        h.encoder = None


def interval_line(tag: str, start_s: float, length_s: float, blob: str,
                  max_us: int | None = None) -> bytes:
    """`Tag=<tag>,<start>,<length>,<max ms>,<base64 V2 histogram>` (times relative to BaseTime)."""
    if max_us is None:
        max_us = max_value_us(blob)
    max_ms = max_us / MAX_VALUE_UNIT_RATIO
    return f"Tag={tag},{max(0.0, start_s):.3f},{length_s:.3f},{max_ms:.3f},{blob}\n".encode()


def tick_lines(hist: Mapping[str, str], t: float, interval: float, start_time: float) -> bytes:
    """One tick's lines, a metric a line in `hist`'s order: what the recorder appends for a
    Snapshot (t, interval, hist) of a run that started at `start_time`, and what a resume
    appends again for a tick whose lines a full disk or a kill cut short."""
    start = t - interval - start_time
    return b"".join(interval_line(metric, start, interval, blob) for metric, blob in hist.items())


def tag_lines(data: bytes) -> list[bytes]:
    """The interval lines (each with its newline) of a log's complete lines."""
    return [line + b"\n" for line in data.split(b"\n") if line.startswith(b"Tag=")]
