"""A request trace to replay (--trace FILE): when each request arrives, how long it is.

One request a line, JSONL or CSV, in any of these forms (the first that fits a line):

  Mooncake JSONL   {"timestamp": 1200, "input_length": 512, "output_length": 64,
                    "hash_ids": [0, 1]}                         (timestamp in ms)
  plain JSONL      {"t": 1.2, "input_tokens": 512, "output_tokens": 64}   (t in s)
  Azure-style CSV  TIMESTAMP,ContextTokens,GeneratedTokens  (a header line, then rows;
                   TIMESTAMP in seconds or an ISO date-time), also as JSONL objects with
                   those keys

Offsets are from the first request. Mooncake's prefix block ids (`hash_ids`: a request's
prompt in blocks of 512 tokens, the same id the same block) are kept: the synthetic prompt
of such a request is its blocks' text, each block's words drawn from a generator seeded by
its id (the same in every worker and every run of the same seed), so requests that share
ids share exactly that prefix at the server, as in the trace.

A trace of 20 000 requests is held as numpy arrays (16 bytes a request, and 8 a block id),
never as a Python object a request. Every worker reads the file once at start and keeps
all of it (with --max-in-flight one worker sends the whole trace; otherwise each sends every
n-th entry).
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

# (time key, seconds per unit, input key, output key)
_JSON_FORMS = (
    ("timestamp", 1e-3, "input_length", "output_length"),  # Mooncake
    ("t", 1.0, "input_tokens", "output_tokens"),
    ("TIMESTAMP", 1.0, "ContextTokens", "GeneratedTokens"),  # Azure, as JSON
)
_CSV_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _no_ids() -> np.ndarray:
    return np.zeros(0, np.int64)


class TraceError(ValueError):
    """A trace that cannot be replayed; the text names the file and the line."""


@dataclass(frozen=True)
class Trace:
    offsets: np.ndarray  # float64 seconds from the first request, non-decreasing
    inputs: np.ndarray  # int32 prompt tokens
    outputs: np.ndarray  # int32 max_tokens
    # prefix block ids (Mooncake's hash_ids), all requests' in one array: request i's are
    # block_ids[block_start[i]:block_start[i + 1]] (none: both empty)
    block_ids: np.ndarray = field(default_factory=_no_ids)
    block_start: np.ndarray = field(default_factory=_no_ids)

    def blocks(self, i: int) -> np.ndarray:
        """Request i's prefix block ids (empty when the trace has none)."""
        if not len(self.block_start):
            return self.block_ids[:0]
        return self.block_ids[self.block_start[i]:self.block_start[i + 1]]

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def span(self) -> float:
        """Seconds from the first request to the last, at speed 1."""
        return float(self.offsets[-1]) if len(self.offsets) else 0.0


def read_trace(path: str | Path) -> Trace:
    """The trace in `path`; TraceError naming the file and line where it is broken."""
    p = Path(path)
    try:
        f = p.open(encoding="utf-8")
    except OSError as e:
        raise TraceError(f"trace {p}: cannot be read ({e.strerror or e})") from None
    times, ins, outs = array("d"), array("q"), array("q")
    ids, counts = array("q"), array("q")
    with f:
        csv = False
        for no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if no == 1 and line.startswith("TIMESTAMP"):
                csv = _check_header(p, line)
                continue
            try:
                t, n_in, n_out, blocks = _csv_row(line) if csv else _json_row(line)
            except (ValueError, TypeError, KeyError) as e:
                raise TraceError(f"trace {p}, line {no}: {_why(e)}") from None
            if n_in < 1 or n_out < 1:
                raise TraceError(f"trace {p}, line {no}: lengths must be at least 1 token")
            times.append(t)
            ins.append(n_in)
            outs.append(n_out)
            ids.extend(blocks)
            counts.append(len(blocks))
    if not times:
        raise TraceError(f"trace {p}: holds no requests")
    return _arrays(times, ins, outs, ids, counts)


def _check_header(p: Path, line: str) -> bool:
    cols = tuple(c.strip() for c in line.split(","))
    if cols[:3] != _CSV_HEADER:
        raise TraceError(f"trace {p}, line 1: a CSV trace starts with the header "
                         f"{','.join(_CSV_HEADER)}")
    return True


def _json_row(line: str) -> tuple[float, int, int, list[int]]:
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    for t_key, unit, in_key, out_key in _JSON_FORMS:
        if t_key in obj:
            return (_time(obj[t_key]) * unit, _count(obj[in_key]), _count(obj[out_key]),
                    _block_ids(obj.get("hash_ids")))
    raise ValueError('no arrival time: expected "timestamp" (ms), "t" (s) or "TIMESTAMP"')


def _csv_row(line: str) -> tuple[float, int, int, list[int]]:
    cols = line.split(",")
    if len(cols) < 3:
        raise ValueError("expected TIMESTAMP,ContextTokens,GeneratedTokens")
    return _time(cols[0].strip()), _count(cols[1].strip()), _count(cols[2].strip()), []


def _block_ids(v: object) -> list[int]:
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                          for x in v):
        raise ValueError(f"bad hash_ids {str(v)[:40]}: expected a list of whole numbers")
    return v


def _time(v: object) -> float:
    if isinstance(v, bool):
        raise ValueError(f"bad time {v!r}")
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            # Azure's traces write "2023-11-16 18:15:46.6805900": seconds since the epoch
            # are all that matter (offsets), so a 7-digit fraction is cut to microseconds
            head, _, frac = v.partition(".")
            return datetime.fromisoformat(head).timestamp() + float(f"0.{frac or 0}")
    raise ValueError(f"bad time {v!r}")


def _count(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int | str) or (
            isinstance(v, str) and not v.strip().isdigit()):
        raise ValueError(f"bad token count {v!r}: expected a whole number")
    return int(v)


def _why(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"missing {e.args[0]!r}"
    if isinstance(e, json.JSONDecodeError):
        return f"not JSON ({e.msg})"
    return str(e)


def _arrays(times: array, ins: array, outs: array, ids: array, counts: array) -> Trace:
    t = np.frombuffer(times, dtype=np.float64)
    order = np.argsort(t, kind="stable")  # a trace need not be written in time order
    t = t[order]
    trace = Trace(
        offsets=t - t[0],
        inputs=np.frombuffer(ins, dtype=np.int64)[order].astype(np.int32),
        outputs=np.frombuffer(outs, dtype=np.int64)[order].astype(np.int32),
    )
    if not len(ids):
        return trace
    # the block ids in time order too: each request's run of them, gathered by the order
    n = np.frombuffer(counts, dtype=np.int64)
    start = np.concatenate(([0], np.cumsum(n)))
    flat = np.frombuffer(ids, dtype=np.int64)
    return Trace(trace.offsets, trace.inputs, trace.outputs,
                 block_ids=np.concatenate([flat[start[i]:start[i + 1]] for i in order]),
                 block_start=np.concatenate(([0], np.cumsum(n[order]))))
