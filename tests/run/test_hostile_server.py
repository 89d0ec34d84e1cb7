"""A hostile server (a test's own aiohttp app on 127.0.0.1): its model id, its /metrics label
values and its HTTP 500 message hold escape sequences and markup. A real `tokentop run
--headless` against it writes no control byte to stderr, stdout or any file of its run
directory, nor does `tokentop report` of that run. The truth is the bytes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

from aiohttp import web
from support import headless_argv, serving, tokentop

TITLE = "PWNED"
MODEL = f"\x1b]0;{TITLE}\x07\x1b[2J[red]x[/red]"
ERROR = f"boom\x1b[2J\x1b]0;{TITLE}\x07\x9b1m[bold]b[/bold]"
METRICS = ("# TYPE odd_gauge gauge\n"
           f'odd_gauge{{who="\x1b]0;{TITLE}\x07a"}} 1\nodd_gauge{{who="b"}} 2\n')


def _app(fail: bool) -> web.Application:
    async def models(_r):
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def complete(_r):
        if fail:
            return web.json_response({"error": {"message": ERROR}}, status=500)
        return web.json_response({"error": {"message": "not served here"}}, status=400)

    async def metrics(_r):
        return web.Response(text=METRICS)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/metrics", metrics)
    return app


def _controls(data: bytes) -> list[str]:
    """C0 (but newline) and C1 control characters in `data`, and JSON's escapes of them."""
    text = data.decode("utf-8", errors="replace")
    found = [repr(c) for c in text if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f]
    return found + (["\\u00xx"] if "\\u001b" in text or "\\u0007" in text
                    or "\\u009b" in text else [])


async def _run(app: web.Application, out: Path, home: Path) -> subprocess.CompletedProcess:
    async with serving(app) as base:
        argv = headless_argv(url=f"{base}/v1", duration=1.5, concurrency=1, workers=1,
                             tick=0.5, drain_grace=0.5, out=out)
        env = {**os.environ, "XDG_DATA_HOME": str(home), "XDG_CONFIG_HOME": str(home)}
        return await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=60,
                                       stdin=subprocess.DEVNULL, env=env)


def _check_bytes(done: subprocess.CompletedProcess, out: Path) -> None:
    assert not _controls(done.stdout + done.stderr), (done.stderr[-2000:])
    report = tokentop("report", str(out), "--no-plots", timeout=60)
    assert not _controls((report.stdout + report.stderr).encode())
    for f in sorted(out.iterdir()):
        if f.suffix in (".json", ".jsonl", ".md"):
            assert not _controls(f.read_bytes()), (f.name, _controls(f.read_bytes())[:5])


async def test_a_hostile_model_id_and_metrics_labels_reach_no_byte_raw(tmp_path: Path):
    out = tmp_path / "run"
    done = await _run(_app(fail=False), out, tmp_path)
    _check_bytes(done, out)
    snaps = [json.loads(x) for x in (out / "snapshots.jsonl").read_text().splitlines()]
    assert {s["target"]["model"] for s in snaps} == {"[red]x[/red]"}
    generic = {k for s in snaps for k in (s.get("server") or {}).get("generic", {})}
    assert 'odd_gauge{who="a"}' in generic, generic
    assert "model [red]x[/red]" in (out / "report.md").read_text()


async def test_a_hostile_500_message_reaches_no_byte_raw(tmp_path: Path):
    out = tmp_path / "run"
    done = await _run(_app(fail=True), out, tmp_path)
    _check_bytes(done, out)
    assert b"boom" in done.stderr and b"[bold]b[/bold]" in done.stderr
