"""The real-engine tier's fixture: one vLLM for the whole test run (its start is most of the
tier's cost), skipped in words where it cannot run.

The tier's tests run last, and the engine comes up at idle priority in the background as
soon as they are collected: while the rest of the suite runs, its start costs the suite's
wall clock nothing."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from vllm_engine import Engine, Vllm, skip_reason

_engine: Engine | None = None


def _uses_engine(item: pytest.Item) -> bool:
    return "vllm" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(session, config, items) -> None:
    global _engine
    tier = [i for i in items if _uses_engine(i)]
    if not tier or skip_reason() is not None:
        return
    rest = [i for i in items if not _uses_engine(i)]
    items[:] = rest + tier
    _engine = Engine(Path(tempfile.mkdtemp(prefix="tokentop-vllm-")))
    _engine.start(idle=bool(rest))


def pytest_sessionfinish(session, exitstatus) -> None:
    if _engine is not None:  # also where the fixture never ran (-x stopped earlier)
        _engine.stop()
        shutil.rmtree(_engine.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def vllm() -> Vllm:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    assert _engine is not None, "the engine is started at collection"
    return _engine.ready()
