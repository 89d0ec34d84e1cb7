"""What several commands take: the run's arguments, the simulator's, the broker's, typed
value parsers, and the secrets read from files or the environment.

Everything here turns text from the command line into typed values once, at the
edge; nothing under loadgen/ or probes/ sees a flag or a namespace. A figure is read
by loadgen.model.units, the parsers the eval plan and the SLO grammar use too, so a
flag takes what a plan takes (24h, 5%, 500ms). Bad input is one line on stderr and
exit code 2, never a traceback: the value parsers raise `argparse.ArgumentTypeError`
(argparse words it), and what can only be checked after parsing goes through `fail`.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from loadgen.fleet.link import DEFAULT_FLEET, DEFAULT_KEEPALIVE, PASSWORD_ENV
from loadgen.model import units

if TYPE_CHECKING:
    from loadgen.fleet.link import BrokerSettings
    from loadgen.run.config import RunConfig
    from loadgen.run.secrets import Secrets
    from loadgen.sim.model import SimConfig

METRICS_TOKEN_ENV = "TOKENTOP_METRICS_TOKEN"  # the default of --metrics-token-file
API_KEY_ENV = "OPENAI_API_KEY"  # the default of --api-key-file


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line that says what to do, and --help says each
    option's default (DefaultsFormatter) unless told otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def fail(message: str, prog: str = "tokentop") -> NoReturn:
    """Bad input found after parsing: one line, exit code 2."""
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(2)


# ---- typed values: loadgen.model.units' parsers as argparse types ---------------------------
# Every flag reads its figure with the same parser as the eval plan and the SLO grammar, so
# `--duration 24h`, `--max-error-rate 5%` and `--ttft-ms 0.5s` mean what the plan's "24h",
# "5%" and the SLO's `ttft<500ms` mean. A UnitError becomes argparse's one line.


def _typed(parse: Callable[..., Any], text: str, **options: Any) -> Any:
    """`parse(text)`, its UnitError raised as argparse's, which argparse words in one line
    naming the flag."""
    try:
        return parse(text, **options)
    except units.UnitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds(text: str, *, zero: bool = False) -> float:
    """Seconds above 0 (or 0 too, `zero`): 20, 0.5, 20s, 500ms, 5m, 24h, 2d."""
    return _typed(units.parse_seconds, text, zero=zero)


def seconds_or_zero(text: str) -> float:
    return seconds(text, zero=True)


def latency_ms(text: str) -> float:
    """A `--…-ms` flag: milliseconds, a bare number in ms (the flag says so) or with any
    time unit (0.5s, 800us), as the SLO grammar reads times."""
    return _typed(units.parse_latency_us, text, bare="ms") / 1e3


def stagger(text: str) -> float | None:
    """--stagger: auto (None), or seconds, 0 or more."""
    return None if text.strip().lower() == "auto" else seconds_or_zero(text)


def key_value(text: str) -> tuple[str, str]:
    """KEY=VALUE (--meta): a key of letters, digits, '_', '-' or '.'; any value."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or not all(c.isalnum() or c in "_-." for c in key):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. tp=2), got {text!r}")
    return key, value.strip()


def fraction(text: str) -> float:
    """A fraction between 0 and 1, or a percentage (0.05, 5%)."""
    return _typed(units.parse_fraction, text)


def rate(text: str) -> float:
    """Requests per second, 0 or more (5, 5/s, 300/m)."""
    return _typed(units.parse_rate, text)


def size(text: str) -> int:
    """Bytes: 512, 4KiB, 64MiB, 1.5GB, 80G."""
    return _typed(units.parse_size, text)


def model_params(text: str) -> float:
    """--model-params: the model's parameters, in billions (8B, 1.5B, 350M, 7e9)."""
    return _typed(units.parse_params, text)


def positive(text: str, *, zero: bool = False) -> float:
    """A number above 0, or 0 too with `zero` (a speed-up, a gamma shape, a cap)."""
    return _typed(units.parse_positive, text, zero=zero)


def whole(minimum: int) -> Callable[[str], int]:
    """An int of at least `minimum` (streams, workers, a pid)."""

    def parse(text: str) -> int:
        return _typed(units.parse_whole, text, minimum=minimum)

    parse.__name__ = "whole number"  # argparse names a type by it in a few of its messages
    return parse


def cancel_at(text: str) -> str:
    """--cancel-at: tokens (20), or a time with its unit (1.5s, 500ms, 2m) written back as
    seconds ("120s"), the form RunConfig reads."""
    if text.strip().isdigit():
        return str(whole(1)(text))
    try:
        return f"{units.parse_latency_us(text) / 1e6:g}s"
    except units.UnitError as e:
        raise argparse.ArgumentTypeError(f"expected tokens (20) or a time (1.5s): {e}") \
            from None


# ---- the run's arguments, in groups a command picks from -------------------------------------
# The console, `tokentop run` and the agent take them all (add_run_arguments). A sweep sets
# how much load and for how long by its steps, an eval most of a run by its plan: each adds
# only the groups it uses, and refuse_elsewhere words a flag of the others. The dests are
# RunConfig's field names (run_config reads them); a group a command leaves out keeps
# RunConfig's default.


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Everything a run takes: the console, `tokentop run`, the agent."""
    add_target_arguments(p)
    load = p.add_argument_group("load")
    add_mode_argument(load)
    add_load_level_arguments(load)
    add_open_loop_arguments(load)
    add_trace_arguments(load)
    workload = p.add_argument_group("workload")
    add_prompt_arguments(workload)
    add_request_arguments(workload)
    add_shaping_arguments(p.add_argument_group("requests as you shape them"))
    limits = p.add_argument_group("limits and measurement")
    add_length_arguments(limits)
    add_judging_arguments(limits)
    add_machinery_arguments(limits)
    add_recording_arguments(p)
    add_prometheus_arguments(p.add_argument_group("figures for other tools"))


def add_target_arguments(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("target")
    t.add_argument("--url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 "
                   "(default: start the embedded simulator). One that does not answer yet "
                   "is waited for, asked every 2 s: see --wait")
    t.add_argument("--wait", type=seconds_or_zero,
                   help="seconds to wait for a --url that does not answer yet (a server "
                   "still loading its model), then exit with code 2; 0: do not wait "
                   "(default: 60 for a headless run or agent, as long as it takes in the "
                   "console)")
    t.add_argument("--model", help="model name (default: the server's first model)")
    t.add_argument("--api", choices=("chat", "completions"), default="chat",
                   help="the endpoint: /chat/completions or /completions")
    t.add_argument("--api-key-file", type=Path,
                   help="file holding the API key (default: $OPENAI_API_KEY); never on the "
                   "command line, so it stays out of shell history and `ps`")
    t.add_argument("--metrics-url", help="the server's Prometheus /metrics, when not at URL root")
    t.add_argument("--metrics-token-file", type=Path,
                   help="file holding a bearer token for --metrics-url (default: "
                   "$TOKENTOP_METRICS_TOKEN, else the API key when /metrics is on the same host)")
    t.add_argument("--sim-profile", help="embedded simulator: a named deployment "
                   "(see tokentop sim --help)")
    t.add_argument("--sim-arg", action="append", default=[], metavar="FLAG",
                   help="embedded simulator: one more flag, e.g. --sim-arg=--slots=16 "
                   "(repeatable)")
    t.add_argument("--server-pid", type=whole(1),
                   help="the server's process id (default: found by the URL's port or by name)")
    t.add_argument("--server-name", help="find the server's process by this name")
    t.add_argument("--client", choices=("raw", "openai"), default="raw",
                   help="raw: tokentop's own fast HTTP client (default); openai: the official "
                   "SDK, to see what SDK-based applications see")


def add_mode_argument(g: argparse._ActionsContainer) -> None:
    g.add_argument("--mode", choices=("closed", "open"), default="closed",
                   help="closed: N concurrent streams; open: a request rate")
    g.add_argument("--stagger", type=stagger, default=None, metavar="auto|S",
                   help="closed loop: streams started together start spread over one "
                   "request's time as measured (auto, the default), over S seconds, or all "
                   "at once (0: in lock-step, when the requests are alike)")


def add_load_level_arguments(g: argparse._ActionsContainer) -> None:
    """How much load, and how it grows: what a sweep's steps and an eval's phases set."""
    # 0 stays valid here: the console may start idle (`+` adds streams), a ramp from 0;
    # a headless run that would never send anything refuses it (loadgen.run.headless)
    g.add_argument("-c", "--concurrency", type=whole(0), default=8,
                   help="concurrent streams (default %(default)s); 0 only in the console, "
                   "with a ramp, or for an agent under remote control")
    # no default here: an open loop without a rate is refused (open_loop_rate), never a
    # silent 1 req/s
    g.add_argument("--rate", type=rate,
                   help="open loop: requests per second (5, 5/s, 300/m); --mode open needs it "
                   "(or a --ramp, --auto-ramp or --trace to set the rate)")
    g.add_argument("--ramp", help="linear:FROM:TO:SECONDS or step:START:STEP:SECONDS[:MAX]")
    g.add_argument("--auto-ramp", action="store_true",
                   help="double the streams while the --slo holds, settle at the boundary")
    g.add_argument("--auto-ramp-hold", type=seconds, default=10.0,
                   help="measured seconds per auto-ramp step")
    g.add_argument("--auto-ramp-max", type=whole(1), default=4096,
                   help="the most streams (or req/s in open loop) auto-ramp tries")


def add_open_loop_arguments(g: argparse._ActionsContainer) -> None:
    g.add_argument("--arrival", choices=("constant", "poisson", "gamma"), default="poisson",
                   help="open loop arrival process")
    g.add_argument("--burstiness", type=positive, default=1.0,
                   help="gamma shape: < 1 burstier than Poisson, > 1 more regular")
    g.add_argument("--max-in-flight", type=whole(1),
                   help="open loop: cap on requests in flight; the rest wait in a backlog")


def add_trace_arguments(g: argparse._ActionsContainer) -> None:
    g.add_argument("--trace", metavar="FILE",
                   help="replay a request trace (open loop): Mooncake JSONL, "
                   "{\"t\": s, \"input_tokens\": n, \"output_tokens\": m} JSONL or Azure CSV; "
                   "the run stops when it is done")
    g.add_argument("--trace-speed", type=positive,
                   help="--trace: play its time this many times faster (default 1)")
    g.add_argument("--trace-block-tokens", type=whole(1),
                   help="--trace: tokens a prefix block of its hash_ids (default 512, "
                   "Mooncake's)")


def add_prompt_arguments(g: argparse._ActionsContainer) -> None:
    """What each request asks: lengths, where prompts come from, conversations."""
    g.add_argument("--input-tokens", default="128",
                   help="prompt length: 128, uniform:64:256, normal:128:32, lognormal:128:0.5")
    g.add_argument("--output-tokens", default="128",
                   help="max_tokens, same forms; dataset: the length of the reply that "
                   "followed each prompt in a ShareGPT --dataset")
    g.add_argument("--dataset", metavar="KIND[:FILE]",
                   help="where prompts come from: synthetic (default); text:FILE (windows of "
                   "--input-tokens words cut from any raw text); sharegpt:FILE (the first "
                   "human turns, JSON array or JSONL); jsonl:FILE (one prompt a line)")
    g.add_argument("--prompts", "--prompts-file", dest="prompts_file", metavar="FILE",
                   help="JSONL prompts ({\"prompt\": …} or ShareGPT conversations): the same "
                   "as --dataset jsonl:FILE")
    g.add_argument("--turns", type=whole(1),
                   help="multi-turn conversations: user turns per conversation, each stream "
                   "a user sending its history with each turn (closed loop, chat API; "
                   "default 1: single requests)")
    g.add_argument("--think-time", metavar="SECONDS",
                   help="a user's wait between turns: 2, 0.5s, uniform:1:3, lognormal:2:0.5 "
                   "(default 0)")
    g.add_argument("--mix", action="append", metavar="'NAME SHARE [in=] [out=] [priority=] "
                   "[slo=]'",
                   help="a class of requests (repeat it: the shares add up to 100%%), e.g. "
                   "--mix 'interactive 20%% in=128 out=64 priority=0 slo=ttft<200ms' --mix "
                   "'batch 80%% in=1024 out=512 priority=10': each class measured apart; "
                   "priority is sent as the body's priority (vLLM with --scheduling-policy "
                   "priority: lower first)")


def add_request_arguments(g: argparse._ActionsContainer) -> None:
    """How each request is made and counted, whatever it asks."""
    g.add_argument("--shared-prefix", type=whole(0), default=0,
                   help="words every prompt shares at the start (prefix-cache studies)")
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let the model stop early (default: ask for exactly max_tokens)")
    g.add_argument("--no-continuous-usage", dest="continuous_usage", action="store_false",
                   help="do not ask for usage on every chunk (for servers that reject it)")
    g.add_argument("--tokenizer", default="auto", metavar="PATH|server|auto|none",
                   help="exact token lengths: PATH, a local tokenizer.json or a model folder "
                   "holding one (read offline; also counts the tokens of each chunk when the "
                   "server sends no per-chunk usage); server: the target's /tokenize; auto "
                   "(default): the server's when it has one; none: about one token a word")


def add_shaping_arguments(g: argparse._ActionsContainer) -> None:
    """The request as the user shapes it: sampling, guided decoding, any body field, and
    headers (whose values are secrets: loadgen.run.secrets)."""
    g.add_argument("--temperature", type=lambda t: positive(t, zero=True),
                   help="sampling temperature sent in every request (default: none sent, "
                   "the server's own)")
    g.add_argument("--top-p", type=fraction,
                   help="nucleus sampling: top_p in every request, above 0 and at most 1 "
                   "(default: none sent)")
    g.add_argument("--top-k", type=whole(-1),
                   help="top_k in every request (-1: all tokens; default: none sent)")
    g.add_argument("--sampling-seed", type=whole(0), metavar="N",
                   help="the body's \"seed\" in every request, for the server's sampling "
                   "(--seed is tokentop's own draws; default: none sent)")
    g.add_argument("--response-format", choices=("json",),
                   help="json: ask for JSON output, response_format {\"type\": "
                   "\"json_object\"} (guided decoding; a schema: --extra-body; default: "
                   "none sent)")
    g.add_argument("--extra-body", type=json_object, metavar="JSON",
                   help="a JSON object merged into every request's body, e.g. "
                   "'{\"repetition_penalty\": 1.1}' (not the keys tokentop writes: model, "
                   "messages, prompt, max_tokens, stream…)")
    g.add_argument("--header", dest="header", type=header, action="append", default=[],
                   metavar="'NAME: VALUE'|@FILE",
                   help="a header for every request to the target (repeatable); @FILE: "
                   "such lines from a file. Every value is taken as a secret: only the "
                   "names are recorded or shown. One on the command line is seen by ps and "
                   "your shell's history: put a secret one in a file")


def json_object(text: str) -> dict[str, Any]:
    """--extra-body: a JSON object, or one line saying why not."""
    import json

    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.args[0].split(':')[0]}): {text!r}") \
            from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object ({{...}}), got {text!r}")
    return value


# headers tokentop writes itself: what is measured is a streamed JSON POST on its own
# connection, so these are not the user's to change
OWN_HEADERS = frozenset({"host", "content-length", "content-type", "transfer-encoding",
                         "connection", "accept"})
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~")  # a header name's characters besides alnum


def header(text: str) -> list[tuple[str, str]]:
    """--header: 'Name: value', or @FILE holding such lines (blank and # lines skipped)."""
    if not text.startswith("@"):
        return [_header_line(text, "")]
    path = Path(text[1:])
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(
            f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    found = [_header_line(line, f" ({path} line {i})") for i, line in enumerate(lines, 1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not found:
        raise argparse.ArgumentTypeError(f"{path} holds no 'Name: value' line")
    return found


def _header_line(line: str, where: str) -> tuple[str, str]:
    """One 'Name: value' checked; the words never quote the value (it may be a secret)."""
    name, sep, value = line.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name or not all(c.isalnum() or c in _TOKEN_CHARS for c in name):
        raise argparse.ArgumentTypeError(
            f"expected 'Name: value', the name of letters, digits and - or _{where}")
    if not value:
        raise argparse.ArgumentTypeError(f"{name} has no value{where}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise argparse.ArgumentTypeError(f"{name}'s value holds control characters{where}")
    if name.lower() in OWN_HEADERS:
        raise argparse.ArgumentTypeError(
            f"{name} is tokentop's own (it sends a streamed JSON POST): it cannot be set")
    return name, value


def headers_from(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """Every --header, in order; a name given twice, or an Authorization beside
    --api-key-file, is one line and exit 2."""
    found = [pair for group in getattr(args, "header", None) or [] for pair in group]
    seen: set[str] = set()
    for name, _ in found:
        if name.lower() in seen:
            fail(f"--header {name} is given twice: give each header once")
        seen.add(name.lower())
    if "authorization" in seen and getattr(args, "api_key_file", None) is not None:
        fail("--header Authorization and --api-key-file both set the Authorization header: "
             "give one")
    return tuple(found)


def add_length_arguments(g: argparse._ActionsContainer) -> None:
    """How long the run goes on: what a sweep's steps and an eval's phases set."""
    g.add_argument("--duration", type=seconds,
                   help="seconds of load after warm-up, then stop (90, 20m, 24h; default: "
                   "until stopped)")
    g.add_argument("--requests", dest="max_requests", type=whole(1),
                   help="stop after this many requests")


def add_judging_arguments(g: argparse._ActionsContainer) -> None:
    """What counts: the warm-up left out and the SLOs (an eval's plan has its own)."""
    g.add_argument("--warmup", type=seconds_or_zero,
                   help="seconds of load excluded from the results (default: 0)")
    g.add_argument("--slo", help="per request (goodput): ttft<500ms,tpot<50ms,e2e<10s; whole run "
                   "(pass/fail): ttft_p99<1s,error_rate<1%%,output_tok_s>500; times need a "
                   "unit (ms, s or us)")


def add_machinery_arguments(g: argparse._ActionsContainer) -> None:
    """How the load is driven and stopped: every command that runs load takes these."""
    g.add_argument("--stop-error-rate", type=fraction,
                   help="stop when errors over the last 10 s pass this fraction (0.05 or 5%%)")
    g.add_argument("--cancel-rate", type=fraction, default=0.0,
                   help="fraction of requests the client abandons (users who leave)")
    g.add_argument("--cancel-at", type=cancel_at,
                   help="abandon after this many tokens (20) or this long (1.5s)")
    g.add_argument("--workers", type=whole(0), default=0,
                   help="load worker processes (default: cores - 1, at least 1)")
    g.add_argument("--request-timeout", type=seconds, default=600.0,
                   help="seconds a request may take before it is abandoned as an error")
    g.add_argument("--drain-grace", type=seconds, default=10.0,
                   help="on stop, seconds in-flight requests may take before they are cancelled")
    g.add_argument("--tick", type=seconds, default=0.5, help="seconds per Snapshot")
    g.add_argument("--seed", type=whole(0), default=0,
                   help="seed of the workload's draws (lengths, arrivals, prompts)")


def add_prometheus_arguments(g: argparse._ActionsContainer) -> None:
    """tokentop's own live figures served in the Prometheus text format (Grafana)."""
    g.add_argument("--prometheus-port", type=whole(0),
                   help="serve tokentop's live figures for Prometheus on this port (0: any)")
    g.add_argument("--prometheus-host", default="127.0.0.1",
                   help="the address the Prometheus endpoint listens on")


def add_recording_arguments(p: argparse.ArgumentParser) -> None:
    r = p.add_argument_group("recording")
    r.add_argument("--out", help="run directory (default: a new one under "
                   "~/.local/share/tokentop/runs)")
    add_resume_arguments(r)
    add_disk_full_argument(r)


def add_resume_arguments(g: argparse._ActionsContainer) -> None:
    g.add_argument("--resume", help="continue the run recorded in this directory")
    g.add_argument("--no-record", dest="record", action="store_false",
                   help="do not record this run")


def add_disk_full_argument(g: argparse._ActionsContainer) -> None:
    g.add_argument("--on-disk-full", choices=("stop", "continue"), default="stop",
                   help="when recording fails: stop the load (default) or keep it running")


def add_console_arguments(p: argparse.ArgumentParser) -> None:
    """The console's own: its look, its redraws, and `--publish` to a fleet (the broker's
    arguments); the group other commands refuse in words (refuse_elsewhere)."""
    ui = p.add_argument_group("console")
    ui.add_argument("--theme", help="tokentop-dark (default), tokentop-light, "
                    "tokentop-high-contrast, tokentop-mono; `t` cycles them in the console "
                    "and the choice is remembered in ~/.config/tokentop/config.toml")
    ui.add_argument("--refresh", type=seconds, default=0.5, help="seconds between redraws")
    add_broker_arguments(p, required=False, url_flag="--publish")
    p.add_argument("--name", default=socket.gethostname(),
                   help="this machine's name in the fleet (with --publish)")


# ---- what a command does not take, said in words ---------------------------------------------


class DefaultsFormatter(argparse.HelpFormatter):
    """Each option's default after its help, unless the help says it already or there is
    nothing to say (no default, or an on/off flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or "").strip()
        d = action.default
        no_default = d is None or d is argparse.SUPPRESS or isinstance(d, bool | list)
        if no_default or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class ListingFormatter(DefaultsFormatter, argparse.RawDescriptionHelpFormatter):
    """DefaultsFormatter, the description kept as written: `tokentop --help`'s list of
    subcommands, one a line."""


def parse_refusing(p: argparse.ArgumentParser, argv: list[str], what: str,
                   elsewhere: dict[str, tuple[Callable[[Any], None], ...]]) -> argparse.Namespace:
    """`argv` read by `p`. A flag `p` lacks that another command takes is one line saying
    why (`elsewhere`: the reason, "it is the console's", and the groups that hold such
    flags), not argparse's "unrecognized arguments"; exit code 2 either way."""
    args, extra = p.parse_known_args(argv)
    for token in extra:
        flag = token.split("=", 1)[0]
        if not flag.startswith("-"):
            continue
        for why, groups in elsewhere.items():
            if any(_takes(add, flag) for add in groups):
                fail(f"{flag} is not for {what}: {why}", prog=p.prog)
    if extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _takes(add: Callable[[Any], None], flag: str) -> bool:
    """Whether the arguments `add` puts on a parser include `flag` (exactly, no prefix)."""
    probe = _EmbeddedParser(add_help=False, allow_abbrev=False)
    add(probe)
    try:
        _, rest = probe.parse_known_args([flag])
    except _FlagError:
        return True  # it knows the flag: it wanted the flag's value
    return not rest


def run_config(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of parsed run arguments, the embedded simulator's flags resolved to a
    SimConfig here (once, by `tokentop sim`'s parser: embedded_sim_config); exits with one
    line when a value cannot be used."""
    from loadgen.model.urls import public_url
    from loadgen.run.config import ConfigError, RunConfig

    fields = set(RunConfig.__struct_fields__) - {"sim", "sim_flags"}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    # what is recorded, shown and published never carries credentials (secrets_from has them)
    for url in ("url", "metrics_url"):
        if values.get(url):
            values[url] = public_url(values[url])
    values["headers"] = [name for name, _ in headers_from(args)]  # the values are secrets
    flags = _sim_flags(args)
    cfg = RunConfig(**values, sim=_embedded_sim(flags), sim_flags=flags)
    try:
        dataset = cfg.parsed().dataset
    except ConfigError as e:
        fail(str(e))
    open_loop_rate(args)
    if dataset.note:  # said once, here (the run's "run started" event has it too)
        print(f"tokentop: note: {dataset.path}: {dataset.note}", file=sys.stderr)
    return cfg


def open_loop_rate(args: argparse.Namespace) -> None:
    """An open loop sends requests at a rate: without --rate (and nothing else to set it:
    a ramp, auto-ramp, a trace) it is refused in one line, where it once ran 1 req/s unsaid.
    A command without --rate (a sweep's steps, an eval's plan set it) is not asked."""
    if "rate" not in vars(args) or args.rate is not None or args.mode != "open":
        return
    if args.ramp or args.auto_ramp or getattr(args, "trace", None):
        return
    fail("--mode open sends requests at a rate: give --rate (e.g. --rate 4/s); "
         "-c/--concurrency is the closed loop's streams")


def _sim_flags(args: argparse.Namespace) -> list[str]:
    """--sim-profile and every --sim-arg, as the user gave them (recorded with the run)."""
    flags = list(getattr(args, "sim_arg", []) or [])
    if getattr(args, "sim_profile", None):
        flags = ["--profile", args.sim_profile, *flags]
    if flags and args.url:
        fail("--sim-profile and --sim-arg are for the embedded simulator; drop them with --url")
    return flags


def _embedded_sim(flags: list[str]) -> SimConfig | None:
    """The embedded simulator's SimConfig (None: no flags, its defaults)."""
    if not flags:
        return None
    try:
        return embedded_sim_config(flags)
    except ValueError as e:
        fail(f"--sim-profile / --sim-arg: {e} (see tokentop sim --help)")


# ---- the simulator's flags (`tokentop sim`, and --sim-profile / --sim-arg of a run) --------
# One parser for both, so a flag means the same wherever it is given; the simulator
# process itself is handed the resulting SimConfig (loadgen/sim/launch.py), never flags.

FAULT_HELP = {
    "error_rate": "fraction of requests answered HTTP 500",
    "rate_limit_rate": "fraction of requests answered HTTP 429",
    "retry_after_s": "Retry-After of the 429s, seconds",
    "slow_first_byte_ms": "delay before every response's first byte, ms",
    "stall_rate": "fraction of streams that stall mid-way",
    "stall_s": "length of a mid-stream stall, seconds",
    "drop_rate": "fraction of streams whose connection drops mid-way",
    "malformed_rate": "fraction of streams with one malformed chunk",
    "malformed_kind": "bad_json | missing_data | split_utf8",
    "empty_choices_rate": "fraction of streams with only empty choices",
    "outage_s": "one outage (restart) of this many seconds ...",
    "outage_after_s": "... this many seconds after start",
    "spike_every_s": "a latency spike (GC pause) every this many seconds ...",
    "spike_ms": "... this long, ms",
    "seed": "seed of the per-request fault draw",
}


def add_sim_arguments(parser: argparse.ArgumentParser, *, listen: bool = True) -> None:
    """The simulator's options: where it listens (`listen`), what it models, its faults.

    Model options default to None so that `--profile` can fill them and any flag given
    still wins; sim_config resolves them (flag > profile > SimConfig default).
    """
    from loadgen.sim.presets import PROFILES
    from loadgen.sim.program import ANNOUNCE

    def port(text: str) -> int:
        # refused here: a port above 65535 was cut to 16 bits (99999 → 34463) on the way
        # down, and the simulator listened somewhere nobody asked for
        value = whole(0)(text)
        if value > 65535:
            raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
        return value

    g = parser.add_argument_group("simulator")
    if listen:
        g.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default %(default)s)")
        g.add_argument("--port", type=port, default=8000,
                       help="port 0..65535, 0 for a free one (default %(default)s)")
    g.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help="named settings modelled on a real deployment (listed below); every other "
        "flag overrides it (default: none, the defaults shown)",
    )
    _add_model_arguments(g)
    if listen:
        g.add_argument("--announce", action="store_true",
                       help=f"print '{ANNOUNCE} <port>' on stdout once listening")
        g.add_argument("--exit-with-parent", action="store_true",
                       help="exit when stdin reaches EOF (the parent has gone)")
    _add_fault_arguments(parser)


def profiles_listing() -> str:
    """`tokentop sim --help`'s list of the --profile names, one a line, in words."""
    from loadgen.sim.presets import PROFILES

    width = max(map(len, PROFILES))
    return "profiles (--profile NAME):\n" + "\n".join(
        f"  {name:<{width}}  {_profile_words(settings)}"
        for name, settings in sorted(PROFILES.items()))


def _profile_words(settings: dict[str, Any]) -> str:
    """A profile in words: its GPUs, slots and KV budget, or its exact timings."""
    if "exact_ttft_ms" in settings:
        return (f"exact timing: TTFT {settings['exact_ttft_ms']:g} ms, then "
                f"{settings.get('exact_itl_ms', 0):g} ms a token")
    gpus = (f"{settings.get('gpu_count', 1)}× {settings['gpu_name'].removeprefix('Simulated ')}"
            ", " if "gpu_name" in settings else "")
    return f"{gpus}{settings['slots']} slots, KV {settings['kv_tokens']:,} tokens"


def _add_model_arguments(g: argparse._ArgumentGroup) -> None:
    from loadgen.sim.model import DIALECTS, SCHEDULING_POLICIES, SimConfig

    d = SimConfig()

    def opt(flag: str, dest: str, kind: type, doc: str, **kw: Any) -> None:
        g.add_argument(flag, dest=dest, type=_sim_type(dest, kind), default=None,
                       help=f"{doc} (default {getattr(d, dest)})", **kw)

    opt("--model", "model_name", str, "served model name")
    opt("--slots", "slots", int, "max running sequences")
    opt("--kv-tokens", "kv_tokens", int, "KV-cache budget in tokens")
    opt("--step-overhead-ms", "step_overhead_ms", float, "fixed cost of every engine step, ms")
    opt("--decode-ms-per-seq", "decode_ms_per_seq", float, "step cost per decoding sequence, ms")
    opt("--prefill-ms-per-token", "prefill_ms_per_token", float,
        "step cost per prompt token prefilled, ms")
    opt("--prefill-chunk-tokens", "prefill_chunk_tokens", int,
        "prefill tokens per step (chunked prefill)")
    opt("--default-max-tokens", "default_max_tokens", int, "max_tokens when a request names none")
    opt("--mean-output-tokens", "mean_output_tokens", float,
        "mean natural output length when ignore_eos is false")
    opt("--seed", "seed", int, "seed for the natural output lengths")
    opt("--tokens-per-chunk", "tokens_per_chunk", int,
        "tokens per SSE chunk after the first (chunk batching)")
    opt("--exact-ttft-ms", "exact_ttft_ms", float,
        "exact-timing mode: every request's TTFT, ms (with --exact-itl-ms)")
    opt("--exact-itl-ms", "exact_itl_ms", float, "exact-timing mode: every inter-token gap, ms")
    opt("--exact-chunk-tokens-max", "exact_chunk_tokens_max", int,
        "exact-timing mode: 1..N tokens a chunk, drawn per chunk (seeded)")
    opt("--reasoning-tokens", "reasoning_tokens", int,
        "a reasoning model: the first N tokens of each chat answer sent as reasoning_content")
    g.add_argument("--prefix-cache-tokens", dest="prefix_cache_tokens", type=int, default=None,
                   help="automatic prefix cache size in tokens, 0 for none (default: the KV "
                   "budget)")
    opt("--prefix-block-tokens", "prefix_block_tokens", int, "tokens a prefix-cache block")
    opt("--chat-template-tokens", "chat_template_tokens", int,
        "tokens a chat template adds to every chat prompt's count")
    opt("--tokenizer", "tokenizer", str,
        "a local tokenizer.json (or a folder holding one): prompts counted with it, words "
        "written one token each in it, POST /tokenize served")
    opt("--metrics-dialect", "metrics_dialect", str, "the /metrics names to speak",
        choices=DIALECTS)
    opt("--scheduling-policy", "scheduling_policy", str,
        "fcfs, or priority: the lowest request `priority` admitted first, as vLLM's flag",
        choices=SCHEDULING_POLICIES)
    opt("--gpu-name", "gpu_name", str, "the simulated GPU's name")
    opt("--gpu-count", "gpu_count", int, "simulated GPUs (tensor parallel)")
    opt("--gpu-memory-bytes", "gpu_memory_bytes", int, "memory per simulated GPU")
    opt("--weights-bytes", "weights_bytes", int, "model weights, all GPUs together")
    opt("--kv-bytes-per-token", "kv_bytes_per_token", int, "KV-cache bytes per token")
    opt("--gpu-memory-utilization", "gpu_memory_utilization", float,
        "the share of each GPU's memory taken at start, as vLLM's flag")
    opt("--kv-leak-fraction", "kv_leak_fraction", float,
        "a leaking engine: the share of each finished request's KV never freed")
    opt("--idle-power-w", "idle_power_w", float, "simulated GPU idle power, W")
    opt("--power-limit-w", "power_limit_w", float, "simulated GPU power limit, W")
    from loadgen.sim.features import BREAKABLE

    g.add_argument("--break", dest="broken", type=_broken, default=None,
                   metavar="FEATURE[,FEATURE]",
                   help="features the server then lacks, for conformance tests: "
                   f"{', '.join(BREAKABLE)} (default: none)")


def _broken(text: str) -> list[str]:
    """--break's comma-separated features, each one the simulator can break."""
    from loadgen.sim.features import check_broken

    names = [n.strip() for n in text.split(",") if n.strip()]
    try:
        check_broken(names)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--break ")) from None
    return names


def _add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    """`--fault-<name>` for every FaultConfig field, typed as its default."""
    from loadgen.sim.faults import MALFORMED_KINDS, FaultConfig

    d = FaultConfig()
    g = parser.add_argument_group(
        "simulated faults (also changeable mid-run: POST /sim/faults, loopback only)"
    )
    for f in fields(FaultConfig):
        default = getattr(d, f.name)
        g.add_argument(
            "--fault-" + f.name.replace("_", "-"),
            dest="fault_" + f.name,
            type=_sim_type(f.name, type(default)),
            default=None,
            choices=MALFORMED_KINDS if f.name == "malformed_kind" else None,
            help=f"{FAULT_HELP[f.name]} (default {default})",
        )


def _sim_type(name: str, kind: type) -> Callable[[str], Any]:
    """The parser of a simulator setting, by what its name says it holds: a fraction
    (`_rate`: 0.05 or 5%), seconds (`_s`: 3, 500ms), milliseconds (`_ms`: 200, 0.2s), bytes
    (`_bytes`: 80GiB); else its type, as the simulator's own checks expect (a count stays
    argparse's int: tests/sim reads its "invalid int value")."""
    if kind is float and name.endswith("_rate"):
        return fraction
    if kind is float and name.endswith("_s"):
        return seconds_or_zero
    if kind is float and name.endswith("_ms"):
        return latency_ms
    if kind is int and name.endswith("_bytes"):
        return size
    return kind


def sim_config(args: argparse.Namespace) -> SimConfig:
    """A SimConfig from parsed simulator arguments: flag > --profile > default.
    Raises ValueError in words (an unknown profile, a value the model refuses)."""
    from loadgen.sim.faults import FaultConfig
    from loadgen.sim.model import SimConfig
    from loadgen.sim.presets import profile

    values: dict[str, Any] = {}
    if getattr(args, "profile", None) is not None:
        try:
            values.update(profile(args.profile))
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
    for f in fields(SimConfig):
        value = getattr(args, f.name, None)
        if f.name != "faults" and value is not None:
            values[f.name] = value
    values["faults"] = FaultConfig().updated({
        f.name: getattr(args, "fault_" + f.name)
        for f in fields(FaultConfig)
        if getattr(args, "fault_" + f.name, None) is not None
    })
    cfg = SimConfig(**values)
    if cfg.tokenizer is not None:
        from loadgen.sim.words import SimTokenizer

        SimTokenizer(cfg.tokenizer)  # loads it and picks its words now: ValueError in words
    return cfg


class _FlagError(ValueError):
    """A simulator flag argparse refused; the message is argparse's."""


class _EmbeddedParser(argparse.ArgumentParser):
    """The simulator's model and fault flags only (the embedded one picks its own address),
    raising instead of exiting so the caller can say where the flags came from."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise _FlagError(message)


def embedded_sim_config(flags: list[str]) -> SimConfig:
    """The embedded simulator's SimConfig from `--sim-profile`/`--sim-arg` flags, e.g.
    ["--profile", "tiny", "--slots=16"]. Raises ValueError in words."""
    parser = _EmbeddedParser(prog="tokentop sim", add_help=False)
    add_sim_arguments(parser, listen=False)
    return sim_config(parser.parse_args(flags))


# ---- secrets: read here, from files or the environment, never from argv ---------------------


def read_secret(path: Path, flag: str, prog: str = "tokentop") -> str:
    """A secret file's one line (surrounding whitespace and the final newline stripped);
    one line naming the file and exit 2 if it cannot be read, is empty, or holds more than
    a single line (a header value cannot hold a line break)."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {flag} {path}: {getattr(e, 'strerror', None) or e}", prog)
    return checked_secret(text, f"{flag} {path}", prog)


def checked_secret(text: str, where: str, prog: str = "tokentop") -> str:
    """`text` as a secret, or one line saying what is wrong with `where` and exit 2."""
    if not text:
        fail(f"{where} is empty: it should hold the secret on one line", prog)
    if any(c in text for c in "\r\n"):
        fail(f"{where} holds more than one line: put the secret alone on one line", prog)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        fail(f"{where} holds control characters: it should hold the secret alone, as text",
             prog)
    return text


def api_key_from(args: argparse.Namespace) -> str | None:
    """The API key: --api-key-file, else $OPENAI_API_KEY (an empty variable is no key)."""
    if getattr(args, "api_key_file", None) is not None:
        return read_secret(args.api_key_file, "--api-key-file")
    key = os.environ.get(API_KEY_ENV, "").strip()
    return checked_secret(key, f"${API_KEY_ENV}") if key else None


def metrics_token_from(args: argparse.Namespace) -> str | None:
    """A bearer token of its own for /metrics: --metrics-token-file, else
    $TOKENTOP_METRICS_TOKEN (the API key is the run's fallback, on the same host only)."""
    if getattr(args, "metrics_token_file", None) is not None:
        return read_secret(args.metrics_token_file, "--metrics-token-file")
    return os.environ.get(METRICS_TOKEN_ENV) or None


def secrets_from(args: argparse.Namespace, *, mqtt_password: str | None = None) -> Secrets:
    """Every secret the run needs, read once here; they travel apart from the RunConfig."""
    from loadgen.model.urls import basic_credentials
    from loadgen.run.secrets import Secrets

    url = getattr(args, "url", None)
    return Secrets(api_key=api_key_from(args), metrics_token=metrics_token_from(args),
                   mqtt_password=mqtt_password,
                   basic_auth=basic_credentials(url) if url else None,
                   headers=headers_from(args))


# ---- the MQTT broker (agent, fleet, the console's --publish) --------------------------------


def add_broker_arguments(p: argparse.ArgumentParser, *, required: bool = True,
                         url_flag: str = "--broker") -> None:
    """Where the broker is and how to reach it; dest "broker" whatever the URL flag is."""
    g = p.add_argument_group("MQTT broker")
    g.add_argument(url_flag, dest="broker", required=required, metavar="URL",
                   help="mqtt://[user@]host[:1883] or mqtts://[user@]host[:8883] (TLS)")
    g.add_argument("--fleet", default=DEFAULT_FLEET,
                   help=f"fleet name, the topic level after tokentop/ (default {DEFAULT_FLEET})")
    g.add_argument("--mqtt-password-file", type=Path,
                   help=f"file holding the broker password (default: ${PASSWORD_ENV}); never on "
                   "the command line")
    g.add_argument("--mqtt-ca-file", help="CA certificate(s) to verify an mqtts:// broker "
                   "(default: the system's)")
    g.add_argument("--mqtt-cert-file", help="client certificate for mqtts:// (mutual TLS)")
    g.add_argument("--mqtt-key-file", help="client key for --mqtt-cert-file")
    g.add_argument("--mqtt-keepalive", type=whole(1), default=DEFAULT_KEEPALIVE, metavar="S",
                   help="MQTT keepalive seconds; the broker declares us gone (last will) after "
                   f"1.5× this (default {DEFAULT_KEEPALIVE})")


def broker_password(path: Path | None) -> str | None:
    """The broker password: --mqtt-password-file (its first line, exactly), else
    $TOKENTOP_MQTT_PASSWORD. Raises BrokerError in words."""
    from loadgen.fleet.link import BrokerError

    if path is None:
        return os.environ.get(PASSWORD_ENV) or None
    try:
        text = Path(path).read_text().rstrip("\r\n")
    except OSError as e:
        raise BrokerError(f"cannot read --mqtt-password-file {path}: {e.strerror or e}") from None
    return text or None


def broker_settings(args: argparse.Namespace) -> BrokerSettings:
    """The broker of parsed broker arguments, checked now; raises BrokerError in words."""
    from loadgen.fleet.link import BrokerSettings

    return BrokerSettings.from_url(
        args.broker, password=broker_password(args.mqtt_password_file),
        ca_file=args.mqtt_ca_file, cert_file=args.mqtt_cert_file, key_file=args.mqtt_key_file,
        keepalive=args.mqtt_keepalive,
    )


# ---- the load from a fleet's agents (eval, sweep) ---------------------------------------------


def add_fleet_load_arguments(p: argparse.ArgumentParser) -> None:
    """--broker (optional) and its settings, and --fleet-agents: the load from a fleet."""
    add_broker_arguments(p, required=False)
    f = p.add_argument_group("load from a fleet (with --broker)")
    f.add_argument("--fleet-agents", type=agent_names, default=[], metavar="A,B,…",
                   help="the agents of --fleet whose load is used (default: every one that "
                   "takes jobs: tokentop agent --accept-jobs); each runs its share, and "
                   "keeps its own run directory")


def agent_names(text: str) -> list[str]:
    from loadgen.fleet.link import BrokerError, check_level

    names = [n.strip() for n in text.split(",") if n.strip()]
    try:
        return [check_level("agent", n) for n in dict.fromkeys(names)]
    except BrokerError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def fleet_from(args: argparse.Namespace, prog: str):
    """--broker's FleetFrom and its password (None, None without --broker); bad broker
    settings fail here, in words."""
    if args.broker is None:
        if args.fleet_agents:
            fail("--fleet-agents needs --broker: the MQTT broker the agents are on", prog=prog)
        return None, None
    from loadgen.fleet.link import BrokerError, check_level
    from loadgen.run.config import FleetFrom

    if not args.url:
        fail("--broker needs --url: the agents load a server they can reach, not this "
             "machine's embedded simulator", prog=prog)
    try:
        settings = broker_settings(args)
        fleet = check_level("fleet", args.fleet)
    except BrokerError as e:
        fail(str(e), prog=prog)
    return FleetFrom(broker=args.broker, fleet=fleet, agents=args.fleet_agents,
                     keepalive=args.mqtt_keepalive, ca_file=args.mqtt_ca_file,
                     cert_file=args.mqtt_cert_file,
                     key_file=args.mqtt_key_file), settings.password
