"""`tokentop eval` of a real engine, with the tier's tiny plan (a conformance pass, a short
baseline, a two-step ramp: `--quick` takes five minutes of load, which CI has no room for).
Each engine's eval runs once for the whole test run (conftest's `vllm_eval`, `llamacpp_eval`),
for its own test and for `eval compare` of the two."""

from __future__ import annotations

import json
from pathlib import Path

from engine import Server, tokentop_client
from support import only_phases

EVAL_PLAN = only_phases("""
version = 1
slo = "ttft_p99<2s,error_rate<1%"
[phases.conformance]
[phases.baseline]
concurrency = 4
duration = "3s"
warmup = "1s"
input_tokens = 128
output_tokens = 32
[phases.ramp]
steps = [2, 8]
step_duration = "2s"
step_warmup = "0.5s"
""")


def run_eval(server: Server, out: Path) -> dict:
    """The eval of `server` into `out`: its eval.json."""
    plan = out.parent / f"{out.name}-plan.toml"
    plan.write_text(EVAL_PLAN)
    done = tokentop_client("eval", f"--url={server.url}", f"--plan={plan}", f"--out={out}",
                           "--workers=1", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "eval.json").read_text())


def verdicts(state: dict) -> dict[str, str]:
    """Each conformance check's verdict, by its id."""
    return {c["id"]: c["verdict"] for c in state["phases"]["conformance"]["figures"]["checks"]}


def evidence(state: dict) -> dict[str, str]:
    return {c["id"]: c["evidence"] for c in state["phases"]["conformance"]["figures"]["checks"]}


# a conformance check the engine did not answer within the check's time: the CI machine's
# two cores busy with the rest of the suite, not what the engine does with the request
TIMED_OUT = "no answer in "


def as_expected(verdict: str, said: str, expected: set[str]) -> bool:
    """A check's verdict is one the engine really gives (`expected`), or a "no" because the
    loaded machine let the check's time run out (its evidence says so)."""
    return verdict in expected or (verdict == "no" and said.startswith(TIMED_OUT))
