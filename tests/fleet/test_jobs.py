"""The load-job protocol's rules (loadgen.fleet.jobs): how a load is shared, what an agent
refuses, and what a job on the wire may carry."""

from __future__ import annotations

import pytest

from loadgen.fleet import jobs
from loadgen.fleet.jobs import JobLoad


@pytest.mark.parametrize("agents", [1, 2, 3, 7])
@pytest.mark.parametrize("total", [0, 1, 2, 5, 10, 64, 1001])
def test_streams_are_shared_whole_and_as_evenly_as_they_go(total, agents):
    got = jobs.split_streams(total, agents)
    assert len(got) == agents and sum(got) == total
    assert max(got) - min(got) <= 1
    assert got == sorted(got, reverse=True)  # the first agents get the remainder


def test_a_rate_is_shared_in_equal_parts():
    assert jobs.split_rate(10.0, 4) == [2.5] * 4


CAPS = {"max_concurrency": 8, "max_rate": 20.0}


@pytest.mark.parametrize(("load", "words"), [
    (JobLoad(concurrency=2, duration=0.0), "needs a duration above 0 s"),
    (JobLoad(concurrency=2, duration=float("inf")), "needs a duration above 0 s"),
    (JobLoad(concurrency=9, duration=5.0), "9 streams is over this agent's --max-concurrency 8"),
    (JobLoad(mode="open", rate=25.0, duration=5.0), "25 req/s is over this agent's --max-rate 20"),
    (JobLoad(concurrency=2, duration=5.0, dataset="text:/etc/passwd"),
     "a dataset file is not read on an agent from a job (the eval asked for text)"),
    (JobLoad(concurrency=2, duration=5.0, tick=0.0), "tick must be between"),
])
def test_an_agent_refuses_in_words(load, words):
    why = jobs.refusal(load, **CAPS)
    assert why is not None and words in why


def test_a_load_within_the_caps_is_run():
    assert jobs.refusal(JobLoad(concurrency=8, duration=5.0), **CAPS) is None
    assert jobs.refusal(JobLoad(mode="open", rate=20.0, duration=5.0), **CAPS) is None


@pytest.mark.parametrize("payload", [
    b"not json",
    b'{"id": "x", "op": "explode"}',
    b'{"id": "x", "op": "run", "load": {"concurrency": 2, "url": "http://elsewhere"}}',
    b'{"id": "x", "op": "run", "load": {"concurrency": "many"}}',
])
def test_a_job_that_is_not_one_is_refused_in_words_and_carries_no_url(payload):
    """A job names no target: a field the protocol does not have (a URL) is refused."""
    with pytest.raises(ValueError, match="bad job"):
        jobs.decode_job(payload)
