"""Input length: the server's own prompt count a request, beside what was asked, flagged
when a chat template (or a tokenizer) makes them differ by more than 5 %."""

from __future__ import annotations

import asyncio
import json

import pytest
from support import FAST, scrape, tokentop

from loadgen.sim import SimConfig, start_sim

ASKED = 128


async def _run(sim, tmp_path) -> tuple[dict, str]:
    out = tmp_path / "summary.json"
    done = await asyncio.to_thread(
        tokentop, "run", "--headless", f"--url={sim.url}", "--concurrency=2", "--workers=1",
        "--tick=0.25", "--duration=1.5", f"--input-tokens={ASKED}", "--output-tokens=8",
        "--json", str(out), "--no-record")
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text()), done.stderr.splitlines()[-1]


@pytest.mark.parametrize("template", [0, 30])
async def test_server_counted_prompt_tokens_beside_the_asked_length(tmp_path, template):
    sim = await start_sim(SimConfig(**FAST, chat_template_tokens=template),
                          host="127.0.0.1", port=0)
    try:
        summary, last_line = await _run(sim, tmp_path)
        metrics = await scrape(sim.url.removesuffix("/v1") + "/metrics")
    finally:
        await sim.close()
    prompt = summary["tokens"]["input_per_request"]
    # the truth: the server's own counters (every request it finished, drain included)
    per_request = metrics["vllm:prompt_tokens_total"] / metrics["vllm:request_success_total"]
    assert prompt["server"] == pytest.approx(per_request, rel=0.01)
    assert prompt["asked"] == pytest.approx(ASKED, rel=0.05)
    assert prompt["differs"] is (template > 0)
    assert ("prompt tokens a request" in last_line) is (template > 0)
