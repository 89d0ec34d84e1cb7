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
* tokens per chunk (`ChunkTokens`) when the server sends no per-chunk usage: a chunk's
  tokens are the running difference of the stream's text, tokens(text so far + chunk) −
  tokens(text so far), so that they add up over a stream to the tokenizer's count of its
  whole text. Counting a chunk alone does not: a SentencePiece layout (Llama 2, Mistral)
  prepends "▁" to every text it encodes, so " lorem" alone is two tokens and one after
  other text; a piece of a word alone is not the piece it is after the word's start. The
  text so far is a window of its last characters (WINDOW_KEEP..WINDOW_MAX), which bounds
  the cost: a token's boundaries depend on the text around it only. `chunk_check` tries
  the counting once at start (a one-token word after a space counts one); a tokenizer
  that fails it does not count chunks (the spread estimate, marked est., stands in).

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
from tokenizers import Encoding, Tokenizer

# the window of a stream's text a chunk is counted after: cut to its last WINDOW_KEEP
# characters once over WINDOW_MAX (far more than any token's reach, a few words)
WINDOW_KEEP, WINDOW_MAX = 32, 64
CHECK_REPEATS = 4  # chunks of one word the start check counts
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
    cannot = chunk_check(tok, candidates)
    chunks = (f"tokens per chunk estimated (est.) where the server sends no per-chunk usage: "
              f"it cannot count chunks ({cannot})" if cannot else
              "tokens per chunk counted by it where the server sends no per-chunk usage")
    if words:
        note = (f"lengths exact (tokenizer {name}; asked lengths exclude the chat template "
                f"and special tokens; {chunks})")
    else:
        note = (f"lengths exact by encode-and-trim (tokenizer {name}: {why}; asked lengths "
                f"exclude the chat template and special tokens; {chunks})")
    return Lengths(source="path", tokenizer=name, words=words, note=note)


def chunk_tokens(tok: Tokenizer, candidates: Sequence[str]) -> ChunkTokens | None:
    """The chunk counter of `tok`, or None where chunk_check says it cannot count chunks
    (then the spread estimate stands in, marked est.; the start event said why)."""
    return None if chunk_check(tok, candidates) else ChunkTokens(tok)


class ChunkTokens:
    """A local tokenizer's counts of the chunks of streams without per-chunk usage: one a
    run (shared by its streams), `stream()` a counter for each stream."""

    __slots__ = ("_encode",)

    def __init__(self, tok: Tokenizer) -> None:
        self._encode = tok.encode

    def stream(self) -> StreamTokens:
        return StreamTokens(self._encode)


class StreamTokens:
    """One stream's chunk counter: each call gives the tokens a chunk's text adds to the
    stream's text so far (the running difference; 0 or less where the text merges into the
    tokens before it), so the counts add up to the tokenizer's count of the whole text.

    Only a window of the text so far is encoded with each chunk: between WINDOW_KEEP and
    WINDOW_MAX characters, cut (and counted once anew) when it grows past WINDOW_MAX. What
    the cut leaves at the window's start is encoded alike with and without the chunk, so the
    difference is the whole text's wherever the cut falls (a window of 16..32 already adds
    up on the tests' prose; 8..16 does not). Cost, paid only on streams without per-chunk
    usage (this 2-core machine, chunks of 1-4 words): one encode of up to WINDOW_MAX + the
    chunk's characters a chunk and a recount of WINDOW_KEEP every few chunks, about 15 µs
    a chunk (byte-level BPE, the Llama 2 layout), 23 µs (WordPiece)."""

    __slots__ = ("_encode", "_n", "_text")

    def __init__(self, encode: Callable[..., Encoding]) -> None:
        self._encode = encode
        self._text = ""  # the window of the stream's text so far
        self._n = 0  # its tokens

    def __call__(self, text: str) -> int:
        window = self._text + text
        n = len(self._encode(window, add_special_tokens=False))
        added = n - self._n
        if len(window) > WINDOW_MAX:
            window = window[-WINDOW_KEEP:]
            n = len(self._encode(window, add_special_tokens=False))
        self._text, self._n = window, n
        return added


def chunk_check(tok: Tokenizer, candidates: Sequence[str]) -> str:
    """Why `tok` cannot count a stream's chunks ("" when it can): a word of `candidates`
    that is one token alone and after a space (and not [UNK]: the token gives the word back)
    must count one as a chunk after its first time, as in the whole text (a tokenizer that
    merges across spaces does not; one with no such word cannot be checked)."""

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    def one_token(word: str) -> bool:
        ids = tok.encode(word, add_special_tokens=False).ids
        return len(ids) == 1 and tok.decode(ids).strip() == word and count(f"{word} {word}") == 2

    word = next((w for w in candidates if one_token(w)), None)
    if word is None:
        return ("no word of the prompt vocabulary is one token after a space in it, so its "
                "counts of chunks cannot be checked")
    counter = ChunkTokens(tok).stream()
    counter(word)
    got = [counter(f" {word}") for _ in range(CHECK_REPEATS)]
    if got != [1] * CHECK_REPEATS:
        return (f"chunks \" {word}\" after \"{word}\" counted {got}, not one each: it merges "
                "tokens across spaces")
    return ""
