"""A small HTTP/1.1 server connection on h11, for the web port.

h11 does the parsing; this module does the I/O around it: read the next
request (keeping its raw bytes, so that a WebSocket upgrade can be replayed
to trio-websocket), answer it, and go on to the next request of a keep-alive
connection. Request bodies are read and thrown away up to a small limit: no
route of the web port takes one.
"""

from __future__ import annotations

from http import HTTPStatus

import h11
import trio

READ_SIZE = 16 * 1024
MAX_HEAD_BYTES = 16 * 1024  # request line and headers
MAX_BODY_BYTES = 64 * 1024  # read and discarded; larger bodies close the connection
SERVER_NAME = b"disque-trio"
# Closing a socket with unread input makes the kernel send a reset, which
# may destroy the error response just sent before the peer reads it. So an
# error answer is followed by a half-close and a short drain (what HTTP
# servers call a lingering close), bounded in time and bytes.
LINGER_S = 1.0
LINGER_BYTES = 256 * 1024


class HttpError(Exception):
    """The peer broke HTTP: answer with ``status`` (if still possible), close."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class HttpConnection:
    """Requests in, responses out, one at a time, on one stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        # Every byte read since the current request began: an upgrade hands
        # them, unparsed, to the WebSocket handshake.
        self._raw = bytearray()
        # An answer to HEAD has no body, whatever the route meant to send
        # (h11 refuses body bytes after a HEAD request).
        self._head = False

    async def next_request(self, idle_s: float, request_s: float) -> h11.Request | None:
        """The next request with its body consumed; None when the peer
        closed the connection between requests, or sent nothing for
        ``idle_s``. HttpError on bad input, and 408 when a request that
        began is not complete (head and body) within ``request_s``: a
        client that trickles bytes holds a connection that long at most."""
        with trio.move_on_after(idle_s) as deadline:
            return await self._next_request(deadline, request_s)
        if self._raw:
            raise HttpError(408, "request not complete in time")
        return None

    async def _next_request(
        self, deadline: trio.CancelScope, request_s: float
    ) -> h11.Request | None:
        request: h11.Request | None = None
        if self._raw:  # pipelined: this request began with the last one
            deadline.deadline = min(deadline.deadline, trio.current_time() + request_s)
        body = 0
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as e:
                raise HttpError(e.error_status_hint, str(e)) from None
            if event is h11.NEED_DATA:
                began = bool(self._raw)
                await self._receive()
                if not began and self._raw:
                    deadline.deadline = min(deadline.deadline, trio.current_time() + request_s)
            elif isinstance(event, h11.Request):
                request = event
                self._head = event.method == b"HEAD"
            elif isinstance(event, h11.Data):
                body += len(event.data)
                if body > MAX_BODY_BYTES:
                    raise HttpError(413, "request body too large")
            elif isinstance(event, h11.EndOfMessage) or event is h11.PAUSED:
                # PAUSED: an Upgrade request waits for our answer.
                return request
            elif isinstance(event, h11.ConnectionClosed):
                if request is not None:
                    raise HttpError(400, "connection closed in the middle of a request")
                return None

    async def _receive(self) -> None:
        data = bytes(await self.stream.receive_some(READ_SIZE))
        self._raw += data
        self.h11.receive_data(data)

    def raw_request(self) -> bytes:
        """The bytes of the current request as they came (an Upgrade's
        handshake, plus anything the client sent right after it)."""
        return bytes(self._raw)

    async def respond(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "text/plain; charset=utf-8",
        headers: list[tuple[str, str]] | None = None,
        head_only: bool = False,
    ) -> None:
        """Send a whole response (Content-Length framed; no body after HEAD)."""
        all_headers = [
            ("server", SERVER_NAME.decode()),
            ("content-type", content_type),
            ("content-length", str(len(body))),
            ("cache-control", "no-store"),
            *(headers or []),
        ]
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
        await self._send(h11.Response(status_code=status, headers=all_headers, reason=reason))
        if body and not head_only and not self._head:
            await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())

    async def _send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.stream.send_all(data)

    def can_respond(self) -> bool:
        return self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE)

    def next_cycle(self) -> bool:
        """Get ready for the next request of a keep-alive connection; False
        when the connection must close instead."""
        if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
            return False
        self.h11.start_next_cycle()
        self._raw = bytearray(self.h11.trailing_data[0])
        return True


class ReplayStream(trio.abc.Stream):
    """A stream whose first bytes are ones already read from it.

    The web port reads a request with h11 before it knows it is a WebSocket
    upgrade; trio-websocket then reads the same handshake again from this.
    """

    def __init__(self, stream: trio.abc.Stream, already_read: bytes) -> None:
        self.inner = stream
        self._pending = already_read

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._pending:
            await trio.lowlevel.checkpoint()
            size = len(self._pending) if max_bytes is None else max_bytes
            data, self._pending = self._pending[:size], self._pending[size:]
            return data
        return bytes(await self.inner.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        send_eof = getattr(self.inner, "send_eof", None)
        if send_eof is not None:
            await send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


def header(request: h11.Request, name: bytes) -> str | None:
    """A request header's value (the last one if repeated), or None."""
    value = None
    for key, raw in request.headers:
        if key == name:
            value = raw.decode("latin-1")
    return value


async def linger(stream: trio.abc.Stream) -> None:
    """Half-close our side and read what the peer still sends, for at most
    LINGER_S and LINGER_BYTES, before the caller closes the stream. Never
    raises for a broken or closed stream."""
    with trio.move_on_after(LINGER_S):
        try:
            if isinstance(stream, trio.abc.HalfCloseableStream):
                await stream.send_eof()
            drained = 0
            while drained < LINGER_BYTES:
                data = await stream.receive_some(READ_SIZE)
                if not data:
                    return
                drained += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
