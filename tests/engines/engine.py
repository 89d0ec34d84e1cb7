"""What every real engine of the tier shares: the wait for `.ci/engines`' install, the server
started on a thread at idle priority (so that its start overlaps the rest of the suite),
pinned to the cores after the first while the client (`tokentop_client`) keeps the first,
its /metrics read straight from the page (apart from tokentop's probes), and its stop.

Each engine (vllm_engine.py, llamacpp_engine.py) says how it is installed, what model it
serves and how it is started; nothing is installed or downloaded at test time."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from support import ROOT

ENGINES = ROOT / ".engines"  # .ci/engines' venvs and builds, its log, the pid of its install
INSTALL_S = 1500.0  # the longest wait for .ci/engines' install under way beside the suite
READY_S = 240.0  # the longest wait for /health; a cold page cache on a fresh machine is slow
MODEL_NAME = "tiny-llama"
# a chat template of the simplest kind, the same for every engine: the role, a colon, the text
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


@dataclass
class Server:
    url: str  # the OpenAI base, http://127.0.0.1:PORT/v1
    root: str  # http://127.0.0.1:PORT
    pid: int
    model_dir: Path
    log: Path


def installer() -> int | None:
    """The pid of .ci/engines while it installs (.ci/run starts it beside the suite)."""
    try:
        pid = int((ENGINES / "installing.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def wait_for_install(folder: Path, needed: Path) -> None:
    """Until no install of `folder` (an engine's venv or build) is under way; AssertionError
    with the installer's words when it failed, or when it takes longer than INSTALL_S. (One
    made by hand has no READY of .ci/engines' and needs none.)"""
    deadline = time.monotonic() + INSTALL_S
    while installer() is not None and not (folder / "READY").exists() \
            and not (folder / "FAILED").exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine install took over {INSTALL_S:.0f} s")
        time.sleep(1)
    failed = folder / "FAILED"
    if failed.exists():
        raise AssertionError(f"the engine install failed: {failed.read_text().strip()} "
                             f"(log: {ENGINES / 'install.log'})")
    if not needed.exists():
        raise AssertionError(f"the engine install ended without {needed}: see "
                             f"{ENGINES / 'install.log'}")


def cpu_skip_reason() -> str | None:
    if len(os.sched_getaffinity(0)) < 2:
        return "the tier pins the engine and the client to separate cores: it needs two"
    return None


def run_maker(argv: list[str], env: dict[str, str], *, idle: bool) -> str:
    """A step of making a model, in a process of its own (at idle priority where `idle`):
    its stdout."""
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120, preexec_fn=_idle if idle else None)
    assert done.returncode == 0, f"making the tiny model failed:\n{done.stderr[-3000:]}"
    return done.stdout


def make_tokenizer(path: Path, *, idle: bool) -> tuple[int, int, int]:
    """The tiny model's tokenizer.json, trained by the `tokenizers` library (tests/
    tokenizer_families.py): the vocabulary's size and the ids of BOS and EOS."""
    vocab, bos, eos = run_maker([sys.executable, "-c", _MAKE_TOKENIZER, str(path)],
                                {"PYTHONPATH": str(ROOT / "tests")}, idle=idle).split()
    return int(vocab), int(bos), int(eos)


_MAKE_TOKENIZER = """
import sys
from tokenizer_families import build
tok = build("byte_level")
tok.add_special_tokens(["<s>", "</s>"])
tok.save(sys.argv[1])
print(tok.get_vocab_size(), tok.token_to_id("<s>"), tok.token_to_id("</s>"))
"""


def _idle() -> None:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def client_cores() -> set[int]:
    return {min(os.sched_getaffinity(0))}


def server_cores() -> set[int]:
    return set(os.sched_getaffinity(0)) - client_cores()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(root: str) -> bool:
    try:
        with urllib.request.urlopen(f"{root}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


class Engine(ABC):
    """A real engine serving the tiny model, brought up on a thread of its own so that its
    start (the install it may wait for, the model, the engine's own start-up) overlaps the
    rest of the suite: at idle priority until `ready()`, so that it takes only CPU the
    suite leaves."""

    name = "engine"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self._server: Server | None = None
        self._error: BaseException | None = None
        self._idle = False
        self._thread = threading.Thread(target=self._start, name=f"{self.name}-start",
                                        daemon=True)

    def start(self, *, idle: bool) -> None:
        self._idle = idle
        self._thread.start()

    def ready(self) -> Server:
        """The server, once it answers /health, at normal priority from here on."""
        self._thread.join(INSTALL_S + READY_S + 60)
        if self._error is not None:
            raise self._error
        assert self._server is not None, f"{self.name}'s start is still under way"
        if self._idle:
            _normal_priority(self._server.pid)
        return self._server

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    @abstractmethod
    def _install(self) -> None:
        """Wait for the engine's install (wait_for_install)."""

    @abstractmethod
    def _launch(self, model_dir: Path, log: Path, port: int) -> Server:
        """Make the model in `model_dir` and start the server (`self._popen`)."""

    def _start(self) -> None:
        try:
            self._install()
            model_dir, log = self.workdir / "model", self.workdir / f"{self.name}.log"
            self._server = self._launch(model_dir, log, free_port())
            self._wait_healthy(self._server)
        except BaseException as e:  # told by ready(), in the test that needs the engine
            self._error = e

    def _popen(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        """The server on the server's cores, in a session of its own (stopped as one)."""
        cores, idle = server_cores(), self._idle

        def pin() -> None:
            os.sched_setaffinity(0, cores)
            if idle:
                _idle()

        with log.open("w") as out:
            self.proc = subprocess.Popen(argv, env={**os.environ, **env},
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, preexec_fn=pin,
                                         start_new_session=True)
        return self.proc

    def _wait_healthy(self, server: Server) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + READY_S
        while not _healthy(server.root):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = server.log.read_text(errors="replace")[-3000:]
                raise AssertionError(
                    f"{self.name} did not come up (exit {self.proc.poll()}):\n{tail}")
            time.sleep(0.5)


def _normal_priority(pid: int) -> None:
    """The server's processes and threads back to the normal scheduler (best effort: an
    unprivileged user may not leave SCHED_IDLE; on the tier's idle machine it matters
    little)."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        with contextlib.suppress(psutil.Error):
            for t in p.threads():
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(t.id, os.SCHED_OTHER, os.sched_param(0))


def _stop(proc: subprocess.Popen) -> None:
    """The server and its engine processes (one session): SIGTERM, the server's own shutdown
    given 20 s, then SIGKILL to whatever of the session is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def metrics_text(root: str) -> str:
    with urllib.request.urlopen(f"{root}/metrics", timeout=10) as resp:
        return resp.read().decode()


def counters(root: str) -> dict[str, float]:
    """The server's samples by name, summed over label sets; a sample with a finished_reason
    also by it, as `vllm:request_success_total:length`."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(metrics_text(root)):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
            if "finished_reason" in s.labels:
                key = f"{s.name}:{s.labels['finished_reason']}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def run_client(*args: str, out: Path, timeout: float = 120) -> dict:
    """`tokentop run --headless` on the client's core, recorded to `out`: its summary. The
    run's stderr is in the AssertionError when it fails."""
    summary = out.with_suffix(".json")
    proc = tokentop_client("run", "--headless", "--out", str(out), "--json", str(summary),
                           *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(summary.read_text())


def tokentop_client(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """The tokentop command line on the client's core."""
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=lambda: os.sched_setaffinity(0, client_cores()))
