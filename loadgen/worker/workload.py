"""What each request asks for: the prompt, the lengths, the API shape.

Synthetic prompts are words from a fixed vocabulary, seeded so a run is
reproducible; most tokenizers give about one token per such word, and the
server's `usage` gives the true count. A per-request serial number follows
the shared prefix (if any) so that prefix caching helps exactly as much as
the prefix length says, and no more. With `--tokenizer` (loadgen.worker.tokenizer)
the words are ones that are one token each, the serial is written in them too, and
a prompt is exactly the asked length.

Lengths come from a distribution given as text:
  128                fixed
  uniform:64:256     uniform between the two
  normal:128:32      mean, standard deviation
  lognormal:128:0.5  median, sigma of the underlying normal
All are clamped to at least 1 token.

Prompts from files (raw text windows, ShareGPT, JSONL) are loadgen.worker.dataset's;
each worker cycles through a file's prompts from its own offset.
"""

from __future__ import annotations

import math
import random

import msgspec

from loadgen.worker.dataset import Dataset, TextWindows, open_source, resolved
from loadgen.worker.tokenizer import ChunkTokens, load_tokenizer

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
    prompts_file: str | None = None  # the older form of dataset jsonl:FILE
    dataset: Dataset = Dataset()  # where prompts come from (loadgen.worker.dataset)
    ignore_eos: bool = True  # vLLM/SGLang/llama.cpp extension: generate exactly max_tokens
    continuous_usage: bool = True  # ask for usage on every chunk (exact tokens per chunk)
    seed: int = 0
    # --tokenizer, as resolved at start (loadgen.worker.tokenizer): a local tokenizer.json the
    # workers load (tokens per chunk without per-chunk usage; prompts by encode-and-trim when
    # no one-token words are known), and words that are one token each anywhere in a prompt
    # (synthetic prompts of them are exactly the asked length). Neither: approx.
    tokenizer: str | None = None
    one_token_words: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return "/chat/completions" if self.api == "chat" else "/completions"

    def describe(self) -> str:
        source = resolved(self.dataset, self.prompts_file).describe(
            self.input_tokens, "tokens" if self.tokenizer else "words")
        prefix = f", {self.shared_prefix} shared" if self.shared_prefix else ""
        return f"{self.api}, {source}{prefix} → {self.output_tokens} out"


class RequestFactory:
    """Builds request bodies (bytes, ready to send) for one worker."""

    def __init__(self, workload: Workload, worker_index: int = 0) -> None:
        self.w = workload
        self.rng = random.Random(workload.seed * 1000 + worker_index)
        self.serial = 0
        self.worker_index = worker_index
        # a dataset file's prompts (a list, or text windows); None: synthetic
        self.prompts = open_source(resolved(workload.dataset, workload.prompts_file),
                                   worker_index, workload.seed)
        # --tokenizer: words one token each (exact prompts), else a local tokenizer to cut
        # prompts to length, else about one token a word (approx.); the local tokenizer also
        # counts the tokens of each chunk when the server sends no per-chunk usage
        self.words = workload.one_token_words or _VOCAB
        self.tokenizer = load_tokenizer(workload.tokenizer) if workload.tokenizer else None
        self.chunk_tokens = ChunkTokens(self.tokenizer) if self.tokenizer else None
        prefix_rng = random.Random(workload.seed)  # the same prefix in every worker
        self.prefix = " ".join(prefix_rng.choices(self.words, k=workload.shared_prefix))
        self._encode = msgspec.json.Encoder().encode

    def next(self) -> tuple[bytes, int]:
        """(body, the prompt's asked length: tokens with a tokenizer, else its words)."""
        self.serial += 1
        prompt, asked = self._prompt()
        return self._body(prompt, self.w.output_tokens.draw(self.rng)), asked

    def sized(self, n_in: int, n_out: int) -> tuple[bytes, int]:
        """A request of given lengths (a trace's entry): a synthetic prompt of n_in tokens
        (exact with a tokenizer, else words) asking for n_out; (body, asked length)."""
        self.serial += 1
        prompt, asked = self._synthetic(n_in)
        return self._body(prompt, n_out), asked

    def _body(self, prompt: str, max_tokens: int) -> bytes:
        w = self.w
        body: dict = {"model": w.model, "max_tokens": max_tokens, "stream": True}
        options = {"include_usage": True}
        if w.continuous_usage:
            options["continuous_usage_stats"] = True
        body["stream_options"] = options
        if w.ignore_eos:
            body["ignore_eos"] = True
            # and no stop before max_tokens where the server honours it (vLLM, SGLang): the
            # output length is then exactly what was asked
            body["min_tokens"] = max_tokens
        if w.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return self._encode(body)

    def _prompt(self) -> tuple[str, int]:
        """The next prompt and its asked length (tokens by the tokenizer where there is one,
        the chat template and special tokens not included; else its words)."""
        if isinstance(self.prompts, TextWindows):  # real text, cut to the asked length
            return self._window()
        if self.prompts is not None:
            i = (self.serial - 1 + self.worker_index * 9973) % len(self.prompts)
            text = self.prompts[i]
            text = f"{self.prefix} {text}" if self.prefix else text
            return text, self._length(text)
        return self._synthetic(self.w.input_tokens.draw(self.rng))

    def _synthetic(self, n: int) -> tuple[str, int]:
        """A synthetic prompt of n tokens (words without a tokenizer)."""
        if self.w.one_token_words:
            return self._exact(n)
        words = [self.prefix] if self.prefix else []
        words.append(f"r{self.worker_index}-{self.serial}")
        words += self.rng.choices(_VOCAB, k=max(0, n - 1 - self.w.shared_prefix))
        text = " ".join(words)
        if self.tokenizer is not None:
            return self._trimmed(text, n)
        return text, len(text.split())

    def _window(self) -> tuple[str, int]:
        """A text dataset's prompt: the shared prefix, this request's serial number (as in
        synthetic prompts: prefix caching helps only as much as the prefix says), then the
        file's next words, n in all; with a tokenizer, that cut to n tokens (text has more
        tokens than words, so the cut is nearly always exact)."""
        assert isinstance(self.prompts, TextWindows)
        n = self.w.input_tokens.draw(self.rng)
        head = f"{self.prefix} " if self.prefix else ""
        text = self.prompts.window(n - 1 - self.w.shared_prefix)
        text = f"{head}r{self.worker_index}-{self.serial} {text}".rstrip()
        if self.tokenizer is not None:
            return self._trimmed(text, n)
        return text, len(text.split())

    def _length(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _exact(self, n: int) -> tuple[str, int]:
        """n one-token words: the shared prefix, this request's marker, then drawn words
        (longer than n only where the prefix and the marker alone are)."""
        marker = self._marker()
        fill = max(0, n - self.w.shared_prefix - len(marker))
        parts = [self.prefix] if self.prefix else []
        parts += marker
        parts += self.rng.choices(self.words, k=fill)
        return " ".join(parts), self.w.shared_prefix + len(marker) + fill

    def _marker(self) -> list[str]:
        """This request's serial and this worker's index written in one-token words, so the
        prompt's length needs no encoding: the serial least significant word first (so
        consecutive requests part right after the shared prefix, which a prefix cache then
        shares and no more), then the worker in two words (a fixed width keeps it unique)."""
        words = self.words
        base = len(words)
        out = []
        x = self.serial
        while True:
            x, d = divmod(x, base)
            out.append(words[d])
            if not x:
                break
        wi = self.worker_index % (base * base)
        out += (words[wi // base], words[wi % base])
        return out

    def _trimmed(self, text: str, n: int) -> tuple[str, int]:
        """`text` cut to n tokens by the local tokenizer, for one whose word counts do not
        add up: its first n tokens decoded, counted again (a cut can merge anew), and cut
        again while over. The length returned is the count of the text sent."""
        tok = self.tokenizer
        assert tok is not None
        ids = tok.encode(text, add_special_tokens=False).ids
        keep = n
        got = len(ids)
        for _ in range(4):  # bounded: a cut rarely moves the count by more than a token
            text = tok.decode(ids[:keep])
            got = len(tok.encode(text, add_special_tokens=False).ids)
            if got <= n or keep <= 1:
                break
            keep -= got - n
        return text, got
