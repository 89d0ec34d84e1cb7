"""The simulator as a program: start it, say where it listens, serve until told to stop.

`start_sim` starts one in the running loop (tests do, in-process); `serve_forever` is
`tokentop sim` and `python -m loadgen.sim`: it serves until SIGINT/SIGTERM (or its parent
goes) and says where it listens in one line, with `TOKENTOP_SIM_LISTENING <port>` on
stdout for a parent that asked for port 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from loadgen.sim.gpu import SimGpu
from loadgen.sim.model import BatchModel, SimConfig
from loadgen.sim.presets import describe
from loadgen.sim.server import SimServer

ANNOUNCE = "TOKENTOP_SIM_LISTENING"


@dataclass
class RunningSim:
    """A simulator listening on a port; `close()` stops it."""

    host: str
    port: int
    server: SimServer
    _runner: web.AppRunner

    @property
    def url(self) -> str:
        """The OpenAI base URL, e.g. http://127.0.0.1:8000/v1."""
        return f"http://{_connect_host(self.host)}:{self.port}/v1"

    @property
    def model(self) -> BatchModel:
        """The engine model (queues, counters), for tests and the console."""
        return self.server.engine

    @property
    def gpu(self) -> SimGpu:
        return self.server.gpu

    async def close(self) -> None:
        # Stop the engine first: every open request ends ("abort"), so handlers return
        # at once and the runner does not wait out its shutdown timeout.
        await self.server.close()
        await self.server.engine.stop()
        await self._runner.cleanup()


def _connect_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


async def start_sim(
    cfg: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> RunningSim:
    """Start a simulator in the running loop; port 0 picks a free port. Raises OSError."""
    server = SimServer(cfg or SimConfig())
    # handler_cancellation: a client that disconnects while its request waits in the
    # queue (no write to fail yet) still frees its place at once.
    runner = web.AppRunner(
        server.app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    server.listening(runner, host, bound)
    return RunningSim(host=host, port=bound, server=server, _runner=runner)


# ---- serving until told to stop


def serve_forever(
    cfg: SimConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    announce: bool = False,
    exit_with_parent: bool = False,
    profile: str | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM (or stdin EOF with `exit_with_parent`); the exit code.

    Once listening it says where, in one line (listening_line): on stdout for a person,
    on stderr with `announce`, which prints `TOKENTOP_SIM_LISTENING <port>` on stdout
    instead, the one line a parent that asked for port 0 waits for. A port that cannot be
    had is one line on stderr and exit code 2.
    """
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_serve(cfg, host, port, announce=announce,
                                 exit_with_parent=exit_with_parent, profile=profile))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve(cfg: SimConfig, host: str, port: int, *, announce: bool,
                 exit_with_parent: bool, profile: str | None = None) -> int:
    try:
        sim = await start_sim(cfg, host=host, port=port)
    except OSError as exc:
        reason = exc.strerror or exc
        print(f"tokentop sim: cannot listen on {host}:{port}: {reason}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    _stop_on_signals(loop, stop)
    if exit_with_parent:
        _watch_stdin(loop, stop)
    if announce:
        print(f"{ANNOUNCE} {sim.port}", flush=True)
    # the real port (asked for 0, the kernel chose), and what is being simulated
    print(listening_line(sim.url, cfg, profile), file=sys.stderr if announce else sys.stdout,
          flush=True)
    try:
        await stop.wait()
    finally:
        await sim.close()
    return 0


def listening_line(url: str, cfg: SimConfig, profile: str | None) -> str:
    """`tokentop sim: listening on URL (what it simulates; model NAME)`: the URL first, as
    that is what a person copies; the served model name last, as requests must name it."""
    return f"tokentop sim: listening on {url} ({describe(cfg, profile)}; model {cfg.model_name})"


def _stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Not in the main thread (or not on POSIX): the caller handles signals itself.
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(sig, stop.set)


def _watch_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Set `stop` when stdin reaches EOF, so a simulator whose parent died never lingers."""

    def watch() -> None:
        # os.read on the raw fd: sys.stdin's buffered reader holds a lock that would
        # trouble interpreter shutdown while this daemon thread sits in read().
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        with contextlib.suppress(RuntimeError):  # the loop already closed
            loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch, name="tokentop-sim-stdin", daemon=True).start()
