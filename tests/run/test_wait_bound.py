"""`--wait S` is a bound, probes included: against a listener that accepts and never
answers, the real command gives up in words by S s plus the last probe's least
(loadgen.run.preflight.LAST_PROBE_S), not a 10 s probe timeout later."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from support import headless_argv

from loadgen.run.preflight import LAST_PROBE_S

START_UP_S = 1.5  # the interpreter and tokentop's imports, before the wait begins


@contextlib.contextmanager
def silent_listener() -> Iterator[tuple[str, list[socket.socket]]]:
    """A TCP listener on 127.0.0.1 that accepts every connection and never sends a byte:
    its URL and the connections it accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn, _ = server.accept()
                accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1", accepted
    finally:
        done.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        server.close()


@pytest.mark.parametrize("wait", [2.0, 5.0])
def test_wait_ends_by_its_bound_against_a_listener_that_never_answers(wait: float):
    with silent_listener() as (url, accepted):
        t0 = time.monotonic()
        done = subprocess.run(headless_argv("--no-record", url=url, wait=wait, duration=1),
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        took = time.monotonic() - t0
        asked = len(accepted)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"tokentop: no answer from {url} within"), done.stderr
    assert asked >= 1  # it was the silence that was waited out, not a refusal
    # the whole wait, its probes included, within the bound (and not given up early)
    assert wait <= took < wait + LAST_PROBE_S + START_UP_S, (took, done.stderr)
