"""The real-engine tier's fixtures: one vLLM and one llama.cpp for the whole test run (their
start is most of the tier's cost), each skipped in words where it cannot run.

The tier's tests run last. Run alone, each engine they use comes up at idle priority in the
background as soon as they are collected: while the rest of the suite runs, its start costs
the suite's wall clock nothing. Under pytest-xdist (`-n 2 --dist loadgroup`) every worker
collects the whole suite, but the tier is one xdist group run by one worker: the engines
start there, at the first of its tests, never once per worker. (xdist hands its largest
group out first, so there the tier runs first; CI runs it apart, after the rest: .ci/run.)"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import llamacpp_engine
import pytest
import vllm_engine
from engine import Engine, Server
from evals import run_eval

# each engine the tier knows: its fixture's name -> (its class, why it cannot run here)
_KINDS = {"vllm": (vllm_engine.Vllm, vllm_engine.skip_reason),
          "llamacpp": (llamacpp_engine.Llamacpp, llamacpp_engine.skip_reason)}
_engines: dict[str, Engine] = {}


def _kinds(item: pytest.Item) -> set[str]:
    return set(_KINDS) & set(getattr(item, "fixturenames", ()))


_collected: set[str] = set()  # the kinds this session's tests use
XDIST_GROUP = "real-engines"  # the worker that runs the tier, and it alone, starts the engines


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which names each test by its group
def pytest_collection_modifyitems(session, config, items) -> None:
    tier = [i for i in items if _kinds(i)]
    if not tier:
        return
    rest = [i for i in items if not _kinds(i)]
    items[:] = rest + tier
    _collected.update(*map(_kinds, tier))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for item in tier:
            item.add_marker(pytest.mark.xdist_group(XDIST_GROUP))
        return
    _start_engines(idle=bool(rest))


def _start_engines(*, idle: bool) -> None:
    """Each engine the tests use and this machine can run, started on its own thread (all at
    once: their starts overlap)."""
    for kind in sorted(_collected - set(_engines)):
        cls, skip_reason = _KINDS[kind]
        if skip_reason() is None:
            _engines[kind] = cls(Path(tempfile.mkdtemp(prefix=f"tokentop-{kind}-")))
            _engines[kind].start(idle=idle)


def pytest_sessionfinish(session, exitstatus) -> None:
    for engine in _engines.values():  # also where a fixture never ran (-x stopped earlier)
        engine.stop()
        shutil.rmtree(engine.workdir, ignore_errors=True)


def _ready(kind: str) -> Server:
    reason = _KINDS[kind][1]()
    if reason is not None:
        pytest.skip(reason)
    if kind not in _engines:  # an xdist worker's first test of the tier: the other worker
        _start_engines(idle=True)  # may still be running timed tests, so idle priority here too
    return _engines[kind].ready()


@pytest.fixture(scope="session")
def vllm() -> Server:
    return _ready("vllm")


@pytest.fixture(scope="session")
def llamacpp() -> Server:
    return _ready("llamacpp")


@pytest.fixture(scope="session")
def vllm_eval(vllm, tmp_path_factory) -> tuple[Path, dict]:
    """`tokentop eval` of vLLM (evals.EVAL_PLAN): its folder and its eval.json."""
    out = tmp_path_factory.mktemp("evals") / "vllm"
    return out, run_eval(vllm, out)


@pytest.fixture(scope="session")
def llamacpp_eval(llamacpp, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("evals") / "llamacpp"
    return out, run_eval(llamacpp, out)
