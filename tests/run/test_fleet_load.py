"""A run's load from a fleet's agents (issue 26.7): a real mosquitto broker, two real
`tokentop agent --accept-jobs` processes, the exact-timing simulator. Each figure is judged
against a truth apart from the code that merged it:

* the requests the merged run counts are the ones the simulator itself served (its own
  record, GET /sim/requests), and the sum of what each agent's own recording counted;
* each agent ran its share (its own recording's config) and nothing else;
* the merged histograms are, tick by tick summed, the `hdrh` library's own sum of the
  histograms each agent recorded on its disk (not what came over MQTT);
* a job over an agent's cap is refused in words that name the agent and the cap, and a
  fleet with no agent taking jobs says how to start one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import aiomqtt
import pytest
from hdrh.histogram import HdrHistogram
from mosquitto import ROOT, Mosquitto, Recorder, agent_process, kill_group, settings, until
from support import running_sim

from loadgen.fleet import jobs
from loadgen.fleet.jobs import Job, JobLoad
from loadgen.record.rundir import iter_snapshots
from loadgen.run.config import RunConfig
from loadgen.run.fleet_load import FleetLoad, FleetLoadError

pytestmark = pytest.mark.timeout(180)

EXACT = {"exact_ttft_ms": 20.0, "exact_itl_ms": 5.0}
AGENTS = ("a1", "a2")
STREAMS = 5  # 3 + 2
RATE = 16.0  # req/s: 8 + 8


PASSWORD = "mqtt-pw-Kq9-never-written"


@contextlib.asynccontextmanager
async def fleet(tmp: Path, *, auth: bool = False):
    """The broker (with `auth`, a user and PASSWORD), the simulator and two agents that
    take jobs; their run roots."""
    users = {"lab": PASSWORD} if auth else None
    async with Mosquitto(tmp, users=users) as broker, running_sim(**EXACT) as sim:
        url = broker.url_for("lab") if auth else broker.url
        env = {"TOKENTOP_MQTT_PASSWORD": PASSWORD} if auth else None
        procs = [agent_process(["--accept-jobs", "--broker", url, "--fleet", "t",
                                "--name", name, "--url", sim.url, "--workers", "1",
                                "--tokenizer", "none", "--max-concurrency", "8",
                                "--out", str(tmp / name)], env=env) for name in AGENTS]
        try:
            yield broker, sim
        finally:
            for p in procs:
                kill_group(p)


async def opened(broker_url: str, password: str | None = None) -> FleetLoad:
    for _ in range(20):  # the agents' processes take a few seconds to connect
        load = FleetLoad(settings(broker_url, password), "t")
        try:
            await load.open()
            if len(load.agents) == len(AGENTS):
                return load
        except FleetLoadError:
            pass
        await load.close()
    raise AssertionError("the agents never said they take jobs")


def job(sim_url: str, out: Path, **kw) -> RunConfig:
    base = dict(url=sim_url, concurrency=STREAMS, duration=2.5, warmup=0.6, tick=0.25,
                input_tokens="8", output_tokens="12", tokenizer="none", drain_grace=5.0,
                out=str(out))
    return RunConfig(**{**base, **kw})  # type: ignore[arg-type]


async def served_rows(sim) -> list[dict]:
    """The simulator's own record of every request it served, in arrival order."""
    root = sim.url.removesuffix("/v1")
    async with aiohttp.ClientSession() as http, http.get(f"{root}/sim/requests") as r:
        assert r.status == 200
        return await r.json()


async def served_ok(sim) -> int:
    return sum(1 for row in await served_rows(sim) if row["status"] == 200)


def hdr_total(run_dir: Path, metric: str) -> HdrHistogram:
    total = HdrHistogram(1, 3_600_000_000, 3)
    for s in iter_snapshots(run_dir):
        if metric in s.hist:
            total.add(HdrHistogram.decode(s.hist[metric]))
    return total


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())["summary"]


async def test_the_fleets_run_is_its_agents_merged_exactly(tmp_path):
    async with fleet(tmp_path) as (broker, sim):
        load = await opened(broker.url)
        lines: list = []
        try:
            # what is not a job is logged by the agent and left: the next job still runs
            async with aiomqtt.Client("127.0.0.1", broker.port) as raw:
                for agent in AGENTS:
                    await raw.publish(f"tokentop/t/{agent}/job", b"\x1b[2Jnot a job", qos=1)
            merged = await load.run(job(sim.url, tmp_path / "merged"), "baseline", lines.append)
            served = await served_ok(sim)
            with pytest.raises(FleetLoadError) as refused:  # 20 streams: 10 each, over 8
                await load.run(job(sim.url, tmp_path / "over", concurrency=20), "big",
                               lines.append)
            one = await load.run(job(sim.url, tmp_path / "one", concurrency=1, duration=1.5,
                                     warmup=0.0), "one", lines.append)
            served_one = await served_ok(sim) - served
            before = len(await served_rows(sim))
            opened_loop = await load.run(job(
                sim.url, tmp_path / "open", mode="open", rate=RATE, arrival="constant",
                duration=2.5, warmup=0.0), "open", lines.append)
            arrivals = sorted(r["arrived_s"] for r in (await served_rows(sim))[before:])
        finally:
            await load.close()
    # either agent may answer first: the one that did is named, with its cap
    assert re.search(r"agent a[12] refused the job: 10 streams is over this agent's "
                     r"--max-concurrency 8", str(refused.value)), refused.value

    agents = json.loads((merged / "agents.json").read_text())["agents"]
    assert [a["agent"] for a in agents] == list(AGENTS)
    assert all(a["exit"] == 0 and a["lost_ticks"] == 0 for a in agents), agents
    assert max(a["start_skew_s"] for a in agents) < 1.0  # one start for all
    own = [Path(a["run_dir"]) for a in agents]
    # each agent ran its share: its own recording's config
    shares = [json.loads((d / "manifest.json").read_text())["config"]["concurrency"]
              for d in own]
    assert shares == [3, 2]

    # the server's own count: every request it answered is in the fleet's counters
    last = list(iter_snapshots(merged))[-1]
    assert last.load.state == "stopped"
    assert last.counters.requests_ok == served > 0
    # the fleet's window is the agents' windows: the same requests, summed
    s = summary(merged)
    assert s["requests"]["ok"] == sum(summary(d)["requests"]["ok"] for d in own) > 0
    assert s["config"]["concurrency"] == STREAMS

    # the merged histograms against the hdrh library's sum of each agent's own recording
    for metric in ("ttft", "itl", "e2e"):
        truth = hdr_total(own[0], metric)
        truth.add(hdr_total(own[1], metric))
        got = hdr_total(merged, metric)
        assert got.get_total_count() == truth.get_total_count() > 0, metric
        for q in (50, 90, 99, 99.9):
            assert got.get_value_at_percentile(q) == truth.get_value_at_percentile(q), metric
    # and the simulator's exact first token: 20 ms, plus the loopback's little
    assert 20.0 <= s["latency_ms"]["ttft"]["p50"] < 30.0

    # 1 stream over 2 agents: one agent runs it, the other gets no job (no idle run)
    rows = json.loads((one / "agents.json").read_text())["agents"]
    assert [(a["agent"], a["concurrency"]) for a in rows] == [("a1", 1)]
    assert list(iter_snapshots(one))[-1].counters.requests_ok == served_one > 0

    # open loop: the rate in equal parts, as the server saw the arrivals come
    rows = json.loads((opened_loop / "agents.json").read_text())["agents"]
    assert [a["rate"] for a in rows] == [RATE / 2, RATE / 2]
    seen = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    assert RATE * 0.8 < seen < RATE * 1.2, seen
    assert list(iter_snapshots(opened_loop))[-1].counters.requests_ok == len(arrivals)


async def test_a_job_stopped_before_its_start_never_loads_the_server(tmp_path):
    async with fleet(tmp_path) as (broker, sim):
        await (await opened(broker.url)).close()
        async with Recorder(settings(broker.url), "tokentop/t/a1/job/state") as states, \
                aiomqtt.Client("127.0.0.1", broker.port) as raw:
            run = Job(id="early", op="run", start_at=time.time() + 3.0,
                      load=JobLoad(concurrency=2, duration=5.0, tick=0.25))
            await raw.publish("tokentop/t/a1/job", jobs.encode(run), qos=1)
            await raw.publish("tokentop/t/a1/job", jobs.encode(Job(id="early", op="stop")),
                              qos=1)
            await until(lambda: any(b'"job":"early"' in p and b'"state":"done"' in p
                                    for _, p, _ in states.messages), 15, "the job's end")
        served = await served_rows(sim)
    (done,) = [jobs.decode_state(p) for _, p, _ in states.messages if b'"done"' in p]
    assert done.reason == "stopped before it started" and done.run_id is None
    assert served == []


async def test_a_fleet_without_agents_taking_jobs_says_how_to_start_one(tmp_path):
    async with Mosquitto(tmp_path) as broker:
        load = FleetLoad(settings(broker.url), "nobody")
        with pytest.raises(FleetLoadError) as e:
            await load.open()
    assert "no agent of fleet nobody" in str(e.value)
    assert "tokentop agent --accept-jobs" in str(e.value)


PLAN = """
version = 1
[phases]
faults = []
[phases.baseline]
concurrency = 4
duration = "2s"
warmup = "0.5s"
input_tokens = 8
output_tokens = 12
[phases.ramp]
steps = [2, 4]
step_duration = "1.5s"
step_warmup = "0.5s"
[phases.scaling]
per_target = "baseline"
duration = "1.5s"
warmup = "0s"
""" + "".join(f"[phases.{p}]\nenabled = false\n" for p in (
    "conformance", "batch", "context", "interference", "priority", "long_tail",
    "leaks", "memory", "efficiency"))


async def test_eval_with_broker_runs_its_phases_from_the_fleet(tmp_path):
    """The baseline from both agents; the ramp steering both, step by step, in one run;
    scaling across client machines: the baseline's load from one agent, then each of two."""
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out = tmp_path / "eval"
    async with fleet(tmp_path, auth=True) as (broker, sim):
        # the agents are up and take jobs; and everything they send is kept, to look in
        await (await opened(broker.url_for("lab"), PASSWORD)).close()
        async with Recorder(settings(broker.url_for("lab"), PASSWORD)) as bus:
            proc = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "tui.cli", "eval", "--headless", "--url", sim.url,
                "--broker", broker.url_for("lab"), "--fleet", "t", "--plan", str(plan),
                "--out", str(out), "--tokenizer", "none", "--workers", "1"],
                cwd=ROOT, capture_output=True, text=True, timeout=150,
                env={**os.environ, "TOKENTOP_MQTT_PASSWORD": PASSWORD})
        served = await served_ok(sim)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the broker's password is nowhere: not on the bus, not in any file of the eval's or the
    # agents' run directories, not in what the eval printed
    assert bus.messages and not [t for t, p, _ in bus.messages if PASSWORD.encode() in p]
    written = [f for f in tmp_path.rglob("*") if f.is_file() and "mosquitto" not in str(f)]
    assert len(written) > 20
    assert not [f for f in written if PASSWORD.encode() in f.read_bytes()]
    assert PASSWORD not in proc.stdout + proc.stderr
    assert "the load from fleet t: a1, a2" in proc.stderr
    state = json.loads((out / "eval.json").read_text())
    assert state["header"]["load_from"].startswith("fleet t: a1, a2")
    run_dir = Path(state["phases"]["baseline"]["run_dir"])
    agents = json.loads((run_dir / "agents.json").read_text())["agents"]
    assert [a["concurrency"] for a in agents] == [2, 2]
    assert state["phases"]["baseline"]["figures"]["requests"] == summary(run_dir)["requests"]["ok"]
    assert "load from" in (out / "eval.md").read_text()

    scaling = state["phases"]["scaling"]["figures"]
    assert [r["agents"] for r in scaling["rows"]] == [1, 2]
    shares = [[a["concurrency"] for a in json.loads(
        (Path(r["run_dirs"][0]) / "agents.json").read_text())["agents"]]
        for r in scaling["rows"]]
    assert shares == [[4], [4, 4]]  # the same load from each agent
    ramp = state["phases"]["ramp"]
    assert [st["load"] for st in ramp["figures"]["steps"]] == [2, 4]
    assert all(st["output_tok_s"] > 0 for st in ramp["figures"]["steps"])
    ramp_dir = Path(ramp["run_dir"])
    # one run on both agents, steered: each agent's own recording held 1 then 2 streams
    ramp_agents = json.loads((ramp_dir / "agents.json").read_text())["agents"]
    assert [a["concurrency"] for a in ramp_agents] == [2, 2]
    for a in ramp_agents:
        held = {s.load.target_concurrency for s in iter_snapshots(Path(a["run_dir"]))}
        assert {1, 2} <= held <= {0, 1, 2}, (a["agent"], held)
    # every request the server answered came in one of the eval's fleet runs
    runs = [run_dir, ramp_dir] + [Path(r["run_dirs"][0]) for r in scaling["rows"]]
    assert sum(list(iter_snapshots(d))[-1].counters.requests_ok for d in runs) == served
    one, two = (r["output_tok_s"] for r in scaling["rows"])
    assert scaling["rows"][1]["efficiency"] == pytest.approx(two / (2 * one))
    ids = {r["id"] for r in state["rows"]}
    assert {"scaling.agents.1.output_tok_s", "scaling.agents.2.efficiency"} <= ids
