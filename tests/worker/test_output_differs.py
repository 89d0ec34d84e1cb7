"""A server that does not give the output length asked exactly (ignore_eos / min_tokens not
honoured) is counted: real llama.cpp bytes (4 tokens generated) against what was asked."""

from __future__ import annotations

import json

import pytest
from support import FIXTURES

from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.stream_measure import StreamMeasure

RAW = (FIXTURES / "captures" / "llamacpp" / "sse-chat.txt").read_bytes()
GENERATED = json.loads(RAW.split(b"\n\n")[-3].removeprefix(b"data: "))["usage"][
    "completion_tokens"]


@pytest.mark.parametrize(("asked", "differs"), [(GENERATED, 0), (GENERATED + 4, 1), (0, 0)])
def test_output_length_against_the_asked(asked, differs):
    rec = IntervalRecorder()
    m = StreamMeasure(rec, 0.0, 13, asked_out=asked)  # 0: no exact length was asked
    for i, event in enumerate(RAW.split(b"\n\n")):
        if event.strip():
            assert m.feed(event + b"\n\n", 0.01 * (i + 1))
    m.finish()
    assert rec.counters.requests_ok == 1
    assert rec.counters.output_differs == differs
