"""`tokentop eval compare` of two real engines batched differently: vLLM (a continuous batch
of 4) and llama.cpp (2 slots, the rest deferred), each eval'd with the tier's plan. What the
compare says differs is held against the engines themselves: their own /version and /props,
their raw answers to the requests the conformance rows are about, their slots."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from engine import tokentop_client
from evals import verdicts
from llamacpp_engine import SLOTS
from vllm_engine import MAX_NUM_SEQS

pytestmark = pytest.mark.timeout(300)


def _compare(*evals) -> dict:
    done = tokentop_client("eval", "compare", "--format", "json", *(str(e) for e in evals),
                           timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _status(server, path: str, body: bytes) -> int:
    """The engine's HTTP status for a raw POST of `body`."""
    req = urllib.request.Request(f"{server.url}{path}", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def _usage_chunks(server) -> tuple[int, int]:
    """A stream asking for usage on every chunk: (chunks with choices that carry usage,
    chunks with choices)."""
    body = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 6, "ignore_eos": True, "stream": True, "stream_options": {
                           "include_usage": True, "continuous_usage_stats": True}}).encode()
    req = urllib.request.Request(f"{server.url}/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = [e.removeprefix("data: ") for e in resp.read().decode().split("\n\n")
                  if e.startswith("data: {")]
    chunks = [json.loads(e) for e in events]
    with_choices = [c for c in chunks if c.get("choices")]
    return sum(1 for c in with_choices if c.get("usage")), len(with_choices)


def test_eval_compare_of_vllm_and_llamacpp_says_what_really_differs(
        vllm, llamacpp, vllm_eval, llamacpp_eval) -> None:
    (a_dir, a), (b_dir, b) = vllm_eval, llamacpp_eval
    c = _compare(a_dir, b_dir)
    # the header: each engine as it names itself
    with urllib.request.urlopen(f"{vllm.root}/version", timeout=10) as resp:
        vllm_version = json.loads(resp.read())["version"]
    with urllib.request.urlopen(f"{llamacpp.root}/props", timeout=10) as resp:
        llamacpp_build = json.loads(resp.read())["build_info"]
    said = " ".join(c["differences"])
    assert "'vllm'" in said and "'llamacpp'" in said
    assert f"'{vllm_version}'" in said and f"'{llamacpp_build}'" in said

    # the conformance rows: where the two differ is where the evals' own checks differ...
    rows = {r["id"]: r for r in c["rows"]}
    va, vb = verdicts(a), verdicts(b)
    differing = {f"conformance.{i}" for i in va if va[i] != vb.get(i)}
    shown = {i for i, r in rows.items() if i.startswith("conformance.")
             and r["evals"][0] and r["evals"][1]
             and r["evals"][0]["note"].split(":")[0] != r["evals"][1]["note"].split(":")[0]}
    assert shown == differing
    # ...and these differences are the engines' own, asked here directly
    bad = b'{"model": "x", "messages": [}'
    assert _status(vllm, "/chat/completions", bad) == 400
    assert _status(llamacpp, "/chat/completions", bad) == 500
    unknown = json.dumps({"model": "tokentop-no-such-model", "max_tokens": 2,
                          "messages": [{"role": "user", "content": "hi"}]}).encode()
    assert _status(vllm, "/chat/completions", unknown) == 404
    assert _status(llamacpp, "/chat/completions", unknown) == 200
    with_usage, chunks = _usage_chunks(vllm)
    assert with_usage == chunks > 0
    assert _usage_chunks(llamacpp)[0] == 0
    assert {"conformance.errors.malformed", "conformance.errors.unknown_model",
            "conformance.usage.continuous"} <= differing
    assert (va["usage.continuous"], vb["usage.continuous"]) == ("yes", "no")

    # the batching: llama.cpp bends at its slot count; vLLM's batch of 4 takes more than 2
    knee = rows["ramp.knee"]["evals"]
    assert knee[1]["value"] == SLOTS
    assert knee[0]["value"] is None or knee[0]["value"] > SLOTS, knee[0]
    assert MAX_NUM_SEQS > SLOTS
    print("\n" + tokentop_client("eval", "compare", "--format", "md", str(a_dir), str(b_dir),
                                 timeout=60).stdout)
