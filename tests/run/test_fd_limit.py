"""The client's own open-file limit is the client's problem, said as such: the soft limit
is raised to the hard one, a load that cannot fit is refused up front, and running into
the limit later is `client_fd_limit`, never an outage of the server."""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys

SMALL = ["--workers", "1", "--input-tokens", "8", "--output-tokens", "64", "--tick", "0.25",
         "--drain-grace", "1", "--no-record"]


def nofile(soft: int, hard: int):
    """A preexec_fn: the child starts with this open-file limit."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


async def cli(*args: str, soft: int, hard: int) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "tui.cli", *args],
                                   capture_output=True, text=True, timeout=90,
                                   stdin=subprocess.DEVNULL, preexec_fn=nofile(soft, hard))


async def test_a_load_that_cannot_fit_is_refused_up_front(sim):
    done = await cli("run", "--headless", "--url", sim.url, "-c", "300", *SMALL,
                     "--duration", "1", soft=200, hard=200)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("tokentop: 300 streams need about")
    assert "ulimit -n" in done.stderr and "Traceback" not in done.stderr
    assert sum(sim.model.metrics.success.values()) == 0  # no load was sent


async def test_a_low_soft_limit_is_raised_to_the_hard_one(sim, tmp_path):
    summary = tmp_path / "s.json"
    done = await cli("run", "--headless", "--url", sim.url, "-c", "150", *SMALL,
                     "--duration", "2", "--json", str(summary), soft=100, hard=4096)
    assert done.returncode == 0, done.stderr
    s = json.loads(summary.read_text())
    # 150 streams held (8 slots: most queue, and the drain cancels them), no socket refused
    assert s["requests"]["ok"] > 0 and set(s["requests"]["errors"]) <= {"cancelled"}


async def test_running_into_the_limit_is_a_client_error_not_an_outage(sim, tmp_path):
    summary, out = tmp_path / "s.json", tmp_path / "run"
    args = [a for a in SMALL if a != "--no-record"]
    done = await cli("run", "--headless", "--url", sim.url, "-c", "40", *args,
                     "--ramp", "linear:40:400:1", "--duration", "3", "--json", str(summary),
                     "--out", str(out), soft=220, hard=220)
    assert done.returncode == 0, done.stderr
    s = json.loads(summary.read_text())
    assert s["requests"]["errors"].get("client_fd_limit", 0) > 0, s["requests"]
    assert "connect" not in s["requests"]["errors"]
    kinds = {json.loads(x)["kind"] for x in (out / "events.jsonl").read_text().splitlines()}
    assert "outage" not in kinds
    assert "Traceback" not in done.stderr


