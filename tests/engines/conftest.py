"""The real-engine tier's fixture: one vLLM for the whole test run (its start is most of the
tier's cost), skipped in words where it cannot run."""

from __future__ import annotations

import pytest
from vllm_engine import Vllm, serving, skip_reason


@pytest.fixture(scope="session")
def vllm(tmp_path_factory) -> Vllm:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with serving(tmp_path_factory.mktemp("vllm")) as server:
        yield server
