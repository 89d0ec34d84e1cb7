"""The engine model: continuous batching over a slot limit and a KV-cache budget.

One asyncio task per server runs the engine loop. Each step it admits waiting
requests (in arrival order, or by `priority` under that policy) while a slot is
free and the request's context + 1 fits in the free KV budget, preempts the
newest running request (the least urgent, by priority) while the batch's decode
growth does not fit, spends `prefill_chunk_tokens` of chunked prefill, sleeps
for the step's modelled duration, and then every decoding sequence emits one
token. A sequence whose prefill completes in a step emits its first token at
the end of that step. So TTFT grows with queueing and prompt length, ITL grows
with batch size, and output tokens/s saturates around the slot limit.

The handlers never poll: each waits on a Future that the loop resolves when
its sequence has something new, once per token for streams and once at the
end for whole responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from dataclasses import dataclass, field

from loadgen.sim import features
from loadgen.sim.faults import FaultConfig, Faults
from loadgen.sim.metrics import EngineMetrics
from loadgen.sim.words import PLAIN_WORDS

GIB = 1024**3

# A stall this long (event-loop lag) is not caught up with: the schedule restarts from now
# rather than running a burst of zero-length steps.
MAX_CATCH_UP_S = 0.05


# The engines whose /metrics the simulator can speak (loadgen.sim.dialects renders each).
DIALECTS = ("vllm", "sglang", "tgi", "llamacpp", "trtllm", "triton")
# vLLM's --scheduling-policy: first come first served, or the lowest `priority` first
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass
class SimConfig:
    """Everything the simulator can be told; every field has a working default."""

    model_name: str = "tokentop-sim"
    slots: int = 32  # max running sequences
    kv_tokens: int = 65536  # KV-cache budget in tokens; also the max context length
    step_overhead_ms: float = 6.0
    decode_ms_per_seq: float = 0.35
    prefill_ms_per_token: float = 0.02
    prefill_chunk_tokens: int = 2048  # chunked-prefill budget per step
    default_max_tokens: int = 256  # when a request names no max_tokens
    mean_output_tokens: float = 160.0  # mean natural length (ignore_eos false), exponential
    seed: int = 0
    # Stream this many tokens per SSE chunk (the first token is always sent alone, as
    # vLLM's stream_interval does); continuous usage then counts k per chunk.
    tokens_per_chunk: int = 1
    # Exact-timing mode (both set): every request gets exactly this TTFT and ITL whatever
    # the load, and every chunk carries "tokentop_sent_ns" (wall clock at write).
    # tokens_per_chunk applies there too; a chunk is written at its last token's deadline.
    exact_ttft_ms: float | None = None
    exact_itl_ms: float | None = None
    # Exact-timing mode: above 1, every chunk after the first carries 1..this many tokens,
    # drawn per chunk (seeded), in place of tokens_per_chunk: a server whose chunks vary
    exact_chunk_tokens_max: int = 1
    # a reasoning model: the first N generated tokens of every chat request are streamed as
    # `delta.reasoning_content`, the rest as `content`, and usage says
    # `completion_tokens_details.reasoning_tokens` (completions stream plain text: that API
    # has no reasoning field). 0: no reasoning.
    reasoning_tokens: int = 0
    # automatic prefix caching (loadgen.sim.prefix_cache), as vLLM has it on by default:
    # the cache's size in tokens (0: no prefix cache; None: the KV budget) and its block
    prefix_cache_tokens: int | None = None
    prefix_block_tokens: int = 16
    # tokens a chat template adds to every chat prompt, as real servers count them
    # (llama.cpp's default template adds about 14)
    chat_template_tokens: int = 0
    # a local tokenizer.json (or a folder holding one): prompts are counted with it, the
    # words written are those that are one token each in it, and POST /tokenize answers
    # (loadgen.sim.words.SimTokenizer); None: a token a word. Loaded when the server
    # starts, not here, so a recorded config whose file has gone still decodes.
    tokenizer: str | None = None
    metrics_dialect: str = "vllm"  # vllm | sglang | tgi | llamacpp | trtllm | triton
    # "fcfs": the queue in arrival order, and a request naming a nonzero `priority` refused
    # (400, as vLLM without the policy); "priority": the waiting request of the lowest
    # priority admitted first (ties by arrival) and the running one of the highest preempted
    scheduling_policy: str = "fcfs"
    faults: FaultConfig = field(default_factory=FaultConfig)
    # the simulated GPU(s); memory and power are per GPU, weights and KV split over them
    gpu_name: str = "Simulated H100 80GB HBM3"
    gpu_count: int = 1
    gpu_memory_bytes: int = 80 * GIB
    weights_bytes: int = 16 * GIB
    # the model's parameters, as llama.cpp states them (/v1/models meta.n_params; vLLM and
    # SGLang state none): the memory phase's GB per billion
    model_params: int = 8_000_000_000
    kv_bytes_per_token: int = 131072
    # vLLM's gpu_memory_utilization: the share of each GPU's memory the engine takes at start
    # (weights, activations and the KV pool) and holds whatever the load, as real engines
    # preallocate; so the GPU's memory used is flat, and a leak shows only in the KV in use
    gpu_memory_utilization: float = 0.9
    # vLLM's cache_config_info states kv_cache_memory_bytes (the pool's bytes per GPU), as
    # when the operator gives --kv-cache-memory-bytes; False: "None", vLLM's default
    state_kv_bytes: bool = False
    # a leaking engine: this share (0..1) of each finished request's KV tokens is never
    # freed, so the KV cache in use creeps up at a steady load (kv_leaked counts them)
    kv_leak_fraction: float = 0.0
    idle_power_w: float = 70.0
    power_limit_w: float = 700.0
    ambient_c: float = 30.0
    c_per_watt: float = 0.07  # steady-state temperature rise per watt drawn
    # a server that wants credentials: /v1/* answers 401 unless the Authorization header is
    # exactly this (e.g. "Bearer sk-…" or "Basic …"); None: no authentication
    require_authorization: str | None = None
    # features the server misbehaves in (loadgen.sim.features.BREAKABLE: "stop", "n", "seed",
    # "models" …): their request keys ignored, their route not served, or (errors) its 4xx
    # refusals answered 500, so a conformance check has a server that really lacks them
    broken: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A zero here would leave requests queued forever: refuse it up front.
        for name in ("slots", "kv_tokens", "prefill_chunk_tokens", "default_max_tokens",
                     "tokens_per_chunk", "exact_chunk_tokens_max", "gpu_count",
                     "prefix_block_tokens"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.prefix_cache_tokens is not None and self.prefix_cache_tokens < 0:
            raise ValueError("prefix_cache_tokens must not be negative (0: no prefix cache)")
        if self.mean_output_tokens <= 0:
            raise ValueError("mean_output_tokens must be positive")
        if (self.exact_ttft_ms is None) != (self.exact_itl_ms is None):
            raise ValueError("exact timing needs both exact_ttft_ms and exact_itl_ms")
        if self.exact_ttft_ms is not None and (self.exact_ttft_ms < 0 or self.exact_itl_ms < 0):  # type: ignore[operator]
            raise ValueError("exact timings must not be negative")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be more than 0 and at most 1, not "
                             f"{self.gpu_memory_utilization}")
        taken = self.gpu_memory_utilization * self.gpu_memory_bytes
        if self.weights_bytes // self.gpu_count > taken:
            raise ValueError("the weights do not fit in gpu_memory_utilization × gpu_memory_bytes"
                             " on each GPU: a real engine would not start")
        if not 0 <= self.kv_leak_fraction <= 1:
            raise ValueError(f"kv_leak_fraction must be 0..1, not {self.kv_leak_fraction}")
        if self.metrics_dialect not in DIALECTS:
            raise ValueError(f"metrics_dialect must be one of {', '.join(DIALECTS)}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}")
        for name in ("step_overhead_ms", "decode_ms_per_seq", "prefill_ms_per_token",
                     "reasoning_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        features.check_broken(self.broken)

    @property
    def exact(self) -> bool:
        return self.exact_ttft_ms is not None


class ContextLengthError(ValueError):
    """The request can never fit: prompt + max_tokens exceeds the KV budget."""


# Sequence states
WAITING = 0
PREFILL = 1
DECODE = 2
DONE = 3


class Sequence:
    """One request inside the engine. Plain slots: the loop touches these per token."""

    __slots__ = (
        "admitted_t",
        "arrived_t",
        "cached",
        "chunk",
        "every_token",
        "finish_reason",
        "first_token_t",
        "generated",
        "kv",
        "last_token_t",
        "offset",
        "prefill_left",
        "priority",
        "prompt_tokens",
        "state",
        "target",
        "target_reason",
        "waiter",
    )

    def __init__(self, prompt_tokens: int, target: int, target_reason: str, now: float) -> None:
        self.prompt_tokens = prompt_tokens
        self.priority = 0  # under the priority policy, the lowest is served first
        self.target = target  # tokens this request will produce
        self.target_reason = target_reason  # "stop" or "length", once target is reached
        self.generated = 0
        self.state = WAITING
        self.kv = 0  # KV tokens held while running
        self.prefill_left = 0
        self.cached = 0  # prompt tokens the prefix cache serves: its first prefill skips them
        self.chunk = 0  # prefill tokens granted in the current step
        self.arrived_t = now
        self.admitted_t: float | None = None
        self.first_token_t: float | None = None
        self.last_token_t = now
        self.finish_reason: str | None = None  # set when DONE: stop | length | abort
        self.waiter: asyncio.Future[None] | None = None
        self.every_token = True  # wake the handler per token (streams) or only at the end
        self.offset = 0  # where in the word list this request's text starts

    @property
    def done(self) -> bool:
        return self.state == DONE


class BatchModel:
    """The engine state and its loop. Start with `start()` inside a running loop."""

    def __init__(self, cfg: SimConfig, faults: Faults | None = None) -> None:
        self.cfg = cfg
        self.faults = faults or Faults(cfg.faults)
        self.metrics = EngineMetrics()
        self.exact_running = 0  # exact-timing requests, which bypass the scheduler
        self._next_spike: float | None = None
        self._chunk_k = cfg.tokens_per_chunk
        self._prefill_s = 0.0  # the prefill share of the step in progress
        self._growth = 0  # KV tokens the step in progress will add (one per decoding sequence)
        self._rng = random.Random(cfg.seed)
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in admission order: the newest is last
        self._kv_used = 0
        self.kv_leaked = 0  # KV tokens of finished requests never freed (kv_leak_fraction)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._busy_s = 0.0  # wall time spent inside steps, for the GPU's utilisation
        self._step_start: float | None = None
        self.steps = 0
        self.table = PLAIN_WORDS  # the words written (the server's, with a tokenizer)

    # ---- what the outside reads

    @property
    def num_running(self) -> int:
        return len(self._running) + self.exact_running

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_used(self) -> int:
        return self._kv_used

    @property
    def kv_usage(self) -> float:
        return self._kv_used / self.cfg.kv_tokens

    def now(self) -> float:
        assert self._loop is not None, "engine not started"
        return self._loop.time()

    def busy_seconds(self, now: float) -> float:
        """Cumulative wall time spent in steps, counting the step in progress."""
        if self._step_start is None:
            return self._busy_s
        return self._busy_s + max(0.0, now - self._step_start)

    def live(self) -> list[Sequence]:
        """Every request in the engine, running or waiting."""
        return [*self._running, *self._waiting]

    def restart(self) -> int:
        """A process restart: abort every request, counters from zero. Returns how many."""
        live = self.live()
        for seq in live:
            self.abort(seq)
        self.metrics = EngineMetrics()
        self._kv_used -= self.kv_leaked  # a new process: what leaked is free again
        self.kv_leaked = 0
        return len(live)

    # ---- lifecycle

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="tokentop-sim-engine")

    async def stop(self) -> None:
        """Stop the loop and end every request with finish_reason "abort"."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in [*self._running, *self._waiting]:
            self.abort(seq)

    # ---- what handlers call

    def submit(
        self, prompt_tokens: int, max_tokens: int | None, ignore_eos: bool, *, stream: bool,
        cached: int = 0, asked: features.Asked | None = None, choice: int = 0,
        priority: int = 0,
    ) -> Sequence:
        """Queue a request (`cached`: its prompt tokens the prefix cache serves; `asked`: its
        key, min_tokens and stops; `choice`: which of its n; `priority`: its rank under the
        priority policy); raises ContextLengthError when it could never fit."""
        seq = self.planned(prompt_tokens, max_tokens, ignore_eos, asked, choice, self.now())
        seq.every_token = stream
        seq.cached = cached
        seq.priority = priority
        self.metrics.arrived += 1
        self._waiting.append(seq)
        # Admit now when a slot is free and it fits: num_requests_waiting then counts only
        # requests that really queue (its prefill still starts with the next step).
        self._admit(seq.arrived_t)
        self._wake.set()
        return seq

    def rng_offset(self) -> int:
        """Where a request's text starts in the word list."""
        return self._rng.randrange(1 << 16)

    def planned(self, prompt_tokens: int, max_tokens: int | None, ignore_eos: bool,
                asked: features.Asked | None, choice: int, now: float) -> Sequence:
        """A new Sequence: its length and text planned (a deterministic request's from its
        key, after the engine's own draws, so the other requests' lengths stay as they were),
        then cut at its first stop (in the words of self.table)."""
        a = asked or features.Asked()
        target, reason = self.plan_length(prompt_tokens, max_tokens, ignore_eos, a.key,
                                          a.min_tokens)
        seq = Sequence(prompt_tokens, target, reason, now)
        seq.offset = self.rng_offset()
        if a.key is not None:
            seq.offset = features.offset_of(a.key, choice)
        cut = features.cut_at_stop(target, seq.offset, a.stop, a.min_tokens, self.table)
        if cut is not None:
            seq.target, seq.target_reason = cut, "stop"
        return seq

    def plan_length(
        self, prompt_tokens: int, max_tokens: int | None, ignore_eos: bool,
        key: int | None = None, min_tokens: int = 0,
    ) -> tuple[int, str]:
        """(tokens to generate, finish_reason); raises ContextLengthError when it cannot fit."""
        limit = self.cfg.kv_tokens
        if max_tokens is None:
            max_tokens = min(self.cfg.default_max_tokens, limit - prompt_tokens)
            if max_tokens < 1:
                raise ContextLengthError(
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"prompt has {prompt_tokens} tokens, which leaves no room for a completion."
                )
        elif prompt_tokens + max_tokens > limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages "
                "or completion."
            )
        target, reason = max_tokens, "length"
        if not ignore_eos:
            natural = 1 + int(self._rng.expovariate(1.0 / self.cfg.mean_output_tokens))
            if key is not None:  # drawn above all the same: the next request's is as it was
                natural = features.natural_length(key, self.cfg.mean_output_tokens)
            natural = max(natural, min_tokens)
            if natural < max_tokens:
                target, reason = natural, "stop"
        return target, reason

    def wait(self, seq: Sequence) -> asyncio.Future[None]:
        """A Future resolved when `seq` emits its next token (or, for whole responses, ends)."""
        assert self._loop is not None, "engine not started"
        fut = self._loop.create_future()
        seq.waiter = fut
        return fut

    def abort(self, seq: Sequence) -> None:
        """Free the request's slot and KV now (client gone, or shutdown). Idempotent."""
        if seq.state == DONE:
            return
        if seq.state == WAITING:
            self._waiting.remove(seq)
        else:
            self._running.remove(seq)
            self._kv_used -= seq.kv
            seq.kv = 0
        seq.state = DONE
        seq.finish_reason = "abort"
        _resolve(seq)

    # ---- the loop

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self._running and not self._waiting:
                # Idle: sleep on the event, no timer, no CPU.
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
            self._admit(loop.time())
            if not self._running:
                # Cannot happen (submit rejects what never fits); guard against a spin anyway.
                self._wake.clear()
                await self._wake.wait()
                continue
            step_s = self._plan()
            start = loop.time()
            spike = self.faults.cfg
            if spike.spike_every_s > 0 and spike.spike_ms > 0:
                step_s += self._spike(start, spike.spike_every_s, spike.spike_ms)
            else:
                self._next_spike = None
            self._step_start = start
            # A fixed schedule: each step ends step_s after the previous deadline, so
            # timer and loop jitter do not accumulate into drift.
            deadline += step_s
            if deadline < start - MAX_CATCH_UP_S:
                deadline = start + step_s
            delay = deadline - start
            await asyncio.sleep(delay if delay > 0 else 0)
            end = loop.time()
            self._busy_s += end - start
            self._step_start = None
            self.steps += 1
            self.metrics.busy_slot_steps += len(self._running)
            self.metrics.prefill_seconds += self._prefill_s
            self._finish_step(end)

    def _spike(self, now: float, every_s: float, spike_ms: float) -> float:
        """A stop-the-world pause once every `every_s`: the extra seconds for this step."""
        if self._next_spike is None:
            self._next_spike = now + every_s
            return 0.0
        if now < self._next_spike:
            return 0.0
        while self._next_spike <= now:
            self._next_spike += every_s
        self.faults.count("spike")
        return spike_ms / 1000.0

    def _admit(self, now: float) -> None:
        cfg = self.cfg
        by_priority = cfg.scheduling_policy == "priority"
        while self._waiting and len(self._running) < cfg.slots:
            seq = min(self._waiting, key=_rank) if by_priority else self._waiting[0]
            context = seq.prompt_tokens + seq.generated
            need = context + 1  # room for the token the prefill produces
            if self._kv_used + self._growth + need > cfg.kv_tokens:
                break  # nobody overtakes the head of the queue (its order's head)
            self._waiting.remove(seq)
            seq.state = PREFILL
            seq.kv = need
            self._kv_used += need
            # A preempted request is prefilled again: its prompt and what it already generated
            # (the first time, without what the prefix cache had).
            seq.prefill_left = max(1, context - seq.cached)
            seq.cached = 0
            if seq.admitted_t is None:
                seq.admitted_t = now
                self.metrics.queue.observe(now - seq.arrived_t)
            self._running.append(seq)

    def _plan(self) -> float:
        """Preempt until the decode growth fits, grant prefill chunks; return the step time."""
        cfg = self.cfg
        running = self._running
        decoding = 0
        for seq in running:
            if seq.state == DECODE:
                decoding += 1
        # Each decoding sequence grows by one KV token this step; prefilling ones reserved theirs.
        while self._kv_used + decoding > cfg.kv_tokens and len(running) > 1:
            # the newest goes back to the queue; under the priority policy, the least urgent
            seq = running.pop() if cfg.scheduling_policy != "priority" else _pop_last(running)
            if seq.state == DECODE:
                decoding -= 1
            self._preempt(seq)
        self._growth = decoding
        budget = cfg.prefill_chunk_tokens
        prefill = 0
        for seq in running:
            if seq.state == PREFILL:
                grant = min(seq.prefill_left, budget)
                seq.chunk = grant
                budget -= grant
                prefill += grant
        self._prefill_s = cfg.prefill_ms_per_token * prefill / 1000.0
        ms = (
            cfg.step_overhead_ms
            + cfg.decode_ms_per_seq * decoding
            + cfg.prefill_ms_per_token * prefill
        )
        return ms / 1000.0

    def _preempt(self, seq: Sequence) -> None:
        self._kv_used -= seq.kv
        seq.kv = 0
        seq.chunk = 0
        seq.state = WAITING
        self._waiting.appendleft(seq)  # first in line to come back
        self.metrics.preemptions += 1

    def _finish_step(self, now: float) -> None:
        metrics = self.metrics
        itl = metrics.itl
        self._growth = 0
        keep: list[Sequence] = []
        emitted = 0
        k = self._chunk_k
        # Sequences that decoded in the same step share one gap: observe them as a run.
        gap_value = -1.0
        gap_count = 0
        for seq in self._running:
            if seq.state == PREFILL:
                seq.prefill_left -= seq.chunk
                seq.chunk = 0
                if seq.prefill_left > 0:
                    keep.append(seq)
                    continue
                seq.state = DECODE  # its KV for this token was reserved on admission
                if seq.first_token_t is None:
                    seq.first_token_t = now
                    metrics.ttft.observe(now - seq.arrived_t)
                    metrics.prompt_tokens += seq.prompt_tokens
                else:
                    itl.observe(now - seq.last_token_t)  # resumed after a preemption
            else:
                seq.kv += 1
                self._kv_used += 1
                gap = now - seq.last_token_t
                if gap == gap_value:
                    gap_count += 1
                else:
                    if gap_count:
                        itl.observe(gap_value, gap_count)
                    gap_value, gap_count = gap, 1
            seq.last_token_t = now
            seq.generated += 1
            emitted += 1
            if seq.generated >= seq.target:
                self._finish(seq, now)
            else:
                keep.append(seq)
                # the first token alone, then every k-th (k = tokens per chunk)
                if seq.every_token and (k == 1 or (seq.generated - 1) % k == 0):
                    _resolve(seq)
        if gap_count:
            itl.observe(gap_value, gap_count)
        self._running = keep
        metrics.generation_tokens += emitted

    def _finish(self, seq: Sequence, now: float) -> None:
        leaked = int(seq.kv * self.cfg.kv_leak_fraction)  # held for good: a leaking engine
        self.kv_leaked += leaked
        self._kv_used -= seq.kv - leaked
        seq.kv = 0
        seq.state = DONE
        seq.finish_reason = seq.target_reason
        self.metrics.finished(seq.target_reason, seq.prompt_tokens, seq.generated)
        self.metrics.e2e.observe(now - seq.arrived_t)
        _resolve(seq)


def _rank(seq: Sequence) -> tuple[int, float]:
    """A sequence's place under the priority policy: the lowest priority, then the oldest."""
    return seq.priority, seq.arrived_t


def _pop_last(running: list[Sequence]) -> Sequence:
    """The running sequence the priority policy gives up first (the last by _rank)."""
    seq = max(running, key=_rank)
    running.remove(seq)
    return seq


def _resolve(seq: Sequence) -> None:
    waiter = seq.waiter
    if waiter is not None:
        seq.waiter = None
        if not waiter.done():
            waiter.set_result(None)
