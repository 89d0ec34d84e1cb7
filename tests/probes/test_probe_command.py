"""`tokentop probe` (probes.oneshot.run_probe) against a live simulator on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from support import tokentop

from loadgen.sim import SimConfig, start_sim
from probes import oneshot
from probes.oneshot import run_probe
from tui.commands.args import Parser
from tui.commands.probe import add_probe_arguments


async def _run(*argv: str, token: str | None = None) -> tuple[int, str]:
    """`tokentop probe ARGV` in-process: the command's own parser, then run_probe."""
    parser = Parser(prog="tokentop probe")
    add_probe_arguments(parser)
    args = parser.parse_args(list(argv))
    out = io.StringIO()
    rc = await run_probe(url=args.url, metrics_url=args.metrics_url, server_pid=args.server_pid,
                         server_name=args.server_name, token=token, as_json=args.json, out=out)
    return rc, out.getvalue()


@contextlib.asynccontextmanager
async def _traffic(url: str, model: str, max_requests: int = 200) -> AsyncIterator[None]:
    """Requests finishing all the time (bounded), so the server's histograms move."""

    async def one(session: aiohttp.ClientSession) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
        }
        async with session.post(f"{url}/chat/completions", json=body) as resp:
            await resp.read()

    async def loop() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(max_requests // 4):
                await asyncio.gather(*(one(session) for _ in range(4)))

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_readable_report_against_the_simulator() -> None:
    sim = await start_sim(SimConfig(slots=8), host="127.0.0.1", port=0)
    try:
        async with _traffic(sim.url, "tokentop-sim"):
            rc, text = await _run("--url", sim.url)
    finally:
        await sim.close()
    assert rc == 0
    assert "GPUs (" in text  # NVML here, else the simulator's GPU, clearly labelled
    if "SIMULATED" in text:
        assert "[simulated]" in text
    assert "Host\n  CPU " in text
    assert "found by port" in text and f"pid {os.getpid()}" in text  # the sim runs in-process
    assert "engine vllm" in text
    assert "tok/s" in text
    assert "TTFT" in text  # the server's own quantiles over the last interval
    assert "Traceback" not in text


async def test_json_report_against_the_simulator() -> None:
    sim = await start_sim(SimConfig(slots=8), host="127.0.0.1", port=0)
    try:
        async with _traffic(sim.url, "tokentop-sim"):
            rc, text = await _run("--url", sim.url + "/", "--json",
                                  token="sk-secret-never-printed")
    finally:
        await sim.close()
    assert rc == 0
    assert "sk-secret" not in text
    report = json.loads(text)
    assert report["url"] == sim.url
    assert report["gpu"]["source"] in ("nvml", "simulated")
    assert report["gpu"]["gpus"]
    assert report["host"]["cpu_count"] >= 1
    assert report["host"]["net_rx_bps"] is not None  # two rounds: rates exist
    assert report["process"]["pid"] == os.getpid()
    assert report["process"]["found_by"] == "port"
    server = report["server"]
    assert server["ok"] and server["engine"] == "vllm"
    assert server["generation_tok_s"] is not None and server["generation_tok_s"] > 0
    assert set(server["latency_ms"]) >= {"ttft", "e2e"}
    assert set(server["latency_ms"]["ttft"]) == {"p50", "p90", "p99"}
    assert server["restarts"] == 0
    assert set(report["probe_ms"]) >= {"host", "process", "gpu", "server_metrics"}


# dialect -> the engine tokentop must detect
DIALECTS = {
    "vllm": "vllm",
    "sglang": "sglang",
    "tgi": "tgi",
    "llamacpp": "llamacpp",
    "trtllm": "trtllm",
    "triton": "triton",
}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
async def test_every_engine_dialect_is_detected_live(
    dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(oneshot, "GAP_S", 0.3)
    sim = await start_sim(SimConfig(slots=8, metrics_dialect=dialect), host="127.0.0.1", port=0)
    try:
        async with _traffic(sim.url, "tokentop-sim"):
            rc, text = await _run("--url", sim.url, "--json")
    finally:
        await sim.close()
    assert rc == 0
    server = json.loads(text)["server"]
    assert server["ok"], server["error"]
    assert server["engine"] == DIALECTS[dialect]
    assert server["running"] is not None


async def test_no_url_reports_gpu_host_and_says_why_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(oneshot, "GAP_S", 0.1)
    rc, text = await _run("--server-name", "no-such-server-process-xyz")
    assert rc == 0
    assert "GPUs" in text
    assert "Server process\n  none: no process named no-such-server-process-xyz" in text
    assert "Server metrics\n  none: no --url or --metrics-url given" in text


async def test_nothing_listening_is_said_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oneshot, "GAP_S", 0.1)
    rc, text = await _run("--url", "http://127.0.0.1:9/v1", "--json")  # discard: nothing there
    assert rc == 0
    report = json.loads(text)
    assert report["server"]["ok"] is False
    assert "connection refused" in report["server"]["error"]
    assert report["process"] is None
    assert "port 9" in report["process_message"]
    if report["gpu"]["source"] == "none":
        assert report["gpu"]["message"]  # why there is no GPU, in words


async def test_remote_server_has_no_local_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oneshot, "GAP_S", 0.0)
    # Only the metrics URL is scraped (a closed loopback port); the target is "elsewhere".
    rc, text = await _run(
        "--url", "http://203.0.113.5:8000/v1", "--metrics-url", "http://127.0.0.1:9/metrics"
    )
    assert rc == 0
    assert "the server is on another host" in text
    assert "Server metrics (http://127.0.0.1:9/metrics)\n  cannot read: connection refused" in text


@pytest.mark.parametrize(
    "argv",
    [
        ("--url", "ftp://127.0.0.1/v1"),
        ("--url", "127.0.0.1:8000"),
        ("--url", "http://127.0.0.1:99999/v1"),
        ("--metrics-url", "nonsense"),
    ],
)
async def test_bad_url_exits_2(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    rc, text = await _run(*argv)
    assert rc == 2
    assert text == ""
    err = capsys.readouterr().err
    assert err.startswith("tokentop probe: ") and "URL" in err
    assert "Traceback" not in err


def test_unreadable_key_file_exits_2(tmp_path: Path) -> None:
    p = tokentop("probe", "--url", "http://127.0.0.1:9/v1", "--api-key-file",
                 str(tmp_path / "nope"), timeout=30)
    assert p.returncode == 2
    assert p.stderr.startswith("tokentop probe: cannot read --api-key-file")
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_the_command_reads_the_key_file_and_never_prints_it(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-secret-never-printed\n")
    p = tokentop("probe", "--metrics-url", "http://127.0.0.1:9/metrics", "--json",
                 "--api-key-file", str(key), "--server-name", "no-such-server-xyz", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "sk-secret" not in p.stdout + p.stderr
    assert json.loads(p.stdout)["server"]["ok"] is False  # nothing listens there


async def test_a_probe_bug_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def broken(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(oneshot, "_collect", broken)
    rc, _ = await _run()
    assert rc == 1
    assert capsys.readouterr().err == "tokentop probe: failed: RuntimeError: boom\n"
