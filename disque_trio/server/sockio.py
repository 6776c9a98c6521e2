"""Reading and writing a plain TCP stream for less than Trio's wrapper costs.

``SocketStream.receive_some`` and ``send_all`` run each system call inside
two generator-based context managers (error translation, and the
"try, else wait" sandwich of ``trio.socket``) and a concurrent-use check,
and make every successful call a checkpoint. For a connection that
exchanges one small request and one small reply, that wrapper costs about
as much as the command itself.

:func:`receive_some` and :func:`send_all` do the same on the socket's
descriptor directly, with Trio's public low-level calls:

* a cancelled task raises ``Cancelled`` first and does no I/O (as Trio);
* ``receive_some`` yields once to the scheduler when data was ready at
  once (as Trio: a connection that always has input still lets others
  run); ``send_all`` does not yield when the kernel takes every byte: the
  connection yields when it reads next;
* a would-block waits for the descriptor with ``wait_readable`` /
  ``wait_writable`` (a read the caller expects to block waits first);
* errors are Trio's: ``BrokenResourceError`` when the peer is gone,
  ``ClosedResourceError`` when the stream was closed.

Streams that are not plain sockets (TLS, test doubles) go through their own
methods. Only for a stream's one reader and one writer: these bypass the
concurrent-use checks.
"""

from __future__ import annotations

import errno
import os

import trio

# A descriptor closed under us: ClosedResourceError, as Trio says it.
_CLOSED = frozenset({errno.EBADF, errno.ENOTSOCK})


def _translate(e: OSError) -> Exception:
    if e.errno in _CLOSED:
        return trio.ClosedResourceError("this socket was already closed")
    return trio.BrokenResourceError(f"socket connection broken: {e}")


async def receive_some(
    stream: trio.abc.ReceiveStream, max_bytes: int, wait_first: bool = False
) -> bytes:
    """``stream.receive_some(max_bytes)``; b"" at the end of the input.

    ``wait_first``: the caller expects nothing to be there yet (it just
    answered everything its client sent, and a client mostly waits for
    the answer before sending more): wait for the descriptor at once,
    without the read that would fail first (a system call and an
    exception per request)."""
    if type(stream) is not trio.SocketStream:
        return bytes(await stream.receive_some(max_bytes))
    await trio.lowlevel.checkpoint_if_cancelled()
    fd = stream.socket.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("this socket was already closed")
    if not wait_first:
        try:
            data = os.read(fd, max_bytes)
        except BlockingIOError:
            pass
        except OSError as e:
            raise _translate(e) from e
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return data
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            return os.read(fd, max_bytes)
        except BlockingIOError:
            continue
        except OSError as e:
            raise _translate(e) from e


async def send_all(stream: trio.abc.SendStream, data: bytes) -> None:
    """``stream.send_all(data)``, without yielding when the kernel takes
    every byte of ``data`` at once."""
    if type(stream) is not trio.SocketStream or not data:
        await stream.send_all(data)
        return
    await trio.lowlevel.checkpoint_if_cancelled()
    fd = stream.socket.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("this socket was already closed")
    view = memoryview(data)
    while view:
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(fd)
            continue
        except OSError as e:
            raise _translate(e) from e
        view = view[sent:]


def write_nowait(stream: trio.abc.SendStream, data: bytes) -> int:
    """Write what the socket takes of ``data`` now, without blocking or
    yielding: the number of bytes written (0 when it would block, on an
    error, which the next ``send_all`` reports, or for a stream that is not a
    plain socket and has no ``write_nowait`` of its own, like TLS)."""
    if type(stream) is not trio.SocketStream:
        write = getattr(stream, "write_nowait", None)
        return 0 if write is None else int(write(data))
    fd = stream.socket.fileno()
    if fd < 0:
        return 0
    try:
        return os.write(fd, data)
    except OSError:
        return 0
