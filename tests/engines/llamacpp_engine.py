"""A real llama.cpp (`llama-server`, built by `.ci/engines` from the llama.cpp sources that
PyPI's llama-cpp-python sdist carries) on 127.0.0.1, for the real-engine tier: a framework
batched differently from vLLM (a fixed number of slots, each with its own context; requests
beyond them deferred), with /metrics only under --metrics.

The model is the same tiny random Llama as vLLM's, written as a GGUF by the `gguf` package
(llama.cpp's own gguf-py, in the build's venv): the tier's byte-level BPE tokenizer as a
"gpt2" vocabulary with its merges, random float32 weights."""

from __future__ import annotations

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

BUILD = Path(os.environ.get("TOKENTOP_LLAMACPP", ENGINES / "llamacpp"))
SERVER = BUILD / "bin" / "llama-server"
GGUF_PYTHON = BUILD / "venv" / "bin" / "python"  # has the `gguf` package
SLOTS = 2  # fewer than vLLM's batch of 4: the two engines bend at different loads
SLOT_CONTEXT = 4096

# the GGUF, written by the build venv's python: argv is the tokenizer.json, the GGUF's path
# and the chat template
_MAKE_GGUF = """
import json, sys
import gguf
import numpy as np
tok_json, out, template = sys.argv[1:4]
tj = json.load(open(tok_json))
vocab = dict(tj["model"]["vocab"])
vocab.update({t["content"]: t["id"] for t in tj["added_tokens"]})
n = max(vocab.values()) + 1
tokens = [""] * n
for text, i in vocab.items():
    tokens[i] = text
special = {t["id"] for t in tj["added_tokens"]}
embd, ff, layers, heads = 128, 256, 2, 2
w = gguf.GGUFWriter(out, "llama")
w.add_name("tiny-llama")
w.add_context_length(4096)
w.add_embedding_length(embd)
w.add_block_count(layers)
w.add_feed_forward_length(ff)
w.add_head_count(heads)
w.add_head_count_kv(heads)
w.add_layer_norm_rms_eps(1e-6)
w.add_rope_dimension_count(embd // heads)
w.add_rope_freq_base(10000.0)
w.add_vocab_size(n)
w.add_file_type(gguf.LlamaFileType.ALL_F32)
w.add_tokenizer_model("gpt2")  # byte-level BPE
w.add_tokenizer_pre("gpt-2")  # the pre-tokenizer's regex, as the HF ByteLevel's
w.add_token_list(tokens)
w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
                   for i in range(n)])
w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]])
w.add_bos_token_id(vocab["<s>"])
w.add_eos_token_id(vocab["</s>"])
w.add_add_bos_token(False)  # as the HF tokenizer (no post-processor): the counts agree
w.add_chat_template(template)
rng = np.random.default_rng(0)
def random(*shape):
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)
w.add_tensor("token_embd.weight", random(n, embd))
w.add_tensor("output_norm.weight", np.ones(embd, np.float32))
for b in range(layers):
    w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(embd, np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.{b}.{name}.weight", random(embd, embd))
    w.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(embd, np.float32))
    w.add_tensor(f"blk.{b}.ffn_gate.weight", random(ff, embd))
    w.add_tensor(f"blk.{b}.ffn_up.weight", random(ff, embd))
    w.add_tensor(f"blk.{b}.ffn_down.weight", random(embd, ff))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
"""


def skip_reason() -> str | None:
    """Why llama.cpp cannot run here, in words; None when it can (a build under way counts:
    the engine waits for it)."""
    if not SERVER.exists() and installer() is None:
        return (f"no llama-server at {SERVER}: `.ci/engines` builds it (or set "
                f"TOKENTOP_LLAMACPP to a folder with bin/llama-server and a venv with gguf)")
    return cpu_skip_reason()


def make_model(folder: Path, *, idle: bool = False) -> Path:
    """The tiny Llama as one GGUF file in `folder`: its path."""
    folder.mkdir(parents=True, exist_ok=True)
    make_tokenizer(folder / "tokenizer.json", idle=idle)
    gguf = folder / "tiny-llama.gguf"
    run_maker([str(GGUF_PYTHON), "-c", _MAKE_GGUF, str(folder / "tokenizer.json"), str(gguf),
               CHAT_TEMPLATE], {}, idle=idle)
    return gguf


class Llamacpp(Engine):
    """llama-server serving the tiny model: SLOTS slots, /metrics on, the model's own chat
    template (--jinja)."""

    name = "llamacpp"

    def _install(self) -> None:
        wait_for_install(BUILD, SERVER)

    def _launch(self, model_dir: Path, log: Path, port: int) -> Server:
        gguf = make_model(model_dir, idle=self._idle)
        proc = self._popen(
            [str(SERVER), "--model", str(gguf), "--alias", MODEL_NAME,
             "--host", "127.0.0.1", "--port", str(port), "--metrics", "--jinja", "--no-webui",
             "--parallel", str(SLOTS), "--ctx-size", str(SLOTS * SLOT_CONTEXT),
             "--threads", str(len(server_cores()))], {}, log)
        root = f"http://127.0.0.1:{port}"
        return Server(f"{root}/v1", root, proc.pid, model_dir, log)
