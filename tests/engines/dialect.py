"""What a /metrics page and a stream look like, reduced to what must agree between the
simulator's imitation of an engine and the engine itself: metric families with their types,
sample names, label names and histogram edges; a stream's sequence of chunk kinds. Values
are left out on purpose: the two serve different loads."""

from __future__ import annotations

import json
from typing import NamedTuple

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from support import chat_body, root, running_sim


class Family(NamedTuple):
    kind: str  # counter, gauge, histogram
    labels: dict[str, frozenset[str]]  # a sample name -> the label names it carries
    edges: frozenset[str]  # a histogram's `le` values


def families(text: str, prefix: str) -> dict[str, Family]:
    """The page's families whose names start with `prefix`."""
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(prefix):
            continue
        labels: dict[str, set[str]] = {}
        edges: set[str] = set()
        for s in fam.samples:
            labels.setdefault(s.name, set()).update(k for k in s.labels if k != "le")
            if "le" in s.labels:
                edges.add(s.labels["le"])
        out[fam.name] = Family(fam.type, {k: frozenset(v) for k, v in labels.items()},
                               frozenset(edges))
    return out


async def simulator_page(dialect: str = "vllm") -> str:
    """The simulator's page in `dialect` after it served requests, with a prefix cache: every
    family it can show is on it."""
    async with running_sim(metrics_dialect=dialect, prefix_cache_tokens=4096) as sim, \
            aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(f"{sim.url}/chat/completions", data=chat_body(4),
                                 headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
        async with http.get(f"{root(sim)}/metrics") as resp:
            return await resp.text()


def differences(imitation: dict[str, Family], real: dict[str, Family]) -> list[str]:
    """Where the imitation says something the real page does not: a family it lacks, another
    type, a sample name or label it has not, other bucket edges. Empty when the imitation's
    page is a subset of the real one."""
    out = []
    for name, fam in sorted(imitation.items()):
        other = real.get(name)
        if other is None:
            out.append(f"{name}: not on the real page")
            continue
        if fam.kind != other.kind:
            out.append(f"{name}: a {fam.kind} here, a {other.kind} there")
        for sample, labels in sorted(fam.labels.items()):
            if sample not in other.labels:
                out.append(f"{name}: sample {sample} not on the real page")
            elif not labels <= other.labels[sample]:
                out.append(f"{sample}: labels {sorted(labels - other.labels[sample])} "
                           f"not on the real page")
        if fam.edges != other.edges:
            out.append(f"{name}: buckets {sorted(fam.edges ^ other.edges, key=float)} differ")
    return out


def chunk_kinds(raw: str) -> list[str]:
    """A stream's events as kinds, runs of one kind collapsed to one: `role` (the delta that
    names the assistant), `content`, `finish` (a choice with its finish_reason), `usage-only`
    (no choices, usage), each with `+usage` where the chunk carries usage, and `[DONE]`."""
    kinds: list[str] = []
    for event in raw.split("\n\n"):
        event = event.strip()
        if not event.startswith("data: "):
            continue
        data = event.removeprefix("data: ")
        kind = "[DONE]" if data == "[DONE]" else _kind(json.loads(data))
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


def _kind(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    usage = "+usage" if chunk.get("usage") else ""
    if not choices:
        return "usage-only" if usage else "empty"
    choice = choices[0]
    if choice.get("finish_reason"):
        return "finish" + usage
    if "role" in (choice.get("delta") or {}):
        return "role" + usage
    return "content" + usage
