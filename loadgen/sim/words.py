"""What the simulated model writes, and how it counts tokens.

Every generated token is one word of WORDS, cycled from a per-request offset. Without a
tokenizer a token is a whitespace-separated word, in prompts and in answers alike. With one
(`SimConfig.tokenizer`), prompts are counted by it and the words written are those of WORDS
that are one token each in it, so a client that counts with the same tokenizer agrees with
the server's usage to the token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The text the simulated model "writes": one word per token, cycled.
WORDS = (
    " lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit",
    " sed", " do", " eiusmod", " tempor", " incididunt", " ut", " labore", " et",
    " dolore", " magna", " aliqua", " enim", " ad", " minim", " veniam", " quis",
    " nostrud", " exercitation", " ullamco", " laboris", " nisi", " aliquip", " ex", " ea",
)  # fmt: skip

# Everything of a content chunk after the token text, per API. A chunk is then
# head (per request) + tail (per word): one concatenation, no JSON encoding per token.
# Here rather than in chunks.py because WordTable precomputes the tails per word.
CHAT_REST = b'"},"logprobs":null,"finish_reason":null}]'
TEXT_REST = b'","logprobs":null,"finish_reason":null}]'


@dataclass(frozen=True)
class WordTable:
    """The words the simulated model writes, one token each, cycled: a power of two of them
    (the cycle is a mask), with their bytes and chunk tails precomputed."""

    words: tuple[str, ...]
    mask: int
    bytes: tuple[bytes, ...]
    chat_tails: tuple[bytes, ...]
    text_tails: tuple[bytes, ...]

    @classmethod
    def of(cls, words: tuple[str, ...]) -> WordTable:
        n = 1 << (len(words).bit_length() - 1)  # the most that are a power of two
        words = words[:n]
        raw = tuple(w.encode() for w in words)
        return cls(words, n - 1, raw, tuple(w + CHAT_REST + b"}\n\n" for w in raw),
                   tuple(w + TEXT_REST + b"}\n\n" for w in raw))

    def text(self, offset: int, n: int) -> str:
        return "".join(self.words[(offset + k) & self.mask] for k in range(n))


PLAIN_WORDS = WordTable.of(WORDS)


def count_words(text: str) -> int:
    """A text's tokens without a tokenizer: its whitespace-separated words."""
    return len(text.split())


class SimTokenizer:
    """A local tokenizer the simulator counts with (`SimConfig.tokenizer`, a tokenizer.json
    or a folder holding one; read offline). Prompt tokens are its count of the prompt's
    text (a completion prompt with the special tokens it adds, as a server counts a BOS;
    chat message contents without, the template's tokens being `chat_template_tokens`);
    the words the model writes are those of WORDS that are one token each in it, alone (a
    chunk's text) and in a row; POST /tokenize answers with it. Raises ValueError in words
    when it cannot be loaded or none of WORDS fits."""

    def __init__(self, path: str) -> None:
        # deferred: `tokenizers` is only needed by a simulator told to use one
        from tokenizers import Tokenizer

        p = Path(path).expanduser()
        file = p / "tokenizer.json" if p.is_dir() else p
        try:
            self.tok = Tokenizer.from_str(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"tokenizer {path}: cannot read {file}: "
                             f"{getattr(e, 'strerror', None) or e}") from None
        except Exception as e:  # the library's own error, serde's message in it
            reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            raise ValueError(f"tokenizer {path}: {file.name} is not a tokenizer the "
                             f"`tokenizers` library can load ({reason})") from None
        fit = tuple(w for w in WORDS if self._one_token(w))
        if not fit:
            raise ValueError(f"tokenizer {path}: none of the simulator's words "
                             f"({WORDS[0].strip()}, {WORDS[1].strip()} …) is one token in it")
        self.table = WordTable.of(fit)
        cycle = "".join(self.table.words * 2)  # in a row, and across the cycle's wrap
        if self.content(cycle) != 2 * len(self.table.words):
            raise ValueError(f"tokenizer {path}: its counts of the simulator's words do not "
                             "add up in a row (it merges across spaces)")

    def _one_token(self, word: str) -> bool:
        """One token that is the word itself (an unknown word is one token too: [UNK])."""
        ids = self.tok.encode(word, add_special_tokens=False).ids
        return len(ids) == 1 and self.tok.decode(ids).strip() == word.strip()

    def ids(self, text: str, special: bool) -> list[int]:
        return self.tok.encode(text, add_special_tokens=special).ids

    def content(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def prompt(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=True).ids)
