"""Tokenizers of the layouts real models ship, built here with the `tokenizers` library
(nothing downloaded): trained on the prompt vocabulary, the simulator's words and a little
prose, then laid out as each family's tokenizer.json is.

* byte_level: byte-level BPE, as GPT-2, Llama 3, Qwen (a ByteLevel pre-tokenizer);
* llama2: the SentencePiece layout of Llama 2, Mistral 7B v0.1 and Mixtral (a normalizer
  that prepends "▁" and replaces spaces by it, no pre-tokenizer): " lorem" alone is two
  tokens ("▁" and "▁lorem"), after other text one;
* metaspace: the newer SentencePiece layout (a Metaspace pre-tokenizer, prepend "first");
* wordpiece: BERT's (lower-cased, split on whitespace and punctuation, "##" pieces; a
  space alone is no token);
* unigram: a Unigram model with Metaspace, as T5 and ALBERT.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from loadgen.sim.words import WORDS
from loadgen.worker.workload import PROMPT_WORDS

FAMILIES = ("byte_level", "llama2", "metaspace", "wordpiece", "unigram")

# text whose chunks do not fall on word boundaries: pieces of words, numbers, punctuation
PROSE = (
    "Streaming servers send their answers in pieces: a chunk may hold one token, several, "
    "or half a word. Counting 12,345 tokens at 67.8 tok/s, the console shows what arrived, "
    "and the summary says how it was counted! Tokenizers differ; the counts must not. "
    "Incremental detokenization yields fragments like 'ing', 'tion,' or \"unbelievably\"."
)


def _corpus() -> list[str]:
    """Every word alone, at a start and after a space (so each is one token in every
    place), and the prose, repeated so that the trainers keep whole words."""
    words = [*PROMPT_WORDS, *(w.strip() for w in WORDS)]
    return [" ".join(words), " " + " ".join(words), *(f"{w} {w}" for w in words),
            *([PROSE] * 4)] * 3


def _bpe(pre: pre_tokenizers.PreTokenizer, **model) -> Tokenizer:
    tok = Tokenizer(models.BPE(**model))
    tok.pre_tokenizer = pre
    alphabet = pre_tokenizers.ByteLevel.alphabet() if isinstance(
        pre, pre_tokenizers.ByteLevel) else []
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=4000, show_progress=False, initial_alphabet=alphabet,
        special_tokens=["<unk>"]))
    return tok


def build(family: str) -> Tokenizer:
    if family == "byte_level":
        tok = _bpe(pre_tokenizers.ByteLevel(add_prefix_space=False))
        tok.decoder = decoders.ByteLevel()
        return tok
    if family in ("llama2", "metaspace"):
        # trained with word-start pieces (as SentencePiece splits by whitespace), then laid
        # out as the family's tokenizer.json
        tok = _bpe(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
                   unk_token="<unk>")
        if family == "llama2":
            tok.pre_tokenizer = None
            tok.normalizer = normalizers.Sequence(
                [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
            tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(),
                                             decoders.Strip(" ", 1, 0)])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁",
                                                         prepend_scheme="first", split=False)
            tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        return tok
    if family == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(_corpus(), trainers.WordPieceTrainer(
            vocab_size=4000, show_progress=False, special_tokens=["[UNK]"]))
        return tok
    if family == "unigram":
        return _unigram()
    raise ValueError(family)


def _unigram() -> Tokenizer:
    """A Unigram model with Metaspace, as T5 and ALBERT: its pieces written down rather
    than trained (the trainer needs more text than a test has), each word of the corpus a
    piece and every character one, a word scoring above its characters."""
    words = {w.lower() for line in _corpus() for w in line.split()}
    chars = sorted({c for line in _corpus() for c in line if c != " "})
    pieces = [("<unk>", 0.0), ("▁", -8.0), *((c, -10.0) for c in chars),
              *((f"▁{w}", -5.0) for w in sorted(words))]
    tok = Tokenizer(models.Unigram(pieces, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def save(family: str, folder: Path) -> Path:
    """The family's tokenizer.json in `folder` (a model folder, as on the hub)."""
    folder.mkdir(parents=True, exist_ok=True)
    build(family).save(str(folder / "tokenizer.json"))
    return folder


def build_merging() -> Tokenizer:
    """A BPE without a pre-tokenizer trained on runs of words, so that its merges span
    spaces ("the of" may be one token): no layout a model ships, and one whose counts of
    chunks do not follow the words."""
    words = [*PROMPT_WORDS, *(w.strip() for w in WORDS)]
    tok = Tokenizer(models.BPE())
    tok.decoder = decoders.Fuse()  # the tokens' text as it is, spaces and all
    tok.train_from_iterator([" ".join(words[i:i + 3]) for i in range(len(words))] * 8,
                            trainers.BpeTrainer(vocab_size=3000, show_progress=False))
    return tok
