"""Plain-HTTP connections read with the kernel's receive stamps: arrival times that do
not wait on our own event loop.

A chunk's arrival time taken in `data_received` is the time our loop got round to it:
when many sockets are ready in one wake-up, the last of them is stamped after every one
before it was parsed (at 100 streams started together, most of the timing error
`tokentop calibrate` saw). With SO_TIMESTAMPNS the kernel stamps each packet as it
reaches the socket, and `recvmsg` hands that stamp over with the bytes, so a chunk is
timed when it arrived, however long the loop took to read it. That is also what lets a
busy worker coalesce its wake-ups (loadgen.worker.coalesce) without its stamps growing
late.

uvloop's transports read with `recv` and drop the stamp, so this module is the transport
for plain HTTP: a non-blocking socket the loop watches with `add_reader`, read with
`recvmsg`, and the protocol (loadgen.worker.http_stream's
StreamConnection) told through `data_received_at(data, arrived)`, `connection_made` and
`connection_lost` as asyncio would. TLS keeps uvloop's transport and its loop-time stamps.

The kernel's stamp is wall-clock (CLOCK_REALTIME) and the run's clock is perf_counter, so
each read takes both clocks and places the stamp by its distance back from now: a wall
clock stepped between the packet and the read shows as a distance below zero or past
MAX_QUEUED_S, and that read is stamped now instead, as without the kernel's stamps.
"""

from __future__ import annotations

import asyncio
import platform
import socket
import struct
import sys
from time import perf_counter, time_ns

# SO_TIMESTAMPNS (and its control message, SCM_TIMESTAMPNS) is 35 in asm-generic's
# socket.h; Python's socket module does not name it. Other architectures number it apart.
SO_TIMESTAMPNS = 35
AVAILABLE = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
READ_SIZE = 1 << 16  # one read's buffer: a chunk is a few hundred bytes
MAX_QUEUED_S = 60.0  # a stamp further back than this is a wall-clock step, not a wait
_TIMESPEC = struct.Struct("qq")  # struct timespec on a 64-bit Linux
_unpack = _TIMESPEC.unpack
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)


class StampedTransport(asyncio.Transport):
    """One connected non-blocking TCP socket: reads stamped by the kernel, writes sent
    straight away (a request is one small write; what the socket does not take waits for
    it to be writable)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._deliver = protocol.data_received_at
        self._out = bytearray()
        self._closing = False
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            data, anc, _, _ = self._sock.recvmsg(READ_SIZE, _ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._close(e)
            return
        if not data:  # the server closed its end
            self._close(None)
            return
        now = perf_counter()
        if anc:  # inline, not a call: this runs for every chunk of every stream
            level, kind, stamp = anc[0]
            if kind == SO_TIMESTAMPNS and level == socket.SOL_SOCKET and len(stamp) == 16:
                sec, ns = _unpack(stamp)
                queued = (time_ns() - sec * 1_000_000_000 - ns) * 1e-9
                if 0.0 <= queued <= MAX_QUEUED_S:  # else the wall clock stepped: now
                    now -= queued
        self._deliver(data, now)

    # ---- asyncio.Transport, what the client uses -------------------------------------------

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        if self._out:  # earlier bytes still wait for the socket
            self._out += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self._close(e)
            return
        if sent < len(data):
            self._out += data[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._close(e)
            return
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._fd)

    def abort(self) -> None:
        self._close(None)

    def close(self) -> None:
        self._close(None)

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default=None):
        return self._sock if name == "socket" else default

    def _close(self, exc: Exception | None) -> None:
        """Stop watching the socket and close it; the protocol hears of it on the loop's
        next turn, once, as from asyncio's own transports."""
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if self._out:
            self._loop.remove_writer(self._fd)
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)


async def connect(host: str, port: int, protocol_factory):
    """A StampedTransport to host:port (each address getaddrinfo gives, in turn) and its
    protocol; OSError in the words of the last address's failure."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
        except OSError as e:
            sock.close()
            error = e
            continue
        except BaseException:  # cancelled or timed out mid-connect: the socket goes too
            sock.close()
            raise
        protocol = protocol_factory()
        return StampedTransport(loop, sock, protocol), protocol
    raise error
