"""A --url that does not answer at start is waited for: probed every 2 s, said once, and
the run starts when it answers. Headless gives up after a bound, with exit code 2."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import time

from support import FAST, headless_argv, root, scrape, tokentop

from loadgen.run.config import RunConfig
from loadgen.run.headless import run_headless
from loadgen.sim import SimConfig, start_sim


async def next_line(stream: asyncio.StreamReader, seen: list[str], wanted,
                    within: float = 20.0) -> str:
    """The first line from now on that `wanted` accepts; every line read goes to `seen`."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        try:
            raw = await asyncio.wait_for(stream.readline(), left)
        except TimeoutError:
            break
        if not raw:
            break
        seen.append(raw.decode().rstrip("\n"))
        if wanted(seen[-1]):
            return seen[-1]
    raise AssertionError("never came; stderr so far:\n" + "\n".join(seen))


async def test_the_run_starts_when_the_server_comes_up(unused_tcp_port, tmp_path):
    url = f"http://127.0.0.1:{unused_tcp_port}/v1"
    out = tmp_path / "r.json"
    proc = await asyncio.create_subprocess_exec(
        *headless_argv("--json", str(out), "--no-record", url=url, duration=1.5,
                       concurrency=2, output_tokens=8),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    seen: list[str] = []
    sim = None
    try:
        waiting = await next_line(proc.stderr, seen, lambda s: "waiting for" in s)
        assert waiting == (f"tokentop: waiting for {url} (connection refused); retrying every "
                           "2 s, Ctrl-C to stop")
        assert proc.returncode is None  # it waits rather than failing
        sim = await start_sim(SimConfig(**FAST), host="127.0.0.1", port=unused_tcp_port)
        await next_line(proc.stderr, seen, lambda s: s.startswith(f"tokentop: {url} answers"))
        while raw := await asyncio.wait_for(proc.stderr.readline(), 30.0):
            seen.append(raw.decode().rstrip("\n"))
        code = await asyncio.wait_for(proc.wait(), 5.0)
        served = (await scrape(root(sim) + "/metrics"))["vllm:request_success_total"]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if sim is not None:
            await sim.close()
    assert code == 0, seen
    assert sum("waiting for" in s for s in seen) == 1, seen  # said once, not every probe
    summary = json.loads(out.read_text())
    ok = summary["requests"]["ok"] + (summary["drain"] or {}).get("requests_ok", 0)
    assert ok == served > 0  # the run's requests are the ones the late server answered


async def test_headless_gives_up_after_its_bound_with_exit_2(unused_tcp_port):
    url = f"http://127.0.0.1:{unused_tcp_port}/v1"
    said = io.StringIO()
    t0 = time.monotonic()
    code = await run_headless(RunConfig(url=url, duration=1.0), record=False, out=said,
                              wait=3.0)
    waited = time.monotonic() - t0
    assert code == 2
    assert said.getvalue().splitlines() == [
        f"tokentop: waiting for {url} (connection refused); retrying every 2 s, Ctrl-C to stop",
        f"tokentop: cannot reach {url}: connection refused; gave up after waiting 3 s",
    ]
    assert 3.0 <= waited < 8.0


def test_wait_flag_bounds_the_wait_from_the_command_line(unused_tcp_port):
    url = f"http://127.0.0.1:{unused_tcp_port}/v1"
    for wait, lines in (("0", 1), ("1", 2)):
        t0 = time.monotonic()
        done = tokentop("run", "--headless", f"--url={url}", f"--wait={wait}", "--duration=1",
                        "--no-record", timeout=30)
        assert done.returncode == 2, done.stderr
        said = done.stderr.strip().splitlines()
        # --wait 0: the one line that it cannot be reached; else the waiting line first
        assert len(said) == lines and "cannot reach" in said[-1], said
        assert "Traceback" not in done.stderr
        assert time.monotonic() - t0 < 20


async def test_ctrl_c_while_waiting_ends_at_once(unused_tcp_port):
    url = f"http://127.0.0.1:{unused_tcp_port}/v1"
    proc = await asyncio.create_subprocess_exec(
        *headless_argv("--no-record", url=url, duration=1), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        await next_line(proc.stderr, seen, lambda s: "waiting for" in s)
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 10.0)
        seen += (await proc.stderr.read()).decode().splitlines()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 2
    assert seen[-1] == f"tokentop: stopped while waiting for {url}", seen
    assert not any("Traceback" in s for s in seen)


async def test_the_console_waits_and_starts_when_the_server_comes_up(unused_tcp_port,
                                                                     monkeypatch, tmp_path):
    from loadgen.run.run_process import RunProcess
    from tui.app import TokentopApp
    from tui.widgets import HostPanel

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    url = f"http://127.0.0.1:{unused_tcp_port}/v1"
    cfg = RunConfig(url=url, concurrency=2, output_tokens="8", workers=1, tick=0.25,
                    drain_grace=1.0)
    app = TokentopApp(RunProcess(cfg, record=False), refresh=0.1)
    sim = None

    async def until(pilot, cond, seconds: float = 20.0) -> None:
        deadline = time.monotonic() + seconds
        while not cond():
            assert time.monotonic() < deadline, "condition not reached in time"
            await pilot.pause(0.05)

    def header() -> str:
        return " ".join(str(app.query_one("#header").render()).split())

    try:
        async with app.run_test(size=(200, 40)) as pilot:
            await until(pilot, lambda: "waiting for" in header())
            assert f"waiting for {url} (connection refused); retrying every 2 s, q to quit" \
                in header(), header()
            assert app.error is None and app.windows.last is None  # waiting, not failed
            # the host is local: its panel is live meanwhile (the run's other panels wait)
            await until(pilot, lambda: "RAM" in app.query_one(HostPanel).plain
                        and "GiB" in app.query_one(HostPanel).plain)
            sim = await start_sim(SimConfig(**FAST), host="127.0.0.1", port=unused_tcp_port)
            await until(pilot, lambda: app.windows.last is not None
                        and app.windows.last.counters.requests_ok > 0)
            assert app.windows.last.target.url == url
            await until(pilot, lambda: "waiting for" not in header())
            await until(pilot, lambda: "answers after" in app.query_one("#events").plain)
            events = " ".join(app.query_one("#events").plain.split())
            assert "waiting for" in events and f"{url} answers after" in events, events
            source = app.source
            await pilot.press("q", "q")
            await until(pilot, lambda: source.proc.returncode is not None)
    finally:
        if sim is not None:
            await sim.close()


async def test_q_while_the_console_waits_quits_at_once(unused_tcp_port, monkeypatch, tmp_path):
    from loadgen.run.run_process import RunProcess
    from tui.app import TokentopApp

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cfg = RunConfig(url=f"http://127.0.0.1:{unused_tcp_port}/v1", workers=1)
    app = TokentopApp(RunProcess(cfg, record=False), refresh=0.1)
    async with app.run_test(size=(200, 40)) as pilot:
        deadline = time.monotonic() + 20.0
        while "waiting for" not in str(app.query_one("#header").render()):
            assert time.monotonic() < deadline, "never said it waits"
            await pilot.pause(0.05)
        await pilot.press("q")  # no load runs yet: one q is enough
        deadline = time.monotonic() + 10.0
        while app.is_running:
            assert time.monotonic() < deadline, "still running after q"
            await pilot.pause(0.05)
    # the run process did the waiting (the console has no wait of its own); q stopped it
    assert app.source.proc is not None and app.source.proc.returncode is not None
    assert app.error == f"stopped while waiting for {cfg.url}", app.error
