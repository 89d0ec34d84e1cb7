"""Exact token lengths (`--tokenizer`): a local tokenizer, or the server's own count.

Two things need a tokenizer, and both are built here:

* prompts of exactly the asked length. A prompt of words separated by spaces has a token
  count that is the sum of its words' counts wherever the tokenizer pre-splits on
  whitespace (byte-level BPE, Metaspace, Whitespace: merges never cross a pre-token), so
  once the vocabulary words that are one token each are known — alone at the start of a
  prompt and after a space — a prompt of n of them is n tokens, with no encoding per
  request. `one_token_words` finds them through any counting function (the local
  tokenizer, or the server's /tokenize: a few hundred calls at most, once at start) and
  checks the sum on sample prompts before it trusts it.
* tokens per chunk (`ChunkTokens`) when the server sends no per-chunk usage: each chunk's
  text is encoded once and its count cached, so a repeated text (the common case: one
  token a chunk) costs a dict lookup.

The asked length is the prompt's own tokens: neither the chat template's tokens nor the
special tokens the tokenizer adds (a BOS) are in it, as the peers' synthetic prompts
count them; the server's count of each request is shown beside it (the summary's
tokens.input_per_request).

Nothing is downloaded: a tokenizer is a local `tokenizer.json` (or a folder holding one,
as every Hugging Face model folder does), read by the `tokenizers` library offline.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import msgspec
from tokenizers import Tokenizer

CACHE_MAX = 1 << 16  # chunk texts whose token count is kept (a few MB at most)
SAMPLE_WORDS = (48, 200)  # lengths of the sample prompts the sum is checked on
MIN_WORDS = 8  # fewer one-token words than this cannot make prompts that differ

TOKENIZER_CHOICES = ("auto", "server", "none")  # --tokenizer's words; anything else is a path

Count = Callable[[list[str]], Awaitable[list[int]]]


class TokenizerError(ValueError):
    """A tokenizer that cannot be used; str(e) names it and says why."""


class Lengths(msgspec.Struct, kw_only=True, frozen=True):
    """How the run's token lengths are known, as resolved at start (loadgen.run.preflight).

    source: "path" (a local tokenizer), "server" (the target's /tokenize) or "approx"
    (none: about one token a word). tokenizer: the local file the workers load (per-chunk
    counts; prompts by encode-and-trim when `words` is empty). words: vocabulary words that
    are one token each anywhere in a prompt (empty: not known). note: what the start event
    says about it."""

    source: str = "approx"
    tokenizer: str | None = None
    words: tuple[str, ...] = ()
    note: str = "lengths approx. (no tokenizer: about one token a word)"


def tokenizer_file(path: str) -> Path:
    """The tokenizer.json that `path` names (the file, or a folder holding one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
        if not p.is_file():
            raise TokenizerError(f"--tokenizer {path}: the folder has no tokenizer.json")
    elif not p.exists():
        raise TokenizerError(f"--tokenizer {path}: no such file or folder")
    return p


@functools.cache
def load_tokenizer(path: str) -> Tokenizer:
    """The tokenizer at `path`, loaded offline (once per process); TokenizerError in words."""
    p = tokenizer_file(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"--tokenizer {path}: cannot read {p}: "
                             f"{getattr(e, 'strerror', None) or e}") from None
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # the library raises its own Exception with serde's message
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise TokenizerError(f"--tokenizer {path}: {p.name} is not a tokenizer the "
                             f"`tokenizers` library can load ({reason})") from None


def local_count(tok: Tokenizer) -> Count:
    """Token counts of texts by a local tokenizer, without its special tokens."""

    async def count(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]

    return count


async def one_token_words(
    count: Count, candidates: Sequence[str], *, base: int | None = 0
) -> tuple[tuple[str, ...], str]:
    """(the candidates that are one token each wherever they stand, or () and why).

    A word is kept when it is one token alone (a prompt's first word) and one more token
    after a kept word and a space (every other place). `base`: the tokens the counter adds
    to every text (0 for a local tokenizer, asked without special tokens); None: not known
    (a server's /tokenize may add a BOS), then it is the fewest any word counts, less one
    (some common word is one token in every real tokenizer). Then the sum is checked on
    seeded sample prompts of kept words: if the tokenizer merges across spaces, nothing
    is kept."""
    words = list(dict.fromkeys(candidates))
    if not words:
        return (), "it knows no word of the prompt vocabulary"
    alone = await count(words)
    if base is None:
        base = max(0, min(alone) - 1)
    kept = [w for w, n in zip(words, alone, strict=True) if n == base + 1]
    if not kept:
        return (), "no word of the prompt vocabulary is one token in it"
    anchor = kept[0]
    after = await count([f"{anchor} {w}" for w in kept])
    kept = [w for w, n in zip(kept, after, strict=True) if n == base + 2]
    if len(kept) < MIN_WORDS:
        return (), (f"only {len(kept)} words of the prompt vocabulary are one token in it, "
                    f"too few to vary prompts (at least {MIN_WORDS})")
    rng = random.Random(0)
    samples = [rng.choices(kept, k=n) for n in SAMPLE_WORDS]
    got = await count([" ".join(s) for s in samples])
    for sample, n in zip(samples, got, strict=True):
        if n != len(sample) + base:
            return (), (f"its counts do not add up over words ({len(sample)} one-token words "
                        f"counted {n - base})")
    return tuple(kept), ""


async def path_lengths(path: str, candidates: Sequence[str]) -> Lengths:
    """Lengths by the local tokenizer at `path` (raises TokenizerError in words)."""
    tok = load_tokenizer(path)
    # a word it does not know may be one token too ([UNK]): only words it gives back
    known = [w for w in candidates
             if tok.decode(tok.encode(w, add_special_tokens=False).ids).strip() == w]
    words, why = await one_token_words(local_count(tok), known)
    name = str(tokenizer_file(path))
    if words:
        note = (f"lengths exact (tokenizer {name}; asked lengths exclude the chat template "
                "and special tokens; tokens per chunk counted by it where the server sends "
                "no per-chunk usage)")
    else:
        note = (f"lengths exact by encode-and-trim (tokenizer {name}: {why}; asked lengths "
                "exclude the chat template and special tokens)")
    return Lengths(source="path", tokenizer=name, words=words, note=note)


class ChunkTokens:
    """Tokens of a chunk's generated text by a local tokenizer (0: the chunk has none).

    Each distinct text is encoded once (without special tokens) and its count cached, up
    to CACHE_MAX texts; a text with characters always carries at least one token (the
    server sent the chunk because one was generated). Cost, paid only on streams without
    per-chunk usage (timeit, this 2-core machine): a cached text about 0.15 µs a chunk more
    than measuring its length, a new one about 9 µs once."""

    __slots__ = ("_cache", "_encode")

    def __init__(self, tok: Tokenizer) -> None:
        self._encode = tok.encode
        self._cache: dict[str, int] = {}

    def __call__(self, chunk) -> int:
        n = 0
        for c in chunk.choices:
            if c.text:
                n += self.text(c.text)
            d = c.delta
            if d is not None:
                if d.content:
                    n += self.text(d.content)
                if d.reasoning_content:
                    n += self.text(d.reasoning_content)
                if d.reasoning:
                    n += self.text(d.reasoning)
        return n

    def text(self, text: str) -> int:
        n = self._cache.get(text)
        if n is None:
            n = max(1, len(self._encode(text, add_special_tokens=False).ids))
            if len(self._cache) < CACHE_MAX:
                self._cache[text] = n
        return n
