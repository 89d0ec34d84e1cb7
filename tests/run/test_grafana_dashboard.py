"""The Grafana dashboard shipped in grafana/: valid JSON with a Prometheus datasource
variable, and every expression names a metric a real run's endpoint serves (a headless run
with a per-request SLO, so goodput is served too, its page read with prometheus_client's
parser)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from support import ROOT, headless_argv

DASHBOARD = ROOT / "grafana" / "tokentop-dashboard.json"
METRIC = re.compile(r"\btokentop_[a-z0-9_]+\b")
SERVING = re.compile(r"serving figures for Prometheus at (http://\S+/metrics)")


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _exprs(dash: dict) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' and its variables' queries."""
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            out.append(var["query"]["query"])
    return out


def test_the_dashboard_is_valid_and_asks_for_its_datasource():
    dash = _dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert METRIC.search(t["expr"]), (panel["title"], t["expr"])
            assert '$target' in t["expr"], (panel["title"], t["expr"])
    titles = " ".join(p["title"] for p in dash["panels"])
    for needed in ("tokens / s", "TTFT", "ITL", "E2E", "Errors", "In flight", "Outage",
                   "Goodput", "Client lag"):
        assert needed in titles, needed


async def _served_names(tmp_path: Path) -> tuple[set[str], dict[str, set[str]]]:
    """Sample names a real run's page serves once every latency has a sample, and the label
    names of each."""
    argv = headless_argv(duration=4, concurrency=2, workers=1, tick=0.25, slo="ttft<10s",
                         output_tokens=16, prometheus_port=0, out=tmp_path / "run")
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, "the run ended before it said where it serves"
            url = m.group(1) if (m := SERVING.search(line)) else None
        assert url is not None
        async with aiohttp.ClientSession() as http:
            while "tokentop_e2e_seconds" not in names and time.monotonic() < deadline:
                async with http.get(url) as r:
                    text = await r.text()
                for fam in text_string_to_metric_families(text):
                    for s in fam.samples:
                        names.add(s.name)
                        labels.setdefault(s.name, set()).update(s.labels)
                await asyncio.sleep(0.1)  # a poll's pace, not a wait for a result
    finally:
        proc.terminate()
        await proc.wait()
    return names, labels


async def test_every_expression_names_a_metric_the_endpoint_serves(tmp_path: Path):
    names, labels = await _served_names(tmp_path)
    asked = {m for e in _exprs(_dashboard()) for m in METRIC.findall(e)}
    assert asked, "no metric in the dashboard"
    assert asked <= names, sorted(asked - names)
    assert "target" in labels["tokentop_run_info"]  # the $target variable's label_values
