"""The eval's context phase (loadgen.eval.context) against a real simulator process over
127.0.0.1, its engine model the truth: a lone request of L prompt tokens (concurrency 1)
is prefilled in ceil(L / chunk) steps, each costing the step overhead plus its tokens ×
prefill_ms_per_token, so its TTFT is known in closed form; a lone decoding sequence's
inter-token gap is the step overhead plus decode_ms_per_seq; the simulator's kv_tokens is
its max context, refusing a longer prompt + max_tokens with a 400. The simulator counts a
word a token, so the ladder's lengths are exact. One eval (only this phase) for the module.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys

import pytest
from support import ROOT, start_sim_process

from loadgen.eval.context import Target, longest_prompt
from loadgen.eval.results import ContextRung

# the simulator's model: the numbers every truth below is computed from
SIM = {"kv_tokens": 2048, "prefill_ms_per_token": 0.1, "prefill_chunk_tokens": 512,
       "step_overhead_ms": 4.0, "decode_ms_per_seq": 0.5}
INPUTS, OUTPUTS, FIXED_OUT, FIXED_IN = [128, 1024, 4096], [64], 32, 128

OTHERS_OFF = "".join(f"[phases.{p}]\nenabled = false\n" for p in (
    "conformance", "baseline", "ramp", "batch", "interference", "priority", "long_tail", "leaks",
    "memory", "efficiency", "scaling"))
PLAN = f"""version = 1
{OTHERS_OFF}[phases]
faults = []
[phases.context]
concurrency = 1
input_ladder = {INPUTS}
output_ladder = {OUTPUTS}
fixed_output = {FIXED_OUT}
fixed_input = {FIXED_IN}
step_duration = "2s"
step_warmup = "0.5s"
"""


def ttft_truth_ms(prompt: int) -> float:
    """A lone request's TTFT by the simulator's model: its chunked prefill's steps."""
    steps = math.ceil(prompt / SIM["prefill_chunk_tokens"])
    return steps * SIM["step_overhead_ms"] + prompt * SIM["prefill_ms_per_token"]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd=ROOT)


@pytest.fixture(scope="module")
def sim():
    proc, port = start_sim_process(*(f"--{k.replace('_', '-')}={v}" for k, v in SIM.items()))
    yield f"http://127.0.0.1:{port}/v1"
    proc.stdin.close()
    proc.wait(10)


@pytest.fixture(scope="module")
def evaluated(sim, tmp_path_factory) -> tuple[dict, dict]:
    """The eval's context figures and its rows by id."""
    tmp = tmp_path_factory.mktemp("context")
    (tmp / "plan.toml").write_text(PLAN)
    done = cli("eval", f"--url={sim}", f"--plan={tmp / 'plan.toml'}", f"--out={tmp / 'out'}",
               "--workers=1")
    assert done.returncode == 0, done.stderr[-3000:]
    raw = json.loads((tmp / "out" / "eval.json").read_text())
    rows = {r["id"]: r for r in raw["rows"] if r["id"].startswith("context.")}
    return raw["phases"]["context"]["figures"], rows


def test_ttft_follows_the_prefill_model_and_prefill_tok_s_follows_it(evaluated):
    _, rows = evaluated
    for n in (128, 1024):  # 4096 + 32 does not fit 2048
        truth = ttft_truth_ms(n)
        got = rows[f"context.input.{n}.ttft.p50"]["value"]
        # the client's own time on top (HTTP, parsing): a little more, never less
        assert truth - 0.5 <= got <= truth * 1.1 + 3.0, (n, got, truth)
        prefill = rows[f"context.input.{n}.prefill_tok_s"]["value"]
        assert prefill == pytest.approx(n / (truth / 1000.0), rel=0.12), (n, prefill)
    # longer prompts cost more per request and prefill faster per token (the step overhead
    # shared by more tokens), as the model says
    ttft = {n: rows[f"context.input.{n}.ttft.p50"]["value"] for n in (128, 1024)}
    assert ttft[1024] > ttft[128]
    assert rows["context.input.1024.prefill_tok_s"]["value"] \
        > rows["context.input.128.prefill_tok_s"]["value"]


def test_itl_is_one_decode_step(evaluated):
    figures, rows = evaluated
    step = SIM["step_overhead_ms"] + SIM["decode_ms_per_seq"]  # one sequence decoding
    out = figures["output_ladder"][0]
    assert (out["input_tokens"], out["output_tokens"]) == (FIXED_IN, OUTPUTS[0])
    assert out["itl_ms"]["mean"] == pytest.approx(step, rel=0.08)
    assert rows["context.output.64.itl.p50"]["value"] == pytest.approx(step, rel=0.2)
    assert rows["context.output.64.error_rate"]["value"] == 0.0
    # every token of every request measured ended in ITL gaps: (out − 1) per request at least
    assert rows["context.output.64.itl.p50"]["samples"] >= (OUTPUTS[0] - 1) * out["requests_ok"]


def test_a_rung_past_the_max_is_not_sent_and_the_longest_prompt_is_the_sims_limit(evaluated):
    figures, rows = evaluated
    assert figures["max_context"] == SIM["kv_tokens"]
    assert rows["context.max_context"]["value"] == SIM["kv_tokens"]
    top = figures["input_ladder"][-1]
    assert top["sent"] is False and top["run_dir"] is None
    for key in ("ttft.p50", "prefill_tok_s", "error_rate"):
        row = rows[f"context.input.4096.{key}"]
        assert row["value"] is None and "not sent" in row["note"] and "2,048" in row["note"]
    # the stated max less the output, asked once and served: the simulator's own limit
    longest = rows["context.longest_prompt"]
    assert longest["value"] == SIM["kv_tokens"] - FIXED_OUT
    assert figures["longest"]["probes"] == 1


def test_bisection_finds_the_limit_where_the_server_states_none(sim):
    # the ladder's 1024 served, its 2048 refused (4xx): single requests bisect between them
    served = ContextRung(input_tokens=1024, output_tokens=FIXED_OUT, sent=True, requests_ok=5,
                         requests_failed=0)
    refused = ContextRung(input_tokens=2048, output_tokens=FIXED_OUT, sent=True, requests_ok=0,
                          requests_failed=20, errors={"http_4xx": 20})
    target = Target(url=sim, headers={}, api="chat", model="tokentop-sim", timeout_s=10.0)
    found = asyncio.run(longest_prompt(target, [served, refused], FIXED_OUT, stated=None))
    assert found.tokens == SIM["kv_tokens"] - FIXED_OUT
    assert found.refused_at == SIM["kv_tokens"] - FIXED_OUT + 1
    assert 1 <= found.probes <= 12
    assert "maximum context length is 2048" in found.how


def test_a_ladder_that_stops_short_of_the_stated_max_asks_the_max(sim):
    # every rung served, the longest (1024) well short of the stated max: the row is the
    # server's max (its cap less the output, served by one request), not the ladder's top
    served = ContextRung(input_tokens=1024, output_tokens=FIXED_OUT, sent=True, requests_ok=5,
                         requests_failed=0)
    target = Target(url=sim, headers={}, api="chat", model="tokentop-sim", timeout_s=10.0)
    found = asyncio.run(longest_prompt(target, [served], FIXED_OUT, stated=SIM["kv_tokens"]))
    assert (found.tokens, found.probes) == (SIM["kv_tokens"] - FIXED_OUT, 1)


def test_a_ladder_out_of_order_is_one_line(tmp_path):
    (tmp_path / "plan.toml").write_text("[phases.context]\ninput_ladder = [512, 128]\n")
    # read before anything is started or sent: a URL nobody listens on is never asked
    done = cli("eval", "--url=http://127.0.0.1:9/v1", f"--plan={tmp_path / 'plan.toml'}",
               f"--out={tmp_path / 'out'}", timeout=30)
    assert done.returncode == 2, done.stdout[-500:]
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert "phases.context.input_ladder: expected increasing lengths" in done.stderr


def test_the_phase_is_in_the_default_plan_and_its_rows_may_be_named_by_scenarios():
    from loadgen.eval.plan import default_plan, parse_plan

    plan = default_plan()
    assert "context.longest_prompt" in plan.scenarios["batch"].rows
    assert plan.quick.context.step_duration < plan.phases.context.step_duration
    parse_plan('[scenarios.long]\nabout = "long prompts"\nrows = ["context.input.8192.ttft.p50"]\n')
