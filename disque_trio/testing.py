"""A small async RESP client over any ``trio.abc.Stream``, for tests and tools.

Used by the tests, the simulator (over its virtual network) and tools that
talk to a node from Trio code: send commands, read decoded replies
(``Status``, ``ReplyError`` values, ints, bytes, lists...), raw and
untyped. Applications use ``disque_trio.client`` instead (typed results,
cluster routing, retries, AnyIO and blocking shells).
"""

from __future__ import annotations

from typing import Any

import trio

from .protocol.resp import NOT_READY, ReplyReader, encode


class RespClient:
    """Talks RESP over any trio Stream; decodes replies with ReplyReader."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = ReplyReader()

    async def send(self, *args: Any) -> None:
        await self.stream.send_all(encode([_arg(a) for a in args]))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read(self) -> Any:
        while True:
            reply = self.reader.next_reply()
            if reply is not NOT_READY:
                return reply
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("connection closed by the node")
            self.reader.feed(bytes(data))

    async def call(self, *args: Any) -> Any:
        await self.send(*args)
        return await self.read()

    async def closed(self) -> bool:
        """True when the node closed the connection (reads to EOF)."""
        try:
            while await self.stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        return True

    async def aclose(self) -> None:
        await self.stream.aclose()


def _arg(a: Any) -> bytes:
    if isinstance(a, bytes):
        return a
    return str(a).encode()
