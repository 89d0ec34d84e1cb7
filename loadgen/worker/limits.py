"""The load generator's own limits: open files (every stream is a socket).

A box whose soft `ulimit -n` is 1024 cannot hold 20 000 streams, and what then fails
is the client, not the server: so the soft limit is raised to the hard one at start
(in the run and in every worker), a load that still cannot fit is refused up front in
words, and running into the limit later is the error kind `client_fd_limit`, never
an outage of the server.

And one BLAS thread: numpy's OpenBLAS starts a thread a core as numpy is imported, and
those threads spin before they sleep (about 80 ms of CPU a process measured on a 2-core
box, unpinned), while nothing here multiplies matrices (`one_blas_thread`).
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import MutableMapping

FD_MARGIN = 64  # descriptors a worker needs besides its streams' sockets (pipes, loop, files)
_UNLIMITED_TARGET = 1 << 20  # where the hard limit is "unlimited", raise the soft one to this

# what OpenBLAS reads for its thread count, in its order: one set by the user is kept
_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def one_blas_thread(env: MutableMapping[str, str]) -> None:
    """Ask for one OpenBLAS thread in `env` (os.environ before numpy is imported, or a
    child's environment), unless the user chose a count. The run and its workers use
    numpy for histograms and small vectors only, which OpenBLAS runs on one thread
    anyway: only the idle threads' start-up spin goes."""
    if not any(k in env for k in _BLAS_THREADS):
        env["OPENBLAS_NUM_THREADS"] = "1"


def raise_open_file_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (children inherit it);
    returns the soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        # where it cannot be raised, the soft limit stays, and the run's fit check judges by it
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def streams_that_fit(open_files: int) -> int:
    """How many concurrent streams one worker can hold under this open-file limit."""
    return max(0, open_files - FD_MARGIN)
