"""Multi-turn conversations (`--turns N`): each closed-loop user holds one.

A conversation is its messages so far: the user turns sent and the assistant's replies
as they streamed, sent back as the next turn's history, as a chat application does (a
server with prefix caching then reuses the earlier turns' KV, and says so in
`usage.prompt_tokens_details.cached_tokens`). Turn n's new user message is drawn as any
prompt (`--input-tokens`, `--dataset`), or with a ShareGPT dataset the conversation's own
human turns in order (as many as it has, up to N); the shared prefix opens the conversation
only.

After a turn the user thinks (`--think-time`) before the next; after the last turn, or a
turn that did not complete (a user whose answer never came cannot go on with it), the
next request starts a new conversation.

The asked prompt length of turn n is the history's: the user messages' asked lengths plus
the replies' answer tokens (the server's output count less its reasoning tokens: a
reasoning model's reasoning is not sent back, only its answer's text), the chat template
excluded as for single requests, so `input_per_request` compares it with the server's
count as ever.

A turn in flight (Turn) is what its request measured, so it lives with the measure in
loadgen.worker.stream_measure.
"""

from __future__ import annotations

from loadgen.worker.stream_measure import Turn


class Conversation:
    """One user's conversation: the messages so far and the asked length of their prompt."""

    __slots__ = ("asked", "limit", "messages", "source", "turn")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.messages: list[dict[str, str]] = []
        self.turn = 0  # turns asked so far
        self.limit = 1  # the turns it will have (set by its first turn)
        self.asked = 0
        # a dataset conversation's human turns and replies' lengths (ShareGPT), if any
        self.source: tuple[tuple[str, int], ...] = ()

    def ask(self, text: str, asked: int) -> Turn:
        """A new user message of `asked` tokens (words without a tokenizer)."""
        self.messages.append({"role": "user", "content": text})
        self.asked += asked
        self.turn += 1
        return Turn(self.turn)

    def answered(self, turn: Turn) -> None:
        """The reply to `turn` joins the history; a turn that did not complete ends the
        conversation."""
        if not turn.ok:
            self.reset()
            return
        self.messages.append({"role": "assistant", "content": "".join(turn.reply)})
        self.asked += turn.answer_tokens

