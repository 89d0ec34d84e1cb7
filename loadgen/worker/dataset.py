"""Where prompts come from: the `--dataset` kinds.

  synthetic       words from a fixed vocabulary, the asked length (loadgen.worker.workload)
  text:FILE       any raw UTF-8 text (e.g. WikiText's raw files): each request gets a
                  window of the asked length, in whitespace words, cut from the file in
                  order from a seeded offset that differs per worker, wrapping around at
                  the end. The words are joined by single spaces (line breaks are not
                  kept) after the request's serial number, so the prompt has exactly the
                  asked number of words; with --tokenizer, that cut to the asked tokens.
  sharegpt:FILE   ShareGPT conversations, a JSON array (ShareGPT_V3_unfiltered_cleaned_split
                  .json) or JSONL, each `{"conversations": [{"from": "human", "value": …},
                  {"from": "gpt", …}, …]}`: the first human turn is the prompt.
                  Conversations without one are skipped and counted. With --turns, a
                  conversation's human turns in order (load_sharegpt_turns); with
                  --output-tokens dataset, max_tokens is the length of the reply that
                  followed each human turn in the file (as `vllm bench serve` does).
  jsonl:FILE      one prompt a line: `{"prompt": …}`, `{"text": …}` or a ShareGPT
                  conversation (`--prompts FILE` is the same).

A broken file is one DatasetError naming the file and the line (`data.jsonl:17: not JSON
(…)`), raised before any load by `check`. Nothing is downloaded. A worker keeps what it
needs and no more: a list of prompt strings (never the parsed JSON), or, for text, the
file mapped into memory (shared with every other worker through the page cache), read
a window at a time.
"""

from __future__ import annotations

import math
import mmap
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from loadgen.worker.distributions import LengthDist

FILE_KINDS = ("text", "sharegpt", "jsonl")
KINDS_TEXT = "synthetic, text:FILE, sharegpt:FILE or jsonl:FILE"
_SPACE = re.compile(rb"\s")  # the ASCII whitespace bytes.split() splits on
_BYTES_A_WORD = 8  # a first guess of a word and its space, in bytes (English: about 6)
_BOM = b"\xef\xbb\xbf"
_BYTE_AT = re.compile(r"\(byte (\d+)\)")  # where msgspec says malformed JSON went wrong
HUMAN = ("human", "user")


class DatasetError(ValueError):
    """A dataset spec or file that cannot be used; the text says why (and where)."""


class Dataset(msgspec.Struct, frozen=True):
    """Which prompts a run sends. `note` is what the check found worth saying once (a
    text shorter than the longest window, skipped conversations); empty when nothing."""

    kind: str = "synthetic"
    path: str | None = None
    note: str = ""

    @classmethod
    def parse(cls, spec: str, prompts_file: str | None = None) -> Dataset:
        """The Dataset of a `--dataset` spec; `prompts_file` (`--prompts`) means jsonl:FILE."""
        spec = (spec or "synthetic").strip()
        if prompts_file:
            if spec != "synthetic":
                raise DatasetError("--prompts FILE is --dataset jsonl:FILE: give one of them")
            return cls("jsonl", prompts_file)
        kind, colon, path = spec.partition(":")
        if kind == "synthetic" and not colon:
            return cls()
        if kind not in FILE_KINDS:
            raise DatasetError(f"bad --dataset {spec!r}: use {KINDS_TEXT}")
        if not path:
            raise DatasetError(f"--dataset {kind} needs a file: {kind}:FILE")
        return cls(kind, path)

    def describe(self, input_tokens: LengthDist, unit: str = "words") -> str:
        """What the run sends, for its "run started" line (`unit`: of a text window)."""
        name = Path(self.path).name if self.path else ""
        source = {
            "synthetic": f"{input_tokens} in",
            "text": f"windows of {input_tokens} {unit} from {name}",
            "sharegpt": f"ShareGPT prompts from {name}",
            "jsonl": f"prompts from {name}",
        }[self.kind]
        return f"{source} ({self.note})" if self.note else source


def resolved(dataset: Dataset, prompts_file: str | None) -> Dataset:
    """`dataset`, with a Workload's older `prompts_file` read as jsonl:FILE."""
    if prompts_file and dataset.kind == "synthetic":
        return Dataset("jsonl", prompts_file)
    return dataset


def check(dataset: Dataset, window_words: int) -> Dataset:
    """Read `dataset`'s file through once, as every worker will, so that a broken one is
    one DatasetError before any load; the Dataset again, with its note. `window_words`:
    about the longest run of the file's words one prompt asks for (text only)."""
    path = dataset.path
    note = ""
    if dataset.kind == "text" and path:
        words = text_words(path, window_words)
        if words < window_words:
            note = (f"{words} words, fewer than the longest window asked (about "
                    f"{window_words}): windows wrap around")
    elif dataset.kind == "sharegpt" and path:
        _, skipped = load_sharegpt(path)
        if skipped:
            note = f"{skipped} conversation(s) without a human turn skipped"
    elif dataset.kind == "jsonl" and path:
        load_prompts(path)
    return msgspec.structs.replace(dataset, note=note)


def longest_words(dist: LengthDist) -> int:
    """About the longest prompt a length distribution asks for: its top, or for the
    unbounded kinds three standard deviations up (what nearly every draw stays under)."""
    if dist.kind == "uniform":
        x = dist.b
    elif dist.kind == "normal":
        x = dist.a + 3 * dist.b
    elif dist.kind == "lognormal":
        x = dist.a * math.exp(3 * dist.b)
    else:
        x = dist.a
    return max(1, round(x))


def open_source(dataset: Dataset, worker_index: int, seed: int) -> list[str] | TextWindows | None:
    """One worker's prompts: a list to cycle through, text windows, or None (synthetic)."""
    if dataset.kind == "synthetic" or not dataset.path:
        return None
    if dataset.kind == "text":
        return TextWindows(dataset.path, f"text:{seed}:{worker_index}")
    if dataset.kind == "sharegpt":
        return load_sharegpt(dataset.path)[0]
    return load_prompts(dataset.path)


# ---- files ----------------------------------------------------------------------------------


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file, one line at a time (a large file is never
    held whole); a line that is not UTF-8 is a DatasetError naming it."""
    try:
        f = open(path, "rb")  # noqa: SIM115 -- closed by the with below, after the error check
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e.strerror or e}") from None
    with f:
        for n, raw in enumerate(f, 1):
            try:
                yield n, (raw.removeprefix(_BOM) if n == 1 else raw).decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"{path}:{n}: not UTF-8 text (byte {raw[e.start]:#04x} at "
                                   f"column {e.start + 1})") from None


def text_words(path: str, enough: int) -> int:
    """The words of a text file, counted up to `enough` (the rest is only checked to be
    UTF-8); a DatasetError when it is not UTF-8 or has no words."""
    words, enough = 0, max(1, enough)
    for _, line in _lines(path):
        if words < enough:
            words += len(line.split())
    if words == 0:
        raise DatasetError(f"{path} has no words")
    return words


def load_prompts(path: str) -> list[str]:
    """Prompts of a JSONL file, one a line; raises DatasetError with the file and line on
    bad input."""
    prompts: list[str] = []
    for n, line in _lines(path):
        if not line.strip():
            continue
        try:
            item = msgspec.json.decode(line)
        except msgspec.DecodeError as e:
            raise DatasetError(f"{path}:{n}: not JSON ({e})") from None
        prompt = _prompt_of(item)
        if prompt is None:
            raise DatasetError(
                f'{path}:{n}: no prompt (expected "prompt", "text" or ShareGPT "conversations")'
            )
        prompts.append(prompt)
    if not prompts:
        raise DatasetError(f"prompt file {path} has no prompts")
    return prompts


def _prompt_of(item: object) -> str | None:
    if not isinstance(item, dict):
        return item if isinstance(item, str) and item else None
    for key in ("prompt", "text"):
        if isinstance(item.get(key), str) and item[key]:
            return item[key]
    for turn in item.get("conversations") or []:
        if isinstance(turn, dict) and turn.get("from") in HUMAN:
            value = turn.get("value")
            return value if isinstance(value, str) and value else None
    return None


class _Turn(msgspec.Struct):
    speaker: str = msgspec.field(name="from", default="")
    # left undecoded: only the one turn used becomes a string, the replies never do
    value: msgspec.Raw = msgspec.Raw()


class _Conversation(msgspec.Struct):
    conversations: list[_Turn] = []


def load_sharegpt(path: str) -> tuple[list[str], int]:
    """(first human turns, conversations skipped for having none) of a ShareGPT file, a JSON
    array or JSONL; a DatasetError naming the line when it is broken or has no prompt."""
    if _starts_with_bracket(path):
        conversations: Iterator[_Conversation] = iter(_sharegpt_array(path))
    else:
        conversations = _sharegpt_lines(path)
    prompts: list[str] = []
    skipped = 0
    for conv in conversations:
        prompt = _first_human(conv)
        if prompt is None:
            skipped += 1
        else:
            prompts.append(prompt)
    if not prompts:
        raise DatasetError(f"{path} has no conversation with a human turn "
                           f"({skipped} without one)")
    return prompts, skipped


# a conversation's human turns, each with the length of the reply that followed it (0: none)
Conversations = list[tuple[tuple[str, int], ...]]


def load_sharegpt_turns(path: str, count: Callable[[str], int] | None = None) -> Conversations:
    """Every conversation's human turns of a ShareGPT file, each with its reply's length
    (`count`: tokens by a tokenizer, else its words); conversations without a human turn
    are left out. Only the human turns' text is kept; the replies are counted, not kept."""
    conversations = _sharegpt_array(path) if _starts_with_bracket(path) else _sharegpt_lines(path)
    out: Conversations = []
    for conv in conversations:
        turns = _human_turns(conv, count or _words)
        if turns:
            out.append(turns)
    if not out:
        raise DatasetError(f"{path} has no conversation with a human turn")
    return out


def _words(text: str) -> int:
    return len(text.split())


def _human_turns(conv: _Conversation, count: Callable[[str], int]) -> tuple[tuple[str, int], ...]:
    turns: list[tuple[str, int]] = []
    for t in conv.conversations:
        value = msgspec.json.decode(t.value) if t.value else None
        if not isinstance(value, str):
            continue
        if t.speaker in HUMAN:
            if value.strip():
                turns.append((value, 0))
        elif turns and not turns[-1][1]:  # the reply to the last human turn
            turns[-1] = (turns[-1][0], count(value))
    return tuple(turns)


def _starts_with_bracket(path: str) -> bool:
    """A JSON array (the usual ShareGPT file) rather than JSONL: its first byte that is not
    white space (read a little at a time: the file may be one line of gigabytes)."""
    try:
        with open(path, "rb") as f:
            if f.read(len(_BOM)) != _BOM:
                f.seek(0)
            while chunk := f.read(4096):
                if head := chunk.lstrip():
                    return head.startswith(b"[")
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e.strerror or e}") from None
    return False


def _sharegpt_array(path: str) -> list[_Conversation]:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e.strerror or e}") from None
    skip = len(_BOM) if data.startswith(_BOM) else 0
    try:
        return msgspec.json.decode(memoryview(data)[skip:], type=list[_Conversation])
    except msgspec.ValidationError as e:
        raise DatasetError(f"{path}: not ShareGPT ({e})") from None
    except msgspec.DecodeError as e:
        where = _BYTE_AT.search(str(e))
        line = data.count(b"\n", skip, skip + int(where.group(1))) + 1 if where else 1
        raise DatasetError(f"{path}:{line}: not JSON ({e})") from None


def _sharegpt_lines(path: str) -> Iterator[_Conversation]:
    decode = msgspec.json.Decoder(_Conversation).decode
    for n, line in _lines(path):
        if not line.strip():
            continue
        try:
            yield decode(line)
        except msgspec.ValidationError as e:
            raise DatasetError(f"{path}:{n}: not a ShareGPT conversation ({e})") from None
        except msgspec.DecodeError as e:
            raise DatasetError(f"{path}:{n}: not JSON ({e})") from None


def _first_human(conv: _Conversation) -> str | None:
    for turn in conv.conversations:
        if turn.speaker in HUMAN:
            value = msgspec.json.decode(turn.value) if turn.value else None
            return value if isinstance(value, str) and value.strip() else None
    return None


# ---- text windows ---------------------------------------------------------------------------


class TextWindows:
    """Windows of a raw text file for one worker: each takes the next words after the last,
    from a seeded offset (`start_seed`, so each worker starts elsewhere), wrapping around
    at the end. The file is mapped, not read: memory is shared with the other workers."""

    def __init__(self, path: str, start_seed: str) -> None:
        try:
            with open(path, "rb") as f:
                self._text = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
            raise DatasetError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") \
                from None
        self.path = path
        self._start = len(_BOM) if self._text[:3] == _BOM else 0
        self.pos = self._word_start(random.Random(start_seed).randrange(len(self._text)))

    def window(self, k: int) -> str:
        """The next `k` words of the file, joined by single spaces ("" for k ≤ 0)."""
        words: list[str] = []
        dry = 0  # passes over the end that found nothing: a file with no words left
        while len(words) < k:
            got, self.pos = self._take(self.pos, k - len(words))
            text = b" ".join(got).decode("utf-8", "replace")
            more = text.split()  # a non-ASCII space (no-break, ideographic) splits again
            if not words and len(more) == k:
                return text  # the usual case: k words in one piece
            dry = 0 if more else dry + 1
            if dry > 2:
                raise DatasetError(f"{self.path} has no words")
            words += more
        del words[k:]
        return " ".join(words)

    def _take(self, pos: int, n: int) -> tuple[list[bytes], int]:
        """The next `n` words from `pos` and where the word after them starts; at the end of
        the file, the words left there and the file's start. One split of a slice a little
        longer than n words (bytes.split is C: a window costs about what its copy does)."""
        size = n * _BYTES_A_WORD
        while True:
            chunk = self._text[pos:pos + size]
            parts = chunk.split(None, n)
            if len(parts) > n:  # n whole words, and the rest from the next word's start
                return parts[:n], pos + len(chunk) - len(parts[n])
            if pos + size >= len(self._text):
                return parts, self._start
            size *= 2  # the slice ended inside the n-th word, or the words are long

    def _word_start(self, at: int) -> int:
        """`at`, moved past the rest of a word it falls inside (a window starts on a word)."""
        at = max(at, self._start)
        if at == self._start or self._text[at - 1:at].isspace():
            return at
        space = _SPACE.search(self._text, at)
        return space.start() if space else self._start
