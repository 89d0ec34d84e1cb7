"""Requests users shape (issue 24.7), judged by what a server of the test's own recorded:
the sampling flags, --response-format and --extra-body in every body, with either client;
--header's headers on every request; and a header's value, a secret, nowhere else: not in
the run directory, the summary, stdout, stderr, nor any process's command line or
environment."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import psutil
import pytest
from aiohttp import web
from support import ROOT, serving, tokentop

from loadgen.eval.plan import parse_plan
from loadgen.run.config import RunConfig
from loadgen.worker.client import StreamingClient
from loadgen.worker.interval import IntervalRecorder
from loadgen.worker.openai_client import OpenAIClient

SECRET = "hdr-s3cret-0f9a7c"  # the Authorization header's credential
KEY = "xkey-s3cret-41d2e8"  # X-Api-Key's value
SHAPING = ["--temperature", "0.3", "--top-p", "0.9", "--top-k", "40", "--sampling-seed", "7",
           "--response-format", "json", "--extra-body", '{"repetition_penalty": 1.1}']
SHAPED = {"temperature": 0.3, "top_p": 0.9, "top_k": 40, "seed": 7,
          "response_format": {"type": "json_object"}, "repetition_penalty": 1.1}


@contextlib.asynccontextmanager
async def recording_server() -> AsyncIterator[tuple[str, list[dict]]]:
    """An OpenAI-style server on 127.0.0.1 that keeps each request's path, headers and JSON
    body, and streams a short answer: (its /v1 URL, the records)."""
    records: list[dict] = []

    async def keep(request: web.Request) -> dict:
        body = await request.json() if request.can_read_body else None
        # header names as HTTP reads them: in any case (httpx sends them lower-case)
        record = {"path": request.path, "body": body,
                  "headers": {k.lower(): v for k, v in request.headers.items()}}
        records.append(record)
        return record

    async def models(request: web.Request) -> web.Response:
        await keep(request)
        return web.json_response({"data": [{"id": "m"}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        await keep(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(4):
            await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"ok "},'
                             b'"text":"ok "}]}\n\n')
            await asyncio.sleep(0.005)
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":8,'
                         b'"completion_tokens":4}}\n\ndata: [DONE]\n\n')
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    async with serving(app) as root:
        yield f"{root}/v1", records


def completions(records: list[dict]) -> list[dict]:
    return [r for r in records if r["path"].endswith("completions")]


async def _run_watching(argv: list[str], env: dict[str, str]) -> tuple[int, str, str, str]:
    """The real command line as a process, reading every process's command line and
    environment of its tree while it runs: (exit code, stdout, stderr, what ps would see)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tui.cli", *argv, cwd=ROOT, env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    seen: list[str] = []
    waiting = asyncio.ensure_future(proc.communicate())
    deadline = time.monotonic() + 60
    while not waiting.done() and time.monotonic() < deadline:
        seen += _process_texts(proc.pid)
        await asyncio.sleep(0.2)
    out, err = await asyncio.wait_for(waiting, 60)
    return proc.returncode or 0, out.decode(), err.decode(), "\n".join(seen)


def _process_texts(pid: int) -> list[str]:
    """The command lines and environments of `pid` and its descendants now."""
    texts = []
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                texts.append(" ".join(p.cmdline()))
                texts.append(" ".join(f"{k}={v}" for k, v in p.environ().items()))
    except psutil.Error:
        pass
    return texts


def _all_text(path: Path) -> str:
    return "\n".join(f.read_text(errors="replace") for f in path.rglob("*") if f.is_file())


@pytest.mark.parametrize("client", ["raw", "openai"])
async def test_shaped_requests_arrive_and_the_header_secret_is_nowhere(tmp_path, client):
    headers = tmp_path / "headers.txt"
    headers.write_text(f"# the gateway's\nAuthorization: Bearer {SECRET}\nX-Api-Key: {KEY}\n")
    run_dir, summary = tmp_path / "run", tmp_path / "summary.json"
    async with recording_server() as (url, records):
        code, out, err, ps = await _run_watching(
            ["run", "--headless", "--url", url, "--duration", "1.5", "-c", "2", "--workers",
             "1", "--tokenizer", "none", "--client", client, "--header", f"@{headers}",
             *SHAPING, "--out", str(run_dir), "--json", str(summary)],
            env={"XDG_DATA_HOME": str(tmp_path / "xdg"), "OPENAI_API_KEY": ""})
    assert code == 0, err
    sent = completions(records)
    assert len(sent) >= 2, records
    for r in sent:  # the server's own record of each body and head
        body = r["body"]
        assert {k: body.get(k) for k in SHAPED} == SHAPED, body
        assert body["stream"] is True and body["max_tokens"] == 128  # tokentop's own kept
        assert r["headers"]["authorization"] == f"Bearer {SECRET}"
    models = [r for r in records if r["path"].endswith("/models")]
    assert models and all(r["headers"]["authorization"] == f"Bearer {SECRET}" for r in models)
    # the secrets: nowhere but on the wire
    for where, text in {"run directory": _all_text(run_dir), "summary": summary.read_text(),
                        "stdout": out, "stderr": err, "processes": ps}.items():
        assert SECRET not in text and KEY not in text, where
    assert ps.count("tui.cli") >= 1  # the processes were seen at all
    config = json.loads((run_dir / "manifest.json").read_text())["config"]
    assert config["headers"] == ["Authorization", "X-Api-Key"]  # names only
    assert (config["temperature"], config["top_p"], config["top_k"], config["sampling_seed"],
            config["response_format"], config["extra_body"]) == (
        0.3, 0.9, 40, 7, "json", {"repetition_penalty": 1.1})


async def test_other_headers_reach_the_server_through_the_command_line(tmp_path):
    headers = tmp_path / "headers.txt"
    headers.write_text(f"X-Api-Key: {KEY}\n")
    async with recording_server() as (url, records):
        code, _, err, _ = await _run_watching(
            ["run", "--headless", "--url", url, "--duration", "1", "-c", "1", "--workers", "1",
             "--tokenizer", "none", "--header", f"@{headers}", "--header", "X-Tenant: blue",
             "--no-record"], env={"OPENAI_API_KEY": ""})
    assert code == 0, err
    assert all(r["headers"].get("x-api-key") == KEY and r["headers"].get("x-tenant") == "blue"
               for r in records), records


@pytest.mark.parametrize("kind", [StreamingClient, OpenAIClient])
async def test_both_clients_send_the_headers_and_the_body_as_built(kind):
    """The clients alone: --header's headers (User-Agent the user's, not tokentop's) and every
    body field, the SDK's unknown ones through its extra_body."""
    async with recording_server() as (url, records):
        client = kind(f"{url}/chat/completions", IntervalRecorder(),
                      authorization="Basic dTpw", headers=[("X-Api-Key", KEY),
                                                           ("User-Agent", "shop/1.0")])
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
                **SHAPED, "chat_template_kwargs": {"enable_thinking": False}}
        try:
            assert await client.request(msgspec.json.encode(body), 1)
        finally:
            client.close()
    (r,) = completions(records)
    assert r["body"] == body
    assert r["headers"]["x-api-key"] == KEY and r["headers"]["user-agent"] == "shop/1.0"
    assert r["headers"]["authorization"] == "Basic dTpw"


@pytest.mark.parametrize(("flags", "words"), [
    (["--extra-body", "[1, 2]"], "expected a JSON object"),
    (["--extra-body", "{nope"], "not JSON"),
    (["--extra-body", '{"max_tokens": 3}'], "may not set max_tokens"),
    (["--temperature", "0.5", "--extra-body", '{"temperature": 1}'], "given twice"),
    (["--top-p", "0"], "--top-p"),
    (["--header", "Host: evil"], "tokentop's own"),
    (["--header", f"no colon {KEY}"], "expected 'Name: value'"),
    (["--header", f"X-A: {KEY}", "--header", f"x-a: {KEY}"], "given twice"),
])
def test_bad_shaping_is_one_line_that_never_quotes_a_header_value(flags, words):
    done = tokentop("run", "--headless", "--duration", "1", "--no-record", *flags)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], done.stderr
    assert KEY not in done.stderr and "Traceback" not in done.stderr


def test_the_eval_plan_shapes_requests_and_a_flag_given_wins():
    from tui.commands.eval import with_plan_request

    plan = parse_plan('[request]\ntemperature = 0.2\ntop_k = 20\nresponse_format = "json"\n'
                      'extra_body = { repetition_penalty = 1.05, min_p = 0.1 }\n')
    cfg = with_plan_request(RunConfig(temperature=0.9, extra_body={"min_p": 0.2}), plan.request)
    assert (cfg.temperature, cfg.top_k, cfg.top_p, cfg.response_format) == (0.9, 20, None, "json")
    assert cfg.extra_body == {"repetition_penalty": 1.05, "min_p": 0.2}
    assert cfg.parsed().workload(cfg, "m").body_fields == {
        "temperature": 0.9, "top_k": 20, "response_format": {"type": "json_object"},
        "repetition_penalty": 1.05, "min_p": 0.2}
    assert parse_plan("").request.run_fields()["temperature"] is None  # none: none sent
