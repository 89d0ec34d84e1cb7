"""What an eval measured, found out once at its start: the engine as its /metrics and its
version route say, the model it serves, the GPUs, this host, the date, tokentop's version and
the plan's digest (results.Header, kept in eval.json, the head of eval.md and eval.html).

Nothing here may fail the eval: each question has a short timeout, and a field that cannot
be found is None with its reason in `Header.why`. Every string a server sends is untrusted:
it is made plain (no control characters, no escape sequences) and bounded (`plain`) before
it is kept, so it can reach a terminal, a Markdown table or a report as it is.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

import loadgen
from loadgen.eval.results import GpuInfo, Header
from loadgen.model.text import plain as text_plain
from probes.gpu import GpuProbe
from probes.nvml import NvmlProbe
from probes.server_metrics import describe_error, metrics_url_for, parse_metrics, server_root

TIMEOUT_S = 2.0  # each question to the server, and NVML's start
TEXT_LIMIT = 200  # characters kept of a server's string (a model path, a build id)
DIGEST_HEX = 12

def plain(text: object, limit: int = TEXT_LIMIT) -> str:
    """A server's string as the header keeps it (loadgen.model.text.plain, bounded)."""
    return text_plain(text, limit)


def plan_digest(plan: dict[str, Any]) -> str:
    """The plan as eval.json keeps it, canonical (keys sorted, no blanks), sha256'd: the same
    plan gives the same digest whatever the order of its tables."""
    canonical = json.dumps(plan, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_HEX]


# ---- the engine's version ---------------------------------------------------------------------


@dataclass(frozen=True)
class VersionRoute:
    """Where an engine says its version: GET `path` (at the server's root), JSON, `key`.
    `marks`: keys only that engine's answer has, so the route can name the engine when
    /metrics does not (llama.cpp without --metrics)."""

    path: str
    key: str
    marks: tuple[str, ...] = ()


# by probes.engines' names; tried in order, the first that answers wins
VERSION_ROUTES: dict[str, tuple[VersionRoute, ...]] = {
    "vllm": (VersionRoute("/version", "version"),),
    "sglang": (VersionRoute("/get_server_info", "version", ("tp_size",)),
               VersionRoute("/server_info", "version", ("tp_size",))),
    "tgi": (VersionRoute("/info", "version", ("model_id", "max_total_tokens")),),
    "llamacpp": (VersionRoute("/props", "build_info", ("default_generation_settings",)),),
    "trtllm": (VersionRoute("/version", "version"),),
    "triton": (VersionRoute("/v2", "version", ("extensions",)),),
}


class _Answer(Exception):
    """A route that gave no JSON object; str(e) says why, in words."""


async def _get_json(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> dict:
    try:
        body = json.loads(await _text(session, url, headers))
    except ValueError as e:
        raise _Answer(f"not JSON ({e})") from None
    if not isinstance(body, dict):
        raise _Answer("not a JSON object")
    return body


async def _version(session: aiohttp.ClientSession, root: str, headers: dict[str, str],
                   engine: str) -> tuple[str | None, str]:
    """(the version, "") or (None, why), from the engine's own routes."""
    tried = []
    for route in VERSION_ROUTES.get(engine, ()):
        try:
            body = await _get_json(session, root + route.path, headers)
        except _Answer as e:
            tried.append(f"{route.path}: {e}")
            continue
        if body.get(route.key):
            return plain(body[route.key]), ""
        tried.append(f"{route.path} has no {route.key!r}")
    if not tried:
        return None, f"no version route known for {engine}"
    return None, "; ".join(tried)


async def _engine_by_route(session: aiohttp.ClientSession, root: str,
                           headers: dict[str, str]) -> str | None:
    """The engine whose version route answers with its marks, for a server whose /metrics
    named none; routes without marks (/version: vLLM's and trtllm-serve's alike) name none.
    Asked together, so a server that holds every request costs one timeout, not five."""
    marked = [(engine, route) for engine, routes in VERSION_ROUTES.items() for route in routes
              if route.marks]
    answers = await asyncio.gather(*(_get_json(session, root + route.path, headers)
                                     for _, route in marked), return_exceptions=True)
    for (engine, route), body in zip(marked, answers, strict=True):
        if isinstance(body, dict) and all(k in body for k in route.marks):
            return engine
    return None


async def _engine(session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                  why: dict[str, str]) -> tuple[str | None, str | None]:
    """(engine, version): the /metrics dialect, else a version route's marks."""
    root = server_root(url)
    engine: str | None = None
    try:
        text = await _text(session, metrics_url_for(url), headers)
        found = parse_metrics(text, metrics_url_for(url)).engine
        engine = found if found and found != "unknown" else None
        metrics_why = "" if engine else "/metrics names no engine tokentop knows"
    except _Answer as e:
        metrics_why = f"/metrics: {e}"
    if engine is None:
        engine = await _engine_by_route(session, root, headers)
    if engine is None:
        why["engine"] = f"{metrics_why}, and no engine's version route answered"
        why["engine_version"] = "no engine detected"
        return None, None
    version, version_why = await _version(session, root, headers, engine)
    if version is None:
        why["engine_version"] = version_why
    return engine, version


async def _text(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> str:
    try:
        async with session.get(url, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as r:
            if r.status != 200:
                raise _Answer(f"HTTP {r.status}")
            return await r.text(errors="replace")
    except _Answer:
        raise
    except (aiohttp.ClientError, TimeoutError) as e:
        raise _Answer(describe_error(e)) from None


# ---- the model --------------------------------------------------------------------------------

SIMULATOR_OWNER = "tokentop"  # the simulator's /v1/models says owned_by "tokentop"


async def _model(session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                 wanted: str | None, why: dict[str, str]) -> tuple[str | None, bool]:
    """(the model the load talks to, whether the server is tokentop's simulator)."""
    try:
        body = await _get_json(session, url.rstrip("/") + "/models", headers)
    except _Answer as e:
        why["model"] = f"GET /models: {e}"
        return None, False
    data = body.get("data")
    entries = [m for m in data if isinstance(m, dict) and m.get("id")] \
        if isinstance(data, list) else []
    if not entries:
        why["model"] = "GET /models listed no model"
        return None, False
    ids = [plain(m["id"]) for m in entries]
    simulator = any(m.get("owned_by") == SIMULATOR_OWNER for m in entries)
    if wanted and plain(wanted) in ids:
        return plain(wanted), simulator
    return plain(", ".join(ids)), simulator


# ---- GPUs and this host -----------------------------------------------------------------------


async def _gpus(root: str, session: aiohttp.ClientSession,
                why: dict[str, str]) -> list[GpuInfo]:
    """The GPUs as a run sees them (probes.gpu: NVML, else the simulator's pretend GPU)."""
    try:
        nvml = await asyncio.wait_for(asyncio.to_thread(NvmlProbe, watch_events=False),
                                      TIMEOUT_S)
        probe = await asyncio.wait_for(GpuProbe.create(root, session, nvml=nvml), TIMEOUT_S)
        try:
            status = await asyncio.wait_for(probe.sample(), TIMEOUT_S)
        finally:
            probe.close()
    except TimeoutError:
        why["gpus"] = f"NVML did not answer within {TIMEOUT_S:g} s"
        return []
    if not status.gpus:
        why["gpus"] = plain(status.message or "no GPU found")
        return []
    if status.source == "simulated":
        why["gpus"] = "the simulator's pretend GPU"
    return [GpuInfo(name=plain(g.name),
                    memory_mb=None if g.memory_total_bytes is None
                    else round(g.memory_total_bytes / 2**20),
                    driver=plain(status.driver) if status.driver else None)
            for g in status.gpus]


def _host_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name (Linux's /proc/cpuinfo; platform's word elsewhere)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return plain(value)
    except OSError:
        pass
    return plain(platform.processor() or platform.machine()) or None


def _host_memory_gb(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """This host's memory in GiB (/proc/meminfo's MemTotal, else psutil)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) * 1024 / 2**30, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # psutil on a platform it does not know
        return None


def _host(header: Header) -> None:
    header.host_cpu = _host_cpu()
    header.host_cores = os.cpu_count()
    header.host_memory_gb = _host_memory_gb()
    for name in ("host_cpu", "host_cores", "host_memory_gb"):
        if getattr(header, name) is None:
            header.why[name] = "this platform does not say"


# ---- the header -------------------------------------------------------------------------------


async def collect_header(url: str, *, plan: dict[str, Any], started: float,
                         label: str | None = None, meta: dict[str, str] | None = None,
                         model: str | None = None,
                         headers: dict[str, str] | None = None) -> Header:
    """What the eval measures: `url` is the OpenAI base URL every phase loads (…/v1), `plan`
    the plan as eval.json keeps it (plan_to_builtins), `started` the eval's unix time,
    `model` the one the workload names (None: the server's), `headers` what a request to the
    target carries (Secrets.request_headers(): Authorization, --header's). Never raises for
    the server's sake: a field it cannot find is None, with why. Takes about 2 s at most per
    question when nothing answers."""
    header = Header(label=plain(label) if label else None,
                    meta={plain(k, 64): plain(v) for k, v in (meta or {}).items()},
                    date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                    tokentop_version=loadgen.__version__, plan_digest=plan_digest(plan))
    header.why = {}
    _host(header)
    async with aiohttp.ClientSession() as session:
        (engine, version), (served, simulator), gpus = await asyncio.gather(
            _engine(session, url, headers or {}, header.why),
            _model(session, url, headers or {}, model, header.why),
            _gpus(server_root(url), session, header.why))
    header.engine, header.engine_version, header.model, header.gpus = engine, version, served, gpus
    if simulator and version is None:  # a simulator of a tokentop before its version route
        header.why["engine_version"] = (f"the tokentop simulator in {engine}'s words, which "
                                        f"has no version route ({header.why['engine_version']})")
    return header
