"""Run a process's main coroutine on uvloop where it is installed, else on asyncio's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


def run(main: Callable[[], Awaitable[int]]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())
