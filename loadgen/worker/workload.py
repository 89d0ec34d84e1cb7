"""What each request asks for: the prompt, the lengths, the API shape.

Synthetic prompts are words from a fixed vocabulary, seeded so a run is
reproducible; most tokenizers give about one token per such word, and the
server's `usage` gives the true count. A per-request serial number follows
the shared prefix (if any) so that prefix caching helps exactly as much as
the prefix length says, and no more. With `--tokenizer` (loadgen.worker.tokenizer)
the words are ones that are one token each, the serial is written in them too, and
a prompt is exactly the asked length.

Lengths (and think times) are drawn from loadgen.worker.distributions.

Prompts from files (raw text windows, ShareGPT, JSONL) are loadgen.worker.dataset's;
each worker cycles through a file's prompts from its own offset.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from loadgen.worker.conversation import Conversation
from loadgen.worker.dataset import (
    Conversations,
    Dataset,
    TextWindows,
    load_sharegpt_turns,
    open_source,
    resolved,
)
from loadgen.worker.distributions import LengthDist, ThinkTime
from loadgen.worker.mix import ClassDraw, TrafficClass
from loadgen.worker.stream_measure import Turn
from loadgen.worker.tokenizer import chunk_tokens, load_tokenizer

# the words synthetic prompts draw on (without --tokenizer's one-token words); preflight
# asks the server which of them are one token each
PROMPT_WORDS = (
    "the of and to in is was for on that with as by at from his her they this which are "
    "be or had an were but not have one all their there been has when who will more no if "
    "out so said what up its about into than them can only other new some could time "
    "these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down "
    "should because each just those people"
).split()

# the body keys tokentop writes itself: what a request measures depends on them (the
# prompt, the lengths, the stream and its usage), so --extra-body may not set them
OWN_BODY_KEYS = frozenset({"model", "messages", "prompt", "max_tokens", "stream",
                           "stream_options", "ignore_eos", "min_tokens"})

# a trace's prefix blocks kept made (each a list of 512 words: 4 KB of pointers), so that
# the blocks requests share are not drawn again for every request
BLOCKS_KEPT = 1024


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
    # multi-turn conversations (loadgen.worker.conversation): user turns per conversation
    # (1: single requests) and the think time between them
    turns: int = 1
    think_time: ThinkTime = ThinkTime()
    # a trace's prefix blocks (Mooncake's hash_ids): tokens a block
    trace_block_tokens: int = 512
    # --output-tokens dataset: max_tokens is the length of the reply the dataset's
    # conversation had after the prompt (ShareGPT), else output_tokens
    output_from_dataset: bool = False
    # what the user shapes (loadgen.run.config.body_fields): the sampling parameters
    # (--temperature …), --response-format and --extra-body, in every request's body
    body_fields: dict[str, Any] = msgspec.field(default_factory=dict)
    # --mix (loadgen.worker.mix): each request one of these classes, drawn by their shares,
    # with its lengths and priority; none: every request the run's
    classes: tuple[TrafficClass, ...] = ()

    @property
    def path(self) -> str:
        return "/chat/completions" if self.api == "chat" else "/completions"

    def describe(self) -> str:
        source = resolved(self.dataset, self.prompts_file).describe(
            self.input_tokens, "tokens" if self.tokenizer else "words")
        prefix = f", {self.shared_prefix} shared" if self.shared_prefix else ""
        turns = (f", conversations of {self.turns} turns, think {self.think_time}"
                 if self.turns > 1 else "")
        shaped = f", with {', '.join(sorted(self.body_fields))}" if self.body_fields else ""
        mix = f"; classes: {'; '.join(c.describe() for c in self.classes)}" if self.classes else ""
        return f"{self.api}, {source}{prefix} → {self.output_tokens} out{turns}{shaped}{mix}"


class Prepared(NamedTuple):
    """A request ready to send: its body, the prompt's asked length (tokens with a
    tokenizer, else words; a conversation's whole history) and the output length asked
    exactly (ignore_eos; 0: the model may stop when it likes)."""

    body: bytes
    asked: int
    asked_out: int = 0
    cls: int = -1  # its class of the mix (Workload.classes), -1: no mix


class RequestFactory:
    """Builds request bodies (bytes, ready to send) for one worker."""

    def __init__(self, workload: Workload, worker_index: int = 0) -> None:
        self.w = workload
        self.rng = random.Random(workload.seed * 1000 + worker_index)
        self.serial = 0
        self.worker_index = worker_index
        # --tokenizer: words one token each (exact prompts), else a local tokenizer to cut
        # prompts to length, else about one token a word (approx.); the local tokenizer also
        # counts the tokens of each chunk when the server sends no per-chunk usage, if it
        # can (loadgen.worker.tokenizer.chunk_check)
        self.words = workload.one_token_words or PROMPT_WORDS
        self.tokenizer = load_tokenizer(workload.tokenizer) if workload.tokenizer else None
        self.chunk_tokens = chunk_tokens(self.tokenizer, self.words) if self.tokenizer \
            else None
        source = resolved(workload.dataset, workload.prompts_file)
        # ShareGPT conversations whole (their human turns and replies' lengths), for --turns
        # and --output-tokens dataset; else a dataset file's prompts (a list, or text
        # windows), None for synthetic ones
        self.dialogues: Conversations | None = None
        self.prompts = None
        if source.kind == "sharegpt" and (workload.turns > 1 or workload.output_from_dataset):
            self.dialogues = load_sharegpt_turns(str(source.path), self._counter())
        else:
            self.prompts = open_source(source, worker_index, workload.seed)
        prefix_rng = random.Random(workload.seed)  # the same prefix in every worker
        self.prefix = " ".join(prefix_rng.choices(self.words, k=workload.shared_prefix))
        self._encode = msgspec.json.Encoder().encode
        self._classes = ClassDraw(workload.classes) if workload.classes else None
        self._blocks: dict[int, list[str]] = {}  # a trace's prefix blocks, by id

    def next(self) -> Prepared:
        """The next single request."""
        self.serial += 1
        if self._classes is not None:
            return self._classed(self._classes.draw(self.rng))
        if self.dialogues is not None:  # a conversation's first human turn, and its reply
            text, reply = self._dialogue()[0]
            prompt, asked = self._prefixed(text)
            out = self._output(reply)
        else:
            prompt, asked = self._prompt()
            out = self.w.output_tokens.draw(self.rng)
        return Prepared(self._body(prompt, out), asked, self._exact_out(out))

    def _classed(self, i: int) -> Prepared:
        """A request of class i of the mix: its lengths where it gives them, its priority."""
        c = self.w.classes[i]
        prompt, asked = self._prompt(length=c.input_tokens)
        out = (c.output_tokens or self.w.output_tokens).draw(self.rng)
        extra = {"priority": c.priority} if c.priority is not None else None
        return Prepared(self._body(prompt, out, extra=extra), asked, self._exact_out(out), i)

    def _dialogue(self) -> tuple[tuple[str, int], ...]:
        """The next dataset conversation (each worker from its own offset)."""
        assert self.dialogues is not None
        return self.dialogues[(self.serial - 1 + self.worker_index * 9973) % len(self.dialogues)]

    def _output(self, reply: int) -> int:
        """max_tokens: the dataset reply's length (--output-tokens dataset), else drawn."""
        if self.w.output_from_dataset and reply > 0:
            return reply
        return self.w.output_tokens.draw(self.rng)

    def _prefixed(self, text: str, bare: bool = False) -> tuple[str, int]:
        text = f"{self.prefix} {text}" if self.prefix and not bare else text
        return text, self._length(text)

    def _counter(self):
        """Tokens of a text by the local tokenizer (None: words are counted)."""
        tok = self.tokenizer
        if tok is None:
            return None
        return lambda text: len(tok.encode(text, add_special_tokens=False).ids)

    def sized(self, n_in: int, n_out: int, blocks: Sequence[int] = ()) -> Prepared:
        """A request of given lengths (a trace's entry): a synthetic prompt of n_in tokens
        (exact with a tokenizer, else words) asking for n_out; with prefix block ids, the
        prompt is those blocks' text (loadgen.worker.trace)."""
        self.serial += 1
        prompt, asked = self._blocked(n_in, blocks) if len(blocks) else self._synthetic(n_in)
        return Prepared(self._body(prompt, n_out), asked, self._exact_out(n_out))

    def _blocked(self, n: int, blocks: Sequence[int]) -> tuple[str, int]:
        """n tokens made of prefix blocks: each block id's words (seeded by the id, so two
        requests with the same ids share that prefix exactly), cut at n, and drawn words
        after the last block if the blocks are fewer than n tokens."""
        words: list[str] = []
        for bid in blocks:
            if len(words) >= n:
                break
            words += self._block(int(bid))[:n - len(words)]
        if len(words) < n:
            words += self.rng.choices(self.words, k=n - len(words))
        text = " ".join(words)
        if self.tokenizer is not None and not self.w.one_token_words:
            return self._trimmed(text, n)
        return text, n

    def _block(self, bid: int) -> list[str]:
        """A prefix block's words, made once and kept (the most recent BLOCKS_KEPT)."""
        got = self._blocks.get(bid)
        if got is None:
            if len(self._blocks) >= BLOCKS_KEPT:
                del self._blocks[next(iter(self._blocks))]
            rng = random.Random(f"{self.w.seed}:{bid}")
            got = self._blocks[bid] = rng.choices(self.words, k=self.w.trace_block_tokens)
        return got

    def turn(self, conv: Conversation) -> tuple[Prepared, Turn]:
        """The next turn of `conv` (a new conversation after its last turn): a new user
        message drawn as any prompt (the shared prefix opens a conversation only), sent
        with the whole history."""
        if conv.turn >= conv.limit:
            conv.reset()
        self.serial += 1
        if self.dialogues is None:
            conv.limit = self.w.turns
            text, asked = self._prompt(bare=conv.turn > 0)
            out = self.w.output_tokens.draw(self.rng)
        else:  # a dataset conversation's human turns in order, as many as it has
            if not conv.turn:
                conv.source = self._dialogue()
                conv.limit = min(self.w.turns, len(conv.source))
            human, reply = conv.source[conv.turn]
            text, asked = self._prefixed(human, bare=conv.turn > 0)
            out = self._output(reply)
        turn = conv.ask(text, asked)
        body = self._body(text, out, conv.messages)
        return Prepared(body, conv.asked, self._exact_out(out)), turn

    def _exact_out(self, max_tokens: int) -> int:
        return max_tokens if self.w.ignore_eos else 0

    def _body(self, prompt: str, max_tokens: int, messages: list[dict] | None = None,
              extra: dict | None = None) -> bytes:
        w = self.w
        # the user's fields first: tokentop's own keys are never theirs (OWN_BODY_KEYS);
        # a class's priority after them (the mix's own, so --extra-body may not set it)
        body: dict = {**w.body_fields, **(extra or {}), "model": w.model,
                      "max_tokens": max_tokens, "stream": True}
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
            body["messages"] = messages or [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return self._encode(body)

    def _prompt(self, bare: bool = False, length: LengthDist | None = None) -> tuple[str, int]:
        """The next prompt and its asked length (tokens by the tokenizer where there is one,
        the chat template and special tokens not included; else its words). `bare`: without
        the shared prefix (a conversation's later turns)."""
        if isinstance(self.prompts, TextWindows):  # real text, cut to the asked length
            return self._window(bare, length)
        if self.prompts is not None:
            i = (self.serial - 1 + self.worker_index * 9973) % len(self.prompts)
            return self._prefixed(self.prompts[i], bare)
        return self._synthetic((length or self.w.input_tokens).draw(self.rng), bare)

    def _synthetic(self, n: int, bare: bool = False) -> tuple[str, int]:
        """A synthetic prompt of n tokens (words without a tokenizer)."""
        if self.w.one_token_words:
            return self._exact(n, bare)
        shared = 0 if bare else self.w.shared_prefix
        words = [self.prefix] if self.prefix and not bare else []
        words.append(f"r{self.worker_index}-{self.serial}")
        words += self.rng.choices(PROMPT_WORDS, k=max(0, n - 1 - shared))
        text = " ".join(words)
        if self.tokenizer is not None:
            return self._trimmed(text, n)
        return text, len(text.split())

    def _window(self, bare: bool = False, length: LengthDist | None = None) -> tuple[str, int]:
        """A text dataset's prompt: the shared prefix, this request's serial number (as in
        synthetic prompts: prefix caching helps only as much as the prefix says), then the
        file's next words, n in all; with a tokenizer, that cut to n tokens (text has more
        tokens than words, so the cut is nearly always exact)."""
        assert isinstance(self.prompts, TextWindows)
        n = (length or self.w.input_tokens).draw(self.rng)
        head = f"{self.prefix} " if self.prefix and not bare else ""
        text = self.prompts.window(n - 1 - (0 if bare else self.w.shared_prefix))
        text = f"{head}r{self.worker_index}-{self.serial} {text}".rstrip()
        if self.tokenizer is not None:
            return self._trimmed(text, n)
        return text, len(text.split())

    def _length(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _exact(self, n: int, bare: bool = False) -> tuple[str, int]:
        """n one-token words: the shared prefix (unless `bare`), this request's marker, then
        drawn words (longer than n only where the prefix and the marker alone are)."""
        marker = self._marker()
        shared = 0 if bare else self.w.shared_prefix
        fill = max(0, n - shared - len(marker))
        parts = [self.prefix] if self.prefix and not bare else []
        parts += marker
        parts += self.rng.choices(self.words, k=fill)
        return " ".join(parts), shared + len(marker) + fill

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
