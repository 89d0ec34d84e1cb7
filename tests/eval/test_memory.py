"""The memory phase (loadgen.eval.memory): GPU memory per billion parameters and the KV
cache's capacity, through the real `tokentop eval` against simulators speaking vLLM's,
llama.cpp's, SGLang's and TGI's words. The truth is each simulator's own config (its GPUs'
memory share, its weights, its KV budget and bytes per token, its model's parameters),
never what the phase computed; the evals run at once, each a baseline of a second or two.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from support import FAST, ROOT, only_phases, tokentop

from loadgen.sim import SimConfig, start_sim

PLAN = """
version = 1
[phases.baseline]
enabled = {baseline}
concurrency = 2
duration = "2s"
warmup = "0.5s"
input_tokens = 16
output_tokens = 8
[phases.memory]
"""

CASES: dict[str, tuple[SimConfig, list[str], bool]] = {
    # vLLM stating its pool's bytes (per GPU, as --kv-cache-memory-bytes is), on 2 GPUs
    "vllm": (SimConfig(metrics_dialect="vllm", state_kv_bytes=True, gpu_count=2,
                       kv_tokens=32768, kv_bytes_per_token=65536, **FAST),
             ["--model-params", "8B"], True),
    # llama.cpp states its parameters: they win over a flag that says otherwise
    "llamacpp": (SimConfig(metrics_dialect="llamacpp", model_params=1_500_000_000,
                           weights_bytes=3 * 2**30, kv_tokens=16384, **FAST),
                 ["--model-params", "70B"], True),
    # SGLang: its token pool, no parameters, no flag
    "sglang": (SimConfig(metrics_dialect="sglang", kv_tokens=20000, **FAST), [], True),
    # TGI states none of it, and without the baseline there are no GPU samples
    "tgi": (SimConfig(metrics_dialect="tgi", **FAST), [], False),
}
EVAL_TIMEOUT_S = 60


async def _eval(tmp: Path, name: str, cfg: SimConfig, flags: list[str],
                baseline: bool) -> dict:
    sim = await start_sim(cfg, host="127.0.0.1", port=0)
    try:
        plan = tmp / f"{name}.toml"
        plan.write_text(only_phases(PLAN.format(baseline="true" if baseline else "false")))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tui.cli", "eval", "--url", sim.url, "--model",
            cfg.model_name, "--plan", str(plan), "--out", str(tmp / name), "--headless",
            "--tick", "0.25", *flags, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), EVAL_TIMEOUT_S)
    finally:
        await sim.close()
    assert proc.returncode == 0, err.decode()[-2000:]
    state = json.loads((tmp / name / "eval.json").read_text())
    return {r["id"]: r for r in state["rows"] if r["id"].startswith("memory.")}


async def _all(tmp: Path) -> dict[str, dict]:
    rows = await asyncio.gather(*(_eval(tmp, name, *case) for name, case in CASES.items()))
    return dict(zip(CASES, rows, strict=True))


@pytest.fixture(scope="module")
def evals(tmp_path_factory) -> dict[str, dict]:
    return asyncio.run(_all(tmp_path_factory.mktemp("memory")))


def _gpu_gb(cfg: SimConfig) -> float:
    """What the simulator's GPUs hold: its preallocated share of each, all GPUs together."""
    return cfg.gpu_memory_utilization * cfg.gpu_memory_bytes * cfg.gpu_count / 1e9


def test_vllm_pool_and_gpu_memory_are_the_simulators(evals):
    rows, cfg = evals["vllm"], CASES["vllm"][0]
    assert rows["memory.params_b"]["value"] == pytest.approx(8.0)
    assert "--model-params" in rows["memory.params_b"]["note"]
    gpu = rows["memory.gpu_memory_gb"]
    assert gpu["value"] == pytest.approx(_gpu_gb(cfg), rel=1e-6)
    assert "2 GPUs" in gpu["note"] and gpu["samples"] >= 1
    assert rows["memory.gb_per_b_params"]["value"] == pytest.approx(_gpu_gb(cfg) / 8.0, rel=1e-6)
    assert rows["memory.kv_capacity_tokens"]["value"] == cfg.kv_tokens
    assert rows["memory.kv_bytes_per_token"]["value"] == pytest.approx(cfg.kv_bytes_per_token)
    assert rows["memory.kv_capacity_gb"]["value"] == pytest.approx(
        cfg.kv_tokens * cfg.kv_bytes_per_token / 1e9)


def test_llamacpp_states_its_parameters_and_they_win_over_the_flag(evals):
    rows, cfg = evals["llamacpp"], CASES["llamacpp"][0]
    params = rows["memory.params_b"]
    assert params["value"] == pytest.approx(cfg.model_params / 1e9)
    assert "n_params" in params["note"] and "70B" in params["note"]  # both, as they differ
    assert rows["memory.gpu_memory_gb"]["value"] == pytest.approx(_gpu_gb(cfg), rel=1e-6)
    assert rows["memory.gb_per_b_params"]["value"] == pytest.approx(
        _gpu_gb(cfg) / (cfg.model_params / 1e9), rel=1e-6)
    kv = rows["memory.kv_capacity_tokens"]
    assert kv["value"] == cfg.kv_tokens and "/props" in kv["note"]
    per_token = rows["memory.kv_bytes_per_token"]
    assert per_token["value"] is None and "llama.cpp states no bytes" in per_token["note"]


def test_sglang_states_its_token_pool_and_no_parameters(evals):
    rows, cfg = evals["sglang"], CASES["sglang"][0]
    assert rows["memory.kv_capacity_tokens"]["value"] == cfg.kv_tokens
    assert rows["memory.kv_bytes_per_token"]["value"] is None
    assert "tokens only" in rows["memory.kv_bytes_per_token"]["note"]
    for id_ in ("memory.params_b", "memory.gb_per_b_params"):
        assert rows[id_]["value"] is None and "--model-params" in rows[id_]["note"], id_
    assert rows["memory.gpu_memory_gb"]["value"] == pytest.approx(_gpu_gb(cfg), rel=1e-6)


def test_a_server_that_states_nothing_has_every_row_say_why(evals):
    rows = evals["tgi"]
    assert len(rows) == 6
    for id_, r in rows.items():
        assert r["value"] is None and r["note"], id_
    assert "baseline skipped" in rows["memory.gpu_memory_gb"]["note"]
    assert "states no KV pool" in rows["memory.kv_capacity_tokens"]["note"]


@pytest.mark.parametrize("value", ["lots", "8", "-3B", "0B"])
def test_a_bad_model_params_is_one_line(tmp_path, value):
    r = tokentop("eval", "--model-params", value, "--out", str(tmp_path / "e"), timeout=30)
    assert r.returncode == 2 and "--model-params" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
