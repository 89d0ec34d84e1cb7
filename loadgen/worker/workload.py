"""What each request asks for: the prompt, the lengths, the API shape.

Synthetic prompts are words from a fixed vocabulary, seeded so a run is
reproducible; most tokenizers give about one token per such word, and the
server's `usage` gives the true count. A per-request serial number follows
the shared prefix (if any) so that prefix caching helps exactly as much as
the prefix length says, and no more.

Lengths come from a distribution given as text:
  128                fixed
  uniform:64:256     uniform between the two
  normal:128:32      mean, standard deviation
  lognormal:128:0.5  median, sigma of the underlying normal
All are clamped to at least 1 token.

A prompt file is JSONL: one `{"prompt": "…"}` (or `"text"`) per line, or
ShareGPT-style `{"conversations": [{"from": "human", "value": "…"}, …]}`
(the first human turn is the prompt). Each worker cycles through the lines from
its own offset.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import msgspec

_VOCAB = (
    "the of and to in is was for on that with as by at from his her they this which are "
    "be or had an were but not have one all their there been has when who will more no if "
    "out so said what up its about into than them can only other new some could time "
    "these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down "
    "should because each just those people"
).split()

DIST_KINDS = ("fixed", "uniform", "normal", "lognormal")


class WorkloadError(ValueError):
    """A workload setting or prompt file that cannot be used; the text says why."""


class LengthDist(msgspec.Struct, frozen=True):
    kind: str = "fixed"
    a: float = 128.0
    b: float = 0.0

    @classmethod
    def parse(cls, text: str | int) -> LengthDist:
        parts = str(text).strip().split(":")
        try:
            if len(parts) == 1:  # a plain number is a fixed length, checked below like any
                kind, values = "fixed", [float(int(parts[0]))]
            else:
                kind, *nums = parts
                values = [float(x) for x in nums]
        except ValueError:
            raise WorkloadError(f"bad length {text!r}: use e.g. 128, uniform:64:256, "
                                "normal:128:32 or lognormal:128:0.5") from None
        if kind not in DIST_KINDS or len(values) != (1 if kind == "fixed" else 2):
            raise WorkloadError(f"bad length {text!r}: kinds are {', '.join(DIST_KINDS)}")
        if values[0] < 1 or (kind == "uniform" and values[1] < values[0]):
            raise WorkloadError(f"bad length {text!r}: lengths must be ≥ 1 and low ≤ high")
        return cls(kind, values[0], values[1] if len(values) > 1 else 0.0)

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            x = self.a
        elif self.kind == "uniform":
            x = rng.uniform(self.a, self.b)
        elif self.kind == "normal":
            x = rng.gauss(self.a, self.b)
        else:
            x = rng.lognormvariate(math.log(self.a), self.b)
        return max(1, round(x))

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "lognormal":
            return self.a * math.exp(self.b**2 / 2)
        return self.a

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g}"
        return f"{self.kind}:{self.a:g}:{self.b:g}"


class Workload(msgspec.Struct, kw_only=True, frozen=True):
    model: str
    api: str = "chat"  # chat | completions
    input_tokens: LengthDist = LengthDist()
    output_tokens: LengthDist = LengthDist()
    shared_prefix: int = 0  # words every prompt starts with (prefix-cache studies)
    prompts_file: str | None = None
    ignore_eos: bool = True  # vLLM/SGLang/llama.cpp extension: generate exactly max_tokens
    continuous_usage: bool = True  # ask for usage on every chunk (exact tokens per chunk)
    seed: int = 0

    @property
    def path(self) -> str:
        return "/chat/completions" if self.api == "chat" else "/completions"

    def describe(self) -> str:
        source = f"prompts from {Path(self.prompts_file).name}" if self.prompts_file else (
            f"{self.input_tokens} in")
        prefix = f", {self.shared_prefix} shared" if self.shared_prefix else ""
        return f"{self.api}, {source}{prefix} → {self.output_tokens} out"


def load_prompts(path: str) -> list[str]:
    """Prompts of a JSONL file; raises WorkloadError with the file and line on bad input."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise WorkloadError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"prompt file {path} is not UTF-8 text") from None
    prompts: list[str] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = msgspec.json.decode(line)
        except msgspec.DecodeError as e:
            raise WorkloadError(f"{path}:{n}: not JSON ({e})") from None
        prompt = _prompt_of(item)
        if prompt is None:
            raise WorkloadError(
                f'{path}:{n}: no prompt (expected "prompt", "text" or ShareGPT "conversations")'
            )
        prompts.append(prompt)
    if not prompts:
        raise WorkloadError(f"prompt file {path} has no prompts")
    return prompts


def _prompt_of(item: object) -> str | None:
    if not isinstance(item, dict):
        return item if isinstance(item, str) and item else None
    for key in ("prompt", "text"):
        if isinstance(item.get(key), str) and item[key]:
            return item[key]
    for turn in item.get("conversations") or []:
        if isinstance(turn, dict) and turn.get("from") in ("human", "user"):
            value = turn.get("value")
            return value if isinstance(value, str) and value else None
    return None


class RequestFactory:
    """Builds request bodies (bytes, ready to send) for one worker."""

    def __init__(self, workload: Workload, worker_index: int = 0) -> None:
        self.w = workload
        self.rng = random.Random(workload.seed * 1000 + worker_index)
        self.serial = 0
        self.worker_index = worker_index
        self.prompts = load_prompts(workload.prompts_file) if workload.prompts_file else None
        prefix_rng = random.Random(workload.seed)  # the same prefix in every worker
        self.prefix = " ".join(prefix_rng.choices(_VOCAB, k=workload.shared_prefix))
        self._encode = msgspec.json.Encoder().encode

    def next(self) -> tuple[bytes, int]:
        """(body, prompt word count) of the next request."""
        w = self.w
        self.serial += 1
        prompt = self._prompt()
        body: dict = {"model": w.model, "max_tokens": w.output_tokens.draw(self.rng),
                      "stream": True}
        options = {"include_usage": True}
        if w.continuous_usage:
            options["continuous_usage_stats"] = True
        body["stream_options"] = options
        if w.ignore_eos:
            body["ignore_eos"] = True
        if w.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return self._encode(body), len(prompt.split())

    def _prompt(self) -> str:
        if self.prompts is not None:
            i = (self.serial - 1 + self.worker_index * 9973) % len(self.prompts)
            text = self.prompts[i]
            return f"{self.prefix} {text}" if self.prefix else text
        n = self.w.input_tokens.draw(self.rng)
        words = [self.prefix] if self.prefix else []
        words.append(f"r{self.worker_index}-{self.serial}")
        words += self.rng.choices(_VOCAB, k=max(0, n - 1 - self.w.shared_prefix))
        return " ".join(words)
