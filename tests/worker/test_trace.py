"""Reading a trace: the forms, the compact arrays, a broken line named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loadgen.worker.trace import TraceError, read_trace


def test_mooncake_jsonl(tmp_path):
    p = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]},
            {"timestamp": 1500, "input_length": 7, "output_length": 3, "hash_ids": [0]},
            {"timestamp": 250, "input_length": 9, "output_length": 4, "hash_ids": []}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tr = read_trace(p)
    # ms to seconds, sorted by time
    assert tr.offsets.tolist() == [0.0, 0.25, 1.5]
    assert tr.inputs.tolist() == [600, 9, 7] and tr.outputs.tolist() == [20, 4, 3]
    assert tr.span == 1.5


def test_plain_jsonl_and_azure_csv(tmp_path):
    p = tmp_path / "plain.jsonl"
    p.write_text('{"t": 2.0, "input_tokens": 5, "output_tokens": 6}\n\n'
                 '{"t": 2.5, "input_tokens": 7, "output_tokens": 8}\n')
    tr = read_trace(p)
    assert tr.offsets.tolist() == [0.0, 0.5] and tr.inputs.tolist() == [5, 7]
    c = tmp_path / "azure.csv"
    c.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.1805900,10,2\n")
    tr = read_trace(c)
    assert tr.offsets.tolist() == pytest.approx([0.0, 0.5])
    assert tr.outputs.tolist() == [44, 2]


def test_compact_arrays(tmp_path):
    p = tmp_path / "big.jsonl"
    n = 20_000
    p.write_text("".join(f'{{"t": {i / 50}, "input_tokens": {i % 97 + 1}, '
                         f'"output_tokens": 3}}\n' for i in range(n)))
    tr = read_trace(p)
    # numpy arrays, 16 bytes a request: no Python object a request
    assert tr.offsets.dtype == np.float64 and tr.inputs.dtype == np.int32
    assert tr.outputs.dtype == np.int32
    assert tr.offsets.nbytes + tr.inputs.nbytes + tr.outputs.nbytes == 16 * n
    assert int(tr.inputs.sum()) == sum(i % 97 + 1 for i in range(n))


@pytest.mark.parametrize(("line", "why"), [
    ('{"t": 1, "input_tokens": 5}', "'output_tokens'"),
    ('{"t": 1, "input_tokens": "x", "output_tokens": 5}', "whole number"),
    ("not json", "not JSON"),
    ('{"t": 1, "input_tokens": 0, "output_tokens": 5}', "at least 1"),
    ('{"when": 1}', "no arrival time"),
])
def test_broken_line_named(tmp_path, line, why):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"t": 0, "input_tokens": 5, "output_tokens": 5}\n' + line + "\n")
    with pytest.raises(TraceError) as e:
        read_trace(p)
    assert f"{p}, line 2" in str(e.value) and why in str(e.value)
