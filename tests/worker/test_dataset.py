"""`--dataset` kinds: each through RequestFactory (the bodies carry what the file holds),
broken files named by line, and a text run through the real command line, where the
simulator's own count of prompt words (whitespace words) is the truth."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import msgspec
import pytest
from support import running_sim, tokentop

from loadgen.run.config import ConfigError, RunConfig
from loadgen.worker.dataset import Dataset, DatasetError
from loadgen.worker.distributions import LengthDist
from loadgen.worker.workload import RequestFactory, Workload

WORDS = [f"w{i}" for i in range(1000)]  # unique, so a window's place in the file is known


def text_file(tmp_path: Path, words: list[str] = WORDS) -> Path:
    """The words over lines of uneven length, with tabs, runs of spaces and blank lines
    (what raw text looks like): only their order is the file's."""
    path = tmp_path / "wiki.raw"
    lines, i = [], 0
    while i < len(words):
        step = 3 + i % 11
        lines.append(("\t" if i % 3 else "  ").join(words[i:i + step]))
        if i % 5 == 0:
            lines.append("")
        i += step
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def workload(spec: str, **kw) -> Workload:
    return Workload(model="m", dataset=Dataset.parse(spec), **kw)


def prompts(factory: RequestFactory, n: int, api: str = "chat") -> list[str]:
    out = []
    for _ in range(n):
        body = factory.next().body
        req = msgspec.json.decode(body)
        out.append(req["messages"][0]["content"] if api == "chat" else req["prompt"])
    return out


# ---- text ---------------------------------------------------------------------------------


def test_text_windows_are_the_asked_length_in_file_order_from_a_per_worker_offset(tmp_path):
    path = text_file(tmp_path)
    w = workload(f"text:{path}", input_tokens=LengthDist.parse("50"))
    got = prompts(RequestFactory(w, worker_index=0), 30)  # 30 × 49 words: past the end
    start = WORDS.index(got[0].split()[1])
    at = start
    for serial, p in enumerate(got, 1):
        words = p.split()
        assert len(words) == 50  # the asked length: the serial number, then 49 of the file
        assert words[0] == f"r0-{serial}"
        # the next words of the file after the previous window, wrapping at its end
        assert words[1:] == [WORDS[(at + i) % len(WORDS)] for i in range(49)]
        at = (at + 49) % len(WORDS)
    # reproducible for a seed; another worker starts elsewhere in the file
    assert prompts(RequestFactory(w, worker_index=0), 1)[0] == got[0]
    other = prompts(RequestFactory(w, worker_index=1), 1)[0].split()
    assert other[0] == "r1-1" and WORDS.index(other[1]) != start


def test_text_windows_with_a_shared_prefix_and_drawn_lengths(tmp_path):
    path = text_file(tmp_path)
    w = workload(f"text:{path}", input_tokens=LengthDist.parse("uniform:10:80"),
                 shared_prefix=5, api="completions")
    factory = RequestFactory(w)
    got = prompts(factory, 40, api="completions")
    prefixes = {" ".join(p.split()[:5]) for p in got}
    assert len(prefixes) == 1  # every prompt starts with the same 5 words
    lengths = [len(p.split()) for p in got]
    assert min(lengths) >= 10 and max(lengths) <= 80 and len(set(lengths)) > 5
    # after the prefix and the serial number, each window carries on from the last
    windows = [p.split()[6:] for p in got]
    for a, b in itertools.pairwise(windows):
        assert WORDS.index(b[0]) == (WORDS.index(a[-1]) + 1) % len(WORDS)


def test_a_text_shorter_than_the_window_wraps_and_says_so(tmp_path):
    path = text_file(tmp_path, WORDS[:20])
    parsed = RunConfig(dataset=f"text:{path}", input_tokens="50").parsed()
    assert parsed.dataset.note == ("20 words, fewer than the longest window asked (about 49): "
                                   "windows wrap around")
    long_enough = RunConfig(dataset=f"text:{path}", input_tokens="21").parsed()
    assert long_enough.dataset.note == ""  # 20 words of the file a prompt: they fit
    factory = RequestFactory(parsed.workload(RunConfig(), "m"))
    words = prompts(factory, 1)[0].split()[1:]
    start = WORDS.index(words[0])
    assert words == [WORDS[(start + i) % 20] for i in range(49)]


# ---- ShareGPT and JSONL ---------------------------------------------------------------------

CONVERSATIONS = [
    {"id": "a", "conversations": [{"from": "human", "value": "first question"},
                                  {"from": "gpt", "value": "a long answer"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "hello"},
                                  {"from": "human", "value": "second question"}]},
    {"id": "c", "conversations": [{"from": "gpt", "value": "nobody asked"}]},
    {"id": "d", "conversations": []},
    {"id": "e", "conversations": [{"from": "human", "value": "third\nquestion"}]},
]
HUMAN_TURNS = {"first question", "second question", "third\nquestion"}


@pytest.mark.parametrize("form", ["array", "jsonl"])
def test_sharegpt_first_human_turns_and_the_skipped_counted(tmp_path, form):
    path = tmp_path / "share.json"
    if form == "array":  # as the usual file is: one indented array
        path.write_text(json.dumps(CONVERSATIONS, indent=2))
    else:
        path.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS) + "\n")
    parsed = RunConfig(dataset=f"sharegpt:{path}").parsed()
    assert parsed.dataset.note == "2 conversation(s) without a human turn skipped"
    factory = RequestFactory(parsed.workload(RunConfig(), "m"))
    assert set(prompts(factory, 9)) == HUMAN_TURNS


def test_sharegpt_with_no_human_turn_at_all_is_an_error(tmp_path):
    path = tmp_path / "share.json"
    path.write_text(json.dumps(CONVERSATIONS[2:4]))
    with pytest.raises(ConfigError, match=r"no conversation with a human turn \(2 without"):
        RunConfig(dataset=f"sharegpt:{path}").parsed()


def test_jsonl_prompts_by_dataset_and_by_the_older_flag(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [{"prompt": "one two"}, {"text": "three"}, CONVERSATIONS[0], "four five six"]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    want = {"one two", "three", "first question", "four five six"}
    for cfg in (RunConfig(dataset=f"jsonl:{path}"), RunConfig(prompts_file=str(path))):
        factory = RequestFactory(cfg.parsed().workload(cfg, "m"))
        assert set(prompts(factory, 8)) == want
    # a Workload made with the older field alone (not through RunConfig) reads it the same
    assert set(prompts(RequestFactory(Workload(model="m", prompts_file=str(path))), 8)) == want
    with pytest.raises(ConfigError, match="give one of them"):
        RunConfig(dataset=f"text:{path}", prompts_file=str(path)).parsed()


# ---- broken files and specs -----------------------------------------------------------------


def _broken(tmp_path: Path, kind: str, name: str, text: bytes) -> str:
    """The message of `text` as a `kind` file called `name`, the folder left out."""
    path = tmp_path / name
    path.write_bytes(text)
    with pytest.raises(ConfigError) as e:
        RunConfig(dataset=f"{kind}:{path}").parsed()
    return str(e.value).replace(str(tmp_path) + "/", "")


def test_a_broken_file_is_one_error_naming_the_line(tmp_path):
    good = b'{"prompt": "fine"}\n'
    msg = _broken(tmp_path, "jsonl", "p.jsonl", good * 16 + b'{"prompt": "cut\n' + good)
    assert msg.startswith("p.jsonl:17: not JSON (")
    msg = _broken(tmp_path, "jsonl", "q.jsonl", good + b'{"other": 1}\n')
    assert msg.startswith('q.jsonl:2: no prompt (expected "prompt"')
    share = json.dumps(CONVERSATIONS[0]).encode()
    msg = _broken(tmp_path, "sharegpt", "s.jsonl", share + b"\n" + share[:-3] + b"\n")
    assert msg.startswith("s.jsonl:2: not JSON (")
    array = b'[\n{"conversations": []},\n{"conversations": [}\n]\n'
    msg = _broken(tmp_path, "sharegpt", "a.json", array)
    assert msg.startswith("a.json:3: not JSON (")
    array = b'[{"conversations": [{"from": "human", "value": "x"}, 7]}]'
    msg = _broken(tmp_path, "sharegpt", "t.json", array)
    assert msg.startswith("t.json: not ShareGPT (") and "$[0].conversations[1]" in msg
    msg = _broken(tmp_path, "text", "w.raw", b"fine words\nmore words\nlatin-1 caf\xe9\n")
    assert msg == "w.raw:3: not UTF-8 text (byte 0xe9 at column 12)"
    assert _broken(tmp_path, "text", "e.raw", b" \n\n\t\n") == "e.raw has no words"


@pytest.mark.parametrize(("spec", "says"), [
    ("foo:x", "bad --dataset 'foo:x': use synthetic, text:FILE, sharegpt:FILE or jsonl:FILE"),
    ("text", "--dataset text needs a file: text:FILE"),
    ("synthetic:x", "bad --dataset 'synthetic:x'"),
])
def test_a_bad_spec_says_what_the_kinds_are(spec, says):
    with pytest.raises(DatasetError, match=f"^{says}".replace("(", r"\(").replace(")", r"\)")):
        Dataset.parse(spec)


# ---- the real command line ------------------------------------------------------------------


def test_command_line_bad_spec_and_missing_file_exit_2_with_one_line(tmp_path):
    for spec, says in [("foo:x", "tokentop: bad --dataset 'foo:x': use synthetic"),
                       (f"text:{tmp_path}/none.txt",
                        f"tokentop: cannot read {tmp_path}/none.txt: No such file")]:
        done = tokentop("run", "--headless", "--dataset", spec, "--no-record", timeout=30)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(says), done.stderr


@pytest.mark.parametrize("file_words", [1000, 30])  # 30: shorter than a window, said once
async def test_command_line_text_windows_are_the_asked_prompt_length_at_the_server(
        tmp_path, file_words):
    path = text_file(tmp_path, WORDS[:file_words])
    out = tmp_path / "summary.json"
    async with running_sim() as sim:
        done = await asyncio.to_thread(
            tokentop, "run", "--headless", f"--url={sim.url}", f"--dataset=text:{path}",
            "--input-tokens=40", "--output-tokens=4", "--concurrency=2", "--workers=2",
            "--tick=0.25", "--duration=1", "--json", str(out), "--no-record", timeout=60)
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    # the simulator counts each prompt's whitespace words itself
    assert summary["tokens"]["input_per_request"]["server"] == 40
    assert summary["tokens"]["input_per_request"]["asked"] == 40
    short = file_words < 40
    assert done.stderr.count("note:") == short
    assert (f"note: {path}: 30 words, fewer than the longest window" in done.stderr) is short
