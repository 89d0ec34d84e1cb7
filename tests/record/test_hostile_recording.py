"""A recording that holds raw outside text (an older tokentop's, another machine's, an edited
one): a model id and event words with escape sequences and Textual markup. `tokentop report`
writes no control byte into report.md, report.json or its output, and `tokentop replay` in a
real terminal (tmux) neither retitles nor clears it, and shows the markup as written.

The recording is the run-v1 fixture with the hostile text put in, so the test does not hang
on how a live run keeps such text out (that is tested where it enters: preflight, worker)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import FIXTURES, ROOT, tokentop

TITLE = "PWNED"
MODEL = f"\x1b]0;{TITLE}\x07\x1b[2J\x1b[31m[red]x[/red]\x9b1m"
WORDS = f"boom\x1b[2J\x1b]2;{TITLE}\x1b\\\x07\x08\x7f\u202e[bold]b[/bold]"
# what the terminal must never get from the recording
FORBIDDEN = (b"\x1b]0;", b"\x1b]2;", b"\x1b[2J", b"\x1b[31m", TITLE.encode(), b"\xc2\x9b",
             b"\x9b1m")


def _hostile(text: str) -> str:
    return (text.replace("tokentop-sim", MODEL).replace("run started", f"run started {WORDS}")
            .replace("recording to", f"recording {MODEL} to"))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """run-v1 with the model id and the events' words made hostile (as JSON escapes)."""
    out = tmp_path / "run"
    shutil.copytree(FIXTURES / "formats" / "run-v1", out)
    for name in ("snapshots.jsonl", "events.jsonl"):
        lines = (out / name).read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        for row in rows:
            for e in row.get("events", []) if name == "snapshots.jsonl" else [row]:
                e["message"] = _hostile(e["message"])
            if "target" in row:
                row["target"]["model"] = MODEL
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["target"]["model"] = MODEL
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert "\\u001b]0;" in (out / "snapshots.jsonl").read_text()  # the hostile text is there
    return out


def _controls(data: bytes) -> list[str]:
    """Every C0 (but newline) and C1 control character in `data`, as text, and ESC."""
    text = data.decode("utf-8", errors="replace")
    return [repr(c) for c in text if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f
            or c == "\u202e"]


def test_report_writes_no_control_byte_and_the_markup_as_written(run_dir: Path):
    done = tokentop("report", str(run_dir), "--no-plots", timeout=60)
    assert done.returncode in (0, 3), done.stderr
    for name in ("report.md", "report.json"):
        data = (run_dir / name).read_bytes()
        assert not _controls(data), (name, _controls(data)[:5])
    md = (run_dir / "report.md").read_text()
    assert "model [red]x[/red]" in md
    json_text = (run_dir / "report.json").read_text()
    assert "\\u00" not in json_text  # no control character escaped in the JSON either
    assert not _controls((done.stdout + done.stderr).encode())


class _Pane:
    """A private tmux server whose pane's output is piped to a file, byte for byte."""

    def __init__(self, tmp: Path) -> None:
        self.socket = f"tokentop-hostile-{time.monotonic_ns()}"
        self.bytes_file = tmp / "pane.bin"

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=10).stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", "t", "-x", "120", "-y", "30", command)
        self.tmux("pipe-pane", "-o", "-t", "t", f"cat >> {self.bytes_file}")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def title(self) -> str:
        return self.tmux("display-message", "-p", "-t", "t", "#{pane_title}").strip()

    def kill(self) -> None:
        self.tmux("kill-server")


def test_replay_in_a_real_terminal_is_neither_retitled_nor_cleared(run_dir: Path,
                                                                   tmp_path: Path):
    pane = _Pane(tmp_path)
    env = (f"env XDG_CONFIG_HOME={tmp_path} XDG_DATA_HOME={tmp_path} TERM=xterm-256color "
           "TOKENTOP_TEST=1")
    try:
        pane.start(f"cd {ROOT} && {env} {sys.executable} -m tui.cli replay {run_dir} "
                   "--speed 0 --no-follow; sleep 60")
        deadline = time.monotonic() + 30
        while "end of the recording" not in pane.screen() and time.monotonic() < deadline:
            time.sleep(0.25)
        screen = pane.screen()
        assert "end of the recording" in screen, screen
        # the markup shown as written, not read
        assert "recording [red]x[/red] to" in screen and "[bold]b[/bold]" in screen
        assert TITLE not in pane.title()
        data = pane.bytes_file.read_bytes()
        assert data, "nothing was piped from the pane"
        found = [f for f in FORBIDDEN if f in data]
        assert not found, found
    finally:
        pane.kill()
