"""API conformance (loadgen.eval.conformance) against the real simulator over 127.0.0.1, the
truth being what it is configured to serve: every feature (with a tokenizer, so /tokenize
too) gives every check a yes; each feature it is told to break (`SimConfig.broken`) gives
exactly that feature's checks a no, with the evidence of what differed. Then `tokentop probe
--api` through the command line, and the eval's conformance phase (the only one enabled)
keeping a row per check in eval.json, and compare's feature table side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, only_phases, running_sim, start_sim_process
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from loadgen.eval.conformance import CHECKS, MARKS, Target, conformance_table, run_checks
from loadgen.eval.results import read_eval
from loadgen.sim.features import BREAKABLE
from loadgen.sim.words import WORDS

FIXTURES = Path(__file__).parent / "fixtures"
# short natural lengths: a server that ignores ignore_eos or min_tokens is seen at once
SIM = {"mean_output_tokens": 3.0, "default_max_tokens": 64}

# the checks each broken feature fails (the simulator's truth)
FAILS: dict[str, set[str]] = {
    "usage": {"usage", "usage.continuous"}, "max_completion_tokens": {"max_completion_tokens"},
    "stop": {"stop"}, "n": {"n"}, "logprobs": {"logprobs"}, "seed": {"seed"},
    "json": {"json_object", "json_schema"}, "tools": {"tools"}, "ignore_eos": {"ignore_eos"},
    "min_tokens": {"min_tokens"}, "models": {"models"},
    "completions": {"completions", "completions.stream"}, "tokenize": {"tokenize"},
    "metrics": {"metrics"}, "health": {"health"},
    "errors": {"errors.too_long", "errors.unknown_model", "errors.malformed"},
}
# a server that ignores ignore_eos answers too short a greedy text to pick a stop in
UNJUDGED = {"ignore_eos": {"stop", "min_tokens"}}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = [w.strip() for w in WORDS] + ["hello", "world", "hi"]
    tok.train_from_iterator([" ".join(words)] * 2, trainers.WordLevelTrainer(
        special_tokens=["[UNK]"], show_progress=False))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def verdicts(figures) -> dict[str, str]:
    return {c.id: c.verdict for c in figures.checks}


def test_every_breakable_feature_has_its_checks():
    assert set(FAILS) == set(BREAKABLE)
    ids = {s.id for s in CHECKS}
    assert set().union(*FAILS.values()) <= ids
    # the checks no break can fail are the plain ones every server has
    assert ids - set().union(*FAILS.values()) == {"chat", "chat.stream", "max_tokens"}


async def test_a_simulator_serving_every_feature_passes_every_check(tokenizer):
    async with running_sim(tokenizer=tokenizer, **SIM) as sim:
        figures = await run_checks(Target(url=sim.url))
    assert figures.model == "tokentop-sim"
    assert [c.id for c in figures.checks] == [s.id for s in CHECKS]
    assert {c.id: c.evidence for c in figures.checks if c.verdict != "yes"} == {}


async def test_tokenize_is_found_in_llamacpps_shape_though_vllms_is_answered_200(tokenizer):
    """llama.cpp's server answers vLLM's tokenize body with 200 and no tokens (it reads only
    `content`; a real one does so, seen in the tier): the check finds the shape that counts,
    as the run's --tokenizer server does, and says which."""
    async with running_sim(tokenizer=tokenizer, metrics_dialect="llamacpp", **SIM) as sim:
        figures = await run_checks(Target(url=sim.url))
    check = next(c for c in figures.checks if c.id == "tokenize")
    assert check.verdict == "yes", check.evidence
    assert check.evidence == "HTTP 200, 2 tokens for 'hello world' (llama.cpp's shape, /tokenize)"


@pytest.mark.parametrize("broken", [
    sorted(set(BREAKABLE) - {"ignore_eos", "min_tokens"}), ["min_tokens"], ["ignore_eos"]],
    ids=["most", "min_tokens", "ignore_eos"])
async def test_each_broken_feature_fails_its_checks_and_no_other(tokenizer, broken):
    async with running_sim(tokenizer=tokenizer, broken=broken, **SIM) as sim:
        # a server without /v1/models: the model is named
        figures = await run_checks(Target(url=sim.url, model="tokentop-sim"))
        served = sim.server.engine.metrics.arrived
    fails = set().union(*(FAILS[b] for b in broken))
    unjudged = set().union(*(UNJUDGED.get(b, set()) for b in broken))
    got = verdicts(figures)
    assert {i for i, v in got.items() if v == "no"} == fails
    assert {i for i, v in got.items() if v == "partial"} == unjudged
    evidence = {c.id: c.evidence for c in figures.checks}
    if "stop" in broken:
        assert "went past the stop" in evidence["stop"]
        stop = evidence["stop"].split("'")[1]
        assert stop in evidence["stop"].split(": ", 1)[1]  # the text shown holds it
    if "errors" in broken:
        assert all(evidence[i].startswith("HTTP 500") for i in FAILS["errors"])
    if "n" in broken:
        assert evidence["n"] == "1 choice of n = 2"
    assert served > 0  # the checks' requests reached the engine


@pytest.fixture(scope="module")
def sim_process():
    proc, port = start_sim_process("--mean-output-tokens=3", "--default-max-tokens=64")
    yield f"http://127.0.0.1:{port}/v1"
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL)


def test_probe_api_prints_a_line_per_check(sim_process):
    done = cli("probe", "--api", f"--url={sim_process}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "API conformance (tokentop-sim): ✓ yes  ✗ no  ~ partial"
    by_name = {line[2:].split("  ")[0].strip(): line[0] for line in lines[1:]}
    # without a tokenizer the simulator has no /tokenize: the one no
    assert by_name == {s.name: "✗" if s.id == "tokenize" else "✓" for s in CHECKS}


def test_probe_api_of_a_dead_url_is_one_line_and_exit_2():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = cli("probe", "--api", f"--url=http://127.0.0.1:{port}/v1", "--timeout=2s")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "does not answer" in done.stderr
    assert "Traceback" not in done.stderr


ONLY_CONFORMANCE = only_phases("version = 1\n[phases.conformance]\n")


def test_the_eval_phase_keeps_a_row_per_check(sim_process, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(ONLY_CONFORMANCE)
    out = tmp_path / "out"
    done = cli("eval", f"--url={sim_process}", f"--plan={plan}", f"--out={out}", "--workers=1")
    assert done.returncode == 0, done.stderr[-2000:]
    raw = json.loads((out / "eval.json").read_text())
    rows = {r["id"]: r for r in raw["rows"] if r["dimension"] == "API conformance"}
    assert list(rows) == [f"conformance.{s.id}" for s in CHECKS]
    assert all(r["value"] is None for r in rows.values())
    want = {s.id: "no" if s.id == "tokenize" else "yes" for s in CHECKS}
    assert {k.removeprefix("conformance."): r["note"].split(":")[0]
            for k, r in rows.items()} == {i: f"{MARKS[v]} {v}" for i, v in want.items()}
    state = read_eval(out)
    assert verdicts(state.phases.conformance.figures) == want
    # side by side with an eval from before the phase: its column says not checked
    old = read_eval(FIXTURES / "eval.json")
    table = conformance_table([("new", state), ("old", old)])
    assert table[1].split() == ["new", "old"]
    line = next(t for t in table if t.startswith("/tokenize"))
    assert line.split()[-2:] == ["✗", "–"]
    assert len(table) == 2 + len(CHECKS)
    # and eval compare shows that table in its text and md, once
    from loadgen.eval.compare import comparison, render
    shown = comparison([("new", state), ("old", old)])
    for fmt in ("text", "md"):
        assert render(shown, fmt).count(line) == 1


@pytest.mark.parametrize(("text", "finish", "verdict"), [
    ('{"name": "a name that rambles on', "length", "partial"),  # cut off: the model's length
    ('{"name": "a name that rambles on', "stop", "no"),  # ended there: broken JSON
    ("Sure! Here is the weather", "length", "no"),  # prose: the format ignored
])
async def test_a_json_answer_cut_at_max_tokens_is_partial_not_no(text, finish, verdict):
    """A constrained small model (a real vLLM's tiny one, tests/engines) may ramble inside a
    string until max_tokens: that is not a server that ignores response_format."""
    from aiohttp import web
    from support import serving

    async def chat(_request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"index": 0, "finish_reason": finish,
                                               "message": {"role": "assistant",
                                                           "content": text}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with serving(app) as root:
        figures = await run_checks(Target(url=f"{root}/v1", model="m"))
    got = {c.id: c.verdict for c in figures.checks}
    assert got["json_object"] == got["json_schema"] == verdict
